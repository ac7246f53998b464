"""Fixtures for the Reachy Mini tests: the real MuJoCo daemon (reachy-mini-daemon --sim --headless) on a free
port, telemetry off, stopped at the end. Imported by the test modules that need them."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from bolt_ros.robot.reachy_mini.convert import from_sdk, rotation
from bolt_ros.robot.reachy_mini.daemon import SimDaemon, get_json

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


def daemon_pose(port: int, host: str = "127.0.0.1") -> np.ndarray:
    """Our six joints as the daemon itself reports them (its REST API: MuJoCo's head site, the body, the antennas),
    not as our joint_states say: what a test reads to know where a robot is, ours or someone else's."""
    s = get_json(host, port, "/api/state/full", timeout=3.0)
    h, head = s["head_pose"], np.eye(4)
    head[:3, :3] = rotation(h["roll"], h["pitch"], h["yaw"])  # the SDK's extrinsic xyz = our Rz Ry Rx
    return from_sdk(head, s["antennas_position"], s["body_yaw"])


def rest_pose(port: int, timeout: float = 10.0) -> np.ndarray:
    """daemon_pose once the head is at rest (two reads 0.5 s apart within 0.002 rad): a daemon just started still
    settles from its start pose for a few seconds (5 deg of roll seen)."""
    import time

    deadline, last = time.monotonic() + timeout, daemon_pose(port)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = daemon_pose(port)
        if np.max(np.abs(now - last)) < 0.002:
            return now
        last = now
    raise AssertionError(f"the head on port {port} did not come to rest in {timeout} s")
