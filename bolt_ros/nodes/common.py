"""Small rclpy helpers shared by the nodes: typed config <-> ROS parameters, and a spin loop that ends cleanly.

Every node takes a pydantic config; `declare_config` declares one ROS parameter per (flattened) field with the
config's value as default, so `--ros-args -p name:=value` / `--params-file` override it, and validates the result
back into the model. Nested models flatten to dotted names (`limits.head_roll.lower`), as ROS params do.
"""
from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import rclpy
from pydantic import BaseModel, ValidationError
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.context import Context
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.task import Future

from bolt_ros.assistant.config import unflatten
from bolt_ros.nodes.stop_signal import stop_on_sigint

C = TypeVar("C", bound=BaseModel)


def flatten_config(config: BaseModel, prefix: str = "") -> dict[str, Any]:
    """{dotted name: value} for every leaf field (nested models recurse; lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for name in type(config).model_fields:
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            out.update(flatten_config(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def declare_config(node: Node, config: C) -> C:
    """Declare config's fields as parameters of `node` and return the config with the overrides applied.
    Raises ValueError naming the node and the bad parameter."""
    flat = flatten_config(config)
    # dynamic typing: `-p rate_hz:=50` (an int) must be able to override a float default; pydantic coerces
    descriptor = ParameterDescriptor(dynamic_typing=True)
    for name, value in flat.items():
        if not node.has_parameter(name):
            node.declare_parameter(name, value, descriptor)
    values = {name: node.get_parameter(name).value for name in flat}
    try:
        return type(config).model_validate(unflatten(values))
    except ValidationError as e:
        raise ValueError(f"node {node.get_name()!r}: invalid parameters:\n{e}") from e


class NodeLoop:
    """A node's own thread (a control loop, a frame loop): `body(stopping)` runs until stop() sets `stopping`. Work
    that must not hold up the executor the process's nodes share lives here."""

    def __init__(self, body: Callable[[threading.Event], None], name: str):
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=body, args=(self.stopping,), name=name, daemon=True)

    def start(self) -> NodeLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self.stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)


def wake_on_done(future: Future, node: Node) -> Future:
    """Make completing `future` (from any thread) wake the node's executor. rclpy tasks poll the futures they
    await, once per executor wake-up: without this a coroutine waiting on work done by one of our threads would
    resume only at the executor's next unrelated event."""
    def wake(_f: Future) -> None:
        executor = node.executor
        if executor is not None:
            executor.wake()
    future.add_done_callback(wake)
    return future


GIL_SWITCH_INTERVAL_S = 0.0002
# How long our action servers keep a finished goal's result for late result requests. Every goal kept is in every
# status message the server publishes and each client deserializes (rclpy: ~5 us per entry, per message); at
# rclpy's default of 10 s a busy robot's status arrays held hundreds of goals and each message cost its clients
# 2-3 ms. Clients ask for the result as soon as the goal is accepted, so 2 s is plenty.
ACTION_RESULT_TIMEOUT_S = 2
# An action server's feedback depth: a converse turn streams dozens of events (states, calls, results, text deltas,
# sentences), and with rclpy's default of 10 a client that falls behind for a moment loses the early ones
FEEDBACK_QOS_DEPTH = 200
FEEDBACK_QOS = QoSProfile(depth=FEEDBACK_QOS_DEPTH)


