"""Shared fixtures for the ROS tests: an isolated ROS graph per test session, a context + background executor per
test, and helpers that wait for conditions with a deadline instead of sleeping.

Isolation: a random ROS_DOMAIN_ID for this session and localhost-only discovery, set in os.environ before any
rclpy context exists, so subprocesses (which must inherit os.environ anyway: the ROS wheels re-exec Python with
LD_LIBRARY_PATH) join the same private graph.
"""
from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable

import pytest

# No GPU in the test environment: Triton kernels run in its interpreter. This must be set before any test module
# imports triton (the engine imports the kernels lazily, but collection order is not ours to choose).
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["ROS_DOMAIN_ID"] = os.environ.get("BOLT_TEST_DOMAIN_ID") or str(random.SystemRandom().randint(1, 200))
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"


def pytest_collection_modifyitems(items):
    # Tests that assert wall-clock behaviour (rates, <100 ms reactions) get two more tries: on a shared 2-core CI
    # machine one scheduler stall can exceed a deadline. A real regression fails all three.
    for item in items:
        if item.get_closest_marker("realtime"):
            item.add_marker(pytest.mark.flaky(reruns=2, reruns_delay=1))


def wait_for(cond: Callable[[], object], timeout: float = 5.0, what: str = "condition", poll: float = 0.005):
    """Poll cond() until it returns something truthy (returned) or fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(poll)


def wait_for_action(client, server_node, name: str, timeout: float = 5.0) -> None:
    """Until the client and the action server see each other. wait_for_server() is the client seeing the server
    only: a server that has not yet discovered the client has the middleware drop its answer to the first goal
    ("failed to send response (timeout): client will not receive response", test_interfaces in one clean-clone CI
    run of 2026-12-06), and the goal's future never completes."""
    assert client.wait_for_server(timeout_sec=timeout)
    wait_for(lambda: server_node.count_clients(f"{name}/_action/send_goal") > 0, timeout,
             f"{name}'s server to see a client")


class RosHarness:
    """One rclpy context (own domain participant) with a SingleThreadedExecutor (what spin_nodes runs: no callback
    of ours blocks) spinning in a background thread."""

    def __init__(self, threads: int = 1):
        """threads > 1: a MultiThreadedExecutor, for test servers whose callbacks block."""
        import rclpy
        from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor

        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=int(os.environ["ROS_DOMAIN_ID"]))
        self.executor = (MultiThreadedExecutor(num_threads=threads, context=self.context) if threads > 1
                         else SingleThreadedExecutor(context=self.context))
        self.nodes: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        from bolt_ros.nodes.common import spin_once  # tests build action clients on nodes this thread spins
        while self.context.ok() and not self._stop.is_set():
            spin_once(self.executor, 0.02)

    def add(self, *nodes):
        """Spin these nodes; returns them (a single node unwrapped)."""
        for n in nodes:
            self.executor.add_node(n)
            self.nodes.append(n)
        return nodes[0] if len(nodes) == 1 else nodes

    def node(self, name: str = "test_client"):
        import rclpy

        return self.add(rclpy.create_node(name, context=self.context))

    def result(self, future, timeout: float = 5.0, what: str = "future"):
        wait_for(future.done, timeout, what)
        return future.result()

    def close(self) -> None:
        import rclpy

        for n in self.nodes:
            if hasattr(n, "close"):
                n.close()
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.executor.shutdown(timeout_sec=2.0)
        for n in self.nodes:
            n.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture
def ros():
    harness = RosHarness()
    try:
        yield harness
    finally:
        harness.close()


@pytest.fixture(scope="session")
def real_ggufs():
    """The two real models from PyPI, opened once: {"default": Gemma 3 270M, "smollm2": SmolLM2-135M}."""
    from bolt_ros.engine.default_models import resolve_model
    from bolt_ros.engine.gguf.reader import GGUFFile

    files = {m: GGUFFile(resolve_model(m)) for m in ("default", "smollm2")}
    yield files
    for f in files.values():
        f.close()


class BringupConsole:
    """`python -m bolt_ros.bringup --console ARGS` (the README's main job) in a subprocess; its output is collected
    line by line. Use as a context manager: the process is killed if a test leaves it running. verbose: the ROS logs
    and the tools' JSON on the console too (what tests wait for); False = the console a person reads."""

    def __init__(self, *args: str, verbose: bool = True):
        import subprocess
        import sys
        from pathlib import Path

        self.proc = subprocess.Popen([sys.executable, "-m", "bolt_ros.bringup", "--console",
                                      *(["--verbose"] if verbose else []), *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=os.environ.copy(), cwd=Path(__file__).resolve().parent.parent)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")), daemon=True).start()

    def output(self) -> str:
        return "".join(self.lines)

    def wait_line(self, pred: Callable[[str], bool], timeout: float = 20.0) -> str:
        """The first output line satisfying pred; fails the test (with the output) after `timeout` s or on exit."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((line for line in list(self.lines) if pred(line)), None)
            if hit is not None:
                return hit
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.proc.kill()
        raise AssertionError("no such line in:\n" + self.output())

    def type(self, text: str) -> None:
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def stop_with_sigint(self, exit_within: float) -> None:
        """One SIGINT must end everything cleanly: exit status 0 within `exit_within` s, no traceback."""
        import signal

        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGINT)
        rc = self.proc.wait(timeout=2 * exit_within)
        took = time.monotonic() - t0
        assert rc == 0 and took < exit_within, f"exit status {rc} after {took:.2f} s; output:\n{self.output()}"
        self.wait_line(lambda s: "bringup: stopped" in s, timeout=2)
        assert "Traceback" not in self.output()

    def __enter__(self) -> BringupConsole:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
