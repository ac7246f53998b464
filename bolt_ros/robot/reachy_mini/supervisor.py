"""Our simulated Reachy Mini's daemon, kept running: started on the port asked for (or, when someone else holds it,
on a free one, or not at all: `port_taken`), restarted when it dies, with a bound on restarts and a back-off, and
the only daemon a simulator-mode link may connect to (`endpoint`).

A daemon that died is restarted after backoff_s, then 2x, 4x, ... up to backoff_max_s; after max_restarts deaths
without a stable run (stable_s) in between it is given up on, and says so. Goals in flight are the link's business:
the daemon's WebSocket closes with it, the link notices at once and the bridge aborts the goal with the reason.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bolt_ros.robot.reachy_mini.daemon import DaemonError, PortTaken, SimDaemon, free_port, port_free

PortPolicy = Literal["free_port", "error"]


@dataclass(frozen=True)
class Restarts:
    max_restarts: int = 5  # deaths in a row (no stable run between them) before we give up
    backoff_s: float = 1.0  # wait before the first restart; doubled for each further one
    backoff_max_s: float = 30.0
    stable_s: float = 60.0  # a daemon that ran this long resets the count


class DaemonSupervisor:
    def __init__(self, port: int = 0, *, port_taken: PortPolicy = "free_port", restarts: Restarts = Restarts(),
                 sleep_on_stop: bool = True, log_path: str | None = None, start_timeout_s: float = 60.0,
                 info: Callable[[str], None] = print, error: Callable[[str], None] = print,
                 status: Callable[[str], None] = lambda _s: None):
        self.port, self.port_taken, self.restarts = port, port_taken, restarts
        self.sleep_on_stop, self.log_path, self.start_timeout_s = sleep_on_stop, log_path, start_timeout_s
        self.info, self.error, self.status = info, error, status  # status: plain words for the person
        self.daemon: SimDaemon | None = None
        self.restart_count = 0  # restarts done over our whole life (tests, the log)
        self.gave_up = False
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="reachy-daemon-supervisor", daemon=True)

    # ---- what the node uses ----------------------------------------------------------------------------------
    def start(self) -> DaemonSupervisor:
        """Start the first daemon now (DaemonError when it cannot: the node then stops with that error), then
        watch it."""
        self._launch(first=True)
        self._thread.start()
        return self

    def endpoint(self) -> tuple[str, int] | None:
        """(host, port) of our daemon while it runs and listens on its port; None otherwise (nothing to connect to:
        whoever may hold the port now is not ours)."""
        d = self.daemon
        return (d.host, d.port) if d is not None and d.owns_port() else None

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            d = self.daemon
        if d is not None:
            d.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)

    # ---- inside ----------------------------------------------------------------------------------------------
    def _choose_port(self) -> int:
        """The port asked for when it is free; else a free one (port_taken: free_port) or PortTaken (error)."""
        if self.port == 0:
            return free_port()
        if port_free(self.port):
            return self.port
        taken = PortTaken(self.port)
        if self.port_taken == "error":
            raise taken
        port = free_port()
        self.info(f"{taken}: the simulator runs on port {port} instead (we never drive a daemon we did not start)")
        self.status(f"port {self.port} is taken by {taken.holder}; my simulator runs on port {port} instead")
        return port

    def _launch(self, *, first: bool) -> None:
        port = self._choose_port()
        d = SimDaemon(port, sleep_on_stop=self.sleep_on_stop, log_path=self.log_path)
        with self._lock:
            if self._closed.is_set():
                return
            self.daemon = d
        self.info(f"{'starting' if first else 'restarting'} reachy-mini-daemon in MuJoCo (headless) on port {port}")
        d.start(self.start_timeout_s)

    def _watch(self) -> None:
        deaths, since = 0, time.monotonic()
        while not self._closed.is_set():
            d = self.daemon
            if d is not None and d.alive():
                self._closed.wait(0.1)
                continue
            if self._closed.is_set():
                return
            status = d.proc.returncode if d is not None and d.proc is not None else None
            deaths = 1 if time.monotonic() - since >= self.restarts.stable_s else deaths + 1
            if deaths > self.restarts.max_restarts:
                self.gave_up = True
                self.error(f"reachy-mini-daemon died {deaths} times in a row; not restarting it again "
                           f"(restart the program; daemon log: {self.log_path or 'discarded'})")
                self.status("my simulated body stopped for good; restart me to get it back")
                return
            delay = min(self.restarts.backoff_s * 2 ** (deaths - 1), self.restarts.backoff_max_s)
            self.error(f"reachy-mini-daemon exited (status {status}); restart {deaths} of at most "
                       f"{self.restarts.max_restarts} in {delay:g} s")
            self.status("my simulated body stopped; restarting it")
            if self._closed.wait(delay):
                return
            try:
                self._launch(first=False)
                self.restart_count += 1
                since = time.monotonic()
            except DaemonError as e:  # PortTaken (policy error), a daemon that would not start: counts as a death
                if not self._closed.is_set():  # (closing kills a daemon that is starting: not a failure)
                    self.error(f"restarting reachy-mini-daemon failed: {e}")
