"""Overhead of the assistant graph itself (no model): p50/p99 over many turns, in milliseconds.

    python bench/bench_graph.py [--runs 200] [--gap-ms 0] [--robot-process] [--json out.json]

One process (bringup's layout): the simulated robot and the assistant (scripted backend: replies instantly, so
only the graph's own work is measured) on one SingleThreadedExecutor, as bringup runs them; a probe publishes
utterances on speech/transcript.
--robot-process runs the simulated robot in its own process instead (the launch file's layout).
  utterance_to_request  transcript callback -> the engine request is issued (worker hand-off, prompt building)
  call_to_goal_sent     tool call parsed -> goal validated, built and handed to rclpy (the router's own work)
  call_to_accepted      tool call parsed -> goal accepted by the robot's action server (the acceptance stamp it
                        sends back; both ends read the system clock)
  call_to_accept_seen   ... -> that acceptance has reached the router (+ the response's way back through DDS and
                        rclpy's Python action client: ~1 ms per client step on 2 cores)
  rclpy_action_floor    a bare accept-everything action server and client on the same executor, for comparison
  sentence_to_tts       sentence complete -> tts/say published
Target: p99 < 5 ms each.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

from bolt_ros.action import GotoPose
from graph_harness import Graph, percentiles, product_config
from rclpy.action import ActionClient, ActionServer

from bolt_ros.assistant.scripted import ScriptedBackend
from bolt_ros.nodes.common import ACTION_RESULT_TIMEOUT_S

# goals that return once accepted, so each run measures the hand-off and not the motion
GLANCE = """
- name: glance
  description: look briefly
  kind: action
  target: goto_pose
  type: bolt_ros/action/GotoPose
  wait: accepted
  parameters: {type: object, properties: {yaw: {type: number, minimum: -60, maximum: 60}}, required: [yaw]}
  goal: {target.head_yaw: {arg: yaw, scale: 0.0174533}, duration: 0.3}
"""
SCRIPT = [{"match": ".", "reply": [{"text": "Okay, let me look. "}, {"tool_call": {"name": "glance",
                                                                                     "arguments": {"yaw": 10}}}],
           "after_tool": [{"text": "Done. Anything else?"}]}]


def action_floor(node, runs: int) -> list[float]:
    """Goal acceptance round trips (ms) of a bare rclpy action server on `node`'s executor, waited for like the
    router waits (a done callback setting an event)."""
    server = ActionServer(node, GotoPose, "bench_floor", execute_callback=_succeed,
                          result_timeout=ACTION_RESULT_TIMEOUT_S)
    client = ActionClient(node, GotoPose, "bench_floor")
    client.wait_for_server(timeout_sec=5.0)
    out = []
    for _ in range(runs + 10):
        done = threading.Event()
        t0 = time.perf_counter()
        client.send_goal_async(GotoPose.Goal()).add_done_callback(lambda _f, done=done: done.set())
        if not done.wait(5.0):
            raise SystemExit("the bare action server did not answer")
        out.append((time.perf_counter() - t0) * 1e3)
        time.sleep(0.005)
    client.destroy()
    server.destroy()
    return out[10:]


async def _succeed(goal_handle):
    goal_handle.succeed()
    return GotoPose.Result()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="pause between turns (0: back to back, the stress case: ~50 turns/s keep ~100 finished "
                         "goals in every action status message; a person speaks every few seconds)")
    ap.add_argument("--robot-process", action="store_true", help="the simulated robot in a separate process")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ["ROS_DOMAIN_ID"] = str(random.randint(100, 200))
    robot = None
    if args.robot_process:
        robot = subprocess.Popen([sys.executable, "-m", "bolt_ros.nodes.sim_robot_nodes"], env=os.environ.copy(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    graph = Graph(product_config(GLANCE), ScriptedBackend(SCRIPT), domain_id=int(os.environ["ROS_DOMAIN_ID"]),
                  sim_robot=robot is None)
    assistant = graph.assistant
    try:
        graph.wait_connected(("glance",))
        for i in range(args.runs + 10):  # 10 warm-up turns, then reset the counters
            if i == 10:
                for d in (*assistant.latency.values(), assistant.router.accept_latency_ms,
                          assistant.router.accept_seen_latency_ms, assistant.router.send_latency_ms):
                    d.clear()
            graph.idle.clear()
            time.sleep(args.gap_ms / 1e3)
            graph.say(f"look over there {i}")
            if not graph.idle.wait(5.0):
                raise SystemExit(f"turn {i} did not finish")
        results = {k: percentiles(assistant.latency[k]) for k in ("utterance_to_request", "sentence_to_tts")}
        results["call_to_goal_sent"] = percentiles(assistant.router.send_latency_ms)
        results["call_to_accepted"] = percentiles(assistant.router.accept_latency_ms)
        results["call_to_accept_seen"] = percentiles(assistant.router.accept_seen_latency_ms)
        results["rclpy_action_floor"] = percentiles(action_floor(graph.probe, args.runs))
    finally:
        graph.close()
        if robot is not None:
            robot.send_signal(signal.SIGINT)
            robot.wait(10)
    print(f"{'metric':<22}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for k, r in results.items():
        print(f"{k:<22}{r['n']:>6}{r['p50']:>10.3f}{r['p99']:>10.3f}{r['max']:>10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    targets = ("utterance_to_request", "sentence_to_tts", "call_to_goal_sent", "call_to_accepted")
    return 0 if all(results[k]["p99"] < 5.0 for k in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
