"""The assistant node: utterances in (`speech/transcript`, the `converse` action), speech and motion out.

Callbacks only queue work and set flags; one worker thread runs the engine and the tool loop, so a long
generation never blocks the executor and a barge-in (new utterance, goal cancel) lands at once: it sets the
running turn's cancel event and, if configured, cancels the robot's running goals from the callback itself.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from pydantic import ValidationError
from rcl_interfaces.msg import ParameterDescriptor, SetParametersResult
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.action.server import ServerGoalHandle
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.node import Node
from rclpy.task import Future
from std_msgs.msg import String

from bolt_ros.action import Converse
from bolt_ros.assistant.backend import BackendError, ChatBackend
from bolt_ros.assistant.backend_factory import make_backend
from bolt_ros.assistant.config import AssistantConfig, from_ros_parameters, to_ros_parameters
from bolt_ros.assistant.conversation import Conversation, SceneMemory, TurnRecord
from bolt_ros.assistant.intent import IntentClassifier
from bolt_ros.assistant.priming import READY, Primer
from bolt_ros.assistant.tool_loop import LoopEvent, ToolLoop, TurnResult
from bolt_ros.assistant.tools import ToolRegistry
from bolt_ros.msg import AssistantEvent, Caption
from bolt_ros.nodes.assistant_msgs import KIND, stats_msg, tool_call_msg, tool_result_msg
from bolt_ros.nodes.common import ACTION_RESULT_TIMEOUT_S, FEEDBACK_QOS, core_log, run_nodes, wake_on_done
from bolt_ros.nodes.tool_router import ToolRouter
from bolt_ros.voice.continuation import CONTINUES

_RESTART_ONLY = ("backend.", "tools", "topics.", "scene_memory.", "intent.")  # parameters read once at startup
MAX_CONVERSATIONS = 16
BARGE_IN_TOPIC = "speech/barge_in"   # speech_recognizer: the person speaks over the robot, or goes on (String)
SPECULATIVE_TOPIC = "speech/speculative"   # speech_recognizer: the words so far, at the person's pause (priming.py)


@dataclass
class Job:
    utterance: str
    conversation_id: str = ""
    enable_thinking: bool = False
    goal: ServerGoalHandle | None = None
    t_received: float = field(default_factory=time.perf_counter)
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    interrupted_by: str = ""        # why it was cancelled: "barge-in", "continued", "cancel", "shutdown"
    t_cancel: float = 0.0
    result: TurnResult | None = None
    finished: Future | None = None  # completed with the job (an action goal's coroutine awaits it)

    def complete(self) -> None:
        self.done.set()
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(True)

    def stop(self, why: str) -> None:
        if not self.cancel.is_set():
            self.interrupted_by, self.t_cancel = why, time.perf_counter()
            self.cancel.set()


class AssistantNode(Node):
    def __init__(self, config: AssistantConfig | None = None, *, backend: ChatBackend | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "assistant_node"), **node_kwargs)
        self.config = self._declare_config(config or AssistantConfig())
        try:
            self.backend = backend if backend is not None else make_backend(self.config.backend)
            self.intent = IntentClassifier.create(self.config.intent, self.backend)  # None when off
        except (BackendError, ValueError, OSError) as e:
            self.destroy_node()
            raise ValueError(f"node {self.get_name()!r}: cannot start backend {self.config.backend.kind!r}: {e}") from e
        self.registry = ToolRegistry(self.config.tools)
        group = ReentrantCallbackGroup()
        self.router = ToolRouter(self, self.registry, callback_group=group)
        self.scene = SceneMemory(self.config.scene_memory)
        self._scene_lock = threading.Lock()
        self._conversations: OrderedDict[str, Conversation] = OrderedDict()
        topics = self.config.topics
        self._events_pub = self.create_publisher(AssistantEvent, topics.events, 100)
        self._tts_pub = self.create_publisher(String, topics.tts, 10)
        self.create_subscription(String, topics.transcript, self._on_transcript, 10, callback_group=group)
        self.create_subscription(Caption, topics.caption, self._on_caption, 50, callback_group=group)
        self.create_subscription(String, BARGE_IN_TOPIC, self._on_barge_in, 10, callback_group=group)
        self.create_subscription(String, SPECULATIVE_TOPIC, self._on_speculative, 10, callback_group=group)
        self._server = ActionServer(self, Converse, topics.converse, execute_callback=self._execute,
                                    goal_callback=self._on_goal, cancel_callback=self._on_cancel,
                                    result_timeout=ACTION_RESULT_TIMEOUT_S, feedback_pub_qos_profile=FEEDBACK_QOS,
                                    callback_group=group)
        self.add_on_set_parameters_callback(self._on_set_parameters)
        # latency accounting (bench/bench_graph.py reads these): milliseconds
        self.latency: dict[str, deque[float]] = {k: deque(maxlen=100_000) for k in
                                                 ("utterance_to_request", "sentence_to_tts", "barge_in_stop")}
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._current: Job | None = None
        self._pending: list[Job] = []
        self._prefill_due: str | None = None   # a conversation whose next prompt the idle worker prefills
        self.primer = Primer(self.backend, self.intent, prefill=self.config.prefill_between_turns, log=core_log(self))
        self.turns_done = 0
        self.prefilled_after = -1              # turns_done when the last next-turn prefill began (tests wait on it)
        self._closing = threading.Event()
        self._worker = threading.Thread(target=self._work, name="assistant-worker", daemon=True)
        self._worker.start()
        self._enum_thread = threading.Thread(target=self._fill_enums, name="assistant-enums", daemon=True)
        self._enum_thread.start()
        self.get_logger().info(f"assistant up: backend {getattr(self.backend, 'label', self.config.backend.kind)}, "
                               f"{len(self.registry.tools)} tools ({', '.join(self.registry.tools) or 'none'}), "
                               f"moves decided by {'the intent classifier' if self.intent else 'the model'}; "
                               "priming, it says when it is ready")

    # ---- parameters ------------------------------------------------------------------------------------------
    def _declare_config(self, config: AssistantConfig) -> AssistantConfig:
        flat = to_ros_parameters(config)
        descriptor = ParameterDescriptor(dynamic_typing=True)  # `-p backend.temperature:=1` (int) is fine
        for name, value in flat.items():
            if not self.has_parameter(name):
                self.declare_parameter(name, value, descriptor)
        try:
            return from_ros_parameters({n: self.get_parameter(n).value for n in flat})
        except ValidationError as e:
            self.destroy_node()
            raise ValueError(f"node {self.get_name()!r}: invalid parameters:\n{e}") from e

    def _on_set_parameters(self, params) -> SetParametersResult:
        changes = {p.name: p.value for p in params}
        late = [n for n in changes if n.startswith(_RESTART_ONLY)]
        if late:
            return SetParametersResult(successful=False, reason=f"{', '.join(late)} only apply at startup")
        try:
            self.config = from_ros_parameters({**to_ros_parameters(self.config), **changes})
        except ValidationError as e:
            return SetParametersResult(successful=False, reason=str(e))
        return SetParametersResult(successful=True)

    # ---- inputs (executor threads: quick, never block) -------------------------------------------------------
    def _on_transcript(self, msg: String) -> None:
        text = msg.data.strip()
        if text:
            self.submit(Job(text, enable_thinking=self.config.enable_thinking))

    def _on_speculative(self, msg: String) -> None:
        if self.config.speculative_start and msg.data.strip():
            self._jobs.put(msg.data.strip())   # the worker's, when no turn waits (Primer.speculate)

    def _on_barge_in(self, msg: String) -> None:
        """Speech onset over the robot's voice, or the person going on (CONTINUES: the turn stays out of the history):
        stop the turn and its motion as a new utterance would, without starting one (the transcript follows)."""
        if self.config.barge_in:
            goals = self.router.cancellable_goals() if self.config.barge_in_stops_motion else []
            self._interrupt("continued" if msg.data == CONTINUES else "barge-in")
            self.router.cancel_goals(goals)

    def _on_caption(self, msg: Caption) -> None:
        with self._scene_lock:
            self.scene.add(msg.text, source=msg.source)

    def _waiting(self) -> int:
        with self._lock:
            return sum(1 for j in self._pending if not j.done.is_set())

    def _queue_full(self) -> bool:
        """Without barge-in turns wait their turn: at most max_queued_turns of them (with it, a new turn
        interrupts the waiting ones, so the queue never grows)."""
        return not self.config.barge_in and self._waiting() >= self.config.max_queued_turns

    def _on_goal(self, _request) -> GoalResponse:
        if not self._queue_full():
            return GoalResponse.ACCEPT
        self.get_logger().warning(f"rejected a converse goal: {self._waiting()} turns are waiting "
                                  f"(max_queued_turns={self.config.max_queued_turns})")
        return GoalResponse.REJECT

    def submit(self, job: Job) -> Job:
        """Queue a turn; with barge-in on, whatever is running or waiting is interrupted first. A full queue
        refuses the turn (its result says why) instead of growing."""
        if self._queue_full():
            why = f"busy: {self._waiting()} turns are waiting (max_queued_turns={self.config.max_queued_turns})"
            self.get_logger().warning(f"dropped the utterance {job.utterance[:40]!r}: {why}")
            job.result = TurnResult(error=why)
            job.complete()
            return job
        self.primer.interrupt(job.utterance)   # priming gives way; speculative work on other words is dropped
        stop_motion = self.config.barge_in and self.config.barge_in_stops_motion
        goals = self.router.cancellable_goals() if stop_motion else []  # taken before the new turn can add any
        if self.config.barge_in:
            self._interrupt("barge-in")
        with self._lock:
            self._pending.append(job)
        self._jobs.put(job)
        # after the hand-off: cancel requests (service calls + a log line) must not delay the new turn
        self.router.cancel_goals(goals)
        return job

    def _interrupt(self, why: str) -> None:
        """Stop the running and queued turns (running goals are the caller's business)."""
        with self._lock:
            victims = [j for j in (self._current, *self._pending) if j is not None and not j.done.is_set()]
        for j in victims:
            j.stop(why)

    def _on_cancel(self, goal: ServerGoalHandle) -> CancelResponse:
        with self._lock:
            jobs = [j for j in (self._current, *self._pending) if j is not None and j.goal is goal]
        for j in jobs:
            j.stop("cancel")
        if jobs and self.config.barge_in_stops_motion:
            self.router.cancel_running()
        return CancelResponse.ACCEPT

    async def _execute(self, goal: ServerGoalHandle) -> Converse.Result:
        # a coroutine: the turn runs on the worker, no executor thread waits for it
        req = goal.request
        finished = wake_on_done(Future(), self)
        job = Job(req.utterance, req.conversation_id, req.enable_thinking, goal=goal, finished=finished)
        if self._closing.is_set():
            job.result = TurnResult(error="shutting down")
        else:
            self.submit(job)
            await finished
        res = job.result or TurnResult(error="not run")
        out = Converse.Result(success=not (res.error or res.cancelled), text=res.text,
                              error=res.error or (f"interrupted ({job.interrupted_by})" if res.cancelled else ""),
                              tool_calls=[tool_call_msg(c) for c in res.tool_calls],
                              tool_results=[tool_result_msg(r) for r in res.tool_results],
                              stats=stats_msg(res.stats))
        if goal.is_cancel_requested:
            goal.canceled()
        elif out.success:
            goal.succeed()
        else:
            goal.abort()
        return out

    # ---- the worker ------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._closing.is_set():
            try:
                job = self._jobs.get(timeout=0.1)
            except queue.Empty:
                self._prefill_next_turn()
                continue
            if job is None:
                break
            if isinstance(job, str):   # a speculative transcript: worked on only while no turn waits
                if not self._waiting():
                    self._speculate(job)
                continue
            with self._lock:
                if job in self._pending:
                    self._pending.remove(job)
                self._current = job
            try:
                job.result = self._run_turn(job) if not job.cancel.is_set() else TurnResult(cancelled=True)
            except Exception as e:  # never let the worker die: report and go on with the next utterance
                self.get_logger().error(f"turn failed: {type(e).__name__}: {e}")
                job.result = TurnResult(error=f"{type(e).__name__}: {e}")
            finally:
                with self._lock:
                    self._current = None
                    self._prefill_due = job.conversation_id
                    self.turns_done += 1
                job.complete()

    def _prefill_next_turn(self) -> None:
        """On the idle worker: the conversation's next prompt up to the person's words goes into the engine's cache
        now (after a turn, and once the robot's tools are known), so the next turn prefills only its message. The
        first one done makes the robot ready (a STATE event `ready`); a turn that comes meanwhile runs first."""
        with self._lock:
            cid, self._prefill_due, turns = self._prefill_due, None, self.turns_done
        if cid is None or not self.primer.prime(self._conversation(cid).messages(), self.registry.openai_tools(),
                                                 self._closing):
            return
        self.prefilled_after = turns
        if self.primer.mark_ready():
            self.get_logger().info("assistant ready: primed, answers at full speed")
            self._emit(Job(""), LoopEvent("state", READY))

    def _speculate(self, text: str) -> None:
        conv = self._conversation("")   # spoken turns are conversation ""
        with self._scene_lock:
            scene = self.scene.render()
        self.primer.speculate(text, lambda u: conv.messages([conv.user_message(u, scene)]),
                              self.registry.openai_tools(), conv.last_move(), self._closing)

    def _run_turn(self, job: Job) -> TurnResult:
        cfg = self.config
        self.primer.claim(job.utterance)   # the speculation before this turn: a hit or a miss
        conv = self._conversation(job.conversation_id)
        with self._scene_lock:
            scene = self.scene.render()
        def call_tool(call, cancel):  # a motion's line is said as the robot starts moving (ToolLoop.acknowledge)
            return self.router.call(call, cancel, started=loop.acknowledge if cfg.say_move_at_start else None)

        loop = ToolLoop(self.backend, call_tool, lambda ev: self._emit(job, ev),
                        max_tool_rounds=cfg.max_tool_rounds, max_sentences=cfg.max_sentences,
                        at_a_loss=cfg.lines("at_a_loss"), at_a_loss_told=cfg.lines("at_a_loss_told"),
                        intent=self.primer.intent, own_name=cfg.robot_name)
        loop.first_clause = cfg.first_clause_words   # a reply's first clause goes to TTS (sentences.py)
        loop.too_long = cfg.lines("too_long") or loop.too_long  # words longer than the context: said so
        user_msg = conv.user_message(job.utterance, scene)
        res = loop.run(conv, user_msg, self.registry.openai_tools(), enable_thinking=job.enable_thinking,
                       cancel=job.cancel, t0=job.t_received, utterance=job.utterance)
        if res.t_request:
            self.latency["utterance_to_request"].append((res.t_request - job.t_received) * 1e3)
        # logged after the turn: logging before the engine request would sit on the utterance -> request path
        self.get_logger().info(f"user: {job.utterance!r}" + (" (thinking)" if job.enable_thinking else ""))
        if res.cancelled and job.t_cancel:
            self.latency["barge_in_stop"].append((time.perf_counter() - job.t_cancel) * 1e3)
            self.get_logger().info(f"turn interrupted ({job.interrupted_by}) after {res.stats['total_ms']:.0f} ms")
        if res.cancelled and job.interrupted_by == "continued":
            self.get_logger().info(f"turn taken back: the person went on after {job.utterance!r}")
            return res
        ok = [(c, r) for c, r in zip(res.tool_calls, res.tool_results) if r.ok]
        conv.commit(res.messages, TurnRecord(job.utterance, res.text, [r.done for _, r in ok if r.done],
                                             [c.name for c, _ in ok]))
        if res.error:
            self.get_logger().error(f"turn failed: {res.error}")
        else:
            self.get_logger().info(f"robot: {res.text!r} ({len(res.tool_calls)} tool calls, "
                                   f"{res.stats['total_ms']:.0f} ms)")
        return res

    def _conversation(self, cid: str) -> Conversation:
        conv = self._conversations.get(cid)
        if conv is None:
            conv = Conversation(self.config.system_prompt, self.config.max_history_messages)
            self._conversations[cid] = conv
            while len(self._conversations) > MAX_CONVERSATIONS:
                self._conversations.popitem(last=False)
        self._conversations.move_to_end(cid)
        cfg = self.config
        conv.system_prompt, conv.max_messages = cfg.system_prompt, cfg.max_history_messages
        conv.history_mode, conv.memory_turns, conv.memory_replies = cfg.history, cfg.memory_turns, cfg.memory_replies
        conv.keep_last_call, conv.facts_in_prompt = cfg.memory_keeps_last_call, cfg.facts_in_prompt
        return conv

    def _emit(self, job: Job, ev: LoopEvent) -> None:
        msg = AssistantEvent(conversation_id=job.conversation_id, type=KIND[ev.kind], text=ev.text)
        msg.stamp = self.get_clock().now().to_msg()
        if ev.kind == "state":
            msg.state, msg.text = ev.text, ""
        if ev.call is not None:
            msg.tool_call = tool_call_msg(ev.call)
        if ev.result is not None:
            msg.tool_result = tool_result_msg(ev.result)
        if ev.kind == "sentence":
            self._tts_pub.publish(String(data=ev.text))  # first: speech must not wait for the event plumbing
            self.latency["sentence_to_tts"].append((time.perf_counter() - ev.t) * 1e3)
        self._events_pub.publish(msg)
        if job.goal is not None and job.goal.is_active:
            job.goal.publish_feedback(Converse.Feedback(event=msg))

    def _fill_enums(self) -> None:
        delay = 0.05
        while not self._closing.is_set() and not self.router.refresh_enums(timeout_s=1.0):
            self._closing.wait(delay)
            delay = min(delay * 2, 2.0)
        with self._lock:  # the tools are final now: the first turn's prompt can be prefilled
            self._prefill_due = "" if self._prefill_due is None else self._prefill_due

    # ---- shutdown --------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the worker (interrupting the running turn); spin_nodes calls this before destroying the node."""
        self._closing.set()
        self.primer.interrupt(None)
        self._interrupt("shutdown")
        self._jobs.put(None)
        self._worker.join(timeout=2.0)
        with self._lock:  # turns the worker never reached: their goals must still end
            left, self._pending = self._pending, []
        for job in left:
            job.result = job.result or TurnResult(error="shutting down")
            job.complete()

    def destroy_node(self) -> None:
        if hasattr(self, "_worker") and not self._closing.is_set():  # also reached from a failed __init__
            self.close()
        if hasattr(self, "_server"):
            self._server.destroy()
        super().destroy_node()


def make_nodes(**node_kwargs) -> list[Node]:
    return [AssistantNode(**node_kwargs)]


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(make_nodes, args))


if __name__ == "__main__":
    main()