def tune_interpreter() -> None:
    """Hand the GIL over sooner. A node process has an executor thread that runs Python almost back to back while
    messages flow, and worker threads that wake for short jobs; at CPython's default 5 ms switch interval each
    hand-off waited up to 5 ms (utterance -> engine request p99 16 ms; 2-3 ms at 0.2 ms, bench/bench_graph.py).
    Long computations (torch) release the GIL anyway, so throughput is unaffected.

    And keep the garbage collector's full passes short: everything built so far (modules, nodes, a loaded model)
    lives as long as the process, so it is moved out of the collector's generations. A full pass over torch's and
    rclpy's objects took 20-40 ms, stalling every node of the process at random moments."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    gc.collect()
    gc.freeze()


def spin_once(executor, timeout_sec: float) -> None:
    """executor.spin_once that outlives rclpy's half-built action client. ActionClient.__init__ adds itself to its
    node's waitables before it sets its `_lock`, so an executor spinning that node on another thread can meet it
    without one: AttributeError, once in a CI run (a test built a client on a node its harness was spinning; the spin
    thread died and every later goal response timed out). The next spin finds it whole. Our nodes build their
    clients before they are spun; this keeps a spin loop alive for the code that does not."""
    try:
        executor.spin_once(timeout_sec=timeout_sec)
    except AttributeError as e:
        if "has no attribute '_lock'" not in str(e):
            raise


def spin_nodes(nodes: Sequence[Node], *, context: Context | None = None, stop: threading.Event | None = None) -> None:
    """Spin on a SingleThreadedExecutor until the context shuts down (rclpy's SIGINT handler does that) or `stop`
    is set. Bounded spin_once calls: plain spin() was seen to miss the first SIGINT.

    Single-threaded on purpose: no callback of ours blocks (long work runs on the nodes' own threads, action goals
    are coroutines), and rclpy's MultiThreadedExecutor re-submits every not-yet-started task to its pool on each
    wake-up; on 2 cores that storm of GIL hand-offs cost 20-400 ms per goal acceptance (bench/bench_graph.py)."""
    context = context or nodes[0].context
    tune_interpreter()
    executor = SingleThreadedExecutor(context=context)
    for n in nodes:
        executor.add_node(n)
    try:
        while context.ok() and not (stop and stop.is_set()):
            try:
                spin_once(executor, 0.1)
            except RuntimeError:
                # rclpy's SIGINT handler shuts the context down from the signal, and a message take already under
                # way then fails ("Unable to convert call argument '0' to Python object": once in a CI run of the
                # Reachy Mini bringup). That is the shutdown asked for; anything while the context is fine is not.
                if context.ok():
                    raise
                break
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        for n in nodes:
            close = getattr(n, "close", None)
            if close is not None:
                _quietly(close)  # wake the nodes' own loops (running goals) before the executor waits for its threads
        _quietly(lambda: executor.shutdown(timeout_sec=2.0))
        for n in nodes:
            _quietly(n.destroy_node)


def _quietly(step: Callable[[], object]) -> None:
    """One shutdown step; a callback still finishing on another thread can make rclpy refuse it ("cannot use
    Destroyable because destruction was requested"). Shutdown goes on: the process is ending anyway."""
    try:
        step()
    except Exception as e:  # reported, not raised: a clean SIGINT must exit 0
        print(f"shutdown: {type(e).__name__}: {e}", file=sys.stderr)


def run_nodes(make_nodes: Callable[[], Sequence[Node]], args: list[str] | None = None) -> int:
    """The body of a node's main(): init rclpy (parsing --ros-args), build the nodes, spin, shut down.
    A config error exits with status 2 and a message instead of a traceback."""
    stop = threading.Event()
    stop_on_sigint(stop)  # before rclpy.init: its handler chains to this one
    rclpy.init(args=args if args is not None else sys.argv)
    try:
        nodes = make_nodes()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    try:
        spin_nodes(nodes, stop=stop)
    finally:
        rclpy.try_shutdown()
    return 0


def core_log(node: Node) -> Callable[[str, str], None]:
    """`log(level, text)` for a ROS-free core, onto the node's logger. One call site per severity: rclpy ties a call
    site to the first severity it logs there and raises on another, so a one-line `getattr(logger, level)(text)`
    killed the assistant's worker as soon as `--log-level debug` let a debug line through after an info one."""
    def log(level: str, text: str) -> None:
        logger = node.get_logger()
        if level == "debug":
            logger.debug(text)
        elif level == "info":
            logger.info(text)
        elif level == "warning":
            logger.warning(text)
        else:
            logger.error(text)
    return log
