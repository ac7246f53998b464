"""The simulated robot: ROS-free trajectory/limit/animation logic, and the rclpy servers driving joint_states."""
from __future__ import annotations

import math
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from bolt_ros.action import GotoPose, PlayAnimation
from bolt_ros.srv import ListAnimations
from conftest import wait_for
from pydantic import ValidationError
from rclpy.action import ActionClient
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState

from bolt_ros.nodes.animation_server import AnimationServer, AnimationServerConfig
from bolt_ros.nodes.motion_server import MotionServer, MotionServerConfig
from bolt_ros.nodes.sim_robot import SimRobot, SimRobotConfig, msg_to_pose, pose_to_msg
from bolt_ros.robot import (
    CANCELLED,
    FINISHED,
    JOINT_NAMES,
    PREEMPTED,
    PROFILES,
    Animation,
    LimitError,
    MotionController,
    RobotConfig,
    RobotConfigError,
    build_animation,
    load_robot_config,
    min_duration,
    plan_goto,
)
from bolt_ros.robot.trajectory import PEAK_RATE

ROOT = Path(__file__).resolve().parents[1]
LIMITS = RobotConfig().limits
LOWER, UPPER, VMAX = LIMITS.arrays()
ZERO = np.zeros(len(JOINT_NAMES))
PITCH, YAW = JOINT_NAMES.index("head_pitch"), JOINT_NAMES.index("head_yaw")

# A small, fast library for the ROS tests (the real one has multi-second animations).
TEST_ROBOT = RobotConfig.model_validate({"animations": [
    {"name": "bob", "description": "pitch down and back",
     "keyframes": [{"time": 0.15, "pose": {"head_pitch": 0.2}}, {"time": 0.3, "pose": {"head_pitch": 0.0}}]},
    {"name": "slow_turn", "description": "turn the head left slowly",
     "keyframes": [{"time": 1.5, "pose": {"head_yaw": 1.0}}]},
]})


def pose(**joints: float) -> np.ndarray:
    p = ZERO.copy()
    for name, v in joints.items():
        p[JOINT_NAMES.index(name)] = v
    return p


def max_speed(traj, dt: float = 0.002) -> np.ndarray:  # [n_joints] peak |velocity| sampled along the trajectory
    return np.max([np.abs(traj.sample(t)[1]) for t in np.arange(0.0, traj.duration, dt)], axis=0)


# ----------------------------------------------------------------------------------------- ROS-free logic
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_profiles_go_from_0_to_1_monotonically_with_their_peak_rate(profile):
    taus = np.linspace(0.0, 1.0, 2001)
    s, ds = np.array([PROFILES[profile](t) for t in taus]).T
    assert s[0] == pytest.approx(0.0, abs=1e-12) and s[-1] == pytest.approx(1.0)
    assert np.all(np.diff(s) >= -1e-12)
    assert ds.max() == pytest.approx(PEAK_RATE[profile], rel=1e-4)
    # ds/dtau is the derivative of s
    np.testing.assert_allclose(np.gradient(s, taus)[5:-5], ds[5:-5], atol=1e-3)
    if profile != "linear":  # smooth profiles start and stop at rest
        assert ds[0] == pytest.approx(0.0, abs=1e-9) and ds[-1] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_goto_is_lengthened_to_respect_velocity_limits(profile):
    target = pose(head_yaw=1.1, head_pitch=-0.5, body_yaw=2.0)
    traj, notes = plan_goto(ZERO, target, 0.1, profile, LIMITS, "refuse")
    assert traj.duration == pytest.approx(min_duration(ZERO, target, VMAX, profile))
    assert traj.duration > 0.1 and any("lengthened" in n for n in notes)
    assert np.all(max_speed(traj) <= VMAX * (1 + 1e-3))
    np.testing.assert_allclose(traj.sample(traj.duration)[0], target)
    # a generous duration is kept as asked
    slow, notes = plan_goto(ZERO, target, 5.0, profile, LIMITS, "refuse")
    assert slow.duration == 5.0 and notes == []


