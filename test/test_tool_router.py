"""The tool router against the simulated robot (real rclpy): valid calls become goals/requests; unknown tools,
bad arguments, a missing server, a refused out-of-limits goal and a timeout become errors the model reads."""
from __future__ import annotations

import json
import threading
import time

import pytest
from conftest import wait_for
from test_assistant_fixtures import start, tool_messages

from bolt_ros.assistant.backend import ToolCallRequest


def _call(assistant, name, arguments, cancel=None):
    return assistant.router.call(ToolCallRequest("t1", name, arguments), cancel or threading.Event())


def test_valid_action_and_service_calls(ros):
    assistant, _, probe = start(ros, [])
    out = _call(assistant, "move_head", {"yaw": -20, "pitch": 10, "duration": 0.3})
    assert out.ok, out.error
    reached = json.loads(out.content)["result"]["reached"]
    assert abs(reached["head_yaw"] + 0.349) < 0.01 and abs(reached["head_pitch"] - 0.1745) < 0.01
    assert abs(probe.head_yaw() + 0.349) < 0.02
    out = _call(assistant, "list_animations", {})
    assert out.ok and "look_around" in json.loads(out.content)["result"]["names"]
    assert assistant.router.accept_latency_ms and assistant.router.running_goals() == 0


def test_refusals_before_ros_unknown_tool_and_bad_arguments(ros):
    assistant, _, _ = start(ros, [])
    out = _call(assistant, "fly", {"height": 3})
    assert not out.ok and out.error.startswith("unknown tool 'fly'; available tools: play_animation, look, move_head")
    out = _call(assistant, "move_head", {"yaw": 200, "pitch": 0})
    assert not out.ok and "yaw: Input should be less than or equal to 60" in out.error
    out = _call(assistant, "play_animation", {"name": "moonwalk"})
    assert not out.ok and "name: Input should be 'nod'" in out.error  # enum from the robot's ListAnimations
    out = assistant.router.call(ToolCallRequest("t2", "", None, raw="<tool_call>{", error="unterminated"),
                                threading.Event())
    assert not out.ok and out.error == "could not parse the tool call: unterminated"
    assert json.loads(out.for_model()) == {"error": out.error}


def test_missing_server_times_out_with_a_clear_error(ros):
    assistant, _, _ = start(ros, [])
    t0 = time.perf_counter()
    out = _call(assistant, "missing_server", {})
    assert time.perf_counter() - t0 >= 0.2  # it did wait its server_timeout_s (how much longer: the realtime test)
    assert not out.ok and out.error == ("action server 'no_such_action' is not available (waited 0.2 s); "
                                        "is the robot running?")


@pytest.mark.realtime
def test_missing_server_error_comes_soon_after_its_timeout(ros):
    assistant, _, _ = start(ros, [])
    t0 = time.perf_counter()
    out = _call(assistant, "missing_server", {})
    assert not out.ok and 0.2 <= time.perf_counter() - t0 < 1.0


def test_out_of_limits_goal_is_refused_by_the_robot_and_never_executed(ros):
    assistant, _, probe = start(ros, [])
    n0 = len(probe.joints)
    out = _call(assistant, "raw_yaw", {"yaw": 3.0})  # the robot's head_yaw limit is 1.2 rad
    assert not out.ok and out.error.startswith("goto_pose goal aborted")
    wait_for(lambda: len(probe.joints) > n0 + 10, what="more joint states")
    assert all(abs(m.position[list(m.name).index("head_yaw")]) < 1e-9 for _, m in probe.joints[n0:])


def test_result_timeout_cancels_the_goal(ros):
    assistant, _, _ = start(ros, [])
    out = _call(assistant, "hasty_animation", {"name": "look_around"})
    assert not out.ok and out.error == "timed out after 0.3 s waiting for the result of play_animation"
    wait_for(lambda: assistant.router.running_goals() == 0, what="the timed-out goal to end")


def test_a_goal_accepted_after_the_timeout_is_cancelled(ros):
    """The router gave up waiting for acceptance; the server accepts later: that goal must not run unseen."""
    from bolt_ros.action import GotoPose
    from conftest import RosHarness
    from rclpy.action import ActionServer, CancelResponse, GoalResponse

    server_side = RosHarness(threads=4)  # its goal callback blocks
    try:
        node = server_side.node("slow_server")
        cancelled = threading.Event()

        def slow_accept(_goal):
            time.sleep(0.5)
            return GoalResponse.ACCEPT

        def execute(goal_handle):
            deadline = time.monotonic() + 5.0
            while not goal_handle.is_cancel_requested and time.monotonic() < deadline:
                time.sleep(0.01)
            if goal_handle.is_cancel_requested:
                cancelled.set()
                goal_handle.canceled()
            return GotoPose.Result()

        ActionServer(node, GotoPose, "slow_accept", execute_callback=execute, goal_callback=slow_accept,
                     cancel_callback=lambda _g: CancelResponse.ACCEPT)
        assistant, _, _ = start(ros, [])
        out = _call(assistant, "slow_accept", {})
        assert not out.ok and out.error == "timed out after 0.2 s waiting for the goal to be accepted of slow_accept"
        wait_for(cancelled.is_set, 3.0, "the late-accepted goal to be cancelled")
    finally:
        server_side.close()


def _at_rest(probe, n: int = 5) -> bool:
    """The head has left 0 and its last n joint states report zero yaw velocity."""
    last = [m for _, m in probe.joints[-n:]]
    i = list(last[0].name).index("head_yaw")
    return len(last) == n and last[-1].position[i] > 0 and all(m.velocity[i] == 0.0 for m in last)


def test_a_goal_whose_acceptance_is_lost_is_cancelled_by_its_id(ros):
    """The server accepts and starts moving, but the acceptance never reaches the router (a middleware double drops
    it, as rmw_fastrtps rarely does): after the timeout the router cancels the goal by its id, so the head stops
    long before the 2 s motion would have ended."""
    assistant, _, probe = start(ros, [])
    client = assistant.router._clients["lossy_goto"]
    take = client.take_data

    def lose_goal_responses():
        data = take()
        data.pop("goal", None)
        return data

    client.take_data = lose_goal_responses
    out = _call(assistant, "lossy_goto", {"yaw": 1.0})
    assert not out.ok and out.error == "timed out after 0.3 s waiting for the goal to be accepted of goto_pose"
    # event-driven: wait until the head has moved and come to rest (had the goal run on, that is only at yaw 1.0
    # after 2 s), then check where it rests
    wait_for(lambda: _at_rest(probe), timeout=10, what="the head to move and stop")
    assert 0.0 < probe.head_yaw() < 0.5  # it had started (accepted), and stopped near the start


def test_errors_reach_the_model_and_the_node_keeps_going(ros):
    script = [{"match": "dance", "reply": [
        {"tool_call": {"name": "teleport", "arguments": {}}},
        {"tool_call": {"name": "move_head", "arguments": {"yaw": "far left", "pitch": 0}}},
        {"tool_call": {"name": "missing_server", "arguments": {}}}],
        "after_tool": [{"text": "Sorry, I could not do that."}]}]
    _, backend, probe = start(ros, script)
    probe.say("dance for me")
    wait_for(lambda: probe.spoken() == ["Sorry, I could not do that."], timeout=10, what="apology")
    errors = [json.loads(m["content"])["error"] for m in tool_messages(backend)]
    assert errors[0].startswith("unknown tool 'teleport'")
    assert "yaw: Input should be a valid number" in errors[1]
    assert "not available" in errors[2]
