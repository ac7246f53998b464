"""Fixtures for the Reachy Mini tests: the real MuJoCo daemon (reachy-mini-daemon --sim --headless) on a free
port, telemetry off, stopped at the end. Imported by the test modules that need them."""
from __future__ import annotations

import os
import tempfile

import pytest

from bolt_ros.robot.reachy_mini.daemon import SimDaemon

# MuJoCo picks its OpenGL platform when it is first imported: offscreen EGL (Mesa) for the render tests, set before
# any test module imports mujoco
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture
def reachy_daemon_factory():
    """daemon(port=0) -> a started SimDaemon; every one is stopped when the test ends. No sleep walk at exit."""
    started: list[SimDaemon] = []
    log_dir = tempfile.mkdtemp(prefix="reachy_daemon_")

    def make(port: int = 0) -> SimDaemon:
        d = SimDaemon(port, sleep_on_stop=False, log_path=os.path.join(log_dir, f"daemon{len(started)}.log"))
        started.append(d)
        return d.start()

    yield make
    for d in started:
        d.stop()


@pytest.fixture(scope="module")
def reachy_daemon():
    """One daemon shared by a module's tests (start-up costs ~5 s of a 2-core machine)."""
    d = SimDaemon(sleep_on_stop=False, log_path=tempfile.mktemp(prefix="reachy_daemon_", suffix=".log")).start()
    yield d
    d.stop()
