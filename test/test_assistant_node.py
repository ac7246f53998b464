"""The assistant node with real rclpy on the simulated robot: caption + utterance -> tool call -> goal ->
joint_states move -> result back to the model -> spoken reply; the converse action; barge-in mid generation and
mid motion; a caption flood; parameters."""
from __future__ import annotations

import json
import math
import threading
import time

import pytest
import rclpy
from action_msgs.msg import GoalStatus, GoalStatusArray
from bolt_ros.action import Converse
from bolt_ros.msg import AssistantEvent
from conftest import wait_for
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile
from test_assistant_fixtures import start, tool_messages

from bolt_ros.nodes.common import FEEDBACK_QOS_DEPTH

LOOK = {"name": "move_head", "arguments": {"yaw": 30, "pitch": 0, "duration": 0.5}}
LOOK_LEFT = [{"match": "look left", "reply": [{"text": "Looking to my left. "}, {"tool_call": LOOK}],
    "after_tool": [{"text": "I see a person there. Hello!"}]}]


def test_caption_and_utterance_lead_to_motion_and_a_spoken_reply(ros):
    assistant, backend, probe = start(ros, LOOK_LEFT)
    probe.see("A person is in front of you, slightly to the left.")
    wait_for(lambda: assistant.scene.items, what="caption in scene memory")
    probe.say("Please look left")
    wait_for(lambda: len(probe.tts) >= 3, timeout=10, what="three spoken sentences")
    assert probe.spoken() == ["Looking to my left.", "I see a person there.", "Hello!"]
    # the model saw the scene with its age, and got the tool result
    first = backend.requests[0]["messages"][-1]["content"]
    assert "A person is in front of you, slightly to the left." in first and "just now" in first
    result = json.loads(tool_messages(backend)[0]["content"])
    assert result["status"] == "succeeded" and result["result"]["success"] is True
    assert abs(result["result"]["reached"]["head_yaw"] - math.radians(30)) < 0.02
    # the robot really moved there, within its limits
    wait_for(lambda: abs(probe.head_yaw() - math.radians(30)) < 0.01, what="head_yaw at 30 deg")
    assert all(abs(m.position[list(m.name).index("head_yaw")]) <= 1.2 + 1e-6 for _, m in probe.joints)
    # speech started before the tool ran: the first sentence was published before the tool result event
    t_result = next(t for t, m in probe.events if m.type == AssistantEvent.TOOL_RESULT)
    assert probe.tts[0][0] < t_result
    call = probe.of_type(AssistantEvent.TOOL_CALL)[0].tool_call
    assert call.name == "move_head" and json.loads(call.arguments) == {"yaw": 30, "pitch": 0, "duration": 0.5}
    wait_for(lambda: probe.of_type(AssistantEvent.STATE)[-1].state == "idle", what="idle again")
    states = [m.state for m in probe.of_type(AssistantEvent.STATE)]
    assert states == ["thinking", "speaking", "acting", "thinking", "speaking", "idle"]


def test_converse_action_streams_feedback_and_returns_calls_results_and_stats(ros):
    script = [{"match": "happy", "reply": [{"tool_call": {"name": "play_animation", "arguments": {"name": "nod"}}}],
               "after_tool": [{"text": "Yes!"}]}]
    _, backend, _ = start(ros, script)
    # rclpy's ActionClient loses feedback messages when several executor threads poll it at once (its ready
    # flags are shared state); a client on its own single-threaded executor sees every one, in order
    cnode = rclpy.create_node("converse_client", context=ros.context)
    ex = SingleThreadedExecutor(context=ros.context)
    ex.add_node(cnode)
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [ex.spin_once(0.02) for _ in iter(stop.is_set, True)], daemon=True)
    spinner.start()
    client = ActionClient(cnode, Converse, "converse")
    assert client.wait_for_server(timeout_sec=5.0)
    # the feedback as it is published, from the action's own topic: rclpy's ActionClient drops a goal's feedback
    # callback once the result is in, and feedback (a topic) and the result (a service reply) may arrive in either
    # order, so a last sentence's feedback read through the client was lost in busy runs
    published = []
    cnode.create_subscription(Converse.Impl.FeedbackMessage, "converse/_action/feedback", published.append,
                              QoSProfile(depth=FEEDBACK_QOS_DEPTH))
    handle = ros.result(client.send_goal_async(Converse.Goal(utterance="are you happy?", enable_thinking=True)))
    res = ros.result(handle.get_result_async(), timeout=10).result
    assert res.success and res.text == "Yes!" and res.error == ""
    assert [c.name for c in res.tool_calls] == ["play_animation"] and res.tool_results[0].ok
    assert res.stats.tool_rounds == 1 and res.stats.total_ms > 0 and res.stats.completion_tokens > 0

    def feedback():
        return [m.feedback.event for m in published if bytes(m.goal_id.uuid) == bytes(handle.goal_id.uuid)]

    wait_for(lambda: [e.text for e in feedback() if e.type == AssistantEvent.SENTENCE] == ["Yes!"], what="feedback")
    assert {e.type for e in feedback()} >= {AssistantEvent.TOOL_CALL, AssistantEvent.TOOL_RESULT,
                                            AssistantEvent.STATE}
    assert backend.requests[0]["enable_thinking"] is True
    offered = {t["function"]["name"]: t["function"] for t in backend.requests[0]["tools"]}
    assert "nod" in offered and "dance" in offered  # one tool per animation, from the robot's ListAnimations
    stop.set()
    spinner.join(2)
    ex.shutdown(1)
    cnode.destroy_node()


