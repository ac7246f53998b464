"""The Reachy Mini backend without ROS: pose conversion, the safety envelope, the robot's reach (the SDK's IK and
the reachability table against a fresh MuJoCo run), the dances in our limits, our config against the SDK's MJCF
(MuJoCo's own parser), the link against the real MuJoCo daemon (read-back, a killed daemon noticed), and a port
someone else's daemon holds: named, never taken, never connected to."""
from __future__ import annotations

import math
import os
import signal
import time
from importlib.resources import files

import numpy as np
import pytest
import reachy_mini_fixtures

from bolt_ros.robot import JOINT_NAMES, load_robot_config
from bolt_ros.robot.reachy_mini.bridge import Envelope
from bolt_ros.robot.reachy_mini.convert import from_sdk, rotation, to_sdk

reachy_daemon_factory = reachy_mini_fixtures.reachy_daemon_factory
reachy_mini = pytest.importorskip("reachy_mini", reason="scripts/setup_reachy_mini.sh installs the SDK")
mujoco = pytest.importorskip("mujoco")

CONFIG = load_robot_config()


def pose(**joints) -> np.ndarray:
    p = np.zeros(len(JOINT_NAMES))
    for name, v in joints.items():
        p[JOINT_NAMES.index(name)] = v
    return p


def test_our_pose_round_trips_through_the_sdk_convention():
    from reachy_mini.utils import create_head_pose

    rng = np.random.default_rng(0)
    lower, upper, _ = CONFIG.limits.arrays()
    for _ in range(200):
        p = rng.uniform(lower, upper)
        head, antennas, body = to_sdk(p)
        np.testing.assert_allclose(from_sdk(head, antennas, body), p, atol=1e-9)
    # the SDK's own helper agrees: +yaw looks left, +pitch looks down, world yaw = body + head (relative) yaw
    p = pose(head_roll=0.1, head_pitch=0.2, head_yaw=0.3, body_yaw=0.4)
    sdk = create_head_pose(roll=0.1, pitch=0.2, yaw=0.7, degrees=False)
    np.testing.assert_allclose(to_sdk(p)[0], sdk, atol=1e-12)
    np.testing.assert_allclose(rotation(0, 0, math.pi / 2) @ [1, 0, 0], [0, 1, 0], atol=1e-12)  # x -> y: left


def test_envelope_never_lets_a_target_out():
    env = Envelope(CONFIG, max_offset_m=0.04)
    safe, offset, clipped = env.guard(pose(head_pitch=1.5, head_yaw=-3.0, antenna_left=9.0),
                                      np.array([0.0, 0.1, -0.2]))
    assert clipped == ["head_pitch", "head_yaw", "antenna_left", "head_offset"]
    lower, upper, _ = CONFIG.limits.arrays()
    assert np.all(safe >= lower) and np.all(safe <= upper) and np.all(np.abs(offset) <= 0.04)
    assert env.guard(pose(head_yaw=0.5), None)[2] == []
    # and no target jumps faster than our velocity limits from the one sent before it
    limited, slowed = env.limit_step(pose(head_yaw=1.0, head_roll=0.01), pose(), 0.01)
    assert slowed == ["head_yaw"] and limited[JOINT_NAMES.index("head_yaw")] == pytest.approx(4.0 * 0.01 * 1.25)
    assert env.limit_step(pose(head_yaw=0.03), pose(), 0.01)[1] == []


def test_dances_are_sampled_inside_our_limits():
    from bolt_ros.robot.reachy_mini.dances import DanceMoves

    moves = DanceMoves(CONFIG, max_offset_m=0.04)
    entries = moves.entries()
    assert len(entries) == 20 and all(2.0 < e.duration < 6.0 for e in entries)
    lower, upper, vmax = CONFIG.limits.arrays()
    start = pose(body_yaw=0.5, head_yaw=-0.8)
    for e in entries:
        traj = e.build(start, 1.0)
        # our velocity limits too: grid_snap is square waves, ~23x faster than our head limit as written
        assert np.all(np.abs(np.diff(traj.poses, axis=0)) <= vmax * traj.dt + 1e-12), e.name
        np.testing.assert_allclose(traj.final[:5], moves.tables[e.name][0][-1][:5])  # it ends where written
        np.testing.assert_allclose(traj.sample(0.0)[0], start)  # starts where the robot is: no jump
        for t in np.linspace(0, traj.duration, 60):
            p, _ = traj.sample(t)
            assert np.all(p >= lower - 1e-12) and np.all(p <= upper + 1e-12), (e.name, t)
            assert p[JOINT_NAMES.index("body_yaw")] == pytest.approx(0.5)  # dances do not turn the body
            assert np.all(np.abs(traj.offset(t)) <= 0.04)