def test_out_of_limit_target_is_refused_or_clamped():
    target = pose(head_pitch=1.2, head_yaw=-0.3)
    with pytest.raises(LimitError, match=r"head_pitch=1\.200 outside \[-0\.600, 0\.600\]"):
        plan_goto(ZERO, target, 1.0, "min_jerk", LIMITS, "refuse")
    traj, notes = plan_goto(ZERO, target, 1.0, "min_jerk", LIMITS, "clamp")
    np.testing.assert_allclose(traj.final, pose(head_pitch=0.6, head_yaw=-0.3))
    assert notes == ["clamped head_pitch from 1.200 to 0.600"]
    for bad in (math.inf, -math.inf):
        with pytest.raises(LimitError, match="head_yaw not a finite number"):
            plan_goto(ZERO, pose(head_yaw=bad), 1.0, "linear", LIMITS, "clamp")
    with pytest.raises(LimitError, match="duration"):
        plan_goto(ZERO, ZERO, math.nan, "linear", LIMITS, "clamp")


def test_nan_target_keeps_the_joint_where_it_is():
    start = pose(head_roll=0.2, body_yaw=-1.0)
    target = np.full(len(JOINT_NAMES), np.nan)
    target[YAW] = 0.5
    traj, _ = plan_goto(start, target, 0.5, "linear", LIMITS, "refuse")
    np.testing.assert_allclose(traj.final, pose(head_roll=0.2, body_yaw=-1.0, head_yaw=0.5))


def test_animation_passes_through_keyframes_at_their_times_and_speed_respects_limits():
    anim = TEST_ROBOT.animation("bob")  # 0.2 rad of pitch in 0.15 s: peak 2.5 rad/s with min-jerk, limit 3
    start = pose(head_roll=0.1)
    traj = build_animation(anim, start, TEST_ROBOT, 1.0)
    assert traj.duration == pytest.approx(0.3)
    np.testing.assert_allclose(traj.sample(0.15)[0], pose(head_roll=0.1, head_pitch=0.2), atol=1e-9)
    np.testing.assert_allclose(traj.final, pose(head_roll=0.1))  # unnamed joints keep their start value
    # at speed 2 each segment would peak at 5 rad/s: stretched to 0.2 * 1.875 / 3 = 0.125 s instead of 0.075 s
    fast = build_animation(anim, start, TEST_ROBOT, 2.0)
    assert fast.duration == pytest.approx(0.25)
    assert np.all(max_speed(fast) <= VMAX * (1 + 1e-3))
    np.testing.assert_allclose(fast.sample(0.125)[0], pose(head_roll=0.1, head_pitch=0.2), atol=1e-9)
    with pytest.raises(ValueError, match="speed"):
        build_animation(anim, start, TEST_ROBOT, math.inf)


def test_default_library_loads_and_every_animation_stays_within_limits():
    cfg = load_robot_config()
    names = [a.name for a in cfg.animations]
    assert {"nod", "shake_head", "look_around", "happy", "sad", "curious", "wake_up", "sleep", "dance"} <= set(names)
    for a in cfg.animations:
        traj = build_animation(a, cfg.neutral_pose(), cfg)
        assert traj.duration >= a.nominal_duration - 1e-9
        assert np.all(max_speed(traj, 0.005) <= VMAX * (1 + 1e-3)), a.name
        samples = np.array([traj.sample(t)[0] for t in np.arange(0, traj.duration, 0.01)])
        assert np.all(samples >= LOWER - 1e-9) and np.all(samples <= UPPER + 1e-9), a.name


@pytest.mark.parametrize(("animation", "error"), [
    ({"keyframes": [{"time": 0.5, "pose": {"head_yaw": 0.1}}, {"time": 0.5, "pose": {"head_yaw": 0.0}}]},
     "strictly increase"),
    ({"keyframes": [{"time": 0.5, "pose": {"head_yaw": 2.0}}]}, r"head_yaw=2\.0 is outside"),
    ({"keyframes": [{"time": 0.5, "pose": {"neck": 0.1}}]}, "neck"),
    ({"keyframes": []}, "at least 1"),
])
def test_bad_animation_library_is_a_clear_error(animation, error):
    with pytest.raises(ValidationError, match=error):
        RobotConfig.model_validate({"animations": [{"name": "x", "description": "d", **animation}]})


def test_bad_config_file_names_the_file(tmp_path):
    bad = tmp_path / "robot.yaml"
    bad.write_text("limits: {head_roll: {lower: 1.0, upper: -1.0, max_velocity: 1.0}}\n")
    with pytest.raises(RobotConfigError, match=r"robot\.yaml[\s\S]*lower < upper"):
        load_robot_config(bad)
    dup = Animation(name="a", description="d", keyframes=[{"time": 1.0, "pose": {}}])
    with pytest.raises(ValidationError, match="duplicate"):
        RobotConfig(animations=[dup, dup])


