"""Ctrl-C as a request to stop (bolt_ros/nodes/stop_signal.py): no KeyboardInterrupt raised into rclpy's code on the
first SIGINT (it left half-built Tasks whose __del__ printed a traceback at exit), a KeyboardInterrupt on the second,
and rclpy's own handler, installed after it, still shuts its context down."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from bolt_ros.nodes.stop_signal import stop_on_sigint


def _wait(cond, timeout: float = 2.0) -> None:
    t0 = time.monotonic()
    while not cond() and time.monotonic() - t0 < timeout:
        time.sleep(0.001)  # Python runs a signal's handler in the main thread between bytecodes


def test_the_first_sigint_sets_the_event_and_the_second_raises():
    old = signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    try:
        stop_on_sigint(stop)
        os.kill(os.getpid(), signal.SIGINT)
        _wait(stop.is_set)
        assert stop.is_set()
        with pytest.raises(KeyboardInterrupt):  # negative control: Python's own handler, as before the change
            os.kill(os.getpid(), signal.SIGINT)
            _wait(lambda: False, timeout=1.0)
    finally:
        signal.signal(signal.SIGINT, old)


def test_rclpy_installed_after_it_still_shuts_its_context_down():
    code = """
import os, signal, threading, time
import rclpy
from bolt_ros.nodes.stop_signal import stop_on_sigint
stop = threading.Event()
stop_on_sigint(stop)
rclpy.init(args=[])
ctx = rclpy.get_default_context()
os.kill(os.getpid(), signal.SIGINT)
t0 = time.monotonic()
while (ctx.ok() or not stop.is_set()) and time.monotonic() - t0 < 5:
    time.sleep(0.01)
print("stop", stop.is_set(), "ok", ctx.ok(), flush=True)
rclpy.try_shutdown()
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.strip() == "stop True ok False", out.stdout
