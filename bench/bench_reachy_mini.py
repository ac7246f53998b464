"""Goal latency through the Reachy Mini bridge, against the real MuJoCo daemon, and the joint_states rate.

    python bench/bench_reachy_mini.py [--goals 20] [--rate-s 10] [--json out.json]

One process: the daemon as a child (reachy-mini-daemon --sim --headless), the bridge's three nodes
(reachy_mini_nodes) and a client node on one SingleThreadedExecutor, as bringup runs them.
  accepted_to_first_motion  goal accepted (the client has the acceptance) -> the first joint_states message whose
                            measured head yaw moved > 0.005 rad (a linear goto at 1.6 rad/s: ~3 ms of command):
                            our streaming, the daemon's IK and 50 Hz control, MuJoCo, the state's way back
  send_to_accepted          goal sent -> accepted (rclpy action round trip + our validation)
  joint_states              intervals between messages (ms, p50/p99), messages/s in 1 s windows (p50 and the
                            slowest 1 %), and how many carried a new robot state (the daemon pushes ~50 Hz)
"""
from __future__ import annotations

import argparse
import itertools
import json
import threading
import time

import numpy as np
import rclpy
from bolt_ros.action import GotoPose
from rclpy.action import ActionClient
from rclpy.executors import SingleThreadedExecutor
from sensor_msgs.msg import JointState

from bolt_ros.nodes.animation_server import AnimationServer
from bolt_ros.nodes.motion_server import MotionServer
from bolt_ros.nodes.reachy_mini_nodes import ReachyMiniConfig, ReachyMiniRobot
from bolt_ros.nodes.sim_robot import pose_to_msg
from bolt_ros.robot import JOINT_NAMES
from bolt_ros.robot.reachy_mini.daemon import SimDaemon

YAW = JOINT_NAMES.index("head_yaw")


def pct(xs, q):
    return float(np.percentile(np.asarray(xs), q)) if len(xs) else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--goals", type=int, default=20)
    ap.add_argument("--rate-s", type=float, default=10.0)
    ap.add_argument("--json")
    ns = ap.parse_args()

    daemon = SimDaemon(sleep_on_stop=False).start()
    rclpy.init()
    robot = ReachyMiniRobot(ReachyMiniConfig(mode="real", host=daemon.host, port=daemon.port))
    nodes = [robot, AnimationServer(robot), MotionServer(robot), rclpy.create_node("bench_client")]
    client = nodes[-1]
    arrivals: list[tuple[float, float, tuple]] = []  # (perf_counter, head_yaw, positions)
    client.create_subscription(JointState, "joint_states", lambda m: arrivals.append(
        (time.perf_counter(), dict(zip(m.name, m.position))["head_yaw"], tuple(m.position))), 200)
    goto = ActionClient(client, GotoPose, "goto_pose")
    executor = SingleThreadedExecutor()
    for n in nodes:
        executor.add_node(n)
    stop = threading.Event()
    spin = threading.Thread(target=lambda: [executor.spin_once(timeout_sec=0.05) for _ in iter(stop.is_set, True)])
    spin.start()
    try:
        deadline = time.monotonic() + 20
        while not (robot.link.connected and arrivals) and time.monotonic() < deadline:
            time.sleep(0.05)
        goto.wait_for_server(timeout_sec=5)
        first_motion, accept = [], []
        for i in range(ns.goals):
            target = 0.4 if i % 2 == 0 else -0.4
            start_yaw = arrivals[-1][1]
            # linear: the command moves from its first cycle (min-jerk would add ~40 ms of its own slow start)
            goal = GotoPose.Goal(target=pose_to_msg(np.array([0, 0, target, 0, 0, 0.0])), duration=0.5,
                                 interpolation=GotoPose.Goal.INTERPOLATION_LINEAR)
            t_send = time.perf_counter()
            fut = goto.send_goal_async(goal)
            while not fut.done():
                time.sleep(0.0005)
            t_acc = time.perf_counter()
            accept.append(t_acc - t_send)
            result = fut.result().get_result_async()
            n0 = len(arrivals)
            while not result.done():
                time.sleep(0.001)
            moved = next((t for t, yaw, _ in arrivals[n0 - 1:]
                          if t >= t_acc and abs(yaw - start_yaw) > 0.005), None)
            if moved is not None:
                first_motion.append(moved - t_acc)
            time.sleep(0.2)
        n0 = len(arrivals)
        time.sleep(ns.rate_s)
        window = arrivals[n0:]
        stamps = np.array([a[0] for a in window])
        intervals = np.diff(stamps) * 1e3
        per_s = [int(np.sum((stamps >= t) & (stamps < t + 1.0))) for t in np.arange(stamps[0], stamps[-1] - 1.0, 0.1)]
        fresh = sum(1 for a, b in itertools.pairwise(window) if a[2] != b[2]) / (stamps[-1] - stamps[0])
        out = {
            "goals": ns.goals,
            "accepted_to_first_motion_ms": {"p50": pct(first_motion, 50) * 1e3, "p99": pct(first_motion, 99) * 1e3,
                                            "max": max(first_motion) * 1e3, "n": len(first_motion)},
            "send_to_accepted_ms": {"p50": pct(accept, 50) * 1e3, "p99": pct(accept, 99) * 1e3},
            "joint_states_interval_ms": {"p50": pct(intervals, 50), "p99": pct(intervals, 99)},
            "joint_states_per_s": {"p50": pct(per_s, 50), "p1": pct(per_s, 1), "mean": len(window) / ns.rate_s},
            "new_robot_states_per_s": fresh,
        }
        print(json.dumps(out, indent=2))
        if ns.json:
            with open(ns.json, "w") as f:
                json.dump(out, f, indent=2)
    finally:
        stop.set()
        spin.join()
        for n in nodes:
            if hasattr(n, "close"):
                n.close()
        executor.shutdown()
        for n in nodes:
            n.destroy_node()
        rclpy.try_shutdown()
        daemon.stop()


if __name__ == "__main__":
    main()