def test_controller_preempts_cancels_and_finishes():
    now = [0.0]
    ctl = MotionController(ZERO, clock=lambda: now[0])
    go = lambda target: (lambda start: plan_goto(start, target, 1.0, "linear", LIMITS, "refuse")[0])  # noqa: E731
    first = ctl.start(go(pose(head_yaw=1.0)), "first")
    now[0] = 0.5
    np.testing.assert_allclose(ctl.state()[0], pose(head_yaw=0.5))
    second = ctl.start(go(pose(head_yaw=0.0)), "second")  # starts from where the first one is
    assert first.outcome == PREEMPTED and first.reason == "preempted by second"
    now[0] = 0.75
    ctl.cancel(second)
    assert second.outcome == CANCELLED
    held = ctl.state()[0]
    np.testing.assert_allclose(held, pose(head_yaw=0.375))  # 0.5 -> 0 over 1 s, a quarter done
    now[0] = 5.0
    np.testing.assert_allclose(ctl.state()[0], held)  # a cancelled motion holds where it stopped
    third = ctl.start(go(pose(head_yaw=-0.2)), "third")
    now[0] = 7.0
    np.testing.assert_allclose(ctl.state()[0], pose(head_yaw=-0.2))
    assert third.outcome == FINISHED and third.done.is_set()
    with pytest.raises(LimitError):  # a refused start leaves the robot alone
        ctl.start(go(pose(head_yaw=9.0)), "bad")


def test_urdf_joints_match_the_robot_config():
    cfg = load_robot_config()
    root = ET.parse(ROOT / "urdf" / "reachy_mini_like.urdf").getroot()
    joints = {j.get("name"): j for j in root.iter("joint") if j.get("type") == "revolute"}
    assert set(joints) == set(JOINT_NAMES)
    for name, j in joints.items():
        lim, want = j.find("limit"), getattr(cfg.limits, name)
        assert float(lim.get("lower")) == want.lower and float(lim.get("upper")) == want.upper, name
        assert float(lim.get("velocity")) == want.max_velocity, name
    links = {link.get("name") for link in root.iter("link")}
    for j in root.iter("joint"):  # the tree is connected: every joint names existing links
        assert j.find("parent").get("link") in links and j.find("child").get("link") in links


# ----------------------------------------------------------------------------------------- ROS nodes
@pytest.fixture
def robot(ros):
    """SimRobot + both servers on TEST_ROBOT, plus a client node recording joint_states."""


    sim = ros.add(SimRobot(robot=TEST_ROBOT, context=ros.context))
    ros.add(AnimationServer(sim, context=ros.context), MotionServer(sim, context=ros.context))
    client = ros.node()
    client.states = []
    client.create_subscription(JointState, "joint_states", client.states.append, 100)
    wait_for(lambda: client.states, what="joint_states")
    return client


def action_client(ros, node, action_type, name):
    client = ActionClient(node, action_type, name)
    assert client.wait_for_server(timeout_sec=5.0), name
    return client


def send(ros, client, goal, feedback=None):
    """Send a goal; returns (accepted goal handle, result future)."""
    handle = ros.result(client.send_goal_async(goal, feedback_callback=feedback), what="goal response")
    assert handle.accepted
    return handle, handle.get_result_async()


def goto_goal(duration=0.3, interpolation=0, **joints):
    return GotoPose.Goal(target=pose_to_msg(pose(**joints)), duration=duration, interpolation=interpolation)


@pytest.mark.realtime
def test_joint_states_published_at_50hz_or_more(ros, robot):
    wait_for(lambda: len(robot.states) >= 30, what="30 joint_states")
    msgs = robot.states[-25:]
    stamps = [m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec for m in msgs]
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0])
    assert rate >= 50.0, rate
    assert list(msgs[-1].name) == list(JOINT_NAMES) and len(msgs[-1].position) == len(JOINT_NAMES)


def test_list_animations_service(ros, robot):
    cli = robot.create_client(ListAnimations, "list_animations")
    assert cli.wait_for_service(timeout_sec=5.0)
    resp = ros.result(cli.call_async(ListAnimations.Request()))
    assert list(resp.names) == ["bob", "slow_turn"]
    assert list(resp.descriptions) == ["pitch down and back", "turn the head left slowly"]
    np.testing.assert_allclose(resp.durations, [0.3, 1.5], rtol=1e-6)


