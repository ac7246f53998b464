"""The package's interfaces over real rclpy: every message type published and received in one process and across
two, ListAnimations and the PlayAnimation / GotoPose actions against the simulated robot running as its own
process (started by its real main, stopped by one SIGINT), and Converse against a tiny in-test server."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from action_msgs.msg import GoalStatus
from bolt_ros.action import Converse, GotoPose, PlayAnimation
from bolt_ros.msg import AssistantEvent, Caption, GenerationStats, RobotPose, ToolCall, ToolResult
from bolt_ros.srv import ListAnimations
from conftest import RosHarness, wait_for, wait_for_action
from rclpy.action import ActionClient, ActionServer, CancelResponse
from rclpy.callback_groups import ReentrantCallbackGroup


def samples() -> dict[str, object]:
    """One message of each type with every field set away from its default."""
    call = ToolCall(id="call_1", name="play_animation", arguments='{"name": "nod", "speed": 1.5}')
    result = ToolResult(id="call_1", name="play_animation", ok=False, content='{"progress": 0.5}',
                        error="aborted: préempté ✓")
    caption = Caption(source="cosmos-reason", text="a person waves", confidence=0.75)
    caption.header.frame_id, caption.header.stamp.sec, caption.header.stamp.nanosec = "camera_link", 12, 345
    event = AssistantEvent(conversation_id="c1", type=AssistantEvent.TOOL_RESULT, text="Nodding.",
                           state=AssistantEvent.STATE_ACTING, tool_call=call, tool_result=result)
    event.stamp.sec = 7
    return {
        "Caption": caption, "ToolCall": call, "ToolResult": result,
        "RobotPose": RobotPose(head_roll=0.1, head_pitch=-0.2, head_yaw=0.3, antennas=[1.0, -1.0], body_yaw=-2.5),
        "GenerationStats": GenerationStats(ttft_ms=12.5, prompt_tokens=300, completion_tokens=42,
                                           tokens_per_second=61.0, acceptance_length=3.25, tool_rounds=2,
                                           total_ms=900.0),
        "AssistantEvent": event,
    }


def test_every_message_type_round_trips_in_one_process(ros):
    node = ros.node()
    received: dict[str, list] = {}
    pubs = {}
    for name, msg in samples().items():
        received[name] = []
        node.create_subscription(type(msg), f"iface/{name}", received[name].append, 10)
        pubs[name] = node.create_publisher(type(msg), f"iface/{name}", 10)
    for name, msg in samples().items():
        wait_for(lambda p=pubs[name]: p.get_subscription_count() > 0, what=f"{name} matched")
        pubs[name].publish(msg)
    for name, msg in samples().items():
        assert wait_for(lambda r=received[name]: r, 3.0, name)[0] == msg


# Echoes every message type from iface/in/<T> to iface/out/<T>; run as its own process.
ECHO = """
import rclpy, sys
from rclpy.executors import ExternalShutdownException
from bolt_ros.msg import AssistantEvent, Caption, GenerationStats, RobotPose, ToolCall, ToolResult
rclpy.init()
node = rclpy.create_node("iface_echo")
for t in (AssistantEvent, Caption, GenerationStats, RobotPose, ToolCall, ToolResult):
    pub = node.create_publisher(t, "iface/out/" + t.__name__, 10)
    node.create_subscription(t, "iface/in/" + t.__name__, pub.publish, 10)
print("ready", flush=True)
try:
    rclpy.spin(node)
except (KeyboardInterrupt, ExternalShutdownException):
    pass
