"""The connection to a Reachy Mini daemon through Pollen's SDK client, kept alive: connects in a background thread,
notices a lost daemon (no state for `stale_after_s`, or a failed send), and reconnects until closed.

The SDK's client caches the state the daemon pushes (~50 Hz over one WebSocket); we read that cache, never block
on the network in the control loop, and stream targets with `set_target` (fire and forget). We never start
daemon-side moves (goto_target, play_move): while one runs the daemon silently ignores set_target, and our own
trajectories already give cancel and preempt.

`endpoint` (simulator mode: supervisor.DaemonSupervisor.endpoint) says where our own daemon is, or that there is
none: the link then connects to nothing, even if something else answers on the port.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bolt_ros.robot.reachy_mini.convert import from_sdk, to_sdk
from bolt_ros.robot.reachy_mini.daemon import get_json, post_json

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class Measured:
    pose: np.ndarray  # our six joints, read back from the robot
    joints: np.ndarray  # the robot's actuated joints (convert.REAL_JOINT_NAMES order)
    received: float  # time.monotonic() when we first saw this state


class ReachyLink:
    def __init__(self, host: str, port: int, *, connect_timeout_s: float = 5.0, stale_after_s: float = 2.0,
                 retry_s: float = 1.0, log: Callable[[str], None] = print,
                 endpoint: Callable[[], tuple[str, int] | None] | None = None):
        self.host, self.port = host, port
        self.endpoint = endpoint  # None: host:port, always (the real robot's daemon)
        self.connect_timeout_s, self.stale_after_s, self.retry_s = connect_timeout_s, stale_after_s, retry_s
        self.log = log
        self.error = "not connected yet"  # why there is no robot now, for refused goals
        self.lost_reason = ""  # how the last connection ended, for the goal it aborted
        self.generation = 0  # +1 at every (re)connection: the bridge re-syncs its command to the measured pose
        self._mini = None
        self._lock = threading.Lock()
        self._lost = threading.Event()
        self._closed = threading.Event()
        self._last_raw = None
        self._last = None  # Measured
        self._thread = threading.Thread(target=self._keep_connected, name="reachy-link", daemon=True)

    def start(self) -> ReachyLink:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._lost.set()
        self._thread.join(timeout=self.connect_timeout_s + 2)
        self._drop()

    @property
    def connected(self) -> bool:
        return self._mini is not None

    def measured(self) -> Measured | None:
        """The latest state, or None when not connected. A closed connection (a daemon that exited or crashed) is
        noticed at once; a state that stopped changing for stale_after_s means a daemon that hangs or a network
        that dropped (it pushes ~50 Hz even when the robot is still): either way the link is marked lost."""
        mini = self._mini
        if mini is None:
            return None
        client = mini.client
        recv = getattr(client, "_recv_thread", None)
        if recv is not None and not recv.is_alive():  # the SDK's receiver ends when the WebSocket closes
            self._mark_lost(f"lost the Reachy Mini daemon at {self.host}:{self.port}: its connection closed")
            return None
        # The SDK keeps the last message object; a new object = a new state (its public getters copy it).
        raw = getattr(client, "_last_joint_positions", None)
        now = time.monotonic()
        if raw is not self._last_raw:
            self._last_raw = raw
            head, antennas = raw.head_joint_positions, raw.antennas_joint_positions
            pose = from_sdk(client.get_current_head_pose(), antennas, head[0])
            self._last = Measured(pose, np.array([*head, *antennas], dtype=float), now)
        elif self._last is not None and now - self._last.received > self.stale_after_s:
            self._mark_lost(f"the Reachy Mini daemon at {self.host}:{self.port} stopped answering "
                            f"(no state for {now - self._last.received:.1f} s)")
            return None
        return self._last

    def send(self, pose: np.ndarray, offset: np.ndarray | None = None) -> bool:
        """Stream one target (our pose, already inside our envelope). False when the link is down."""
        mini = self._mini
        if mini is None:
            return False
        head, antennas, body_yaw = to_sdk(pose, offset)
        try:
            mini.set_target(head=head, antennas=antennas, body_yaw=body_yaw)
            return True
        except Exception as e:  # ConnectionError, websockets' ConnectionClosed: the daemon went away
            self._mark_lost(f"lost the Reachy Mini daemon at {self.host}:{self.port}: {type(e).__name__}: {e}")
            return False

    def stop_daemon_moves(self) -> list[str]:
        """Stop every move running inside the daemon (REST /api/move/running, /api/move/stop); their uuids."""
        stopped = []
        try:
            for move in get_json(self.host, self.port, "/api/move/running", timeout=1.0):
                post_json(self.host, self.port, "/api/move/stop", {"uuid": move["uuid"]}, timeout=1.0)
                stopped.append(move["uuid"])
        except (OSError, ValueError) as e:  # it may have ended between the two calls (HTTP 500): nothing to stop
            self.log(f"could not check the daemon's running moves: {e}")
        return stopped

    def _mark_lost(self, why: str) -> None:
        with self._lock:
            if self._mini is None:
                return
            self.error = self.lost_reason = why
            self._mini = None
        self.log(why)
        self._lost.set()

    def _connect(self):
        from reachy_mini import ReachyMini  # the SDK imports GLib: only where a Reachy Mini is driven

        mode = "localhost_only" if self.host in LOCAL_HOSTS else "network"
        # automatic_body_yaw off: the body turns where we say, not where the SDK's IK would put it
        return ReachyMini(host=self.host, port=self.port, connection_mode=mode, media_backend="no_media",
                          timeout=self.connect_timeout_s, automatic_body_yaw=False, log_level="WARNING")

    def _keep_connected(self) -> None:
        while not self._closed.is_set():
            target = self.endpoint() if self.endpoint is not None else (self.host, self.port)
            if target is None:
                self.error = "our simulated Reachy Mini's daemon is not running"
                self._closed.wait(min(self.retry_s, 0.2))  # it comes back within seconds: look often
                continue
            self.host, self.port = target
            try:
                mini = self._connect()
            except Exception as e:  # ConnectionError, TimeoutError, ...: not there (yet); try again
                self.error = (f"cannot reach the Reachy Mini daemon at {self.host}:{self.port} "
                              f"({type(e).__name__}: {e}); retrying every {self.retry_s:g} s")
                self._closed.wait(self.retry_s)
                continue
            with self._lock:
                self._lost.clear()
                self._last_raw = self._last = None
                self._mini = mini
                self.generation += 1
                self.error = ""
            self.log(f"connected to the Reachy Mini daemon at {self.host}:{self.port}")
            self._lost.wait()
            self._disconnect(mini)

    def _drop(self) -> None:
        with self._lock:
            mini, self._mini = self._mini, None
        if mini is not None:
            self._disconnect(mini)

    @staticmethod
    def _disconnect(mini) -> None:
        try:
            mini.client.disconnect()
        except Exception:  # already closed by the daemon's exit
            pass