def test_play_animation_moves_joints_with_feedback(ros, robot):
    client = action_client(ros, robot, PlayAnimation, "play_animation")
    feedback = []
    n0 = len(robot.states)
    _, result = send(ros, client, PlayAnimation.Goal(name="bob"), lambda f: feedback.append(f.feedback))
    res = ros.result(result, what="play_animation result")
    assert res.status == 4 and res.result.success, res.result.message  # 4 = SUCCEEDED
    assert res.result.duration == pytest.approx(0.3, abs=0.05)
    progress = [f.progress for f in feedback]
    assert len(progress) >= 2 and progress == sorted(progress) and all(f.duration == pytest.approx(0.3)
                                                                        for f in feedback)
    pitches = [m.position[PITCH] for m in robot.states[n0:]]
    assert max(pitches) == pytest.approx(0.2, abs=0.02)  # reached the keyframe, not beyond
    wait_for(lambda: abs(robot.states[-1].position[PITCH]) < 1e-9, 1.0, "back at rest")


@pytest.mark.realtime
def test_animation_goals_queue_and_cancel_stops_the_motion(ros, robot):
    client = action_client(ros, robot, PlayAnimation, "play_animation")
    t0 = time.monotonic()
    _, first = send(ros, client, PlayAnimation.Goal(name="bob"))
    starts = []
    _, second = send(ros, client, PlayAnimation.Goal(name="bob", speed=2.0),
                     lambda f: starts.append(time.monotonic()))
    r1 = ros.result(first)
    t1 = time.monotonic()
    r2 = ros.result(second)
    assert r1.result.success and r2.result.success
    assert starts and min(starts) >= t1 - 0.1  # the second one waited for the first
    assert r2.result.duration == pytest.approx(0.25, abs=0.04) and time.monotonic() - t0 >= 0.54

    handle, result = send(ros, client, PlayAnimation.Goal(name="slow_turn"))
    wait_for(lambda: robot.states[-1].position[YAW] > 0.2, 2.0, "turning")
    t_cancel = time.monotonic()
    ros.result(handle.cancel_goal_async())
    res = ros.result(result)
    assert res.status == 5 and not res.result.success  # 5 = CANCELED
    assert time.monotonic() - t_cancel < 0.25
    stopped = robot.states[-1].position[YAW]
    time.sleep(0.1)
    # held where it stopped (one 100 Hz tick of slack for the cancel racing the control loop on a loaded machine)
    assert robot.states[-1].position[YAW] == pytest.approx(stopped, abs=0.01) and stopped < 0.9


def test_animation_queue_is_bounded_and_a_full_queue_rejects_goals(ros):
    sim = ros.add(SimRobot(robot=TEST_ROBOT, context=ros.context))
    ros.add(AnimationServer(sim, AnimationServerConfig(max_queued_goals=2), context=ros.context))
    client = action_client(ros, ros.node(), PlayAnimation, "play_animation")
    handles = [ros.result(client.send_goal_async(PlayAnimation.Goal(name="slow_turn")), what="goal response")
               for _ in range(4)]  # one runs, two wait, the fourth finds the queue full
    assert [h.accepted for h in handles] == [True, True, True, False]
    for h in handles[:3]:  # cancelling frees the queue: a new goal is accepted again
        ros.result(h.cancel_goal_async())
    wait_for(lambda: ros.result(client.send_goal_async(PlayAnimation.Goal(name="bob"))).accepted, 5.0,
             "a goal accepted once the queue drained")


def test_unknown_animation_is_aborted_with_the_list(ros, robot):
    client = action_client(ros, robot, PlayAnimation, "play_animation")
    _, result = send(ros, client, PlayAnimation.Goal(name="moonwalk"))
    res = ros.result(result)
    assert res.status == 6 and not res.result.success  # 6 = ABORTED
    assert "unknown animation 'moonwalk'" in res.result.message and "bob" in res.result.message


