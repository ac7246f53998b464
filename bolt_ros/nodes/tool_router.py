"""The tool router: a model's tool call -> a checked goal on a ROS action (or a request to a service) -> JSON.

Lives inside the assistant node (no extra hop); `call()` blocks the assistant's worker thread, never an executor
thread. Every failure is a ToolOutcome with a message written for the model: unknown tool, unparsable call, bad
arguments, server missing, goal rejected/aborted, timeout, interrupted. Every call is logged with its latency.
"""
from __future__ import annotations

import importlib
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rclpy.action.client import ClientGoalHandle
from rclpy.node import Node
from rclpy.task import Future
from sensor_msgs.msg import JointState
from unique_identifier_msgs.msg import UUID

from bolt_ros.assistant.backend import ToolCallRequest
from bolt_ros.assistant.relative import TO_LIMIT, RelativeError, plan_relative
from bolt_ros.assistant.tools import Tool, ToolError, ToolOutcome, ToolRegistry, failure_line, fill_words

_UNFILLED = re.compile(r"\{\w+\}")  # a say line's placeholder the arguments did not fill (tools.fill_words)
_STATUS = {GoalStatus.STATUS_SUCCEEDED: "succeeded", GoalStatus.STATUS_ABORTED: "aborted",
           GoalStatus.STATUS_CANCELED: "canceled"}


def import_interface(type_name: str):
    """"bolt_ros/action/PlayAnimation" -> the generated class."""
    try:
        pkg, kind, name = type_name.split("/")
        return getattr(importlib.import_module(f"{pkg}.{kind}"), name)
    except (ValueError, ImportError, AttributeError) as e:
        raise ValueError(f"unknown ROS interface type {type_name!r}: {e}") from e


def set_fields(msg, fields: dict[str, Any]) -> None:
    """Assign {"target.head_yaw": 0.3, ...} onto a message; a wrong field or type is a ToolError."""
    for path, value in fields.items():
        obj, *parents_leaf = msg, *path.split(".")
        *parents, leaf = parents_leaf
        try:
            for p in parents:
                obj = getattr(obj, p)
            current = getattr(obj, leaf)
            if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # rosidl float fields refuse ints
            setattr(obj, leaf, value)
        except (AttributeError, TypeError, ValueError, AssertionError) as e:
            raise ToolError(f"cannot set {type(msg).__name__}.{path} = {value!r}: {e}") from None


def msg_to_dict(msg) -> Any:
    if hasattr(msg, "get_fields_and_field_types"):
        return {name: msg_to_dict(getattr(msg, name)) for name in msg.get_fields_and_field_types()}
    if isinstance(msg, list | tuple) or type(msg).__name__ == "ndarray" or type(msg).__name__ == "array":
        return [msg_to_dict(v) for v in msg]
    if isinstance(msg, float):
        return round(msg, 6)
    return msg


