"""The robot's voice moves its head and antennas a little, within the configured offsets and through the motion
server's limits, and keeps still while a tool's motion runs."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
from conftest import wait_for

from bolt_ros.voice.config import SpeechMotionConfig, SwayConfig
from bolt_ros.voice.sway import Sway


def voice_like(seconds: float, rate: int = 16000) -> np.ndarray:
    """A loud voice-like signal: 150 Hz with a 4 Hz syllable envelope."""
    t = np.arange(int(seconds * rate)) / rate
    return (0.5 * np.sin(2 * np.pi * 150 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)


def test_offsets_follow_loudness_and_stay_within_the_configured_range():
    cfg = SwayConfig()
    sway = Sway(cfg)
    sway.add_audio(voice_like(3.0), 16000, 100.0)
    sway.add_audio(np.zeros(16000, np.float32), 16000, 103.0)
    ts = np.arange(100.3, 103.0, 0.01)
    offs = [sway.offsets(t) for t in ts]
    pitch = np.array([o["head_pitch"] for o in offs])
    assert np.abs(pitch).max() <= math.radians(cfg.pitch_deg) + 1e-9
    assert np.abs(pitch).max() > 0.5 * math.radians(cfg.pitch_deg)      # it does move while speaking
    assert all(abs(o["antenna_right"] + o["antenna_left"]) < 1e-12 for o in offs)   # mirrored
    assert all(v == 0.0 for v in sway.offsets(103.5).values())          # silence: no offset
    assert sway.offsets(101.234) == sway.offsets(101.234)               # deterministic
    assert sway.speaking(102.9) and not sway.speaking(104.5)


@pytest.fixture
def motion_graph(ros):
    from bolt_ros.nodes.sim_robot_nodes import make_sim_robot_nodes
    from bolt_ros.nodes.speech_motion import SpeechMotion
    ros.add(*make_sim_robot_nodes(context=ros.context))
    motion = ros.add(SpeechMotion(SpeechMotionConfig(), context=ros.context))
    probe = ros.node("motion_probe")
    from bolt_ros.msg import AudioChunk
    from sensor_msgs.msg import JointState
    joints = []
    probe.create_subscription(JointState, "joint_states", lambda m: joints.append(dict(zip(m.name, m.position))), 500)
    out = probe.create_publisher(AudioChunk, "audio/out", 100)
    wait_for(lambda: joints and motion._client.server_is_ready() and out.get_subscription_count(), what="graph")
    return motion, probe, joints, out


def play(out, seconds: float) -> None:
    """What speech_synthesizer does: the audio, in real time, on audio/out."""
    from bolt_ros.nodes.speech_common import chunk_msg
    from bolt_ros.voice.audio import to_int16
    x, n, t = to_int16(voice_like(seconds)), 320, time.time()
    for i in range(0, len(x), n):
        out.publish(chunk_msg(x[i:i + n], 16000, t + i / 16000))
        time.sleep(max(0.0, t + (i + n) / 16000 - time.time()))


def test_speech_moves_the_head_a_little_and_back(motion_graph):
    motion, _, joints, out = motion_graph
    base = dict(joints[-1])
    n0 = len(joints)
    play(out, 2.0)
    moved = [j for j in joints[n0:]]
    dev = max(abs(j["head_pitch"] - base["head_pitch"]) for j in moved)
    cfg = motion.config.sway
    assert math.radians(0.5) < dev <= math.radians(cfg.pitch_deg) + 0.01, math.degrees(dev)
    assert max(abs(j["antenna_right"] - base["antenna_right"]) for j in moved) <= math.radians(cfg.antenna_deg) + 0.01
    assert all(abs(j["body_yaw"] - base["body_yaw"]) < 1e-6 for j in moved)   # the body is not part of it
    wait_for(lambda: abs(joints[-1]["head_pitch"] - base["head_pitch"]) < math.radians(0.2), what="back to base")


def test_speech_motion_keeps_still_while_a_tool_moves_the_robot(motion_graph, ros):
    from bolt_ros.action import PlayAnimation
    from rclpy.action import ActionClient
    motion, probe, _, out = motion_graph
    client = ActionClient(probe, PlayAnimation, "play_animation")
    assert client.wait_for_server(timeout_sec=5.0)
    handle = ros.result(client.send_goal_async(PlayAnimation.Goal(name="look_around")))
    assert handle.accepted
    wait_for(motion.busy, what="the tool's goal seen")
    goals = motion.counts["goals"]
    play(out, 1.0)   # the animation (several seconds) is still running
    assert motion.counts["goals"] == goals and motion.counts["yielded"] > 0
    # negative control: once the tool is done, speech moves the robot again
    ros.result(handle.get_result_async(), timeout=15)
    wait_for(lambda: not motion.busy(), what="the tool's goal finished")
    play(out, 0.5)
    assert motion.counts["goals"] > goals


SLEEP = {"head_roll": 0.0, "head_pitch": 0.55, "head_yaw": 0.0, "antenna_right": -3.05, "antenna_left": 3.05}


def test_the_sway_stays_inside_the_joint_limits_from_the_sleep_pose():
    """The sleep pose (config/robot.yaml) sits 0.05 rad from the limits; the sway's offsets reach 0.07 (pitch) and
    0.21 rad (antennas). Negative control: the offsets added as they were go out of range; within() keeps every
    target in range and the robot still sways (away from the limit)."""
    from bolt_ros.robot import load_robot_config
    from bolt_ros.voice.sway import within
    limits = load_robot_config().limits
    envelope = {j: (getattr(limits, j).lower, getattr(limits, j).upper) for j in SLEEP}
    sway = Sway(SwayConfig())
    sway.add_audio(voice_like(3.0), 16000, 100.0)
    raw = [{j: SLEEP[j] + o for j, o in sway.offsets(t).items()} for t in np.arange(100.3, 103.0, 0.1)]
    out = lambda p: [j for j, v in p.items() if not envelope[j][0] <= v <= envelope[j][1]]  # noqa: E731
    assert sum(bool(out(p)) for p in raw) > len(raw) // 3   # negative control: refused goals, as before
    clamped = [within(p, envelope) for p in raw]
    assert not any(out(p) for p in clamped)
    for j in ("head_pitch", "antenna_right", "antenna_left"):
        assert max(abs(p[j] - SLEEP[j]) for p in clamped) > math.radians(2), j   # it still moves


def test_speech_after_go_to_sleep_sways_without_refused_goals(motion_graph, ros):
    """Through the motion server: the sleep animation, then speech. No sway goal is refused and the antennas move.
    Negative control: the same speech with no envelope (the offsets unclamped, as before) has goals refused."""
    from bolt_ros.action import PlayAnimation
    from rclpy.action import ActionClient

    from bolt_ros.nodes.motion_server import MotionServer
    motion, probe, joints, out = motion_graph
    server = next(n for n in ros.nodes if isinstance(n, MotionServer))
    refused, refuse = [], server._refuse  # a spy on the real server's refusal ("goto_pose refused: ...")
    server._refuse = lambda handle, message: (refused.append(message), refuse(handle, message))[1]
    client = ActionClient(probe, PlayAnimation, "play_animation")
    assert client.wait_for_server(timeout_sec=5.0)
    handle = ros.result(client.send_goal_async(PlayAnimation.Goal(name="sleep")))
    assert ros.result(handle.get_result_async(), timeout=10).result.success
    wait_for(lambda: not motion.busy() and abs(joints[-1]["antenna_left"] - 3.05) < 1e-3, what="asleep")
    goals, n0 = motion.counts["goals"], len(joints)
    play(out, 1.5)
    wait_for(lambda: abs(joints[-1]["antenna_left"] - 3.05) < 1e-3, what="back to the sleep pose")
    assert motion.counts["goals"] - goals >= 10 and refused == []
    assert max(abs(j["antenna_left"] - 3.05) for j in joints[n0:]) > math.radians(3)
    motion.envelope = {}  # negative control
    play(out, 1.5)
    wait_for(lambda: refused, what="refused goals without the envelope")
    time.sleep(0.3)
    print(f"from the sleep pose: {motion.counts['goals'] - goals} sway goals, {len(refused)} refused without the "
          f"envelope (the last 1.5 s); none with it")
    assert all("outside" in m for m in refused)