@pytest.mark.realtime
def test_barge_in_mid_generation_stops_within_100ms_and_the_new_utterance_is_answered(ros):
    script = [{"match": "story", "reply": [{"text": "Once upon a time. " + "and then " * 300}]},
              {"match": "stop", "reply": [{"text": "Okay, stopping."}]}]
    assistant, backend, probe = start(ros, script, token_delay_s=0.01)
    probe.say("tell me a story")
    wait_for(lambda: probe.spoken() == ["Once upon a time."], what="first sentence")
    t_barge = probe.say("stop please")
    wait_for(lambda: "Okay, stopping." in probe.spoken(), what="the new reply")
    assert assistant.latency["barge_in_stop"] and assistant.latency["barge_in_stop"][-1] < 100.0
    # the interrupted reply stopped: no text deltas of it arrive once the barge-in has been handled
    t_stop = t_barge + 0.1
    late = [m.text for t, m in probe.events if t > t_stop and m.type == AssistantEvent.TEXT_DELTA
            and m.text.startswith("and")]
    assert late == []
    assert probe.spoken() == ["Once upon a time.", "Okay, stopping."]
    # the interrupted turn stays in the conversation's memory, as far as it got
    assert 'you answered "Once upon a time."' in backend.requests[-1]["messages"][-2]["content"]


def test_a_turn_the_person_went_on_from_stops_and_stays_out_of_the_history(ros):
    """The recognizer took a pause for the end of the turn, then the person went on: speech/barge_in says so
    (CONTINUES), and the joined words come as the next transcript. The first part's reply stops and the
    conversation keeps only the whole request; a plain barge-in (the negative control) keeps the turn it stopped."""
    from std_msgs.msg import String

    from bolt_ros.voice.continuation import CONTINUES
    script = [{"match": "for me", "reply": [{"text": "Here is a dance."}]},
              {"match": "dance", "reply": [{"text": "Dancing is fun. " + "and then " * 300}]},
              {"match": "a song", "reply": [{"text": "Here is a song."}]},
              {"match": "sing", "reply": [{"text": "Singing is fun. " + "and then " * 300}]}]
    _, backend, probe = start(ros, script, token_delay_s=0.01)
    barge = probe.node.create_publisher(String, "speech/barge_in", 10)
    wait_for(lambda: barge.get_subscription_count(), what="the barge-in subscription")
    probe.say("Can you dance?")
    wait_for(lambda: probe.spoken() == ["Dancing is fun."], what="the first part's reply")
    barge.publish(String(data=CONTINUES))   # at the person's onset: the joined transcript comes ~1 s later
    time.sleep(0.3)
    probe.say("Can you dance for me?")
    wait_for(lambda: "Here is a dance." in probe.spoken(), what="the whole request's reply")
    said = " ".join(m["content"] for m in backend.requests[-1]["messages"] if m["role"] in ("user", "system"))
    assert "Can you dance?" not in said and "Can you dance for me?" in said, said   # only the whole request
    probe.say("Can you sing?")
    wait_for(lambda: "Singing is fun." in probe.spoken(), what="the next first part's reply")
    barge.publish(String(data="speech onset"))
    time.sleep(0.3)
    probe.say("Can you sing a song?")
    wait_for(lambda: "Here is a song." in probe.spoken(), what="the next whole reply")
    said = " ".join(m["content"] for m in backend.requests[-1]["messages"] if m["role"] in ("user", "system"))
    assert "Can you sing?" in said, said       # a barge-in's stopped turn is remembered