class ToolRouter:
    def __init__(self, node: Node, registry: ToolRegistry, *, callback_group=None):
        self.node, self.registry, self.log = node, registry, node.get_logger()
        self._clients: dict[str, Any] = {}
        self._types: dict[str, Any] = {}
        self._enum_clients: dict[str, Any] = {}
        for name, tool in registry.tools.items():
            spec, iface = tool.spec, import_interface(tool.spec.type)
            self._types[name] = iface
            if spec.kind == "action":
                self._clients[name] = ActionClient(node, iface, spec.target, callback_group=callback_group)
            else:
                self._clients[name] = node.create_client(iface, spec.target, callback_group=callback_group)
            if spec.enum_from:
                src = spec.enum_from
                self._enum_clients[name] = node.create_client(import_interface(src.type), src.service,
                                                              callback_group=callback_group)
        # the joints' measured positions (joint_states) and limits, for tools that move on from where the robot is
        self.positions: dict[str, float] = {}
        self.limits: dict[str, tuple[float, float]] = {}
        states = {t.spec.relative.state_topic for t in registry.tools.values() if t.spec.relative}
        if states:
            from bolt_ros.robot import load_robot_config
            lim = load_robot_config().limits
            self.limits = {n: (getattr(lim, n).lower, getattr(lim, n).upper) for n in type(lim).model_fields}
        for topic in states:
            node.create_subscription(JointState, topic, self._on_joint_state, 10, callback_group=callback_group)
        self._running: dict[int, tuple[Tool, Any]] = {}  # id(goal handle) -> (tool, handle) of goals in flight
        self._lock = threading.Lock()
        self.accept_latency_ms: deque[float] = deque(maxlen=100_000)  # call received -> server accepted the goal
        self.accept_seen_latency_ms: deque[float] = deque(maxlen=100_000)  # ... -> the acceptance reached us
        self.send_latency_ms: deque[float] = deque(maxlen=100_000)    # call received -> goal handed to rclpy

    def _on_joint_state(self, msg: JointState) -> None:
        self.positions = {**self.positions, **dict(zip(msg.name, msg.position, strict=False))}

    # ---- the call path -------------------------------------------------------------------------------------
    def call(self, call: ToolCallRequest, cancel: threading.Event,
             started: Callable[[list[str]], None] | None = None) -> ToolOutcome:
        """started: given a motion's lines (ToolSpec.say, filled from the arguments) as soon as the robot moves (the
        goal's first feedback), so that they are said while it moves, not after it (issue 33); a goal refused or
        finished before any feedback never calls it."""
        t0 = time.perf_counter()
        tool, sent = None, False
        try:
            tool, args = self.registry.resolve(call)
            fields = tool.request_fields(args)
            sent = True  # from here on a failure is the robot's, not the call's (bad arguments go back to the model)
            rel = tool.spec.relative
            relative = rel is not None and rel.applies(args)
            if relative:  # on from where the joint is now, inside its limits (relative.py), or a plain reason
                try:
                    moved, how, words = plan_relative(rel, args, self.positions, self.limits)
                except RelativeError as e:
                    raise ToolError(str(e)) from None
                fields.update(moved)
                said = [fill_words(x, words)
                        for x in (rel.say_at_limit if how == TO_LIMIT else rel.say) or tool.spec.say]
            if tool.spec.kind == "action":
                lines = (said if relative else tool.say_lines(args)) if started is not None else []
                # lines naming the result's fields ("{names}") can only be said after it
                moving = (lambda: started(lines)) if lines and not any(_UNFILLED.search(x) for x in lines) else None
                content = self._run_action(tool, fields, cancel, t0, moving)
            else:
                content = self._run_service(tool, fields, cancel, t0)
            done = fill_words(rel.done, words) if relative else tool.done_text(args)
            # what the model reads back: the result in the tool's words, or for a motion that speaks its own line
            # (no words round reads it) what it did, as the conversation's last turn shows it
            text = tool.result_for_model(content.get("result", {})) or (f"{done[0].upper()}{done[1:]}."
                                                                         if tool.spec.say else "")
            out = ToolOutcome(call.id, call.name, True, json.dumps(content), done=done,
                              say=said if relative else tool.say_lines(args, content.get("result", {})), text=text)
        except ToolError as e:
            # a motion (a tool with lines of its own) the robot could not do says why in plain words (interrupted:
            # the turn is over anyway)
            plain = sent and (tool.spec.say or tool.spec.relative) and not cancel.is_set()
            out = ToolOutcome(call.id, call.name, False, error=str(e), say=[failure_line(str(e))] if plain else [])
        except Exception as e:  # a router bug must not take the node down; the model and the log both see it
            out = ToolOutcome(call.id, call.name, False, error=f"internal error: {type(e).__name__}: {e}")
        out.elapsed_ms = (time.perf_counter() - t0) * 1e3
        args_text = json.dumps(call.arguments) if call.arguments is not None else call.raw
        if out.ok:
            self.log.info(f"tool {call.name}({args_text}) [{call.id}] -> ok in {out.elapsed_ms:.1f} ms: "
                          f"{out.content[:200]}")
        else:
            self.log.warning(f"tool {call.name}({args_text}) [{call.id}] -> error in {out.elapsed_ms:.1f} ms: "
                             f"{out.error}")
        return out

    def _run_action(self, tool: Tool, fields: dict, cancel: threading.Event, t0: float,
                    on_moving: Callable[[], None] | None = None) -> dict:
        spec, client = tool.spec, self._clients[tool.spec.name]
        self._wait_ready(client.server_is_ready, spec, cancel)
        goal = self._types[spec.name].Goal()
        set_fields(goal, fields)
        feedback: dict = {}
        # the first feedback says the robot moves: our servers accept every goal and refuse a target out of reach
        # only as they execute it (an aborted result, no feedback), so the acceptance alone does not say it moves
        moving = threading.Event()

        def on_feedback(fb) -> None:
            feedback.update(msg_to_dict(fb.feedback))
            moving.set()
        self.send_latency_ms.append((time.perf_counter() - t0) * 1e3)
        goal_id = UUID(uuid=list(uuid.uuid4().bytes))  # ours, so the goal can be cancelled without its acceptance
        send = client.send_goal_async(goal, feedback_callback=on_feedback, goal_uuid=goal_id)
        _drop_orphaned_futures(client)
        try:
            handle = self._wait(send, cancel, t0 + spec.timeout_s, spec, "the goal to be accepted")
        except ToolError:
            # we stopped waiting; the goal must not run unseen: if its acceptance arrives late, cancel it then; if
            # the acceptance was lost on the way (seen, rarely, with rmw_fastrtps), cancel it by its id now
            send.add_done_callback(_cancel_if_accepted)
            _cancel_by_id(client, goal_id, self._types[spec.name])
            raise
        if not handle.accepted:
            raise ToolError(f"{spec.target} rejected the goal {json.dumps(fields)} (the server is busy or refuses it: "
                            f"try again later)")
        seen = time.perf_counter()
        self.accept_seen_latency_ms.append((seen - t0) * 1e3)
        # the server's acceptance stamp (its clock: system time, unless the robot runs on sim time)
        accepted = handle.stamp.sec + 1e-9 * handle.stamp.nanosec - (time.time() - (seen - t0))
        if 0.0 <= accepted < 60.0:
            self.accept_latency_ms.append(accepted * 1e3)
        result_future = handle.get_result_async()
        with self._lock:
            self._running[id(handle)] = (tool, handle)
        result_future.add_done_callback(lambda _f: self._forget(handle))
        if spec.wait == "accepted":
            return {"status": "started", "goal": fields}
        try:
            if on_moving is not None and self._wait(result_future, cancel, t0 + spec.timeout_s, spec, "the result",
                                                    until=moving) is None:
                on_moving()  # on this (the assistant's worker) thread, while the robot moves
            response = self._wait(result_future, cancel, t0 + spec.timeout_s, spec, "the result")
        except ToolError:
            handle.cancel_goal_async()  # a timed-out motion must not keep running unseen
            raise
        result = msg_to_dict(response.result)
        status = _STATUS.get(response.status, f"status {response.status}")
        if response.status != GoalStatus.STATUS_SUCCEEDED or result.get("success") is False:
            why = result.get("message") or result.get("error") or ""
            raise ToolError(f"{spec.target} goal {status}" + (f": {why}" if why else "")
                            + (f" (last feedback {json.dumps(feedback)})" if feedback else ""))
        return {"status": status, "result": result}

    def _run_service(self, tool: Tool, fields: dict, cancel: threading.Event, t0: float) -> dict:
        spec, client = tool.spec, self._clients[tool.spec.name]
        self._wait_ready(client.service_is_ready, spec, cancel)
        request = self._types[spec.name].Request()
        set_fields(request, fields)
        future = client.call_async(request)
        try:
            response = self._wait(future, cancel, t0 + spec.timeout_s, spec, "the response")
        except ToolError:
            client.remove_pending_request(future)
            raise
        return {"status": "succeeded", "result": msg_to_dict(response)}

    def _wait_ready(self, is_ready, spec, cancel: threading.Event) -> None:
        deadline = time.perf_counter() + min(spec.server_timeout_s, spec.timeout_s)
        while not is_ready():
            if cancel.is_set():
                raise ToolError("interrupted by the user before the call was sent")
            if time.perf_counter() > deadline:
                raise ToolError(f"{spec.kind} server {spec.target!r} is not available (waited "
                                f"{min(spec.server_timeout_s, spec.timeout_s):.1f} s); is the robot running?")
            time.sleep(0.01)

    def _wait(self, future: Future, cancel: threading.Event, deadline: float, spec, what: str, *,
              until: threading.Event | None = None):
        """The future's result; with `until`, None as soon as that event is set while the future is not done (the
        future's completion sets it too, and rclpy marks a future done before it runs its done callbacks)."""
        # event-driven, not polled: a polling worker takes the GIL from the executor thread thousands of times a
        # second, slowing the very callbacks it waits for (rclpy runs the done callback as an executor task)
        done = until if until is not None else threading.Event()
        future.add_done_callback(lambda _f: done.set())
        while not future.done():
            if until is not None and until.is_set() and not future.done():
                return None
            if cancel.is_set():
                raise ToolError(f"interrupted by the user while waiting for {what} of {spec.target}")
            now = time.perf_counter()
            if now > deadline:
                raise ToolError(f"timed out after {spec.timeout_s:.1f} s waiting for {what} of {spec.target}")
            done.wait(min(deadline - now, 0.01))
        if cancel.is_set():  # a barge-in cancelled the goal: its CANCELED result may land before we look at cancel
            raise ToolError(f"interrupted by the user while waiting for {what} of {spec.target}")
        if future.exception() is not None:
            raise ToolError(f"{spec.target} failed: {future.exception()}")
        return future.result()

    def _forget(self, handle) -> None:
        with self._lock:
            self._running.pop(id(handle), None)

    # ---- barge-in and startup ------------------------------------------------------------------------------
    def cancel_running(self) -> int:
        """Ask every running goal of a barge-in-cancellable tool to stop; returns how many were asked."""
        return self.cancel_goals(self.cancellable_goals())

    def cancellable_goals(self) -> list:
        """Handles of the running goals a barge-in may cancel (a snapshot: goals sent later are not in it)."""
        with self._lock:
            return [h for tool, h in self._running.values() if tool.spec.cancel_on_barge_in]

    def cancel_goals(self, handles: list) -> int:
        for h in handles:
            h.cancel_goal_async()
        if handles:
            self.log.info(f"barge-in: cancelling {len(handles)} running goal(s)")
        return len(handles)

    def running_goals(self) -> int:
        with self._lock:
            return len(self._running)

    def refresh_enums(self, timeout_s: float = 1.0) -> bool:
        """Fill enum parameters (animation names) from their services; True when every one is filled."""
        all_filled = True
        for name, client in self._enum_clients.items():
            tool = self.registry.tools[name]
            if tool.enum_values is not None:
                continue
            src = tool.spec.enum_from
            if not client.service_is_ready():
                all_filled = False
                continue
            future = client.call_async(client.srv_type.Request())
            done = threading.Event()
            future.add_done_callback(lambda _f, d=done: d.set())
            if not done.wait(timeout_s) or future.result() is None:
                client.remove_pending_request(future)
                all_filled = False
                continue
            resp = future.result()
            names = list(getattr(resp, src.names_field))
            descs = list(getattr(resp, src.descriptions_field)) if src.descriptions_field else []
            tool.set_enum(names, descs)
            self.log.info(f"tool {name}: {src.parameter} is one of {', '.join(names)}")
        return all_filled


