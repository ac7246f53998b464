"""The simulated robot: one shared joint state (the single control point) published on `joint_states`.

`SimRobot` owns the MotionController that the animation and motion servers drive (goal_runner.GoalRunner follows
their goals); sim_robot_nodes.py builds the three nodes sharing it and runs them in one process.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from rclpy.node import Node
from sensor_msgs.msg import JointState

from bolt_ros.msg import RobotPose
from bolt_ros.nodes.common import NodeLoop, declare_config
from bolt_ros.robot import JOINT_NAMES, MotionController, RobotConfig, load_robot_config


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
