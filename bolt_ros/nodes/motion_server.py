"""`goto_pose` action (GotoPose): a new goal preempts the running one; targets outside the joint limits are refused
(aborted with a message) or clamped, per config, and never executed beyond the limits; feedback = progress and
the current pose; result = the pose reached. NaN in a target field means "keep that joint where it is"."""
from __future__ import annotations

import threading

from pydantic import BaseModel, ConfigDict, Field
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node

from bolt_ros.action import GotoPose
from bolt_ros.nodes.common import ACTION_RESULT_TIMEOUT_S, declare_config, run_nodes
from bolt_ros.nodes.goal_runner import GoalRunner
from bolt_ros.nodes.robot_node import RobotNode
from bolt_ros.nodes.sim_robot import SimRobot, SimRobotConfig, msg_to_pose, pose_to_msg
from bolt_ros.robot import CANCELLED, FINISHED, LimitError, Motion, plan_goto

INTERPOLATIONS = {GotoPose.Goal.INTERPOLATION_MIN_JERK: "min_jerk", GotoPose.Goal.INTERPOLATION_LINEAR: "linear",
                  GotoPose.Goal.INTERPOLATION_EASE_IN_OUT: "ease_in_out"}


class MotionServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action_name: str = "goto_pose"
    limit_mode: str = Field("", pattern="^(|refuse|clamp)$")  # "" = the robot config's limit_mode
    feedback_rate_hz: float = Field(20.0, gt=0.0, le=100.0)


class _Superseded(Exception):
    pass


class MotionServer(Node):
    def __init__(self, sim: RobotNode, config: MotionServerConfig | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "motion_server"), **node_kwargs)
        self.config = declare_config(self, config or MotionServerConfig())
        self._robot = sim.robot
        self._controller = sim.controller
        self._sim = sim
        self._limit_mode = self.config.limit_mode or self._robot.limit_mode
        self._runner = GoalRunner(sim, self, self.config.feedback_rate_hz)
        self._lock = threading.Lock()
        self._latest: bytes | None = None  # uuid of the newest accepted goal: the only one allowed to start
        self._server = ActionServer(
            self, GotoPose, self.config.action_name, execute_callback=self._execute,
            goal_callback=lambda _req: GoalResponse.ACCEPT, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel, result_timeout=ACTION_RESULT_TIMEOUT_S,
            callback_group=ReentrantCallbackGroup())

    def close(self) -> None:
        self._runner.close()

    def destroy_node(self) -> None:
        self._server.destroy()
        super().destroy_node()

    def _on_accepted(self, goal_handle: ServerGoalHandle) -> None:
        with self._lock:
            self._latest = bytes(goal_handle.goal_id.uuid)
        goal_handle.execute()

    def _on_cancel(self, goal_handle: ServerGoalHandle) -> CancelResponse:
        self._runner.cancel(goal_handle)
        return CancelResponse.ACCEPT

    async def _execute(self, goal_handle: ServerGoalHandle) -> GotoPose.Result:
        try:
            return await self._goto(goal_handle)
        except Exception as e:  # a bug must fail the goal, not the server
            self.get_logger().error(f"goto_pose failed: {e!r}")
            return self._finish(goal_handle, "abort", f"internal error: {e}")

    async def _goto(self, goal_handle: ServerGoalHandle) -> GotoPose.Result:
        req = goal_handle.request
        if goal_handle.is_cancel_requested:
            return self._finish(goal_handle, "canceled", "cancelled before it started")
        profile = INTERPOLATIONS.get(req.interpolation)
        if profile is None:
            return self._refuse(goal_handle, f"unknown interpolation {req.interpolation}; expected 0, 1 or 2")
        key, notes = bytes(goal_handle.goal_id.uuid), []

        def plan(start):
            # runs under the controller's lock: an older goal that starts late must not preempt a newer one
            if self._latest != key:
                raise _Superseded
            trajectory, plan_notes = plan_goto(start, msg_to_pose(req.target), float(req.duration), profile,
                                               self._robot.limits, self._limit_mode)
            notes.extend(plan_notes)
            return trajectory

        try:
            motion = self._controller.start(plan, "a goto_pose goal")
        except _Superseded:
            return self._finish(goal_handle, "abort", "preempted by a newer goal before it started")
        except LimitError as e:
            return self._refuse(goal_handle, str(e))
        for n in notes:
            self.get_logger().info(f"goto_pose: {n}")

        def feedback(m: Motion, pose) -> None:
            goal_handle.publish_feedback(GotoPose.Feedback(progress=m.progress(self._controller.now()),
                                                           current=pose_to_msg(pose)))

        outcome = await self._runner.follow(goal_handle, motion, feedback)
        if outcome == FINISHED:
            missed = self._sim.shortfall(motion)
            if missed:  # the result must not claim a pose the robot did not reach
                return self._finish(goal_handle, "abort", "; ".join([f"did not reach the target: {missed}", *notes]))
            return self._finish(goal_handle, "succeed", "; ".join(["reached", *notes]))
        if outcome == CANCELLED and goal_handle.is_cancel_requested:
            return self._finish(goal_handle, "canceled", "cancelled")
        return self._finish(goal_handle, "abort", motion.reason or "stopped")

    def _refuse(self, goal_handle: ServerGoalHandle, message: str) -> GotoPose.Result:
        self.get_logger().warning(f"goto_pose refused: {message}")
        return self._finish(goal_handle, "abort", message)

    def _finish(self, goal_handle: ServerGoalHandle, how: str, message: str) -> GotoPose.Result:
        if goal_handle.is_active:
            getattr(goal_handle, how)()
        reached = self._sim.reached()  # read back from the robot where there is one
        return GotoPose.Result(success=how == "succeed", message=message, reached=pose_to_msg(reached))


def main(args: list[str] | None = None) -> None:
    """Standalone: this server plus its own SimRobot (use sim_robot's main to run both servers on one robot)."""
    def make():
        sim = SimRobot(SimRobotConfig())
        return [sim, MotionServer(sim)]
    raise SystemExit(run_nodes(make, args))


if __name__ == "__main__":
    main()