def test_goto_pose_reaches_target_within_velocity_limits(ros, robot):
    client = action_client(ros, robot, GotoPose, "goto_pose")
    feedback = []
    n0 = len(robot.states)
    # 0.05 s is too fast for 0.5 rad of yaw at 4 rad/s with min-jerk: the server stretches it to ~0.23 s
    t0 = time.monotonic()
    _, result = send(ros, client, goto_goal(0.05, head_yaw=0.5, head_roll=-0.2), lambda f: feedback.append(f.feedback))
    res = ros.result(result)
    assert time.monotonic() - t0 >= 0.5 * 1.875 / 4.0  # the stretched duration really ran
    assert res.status == 4 and res.result.success and "lengthened" in res.result.message
    target = pose(head_yaw=0.5, head_roll=-0.2)
    np.testing.assert_allclose(msg_to_pose(res.result.reached), target, atol=1e-9)
    wait_for(lambda: np.allclose(robot.states[-1].position, target), 1.0, "joint_states at target")
    assert feedback and 0.0 <= feedback[0].progress <= feedback[-1].progress <= 1.0
    vel = np.abs([m.velocity for m in robot.states[n0:]]).max(axis=0)
    assert np.all(vel <= VMAX * 1.001)  # never faster than allowed


def test_out_of_limit_goto_is_refused_and_never_executed(ros, robot):
    client = action_client(ros, robot, GotoPose, "goto_pose")
    n0 = len(robot.states)
    _, result = send(ros, client, goto_goal(0.2, head_pitch=1.5, head_yaw=0.3))
    res = ros.result(result)
    assert res.status == 6 and not res.result.success
    assert "head_pitch=1.500 outside" in res.result.message
    # joint states published after the refusal (not vacuous: wait until some have arrived)
    wait_for(lambda: len(robot.states) >= n0 + 10, 2.0, "joint_states after the refusal")
    assert np.allclose([m.position for m in robot.states[n0:]], 0.0)  # nothing moved, not even the valid joint
    _, result = send(ros, client, GotoPose.Goal(interpolation=7))
    assert "unknown interpolation" in ros.result(result).result.message


def test_goto_clamps_when_configured(ros):
    sim = ros.add(SimRobot(robot=TEST_ROBOT, context=ros.context))
    ros.add(MotionServer(sim, MotionServerConfig(limit_mode="clamp"), context=ros.context))
    node = ros.node()
    states = []
    node.create_subscription(JointState, "joint_states", states.append, 100)
    _, result = send(ros, action_client(ros, node, GotoPose, "goto_pose"), goto_goal(0.2, head_pitch=-2.0))
    res = ros.result(result)
    assert res.result.success and "clamped head_pitch from -2.000 to -0.600" in res.result.message
    np.testing.assert_allclose(msg_to_pose(res.result.reached), pose(head_pitch=-0.6), atol=1e-9)
    assert min(m.position[PITCH] for m in states) >= -0.6 - 1e-9


@pytest.mark.realtime
def test_new_goto_preempts_the_running_one(ros, robot):
    client = action_client(ros, robot, GotoPose, "goto_pose")
    _, first = send(ros, client, goto_goal(1.0, head_yaw=1.0))
    wait_for(lambda: robot.states[-1].position[YAW] > 0.1, 2.0, "first goal moving")
    _, second = send(ros, client, goto_goal(0.2, head_yaw=-0.3))
    r1, r2 = ros.result(first), ros.result(second)
    assert r1.status == 6 and "preempted" in r1.result.message and r1.result.reached.head_yaw < 1.0
    assert r2.status == 4 and r2.result.reached.head_yaw == pytest.approx(-0.3)
    assert max(m.position[YAW] for m in robot.states) < 0.9  # the first target was never reached


def test_node_config_comes_from_ros_parameters(ros):
    sim = ros.add(SimRobot(robot=TEST_ROBOT, context=ros.context,
                           parameter_overrides=[Parameter("publish_rate_hz", value=60)]))
    assert sim.config.publish_rate_hz == 60.0  # an int override of a float field is coerced
    with pytest.raises(ValueError, match=r"motion_server[\s\S]*limit_mode"):
        MotionServer(sim, context=ros.context, parameter_overrides=[Parameter("limit_mode", value="ignore")])


def test_a_bad_robot_config_is_a_clear_error(ros, tmp_path):
    bad = tmp_path / "robot.yaml"
    bad.write_text("limits: [1, 2\n")
    for path, why in (("/nonexistent/robot.yaml", "cannot read robot config"), (str(bad), "robot.yaml")):
        with pytest.raises(ValueError, match=rf"node 'sim_robot': [\s\S]*{why}"):
            SimRobot(SimRobotConfig(robot_config=path), context=ros.context)
