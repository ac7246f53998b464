"""A move's own line is said as the robot starts moving, not after the motion (issue 33, item 1): the assistant node
with real rclpy on the simulated robot, the product's tools and their lines (config/assistant.yaml)."""
from __future__ import annotations

import math
import time

import pytest
from action_msgs.msg import GoalStatus, GoalStatusArray
from bolt_ros.action import GotoPose
from bolt_ros.msg import AssistantEvent, RobotPose
from conftest import wait_for
from rclpy.action import ActionClient
from test_assistant_fixtures import EXTRA_TOOLS, start

from bolt_ros.assistant.config import load_params_file
from bolt_ros.assistant.tools import DID_NOT_WORK, TOO_FAR
from bolt_ros.graph import package_file

LOOK_LEFT = [{"match": "look left", "reply": [{"tool_call": {"name": "look_left", "arguments": {}}}]},
             {"match": "too far", "reply": [{"tool_call": {"name": "raw_yaw_said", "arguments": {"yaw": 3.0}}}]}]
# raw_yaw with a line of its own: the motion server accepts the goal and refuses the target as it executes it
RAW_YAW_SAID = """
- name: raw_yaw_said
  description: head yaw in radians, unchecked here, with a line
  kind: action
  target: goto_pose
  type: bolt_ros/action/GotoPose
  parameters: {type: object, properties: {yaw: {type: number}}, required: [yaw]}
  goal: {target.head_yaw: {arg: yaw}, duration: 0.3}
  say: ["Turning."]
"""


def _start(ros, at_start: bool):
    tools = load_params_file(package_file("config/assistant.yaml"), "assistant_node")["tools"]
    assistant, _, probe = start(ros, LOOK_LEFT, say=True, say_move_at_start=at_start,
                                tools=tools + EXTRA_TOOLS + RAW_YAW_SAID)
    ended = []  # (perf_counter, status) of goto_pose goals as they end on the server
    probe.node.create_subscription(GoalStatusArray, "goto_pose/_action/status", lambda m: ended.extend(
        (time.perf_counter(), s.status) for s in m.status_list if s.status in TERMINAL), 50)
    return assistant, probe, ended


TERMINAL = (GoalStatus.STATUS_SUCCEEDED, GoalStatus.STATUS_ABORTED, GoalStatus.STATUS_CANCELED)


def _replies(assistant) -> list[str]:
    """What the conversation recorded (committed just after the turn's `idle` event)."""
    return wait_for(lambda: assistant.turns_done and assistant._conversation("").recent_replies(), what="the record")


def _other_client(probe) -> ActionClient:
    other = ActionClient(probe.node, GotoPose, "goto_pose")
    assert other.wait_for_server(timeout_sec=5.0)
    return other


def _preempt(other: ActionClient) -> None:
    """Another client's goal on goto_pose: it preempts the running one (the motion server runs the newest)."""
    other.send_goal_async(GotoPose.Goal(target=RobotPose(head_roll=math.nan, head_pitch=math.nan, head_yaw=-0.2,
                                                         antennas=[math.nan, math.nan], body_yaw=math.nan),
                                        duration=0.3))


def _yaw_at(probe, t: float) -> float:
    js = next(m for tj, m in probe.joints if tj >= t)
    return js.position[list(js.name).index("head_yaw")]