"""


def stop(proc: subprocess.Popen, timeout: float = 5.0) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("process did not exit on SIGINT") from None


def test_every_message_type_round_trips_across_processes(ros):
    proc = subprocess.Popen([sys.executable, "-c", ECHO], env=os.environ.copy(), stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        node = ros.node()
        received: dict[str, list] = {}
        for name, msg in samples().items():
            received[name] = []
            node.create_subscription(type(msg), f"iface/out/{name}", received[name].append, 10)
            pub = node.create_publisher(type(msg), f"iface/in/{name}", 10)
            # discovery takes a moment: republish until the echo arrives
            wait_for(lambda p=pub, m=msg, r=received[name]: r or p.publish(m), 10.0, f"{name} echoed", poll=0.05)
            assert received[name][0] == msg
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def sim_process():
    """The simulated robot as its own process, started by its real main with a parameter override."""
    proc = subprocess.Popen([sys.executable, "-m", "bolt_ros.nodes.sim_robot_nodes", "--ros-args",
                             "-p", "publish_rate_hz:=50", "--log-level", "warn"], env=os.environ.copy())
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sim_robot_process_serves_animations_and_goto(ros, sim_process):
    node = ros.node()
    cli = node.create_client(ListAnimations, "list_animations")
    assert cli.wait_for_service(timeout_sec=15.0), "sim_robot process did not come up"
    resp = ros.result(cli.call_async(ListAnimations.Request()))
    assert "nod" in resp.names and len(resp.names) == len(resp.descriptions) == len(resp.durations)
    nod = list(resp.names).index("nod")
    assert resp.durations[nod] > 0 and "yes" in resp.descriptions[nod]

    play = ActionClient(node, PlayAnimation, "play_animation")
    assert play.wait_for_server(timeout_sec=5.0)
    feedback = []
    handle = ros.result(play.send_goal_async(PlayAnimation.Goal(name="nod", speed=4.0),
                                             feedback_callback=lambda f: feedback.append(f.feedback)))
    res = ros.result(handle.get_result_async(), 5.0)
    assert res.status == GoalStatus.STATUS_SUCCEEDED and res.result.success, res.result.message
    assert feedback and feedback[-1].progress <= 1.0
    # 4x faster, but the velocity limits stretch the quick segments back out
    assert resp.durations[nod] / 4 < feedback[-1].duration < resp.durations[nod]

    goto = ActionClient(node, GotoPose, "goto_pose")
    assert goto.wait_for_server(timeout_sec=5.0)
    target = RobotPose(head_yaw=0.8, antennas=[0.5, -0.5])
    gfeedback = []
    handle = ros.result(goto.send_goal_async(GotoPose.Goal(target=target, duration=2.0, interpolation=1),
                                             feedback_callback=lambda f: gfeedback.append(f.feedback)))
    wait_for(lambda: gfeedback and gfeedback[-1].current.head_yaw > 0.05, 3.0, "goto moving")
    ros.result(handle.cancel_goal_async())
    res = ros.result(handle.get_result_async())
    assert res.status == GoalStatus.STATUS_CANCELED and 0.0 < res.result.reached.head_yaw < 0.8

    t0 = time.monotonic()
    assert stop(sim_process) == 0  # one SIGINT, clean exit
    assert time.monotonic() - t0 < 3.0


class TinyAssistant:
    """A Converse server that streams one TEXT_DELTA per word (the real assistant is another module)."""

    def __init__(self, node, word_delay: float = 0.03):
        self.word_delay = word_delay
        self.server = ActionServer(node, Converse, "converse", execute_callback=self.execute,
                                   cancel_callback=lambda _g: CancelResponse.ACCEPT,
                                   callback_group=ReentrantCallbackGroup())

    def execute(self, goal_handle):
        words, said = f"You said {goal_handle.request.utterance}, and I agree completely.".split(), []
        for word in words:
            if goal_handle.is_cancel_requested:
                goal_handle.canceled()
                return Converse.Result(success=False, text=" ".join(said), error="cancelled")
            said.append(word)
            goal_handle.publish_feedback(Converse.Feedback(event=AssistantEvent(
                conversation_id=goal_handle.request.conversation_id, type=AssistantEvent.TEXT_DELTA, text=word)))
            time.sleep(self.word_delay)
        goal_handle.succeed()
        call = ToolCall(id="0", name="play_animation", arguments='{"name": "nod"}')
        return Converse.Result(success=True, text=" ".join(said), tool_calls=[call],
                               tool_results=[ToolResult(id="0", name="play_animation", ok=True, content="{}")],
                               stats=GenerationStats(completion_tokens=len(said), tool_rounds=1))


@pytest.fixture
def server_side():
    """A second graph participant on a multi-threaded executor, for a test server whose execute callback blocks."""
    harness = RosHarness(threads=4)
    try:
        yield harness
    finally:
        harness.close()


def test_converse_goal_streams_feedback_and_can_be_cancelled(ros, server_side):
    stub = server_side.node("assistant_stub")
    TinyAssistant(stub)
    node = ros.node()
    client = ActionClient(node, Converse, "converse")
    wait_for_action(client, stub, "converse")

    events = []
    handle = ros.result(client.send_goal_async(Converse.Goal(utterance="hello", conversation_id="c7"),
                                               feedback_callback=lambda f: events.append(f.feedback.event)))
    res = ros.result(handle.get_result_async(), 5.0)
    assert res.status == GoalStatus.STATUS_SUCCEEDED
    # feedback is a topic, the result a service reply: the last feedback may arrive after the result
    wait_for(lambda: len(events) == 7, what="all feedback")
    assert res.result.text == "You said hello, and I agree completely." == " ".join(e.text for e in events)
    assert {e.conversation_id for e in events} == {"c7"} and res.result.tool_calls[0].name == "play_animation"
    assert res.result.stats.completion_tokens == 7

    events.clear()
    handle = ros.result(client.send_goal_async(Converse.Goal(utterance="a long story"),
                                               feedback_callback=lambda f: events.append(f.feedback.event)))
    wait_for(lambda: len(events) >= 2, 3.0, "streaming")
    cancel = ros.result(handle.cancel_goal_async())
    assert len(cancel.goals_canceling) == 1
    res = ros.result(handle.get_result_async())
    assert res.status == GoalStatus.STATUS_CANCELED and not res.result.success
    assert 2 <= len(res.result.text.split()) < 9  # stopped mid-reply


def test_many_clients_publish_concurrently_without_loss(ros):
    """Several publisher threads into one subscriber: the bounded-queue setup the nodes rely on loses nothing
    when the reader keeps up."""
    node = ros.node()
    got = []
    node.create_subscription(ToolCall, "iface/many", got.append, 100)
    pubs = [node.create_publisher(ToolCall, "iface/many", 100) for _ in range(3)]
    wait_for(lambda: all(p.get_subscription_count() > 0 for p in pubs), what="matched")

    def burst(i, pub):
        for k in range(20):
            pub.publish(ToolCall(id=f"{i}-{k}", name="t", arguments="{}"))
            time.sleep(0.001)

    threads = [threading.Thread(target=burst, args=(i, p)) for i, p in enumerate(pubs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wait_for(lambda: len(got) >= 60, 3.0, "all 60 messages")
    ids = [m.id for m in got]
    assert sorted(ids) == sorted(f"{i}-{k}" for i in range(3) for k in range(20))
    for i in range(3):  # per publisher, in order
        mine = [int(x.split("-")[1]) for x in ids if x.startswith(f"{i}-")]
        assert mine == sorted(mine)