def test_config_limits_match_the_real_robot_mjcf():
    """Our limits against the SDK's MJCF, parsed by MuJoCo: the body's range, the antennas' sign (the SDK's sleep pose
    is our sleep animation's end), the head within the robot's yaw gap and pitch/roll reach."""
    from reachy_mini.reachy_mini import SLEEP_ANTENNAS_JOINT_POSITIONS

    mjcf = files(reachy_mini).joinpath("descriptions/reachy_mini/mjcf/reachy_mini.xml")
    model = mujoco.MjModel.from_xml_path(str(mjcf))
    body = model.joint("yaw_body")
    assert body.limited and body.range.tolist() == pytest.approx([CONFIG.limits.body_yaw.lower,
                                                                  CONFIG.limits.body_yaw.upper], abs=1e-4)
    for name in ("right_antenna", "left_antenna"):
        assert model.joint(name).type == mujoco.mjtJoint.mjJNT_HINGE
    assert {f"stewart_{i}" for i in range(1, 7)} <= {model.joint(i).name for i in range(model.njnt)}
    lim = CONFIG.limits
    assert -math.radians(65) <= lim.head_yaw.lower and lim.head_yaw.upper <= math.radians(65)
    for j in (lim.head_pitch, lim.head_roll):
        assert -math.radians(40) <= j.lower and j.upper <= math.radians(40)
    right, left = SLEEP_ANTENNAS_JOINT_POSITIONS
    assert lim.antenna_right.lower <= right <= lim.antenna_right.upper
    assert lim.antenna_left.lower <= left <= lim.antenna_left.upper
    end = CONFIG.animation("sleep").keyframes[-1].pose
    assert (end["antenna_right"], end["antenna_left"]) == pytest.approx((right, left))


