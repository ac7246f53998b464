"""Running action goals on a robot node (robot_node.RobotNode): feedback at a fixed rate, cancels, shutdown
(shared by the animation and motion servers)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rclpy.action.server import ServerGoalHandle
from rclpy.node import Node
from rclpy.task import Future

from bolt_ros.nodes.common import wake_on_done
from bolt_ros.nodes.robot_node import RobotNode
from bolt_ros.robot import CANCELLED, Motion


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

    def __init__(self, sim: RobotNode, node: Node, feedback_rate_hz: float):
        self.controller = sim.controller
        self._robot = sim
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
                if not self._robot.settled(f.motion):  # a real robot still catching up with the command
                    continue
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
