"""The simulated robot: one shared joint state (the single control point) published on `joint_states`.

`SimRobot` owns the MotionController that the animation and motion servers drive; `make_sim_robot_nodes` builds
the three nodes sharing it, and `main` runs them in one process (the simulated robot of the launch graph).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from rclpy.action.server import ServerGoalHandle
from rclpy.node import Node
from rclpy.task import Future
from sensor_msgs.msg import JointState

from bolt_ros.msg import RobotPose
from bolt_ros.nodes.common import NodeLoop, declare_config, run_nodes, wake_on_done
from bolt_ros.robot import CANCELLED, JOINT_NAMES, Motion, MotionController, RobotConfig, load_robot_config


class SimRobotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    robot_config: str = ""  # path of the robot YAML (limits, animations); "" = the package's config/robot.yaml
    publish_rate_hz: float = Field(100.0, ge=1.0, le=1000.0)
    joint_states_topic: str = "joint_states"
    frame_id: str = "base_link"


def pose_to_msg(pose: np.ndarray) -> RobotPose:
    p = [float(v) for v in pose]
    return RobotPose(head_roll=p[0], head_pitch=p[1], head_yaw=p[2], antennas=[p[3], p[4]], body_yaw=p[5])


def msg_to_pose(msg: RobotPose) -> np.ndarray:  # [n_joints] in JOINT_NAMES order
    return np.array([msg.head_roll, msg.head_pitch, msg.head_yaw, msg.antennas[0], msg.antennas[1], msg.body_yaw],
                    dtype=float)


class SimRobot(Node):
    def __init__(self, config: SimRobotConfig | None = None, robot: RobotConfig | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "sim_robot"), **node_kwargs)
        self.config = declare_config(self, config or SimRobotConfig())
        try:
            self.robot = robot or load_robot_config(self.config.robot_config)
        except ValueError as e:
            self.destroy_node()
            raise ValueError(f"node 'sim_robot': {e}") from e
        self.controller = MotionController(self.robot.neutral_pose())
        self._pub = self.create_publisher(JointState, self.config.joint_states_topic, 10)
        # The state loop runs in its own thread, as a robot's control loop does, not as an executor timer: an rclpy
        # timer costs a full executor wake-up per tick (~20% of a core at 100 Hz with the servers' entities in the
        # wait set) and its rate fell below 50 Hz whenever the executor was busy (measured on a 2-core machine).
        self._tick_hooks: list[Callable[[], None]] = []
        self._control = NodeLoop(self._loop, "sim-robot-joint-states").start()

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Run hook() on the control loop after every joint-state cycle (the servers follow their goals there)."""
        self._tick_hooks.append(hook)

    def close(self) -> None:
        if hasattr(self, "_control"):  # not when __init__ failed before the loop started
            self._control.stop()

    def destroy_node(self) -> None:
        self.close()
        super().destroy_node()

    def _loop(self, stopping: threading.Event) -> None:
        """Publish at publish_rate_hz on absolute deadlines (no drift); after a stall longer than one period it
        resumes from now instead of bursting the missed ticks."""
        period = 1.0 / self.config.publish_rate_hz
        next_tick = time.monotonic()
        while not stopping.is_set():
            try:
                self._publish()
                for hook in self._tick_hooks:
                    hook()
            except Exception as e:  # e.g. the context shut down under us: the node is going away
                if not stopping.wait(period):
                    self.get_logger().warning(f"control loop: {type(e).__name__}: {e}", throttle_duration_sec=5.0)
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay < -period:
                next_tick, delay = time.monotonic(), 0.0
            if delay > 0:
                stopping.wait(delay)

    def _publish(self) -> None:
        position, velocity = self.controller.state()
        msg = JointState()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.header.frame_id = self.config.frame_id
        msg.name = list(JOINT_NAMES)
        msg.position = [float(v) for v in position]
        msg.velocity = [float(v) for v in velocity]
        self._pub.publish(msg)


@dataclass
class _Following:
    goal_handle: ServerGoalHandle
    motion: Motion
    feedback: Callable[[Motion, np.ndarray], None]
    outcome: Future
    next_feedback: float = 0.0


class GoalRunner:
    """Follows running goals until their motions end: feedback at a fixed rate, cancel requests stop the motion,
    and `close()` (node shutdown) stops every running goal. Shared by the animation and motion servers.

    The robot's control loop does the following (`tick`, every joint-state cycle), not a thread per goal: the
    servers' execute callbacks are coroutines awaiting `follow`, so no executor thread blocks while a robot moves
    and the nodes run on a single-threaded executor."""

    def __init__(self, sim: SimRobot, node: Node, feedback_rate_hz: float):
        self.controller = sim.controller
        self.feedback_period = 1.0 / feedback_rate_hz
        self.closed = threading.Event()
        self._node = node
        self._lock = threading.Lock()
        self._goals: dict[bytes, _Following] = {}  # goal uuid -> its running motion
        sim.add_tick_hook(self.tick)

    def cancel(self, goal_handle: ServerGoalHandle) -> None:
        """From the cancel callback: stop the motion right away (the next tick completes the goal)."""
        with self._lock:
            f = self._goals.get(bytes(goal_handle.goal_id.uuid))
        if f is not None:
            self.controller.cancel(f.motion, "cancel requested")

    def close(self) -> None:
        self.closed.set()
        self.tick()

    async def follow(self, goal_handle: ServerGoalHandle, motion: Motion,
                     feedback: Callable[[Motion, np.ndarray], None]) -> str:
        """Wait (without blocking the executor) until the motion ends; returns FINISHED / CANCELLED / PREEMPTED."""
        f = _Following(goal_handle, motion, feedback, wake_on_done(Future(), self._node))
        with self._lock:
            self._goals[bytes(goal_handle.goal_id.uuid)] = f
        self.tick()
        return await f.outcome

    def tick(self) -> None:
        with self._lock:
            goals = list(self._goals.items())
        if not goals:
            return
        position, _ = self.controller.state()  # also finishes motions whose time is up
        now = self.controller.now()
        for key, f in goals:
            if f.motion.done.is_set():
                outcome = f.motion.outcome
            elif f.goal_handle.is_cancel_requested or self.closed.is_set() or not f.goal_handle.is_active:
                self.controller.cancel(f.motion, "cancel requested")
                outcome = CANCELLED
            else:
                if now >= f.next_feedback:
                    f.feedback(f.motion, position)
                    f.next_feedback = now + self.feedback_period
                continue
            with self._lock:
                self._goals.pop(key, None)
            if not f.outcome.done():
                f.outcome.set_result(outcome)


def make_sim_robot_nodes(sim_config: SimRobotConfig | None = None, animation_config=None, motion_config=None,
                         **node_kwargs) -> list[Node]:
    """[SimRobot, AnimationServer, MotionServer] sharing one joint state; node_kwargs (context, namespace, ...)
    go to every node."""
    from bolt_ros.nodes.animation_server import AnimationServer
    from bolt_ros.nodes.motion_server import MotionServer

    sim = SimRobot(sim_config, **node_kwargs)
    return [sim, AnimationServer(sim, animation_config, **node_kwargs), MotionServer(sim, motion_config, **node_kwargs)]


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(make_sim_robot_nodes, args))


if __name__ == "__main__":
    main()