@pytest.mark.parametrize("at_start", [True, False])
def test_the_line_is_said_as_the_goal_runs_before_its_result(ros, at_start):
    """"look left" (a 1 s head turn): with say_move_at_start the line is on tts/say while the head turns, before the
    goal's result reaches the server's status and before the tool result. Negative control: without it (the order
    before issue 33) the same line comes after the goal succeeded."""
    assistant, probe, ended = _start(ros, at_start)
    probe.t_said = probe.say("please look left")
    wait_for(lambda: probe.of_type(AssistantEvent.TOOL_RESULT) and probe.tts, timeout=10, what="the result and line")
    wait_for(lambda: probe.of_type(AssistantEvent.STATE)[-1].state == "idle", what="idle again")
    assert probe.spoken() in (["Looking left."], ["Okay, left it is."], ["Turning left."])
    t_said = probe.tts[0][0]
    t_result = next(t for t, m in probe.events if m.type == AssistantEvent.TOOL_RESULT)
    t_succeeded = wait_for(lambda: [t for t, s in ended if s == GoalStatus.STATUS_SUCCEEDED], what="success")[0]
    if at_start:
        assert t_said < t_succeeded and t_said < t_result
        assert t_succeeded - t_said > 0.5  # said at the start of a 1 s turn, not at its end
        assert abs(_yaw_at(probe, t_said)) < 0.3  # the head had not got far towards 0.6 rad yet
        # no `speaking` state while the tool moves the robot: the speech sway keeps still
        states = [m.state for m in probe.of_type(AssistantEvent.STATE)]
        assert states == ["thinking", "acting", "idle"]
    else:
        assert t_said > t_succeeded  # (the tool result event travels on another topic: either may arrive first)
    print(f"line on tts/say {1e3 * (t_said - probe.t_said):.0f} ms after the utterance, goal succeeded "
          f"{1e3 * (t_succeeded - probe.t_said):.0f} ms after it")
    assert _replies(assistant) == probe.spoken()  # the history records it once, as said
    assert abs(probe.head_yaw() - 0.6) < 0.02


def test_a_move_that_fails_after_its_line_is_corrected(ros):
    """The head starts turning left, the line is said, then another client's goal preempts it on goto_pose: the
    robot says it could not, and its memory holds both sentences and no "you looked left". Negative control: the
    same preemption without say_move_at_start (next test) is said as a failure only."""
    assistant, probe, ended = _start(ros, True)
    other = _other_client(probe)
    probe.say("look left")
    wait_for(lambda: probe.tts, what="the line")
    _preempt(other)
    wait_for(lambda: len(probe.tts) >= 2, what="the correction")
    line = probe.spoken()[0]
    assert probe.spoken() == [line, "Sorry, I couldn't do that."]
    assert [s for _, s in ended][:1] == [GoalStatus.STATUS_ABORTED]  # the look goal ended aborted (preempted)
    wait_for(lambda: probe.of_type(AssistantEvent.STATE)[-1].state == "idle", what="idle again")
    assert _replies(assistant) == [f"{line} Sorry, I couldn't do that."]
    assert assistant._conversation("").records[-1].done == []
    assert not probe.of_type(AssistantEvent.TOOL_RESULT)[0].tool_result.ok


def test_without_the_line_at_start_a_preempted_move_is_said_as_a_failure_only(ros):
    """Negative control of the correction: no line was said, so no "Sorry": the plain failure line, as before."""
    _, probe, _ = _start(ros, False)
    other = _other_client(probe)
    running = []
    probe.node.create_subscription(GoalStatusArray, "goto_pose/_action/status", lambda m: running.extend(
        s for s in m.status_list if s.status == GoalStatus.STATUS_EXECUTING), 50)
    probe.say("look left")
    wait_for(lambda: running, what="the look goal running")
    _preempt(other)
    wait_for(lambda: probe.tts, what="the failure line")
    wait_for(lambda: probe.of_type(AssistantEvent.STATE)[-1].state == "idle", what="idle again")
    assert probe.spoken() == [DID_NOT_WORK]


def test_a_refused_target_is_never_announced(ros):
    """The motion server accepts every goal and refuses a target out of reach as it executes it: no feedback ever
    came, so no line was said, only why not. Negative control: announcing at the acceptance (not at the first
    feedback) would have said "Turning." first."""
    assistant, probe, ended = _start(ros, True)
    probe.say("too far")
    wait_for(lambda: probe.tts, what="the failure line")
    assert [s for _, s in ended][:1] == [GoalStatus.STATUS_ABORTED]  # accepted, then aborted (a rejection: none)
    wait_for(lambda: probe.of_type(AssistantEvent.STATE)[-1].state == "idle", what="idle again")
    assert probe.spoken() == [TOO_FAR]
    assert _replies(assistant) == [TOO_FAR]