@pytest.mark.realtime
def test_barge_in_mid_motion_cancels_the_running_goal_within_100ms(ros):
    script = [{"match": "look around", "reply": [
        {"tool_call": {"name": "play_animation", "arguments": {"name": "look_around"}}}],
        "after_tool": [{"text": "Done."}]},
        {"match": "wait", "reply": [{"text": "Stopped."}]}]
    _, backend, probe = start(ros, script)
    statuses = []
    probe.node.create_subscription(GoalStatusArray, "play_animation/_action/status",
                                   lambda m: statuses.append((time.perf_counter(), m)), 50)
    probe.say("look around")
    wait_for(lambda: any(s.status == GoalStatus.STATUS_EXECUTING for _, m in statuses for s in m.status_list),
             what="animation running")
    time.sleep(0.3)
    yaw_before = probe.head_yaw()
    t_barge = probe.say("wait")
    t_cancel = wait_for(lambda: next((t for t, m in statuses for s in m.status_list
                                      if s.status == GoalStatus.STATUS_CANCELED), None), what="goal canceled")
    # issue 7: running motions stop within 100 ms of a barge-in (measured 6-19 ms on 2 cores)
    assert t_cancel - t_barge < 0.1, f"motion stopped {1e3 * (t_cancel - t_barge):.0f} ms after the barge-in"
    wait_for(lambda: "Stopped." in probe.spoken(), what="reply to the barge-in")
    time.sleep(0.2)
    assert abs(probe.head_yaw() - yaw_before) < 0.3  # look_around would have swung the head far past this
    result = json.loads(tool_messages(backend)[0]["content"])
    assert "interrupted" in result["error"]
    assert "Done." not in probe.spoken()


def test_caption_flood_keeps_scene_memory_bounded(ros):
    assistant, backend, probe = start(ros, [{"match": ".", "reply": [{"text": "Ok."}]}])
    for i in range(400):
        probe.see(f"caption {i}: a person holding object number {i}")
    probe.see("a cat on the table")
    wait_for(lambda: assistant.scene.items and assistant.scene.items[-1].text == "a cat on the table",
             what="the last caption")
    cfg = assistant.config.scene_memory
    assert len(assistant.scene.items) <= cfg.max_items and assistant.scene.tokens() <= cfg.max_tokens
    probe.say("what do you see")
    wait_for(lambda: probe.spoken() == ["Ok."], what="reply")
    prompt = backend.requests[0]["messages"][-1]["content"]
    assert "a cat on the table" in prompt and len(prompt) < 4 * cfg.max_tokens + 200


def test_cancelling_a_converse_goal_mid_generation(ros):
    _, _, probe = start(ros, [{"match": ".", "reply": [{"text": "word " * 500}]}], token_delay_s=0.01)
    client = ActionClient(probe.node, Converse, "converse")
    assert client.wait_for_server(timeout_sec=5.0)
    handle = ros.result(client.send_goal_async(Converse.Goal(utterance="talk")))
    wait_for(lambda: probe.of_type(AssistantEvent.TEXT_DELTA), what="generation started")
    ros.result(handle.cancel_goal_async())
    res = ros.result(handle.get_result_async(), timeout=5)
    assert res.status == GoalStatus.STATUS_CANCELED and not res.result.success
    assert "interrupted (cancel)" in res.result.error


def test_parameters_mirror_the_config_and_bad_values_are_refused(ros):
    assistant, _, _ = start(ros, [])
    assert assistant.get_parameter("backend.kind").value == "embedded"  # the file's; the test injected a backend
    assert assistant.get_parameter("max_tool_rounds").value == assistant.config.max_tool_rounds == 3
    ok = assistant.set_parameters([Parameter("max_tool_rounds", value=1)])[0]
    assert ok.successful and assistant.config.max_tool_rounds == 1
    bad = assistant.set_parameters([Parameter("max_tool_rounds", value=-2)])[0]
    assert not bad.successful and assistant.config.max_tool_rounds == 1
    late = assistant.set_parameters([Parameter("backend.kind", value="openai")])[0]
    assert not late.successful and "startup" in late.reason


def test_without_barge_in_the_turn_queue_is_bounded_and_refuses_with_a_reason(ros):
    """barge_in off: turns wait their turn, at most max_queued_turns of them; a converse goal beyond that is
    rejected and a transcript is refused with a logged reason, while the running turn goes on."""
    slow = [{"match": ".", "reply": [{"text": "word " * 400}]}]
    assistant, backend, probe = start(ros, slow, token_delay_s=0.01, barge_in=False, max_queued_turns=1,
                                      max_sentences=0)
    client = ActionClient(probe.node, Converse, "converse")
    assert client.wait_for_server(timeout_sec=5.0)
    first = ros.result(client.send_goal_async(Converse.Goal(utterance="one")), what="goal response")
    wait_for(lambda: backend.requests, what="the first turn running")
    second = ros.result(client.send_goal_async(Converse.Goal(utterance="two")), what="goal response")
    third = ros.result(client.send_goal_async(Converse.Goal(utterance="three")), what="goal response")
    assert first.accepted and second.accepted and not third.accepted  # one running, one waiting, then full
    from bolt_ros.nodes.assistant_node import Job

    refused = assistant.submit(Job("four"))  # the transcript path
    assert refused.done.is_set() and refused.result.error.startswith("busy: 1 turns are waiting")
    assert len(backend.requests) == 1  # nothing refused reached the model; the first turn still runs
    for h in (first, second):
        ros.result(h.cancel_goal_async())
