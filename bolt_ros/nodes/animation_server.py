"""`play_animation` action (PlayAnimation: goals queue, feedback elapsed/progress, cancel stops the motion) and the
`list_animations` service, driving the shared joint state of a SimRobot."""
from __future__ import annotations

import threading
from collections import deque

from pydantic import BaseModel, ConfigDict, Field
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node

from bolt_ros.action import PlayAnimation
from bolt_ros.nodes.common import ACTION_RESULT_TIMEOUT_S, declare_config, run_nodes
from bolt_ros.nodes.goal_runner import GoalRunner
from bolt_ros.nodes.robot_node import RobotNode
from bolt_ros.nodes.sim_robot import SimRobot, SimRobotConfig
from bolt_ros.robot import CANCELLED, FINISHED, Motion
from bolt_ros.srv import ListAnimations


class AnimationServerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action_name: str = "play_animation"
    list_service: str = "list_animations"
    feedback_rate_hz: float = Field(10.0, gt=0.0, le=100.0)
    max_queued_goals: int = Field(8, ge=0)  # goals waiting behind the running one; more are rejected (logged why)


class AnimationServer(Node):
    def __init__(self, sim: RobotNode, config: AnimationServerConfig | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "animation_server"), **node_kwargs)
        self.config = declare_config(self, config or AnimationServerConfig())
        self._library = sim.library
        self._controller = sim.controller
        self._runner = GoalRunner(sim, self, self.config.feedback_rate_hz)
        self._lock = threading.Lock()
        self._queue: deque[ServerGoalHandle] = deque()
        self._running: ServerGoalHandle | None = None
        group = ReentrantCallbackGroup()
        self._server = ActionServer(
            self, PlayAnimation, self.config.action_name, execute_callback=self._execute,
            goal_callback=self._on_goal, handle_accepted_callback=self._on_accepted,
            cancel_callback=self._on_cancel, result_timeout=ACTION_RESULT_TIMEOUT_S, callback_group=group)
        self._service = self.create_service(ListAnimations, self.config.list_service, self._list, callback_group=group)
        self.get_logger().info(f"{len(self._library.entries)} animations: {', '.join(self._library.names())}")

    def close(self) -> None:
        self._runner.close()

    def destroy_node(self) -> None:
        self._server.destroy()
        super().destroy_node()

    # --- queue: one goal runs, the others wait their turn in arrival order (ros2/examples server_queue_goals) ---
    def _on_goal(self, request) -> GoalResponse:
        """Bounded queue: a goal that would wait behind max_queued_goals others is rejected (an action goal
        response carries no reason, so the reason goes to the log; the tool router tells the model)."""
        with self._lock:
            waiting = len(self._queue)
        if waiting >= self.config.max_queued_goals:
            self.get_logger().warning(f"rejected animation {request.name!r}: the queue is full "
                                      f"({waiting} goals waiting, max_queued_goals={self.config.max_queued_goals})")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def _on_accepted(self, goal_handle: ServerGoalHandle) -> None:
        with self._lock:
            start = self._running is None
            if start:
                self._running = goal_handle
            else:
                self._queue.append(goal_handle)
        if start:
            goal_handle.execute()

    def _start_next(self) -> None:
        with self._lock:
            self._running = self._queue.popleft() if self._queue else None
            nxt = self._running
        if nxt is not None:
            nxt.execute()

    def _on_cancel(self, goal_handle: ServerGoalHandle) -> CancelResponse:
        self._runner.cancel(goal_handle)
        return CancelResponse.ACCEPT

    def _list(self, _request, response: ListAnimations.Response) -> ListAnimations.Response:
        entries = list(self._library.entries.values())
        response.names = [e.name for e in entries]
        response.descriptions = [e.description for e in entries]
        response.durations = [float(e.duration) for e in entries]
        return response

    async def _execute(self, goal_handle: ServerGoalHandle) -> PlayAnimation.Result:
        try:
            return await self._play(goal_handle)
        except Exception as e:  # a bug must fail the goal, not the server
            self.get_logger().error(f"play_animation failed: {e!r}")
            return _finish(goal_handle, "abort", f"internal error: {e}")
        finally:
            self._start_next()

    async def _play(self, goal_handle: ServerGoalHandle) -> PlayAnimation.Result:
        req = goal_handle.request
        if goal_handle.is_cancel_requested:
            return _finish(goal_handle, "canceled", "cancelled before it started")
        anim = self._library.get(req.name)
        if anim is None:
            msg = f"unknown animation {req.name!r}; available: {', '.join(self._library.names())}"
            self.get_logger().warning(msg)
            return _finish(goal_handle, "abort", msg)
        try:
            motion = self._controller.start(lambda pose: anim.build(pose, req.speed), f"animation {req.name!r}")
        except ValueError as e:
            self.get_logger().warning(f"play_animation {req.name!r} refused: {e}")
            return _finish(goal_handle, "abort", str(e))
        self.get_logger().info(f"playing {req.name!r} ({motion.trajectory.duration:.2f} s)")

        def feedback(m: Motion, _pose) -> None:
            now = self._controller.now()
            goal_handle.publish_feedback(PlayAnimation.Feedback(
                elapsed=m.elapsed(now), duration=m.trajectory.duration, progress=m.progress(now)))

        outcome = await self._runner.follow(goal_handle, motion, feedback)
        played = motion.elapsed(self._controller.now())
        if outcome == FINISHED:
            return _finish(goal_handle, "succeed", f"played {req.name!r}", played)
        if outcome == CANCELLED and goal_handle.is_cancel_requested:
            return _finish(goal_handle, "canceled", f"cancelled after {played:.2f} s", played)
        return _finish(goal_handle, "abort", motion.reason or "stopped", played)


def _finish(goal_handle: ServerGoalHandle, how: str, message: str, played: float = 0.0) -> PlayAnimation.Result:
    """Move the goal to its terminal state (succeed / abort / canceled) and build the result."""
    if goal_handle.is_active:
        getattr(goal_handle, how)()
    return PlayAnimation.Result(success=how == "succeed", message=message, duration=float(played))


def main(args: list[str] | None = None) -> None:
    """Standalone: this server plus its own SimRobot (use sim_robot's main to run both servers on one robot)."""
    def make():
        sim = SimRobot(SimRobotConfig())
        return [sim, AnimationServer(sim)]
    raise SystemExit(run_nodes(make, args))


if __name__ == "__main__":
    main()