def test_link_reads_back_and_notices_a_hung_then_a_killed_daemon(reachy_daemon_factory):
    from bolt_ros.robot.reachy_mini.link import ReachyLink

    daemon = reachy_daemon_factory()
    link = ReachyLink(daemon.host, daemon.port).start()
    try:
        deadline = time.monotonic() + 15
        while link.measured() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        start = link.measured().pose
        target = pose(head_yaw=0.4, antenna_right=0.5)
        for k in range(1, 41):  # 0.8 s ramp, as our trajectories stream it
            link.send(start + (target - start) * k / 40)
            time.sleep(0.02)
        time.sleep(0.6)
        assert np.max(np.abs(link.measured().pose - target)) < 0.05
        # a daemon that hangs (SIGSTOP) keeps its connection open: its silence for stale_after_s gives it away
        generation = link.generation
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        while link.measured() is not None and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        assert "stopped answering" in link.error and 1.9 < time.monotonic() - t0 < 3.5
        os.kill(daemon.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 15
        while link.generation == generation and time.monotonic() < deadline:  # it reconnects by itself
            time.sleep(0.05)
        assert link.connected and link.generation == generation + 1
        deadline = time.monotonic() + 5
        while link.measured() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        daemon.kill()
        t0 = time.monotonic()
        while link.measured() is not None and time.monotonic() - t0 < 3:
            time.sleep(0.02)
        assert not link.connected and "connection closed" in link.error
        assert time.monotonic() - t0 < 1.0  # a closed connection is noticed at once, not after stale_after_s (2 s)
    finally:
        link.close()


def test_gazebo_launch_controls_the_urdf_joints_in_config_order():
    """launch/gazebo.launch.py (unverified: no Gazebo here) hands gz_ros2_control our six joints, the ones the
    position controller commands in config/robot.yaml's order (gz_relay sends them in that order)."""
    import importlib.util
    import xml.etree.ElementTree as ET
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("gazebo_launch", root / "launch" / "gazebo.launch.py")
    launch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(launch)
    urdf = launch.with_ros2_control((root / "urdf" / "reachy_mini_like.urdf").read_text(), "/x/gz_controllers.yaml")
    robot = ET.fromstring(urdf)
    controlled = [j.get("name") for j in robot.find("ros2_control").iter("joint")]
    revolute = {j.get("name") for j in robot.iter("joint") if j.get("type") == "revolute"}
    assert controlled == list(JOINT_NAMES) and set(controlled) == revolute
    assert robot.find("gazebo/plugin/parameters").text == "/x/gz_controllers.yaml"
    controllers = yaml.safe_load((root / "config" / "gz_controllers.yaml").read_text())
    assert controllers["position_controller"]["ros__parameters"]["joints"] == list(JOINT_NAMES)


def test_reach_refuses_what_the_simulated_head_does_not_reach_and_the_table_is_reproducible():
    """The table is what MuJoCo does with the SDK's MJCF and IK (recomputed here at 5 grid poses: the physics is
    deterministic, so within the table's 0.01 deg rounding). Negative control: the IK alone accepts yaw 65 deg (every
    Stewart motor inside its range), where the daemon's head ended 4.5 deg short 1.5 s later; the table refuses it."""
    from bolt_ros.robot.reachy_mini.reach import RPY, MujocoHead, Reach

    reach, sim = Reach(), MujocoHead()
    rng = np.random.default_rng(1)
    for _ in range(5):
        i, j, k = (int(rng.integers(len(a))) for a in reach.axes)
        p = pose()
        p[RPY] = reach.axes[0][i], reach.axes[1][j], reach.axes[2][k]
        assert sim.miss_deg(p) == pytest.approx(min(reach.table[i, j, k], 1e3), abs=0.02), (i, j, k)
    assert reach.why_not(pose()) == "" and reach.why_not(pose(head_yaw=0.6, head_pitch=-0.35)) == ""  # look left, up
    yaw65 = pose(head_yaw=math.radians(65))
    m = reach.motors(yaw65)
    assert np.all(np.isfinite(m)) and np.all((m > reach.lower) & (m < reach.upper))  # the IK alone: fine
    assert "deg short there, by the reach table" in reach.why_not(yaw65)
    corner = pose(head_roll=0.6, head_pitch=0.6, head_yaw=1.1344, body_yaw=2.7925)
    assert reach.why_not(corner) == "its head has no kinematic solution there"
    near = reach.nearest(corner, pose(body_yaw=2.7925))
    assert reach.reachable(near) and near[JOINT_NAMES.index("body_yaw")] == pytest.approx(2.7925)
    step = near.copy()
    step[RPY] += 0.01 * (corner[RPY] - near[RPY]) / np.max(np.abs(corner[RPY] - near[RPY]))
    assert not reach.reachable(step)  # the edge: 0.01 rad further is out


def test_a_port_someone_else_holds_is_named_and_never_taken_or_connected_to(reachy_daemon_factory):
    from bolt_ros.robot.reachy_mini.daemon import PortTaken, SimDaemon
    from bolt_ros.robot.reachy_mini.link import ReachyLink

    foreign = reachy_daemon_factory()
    assert foreign.owns_port()
    with pytest.raises(PortTaken) as taken:
        SimDaemon(foreign.port, sleep_on_stop=False).start()
    assert taken.value.holder.startswith(f"a reachy-mini-daemon (simulated): pid {foreign.proc.pid} ")
    # the link of a simulator mode connects only where its supervisor says our daemon is: here, nowhere
    link = ReachyLink(foreign.host, foreign.port, retry_s=0.2, endpoint=lambda: None).start()
    try:
        time.sleep(2.0)
        assert not link.connected and link.generation == 0 and "not running" in link.error
    finally:
        link.close()
    # negative control: the same link told the daemon is there connects within the same time
    link = ReachyLink(foreign.host, foreign.port, retry_s=0.2, endpoint=lambda: (foreign.host, foreign.port)).start()
    try:
        deadline = time.monotonic() + 2.0
        while not link.connected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert link.connected
    finally:
        link.close()