def _drop_orphaned_futures(client: ActionClient) -> None:
    """rclpy 9.1.2 (ros-kilted-rclpy, the newest on PyPI) registers two futures per send_goal_async and completes
    one (ros2/rclpy#1532, fixed upstream): the other stayed in the client's list for good, ~0.3 KB per goal, and the
    executor walks that list whenever the action's status or feedback arrives (found by bench/soak.py). Drop the
    futures nothing can complete: not done and in no pending request table (rclpy fills those tables under the
    client's lock; done futures are left to rclpy's own removal). A fixed rclpy leaves none: then a no-op."""
    with client._lock:
        pending = {id(f) for table in (client._pending_goal_requests, client._pending_cancel_requests,
                                       client._pending_result_requests) for f in table.values()}
        orphans = [f for f in client._futures if not f.done() and id(f) not in pending]
    for f in orphans:
        client.remove_future(f)


def _cancel_by_id(client: ActionClient, goal_id: UUID, action_type) -> None:
    """Ask the server to cancel this goal id: a server that accepted it stops it; one that never saw it answers
    'unknown goal' and nothing happens."""
    accepted = action_type.Impl.SendGoalService.Response(accepted=True)
    handle = ClientGoalHandle(client, goal_id, accepted)
    handle.cancel_goal_async()
    # rclpy drops the goal's feedback callback only when a result response for it arrives (the server's result, or
    # "unknown goal"): without this request every goal given up on here kept its callback for good (bench/soak.py)
    handle.get_result_async()


def _cancel_if_accepted(send_future: Future) -> None:
    handle = send_future.result() if send_future.exception() is None else None
    if handle is not None and handle.accepted:
        handle.cancel_goal_async()
