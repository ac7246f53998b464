"""The simulated robot: one shared joint state (the single control point) published on `joint_states`.

`SimRobot` owns the MotionController that the animation and motion servers drive; `make_sim_robot_nodes` builds
the three nodes sharing it, and `main` runs them in one process (the simulated robot of the launch graph).
"""
from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from rclpy.action.server import ServerGoalHandle
from rclpy.node import Node
from sensor_msgs.msg import JointState

from bolt_ros.msg import RobotPose
from bolt_ros.nodes.common import declare_config, run_nodes
from bolt_ros.robot import CANCELLED, JOINT_NAMES, Motion, MotionController, RobotConfig, load_robot_config

CONTROL_POLL_S = 0.02  # how often a running goal checks for cancel / end: bounds cancel latency to ~20 ms


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
        self._timer = self.create_timer(1.0 / self.config.publish_rate_hz, self._publish)

    def _publish(self) -> None:
        position, velocity = self.controller.state()
        msg = JointState()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.header.frame_id = self.config.frame_id
        msg.name = list(JOINT_NAMES)
        msg.position = [float(v) for v in position]
        msg.velocity = [float(v) for v in velocity]
        self._pub.publish(msg)


class GoalRunner:
    """Follows one running goal's motion until it ends: feedback at a fixed rate, cancel requests stop the motion,
    and `close()` (node shutdown) stops every running goal. Shared by the animation and motion servers."""

    def __init__(self, controller: MotionController, feedback_rate_hz: float):
        self.controller = controller
        self.feedback_period = 1.0 / feedback_rate_hz
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._motions: dict[bytes, Motion] = {}  # goal uuid -> its running motion

    def cancel(self, goal_handle: ServerGoalHandle) -> None:
        """From the cancel callback: stop the motion right away rather than at the next poll."""
        with self._lock:
            motion = self._motions.get(bytes(goal_handle.goal_id.uuid))
        if motion is not None:
            self.controller.cancel(motion, "cancel requested")

    def close(self) -> None:
        self.closed.set()
        with self._lock:
            motions = list(self._motions.values())
        for m in motions:
            self.controller.cancel(m, "server shutting down")

    def follow(self, goal_handle: ServerGoalHandle, motion: Motion,
               feedback: Callable[[Motion, np.ndarray], None]) -> str:
        """Block until the motion ends; returns its outcome (FINISHED / CANCELLED / PREEMPTED)."""
        key = bytes(goal_handle.goal_id.uuid)
        with self._lock:
            self._motions[key] = motion
        try:
            next_feedback = 0.0
            while True:
                position, _ = self.controller.state()  # also finishes the motion when its time is up
                if motion.done.is_set():
                    return motion.outcome
                if goal_handle.is_cancel_requested or self.closed.is_set() or not goal_handle.is_active:
                    self.controller.cancel(motion, "cancel requested")
                    return CANCELLED
                now = self.controller.now()
                if now >= next_feedback:
                    feedback(motion, position)
                    next_feedback = now + self.feedback_period
                motion.done.wait(CONTROL_POLL_S)
        finally:
            with self._lock:
                self._motions.pop(key, None)


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
