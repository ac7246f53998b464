"""What every robot node of ours shares (the simulated robot, the Reachy Mini bridge): the robot config and its
animation library, the MotionController the animation and motion servers drive, and a control loop thread that
publishes `joint_states` and runs the servers' tick hooks (goal_runner.GoalRunner follows goals there).

Subclasses say what one cycle does (`_cycle`), when a finished goal may report (`settled`) and what the robot
reached (`reached`).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import JointState

from bolt_ros.nodes.common import NodeLoop, declare_config
from bolt_ros.robot import Motion, MotionController, RobotConfig, load_robot_config
from bolt_ros.robot.library import AnimationLibrary, config_library


class RobotNode(Node):
    controller: MotionController
    library: AnimationLibrary

    def __init__(self, default_name: str, config, robot: RobotConfig | None, node_kwargs: dict):
        """config: a pydantic model with robot_config, publish_rate_hz, joint_states_topic and frame_id."""
        super().__init__(node_kwargs.pop("node_name", default_name), **node_kwargs)
        self.config = declare_config(self, config)
        try:
            self.robot = robot or load_robot_config(self.config.robot_config)
        except ValueError as e:
            name = self.get_name()
            self.destroy_node()
            raise ValueError(f"node {name!r}: {e}") from e
        self.library = config_library(self.robot)
        self._pub = self.create_publisher(JointState, self.config.joint_states_topic, 10)
        self._tick_hooks: list[Callable[[], None]] = []

    def start_loop(self, name: str) -> None:
        # The state loop runs in its own thread, as a robot's control loop does, not as an executor timer: an rclpy
        # timer costs a full executor wake-up per tick (~20% of a core at 100 Hz with the servers' entities in the
        # wait set) and its rate fell below 50 Hz whenever the executor was busy (measured on a 2-core machine).
        self._control = NodeLoop(self._loop, name).start()

    def add_tick_hook(self, hook: Callable[[], None]) -> None:
        """Run hook() on the control loop after every joint-state cycle (the servers follow their goals there)."""
        self._tick_hooks.append(hook)

    def settled(self, motion: Motion) -> bool:
        """Whether the goal of a finished motion may report (a real robot may still be catching up)."""
        return True

    def shortfall(self, motion: Motion) -> str:
        """Why a finished motion's robot is not at its final pose ("" when it is): a real robot's reach can end
        before our per-joint limits (the Reachy Mini's head cannot combine full pitch with full yaw)."""
        return ""

    def reached(self) -> np.ndarray:
        """The pose the robot is at [n_joints], for goal results."""
        return self.controller.state()[0]

    def close(self) -> None:
        if hasattr(self, "_control"):  # not when __init__ failed before the loop started
            self._control.stop()

    def destroy_node(self) -> None:
        self.close()
        super().destroy_node()

    def _cycle(self) -> tuple[Sequence[str], Sequence[float], Sequence[float]] | None:
        """One control cycle: (joint names, positions, velocities) to publish, or None for nothing this time."""
        raise NotImplementedError

    def _loop(self, stopping: threading.Event) -> None:
        """Cycle at publish_rate_hz on absolute deadlines (no drift); after a stall longer than one period it
        resumes from now instead of bursting the missed ticks."""
        period = 1.0 / self.config.publish_rate_hz
        next_tick = time.monotonic()
        while not stopping.is_set():
            try:
                state = self._cycle()
                if state is not None:
                    self._publish(*state)
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

    def _publish(self, names: Sequence[str], position: Sequence[float], velocity: Sequence[float]) -> None:
        msg = JointState()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.header.frame_id = self.config.frame_id
        msg.name = list(names)
        msg.position = [float(v) for v in position]
        msg.velocity = [float(v) for v in velocity]
        self._pub.publish(msg)
