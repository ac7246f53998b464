"""Pollen's `reachy-mini-daemon` in MuJoCo as a child process: started headless on a port of our choosing, waited
for until its REST API answers, stopped (SIGTERM, then SIGKILL) when we are done. Used by the robot node
(robot:=reachy_mini_sim, through supervisor.DaemonSupervisor), the tests, the render command and the bench.

A simulator mode must only ever drive the simulator it started: a port someone else listens on may be a real robot's
daemon (USB: 127.0.0.1:8000, the SDK's default). So a start on a taken port fails with who holds it (`holder`), and
a daemon counts as ready only when the process listening on its port is ours (`owns_port`), not merely when
something there answers."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class DaemonError(RuntimeError):
    """The daemon could not be started or did not answer."""


class PortTaken(DaemonError):
    """Someone else listens on the port we were to start our daemon on."""

    def __init__(self, port: int):
        self.port, self.holder = port, holder(port)
        super().__init__(f"port {port} is taken by {self.holder}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_free(port: int) -> bool:
    """No one listens on it (connections of a dead daemon in TIME_WAIT do not count, as for uvicorn's bind)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def listening_pids(port: int) -> set[int | None]:
    """The processes listening on TCP `port` (None for one we may not see: another user's)."""
    import psutil

    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):  # macOS without root: nothing known
        return set()
    return {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


def holder(port: int) -> str:
    """Who listens on `port`, in words: the process, and whether it answers as a Reachy Mini daemon (real or sim)."""
    import psutil

    names = []
    for pid in sorted(listening_pids(port), key=lambda p: p or 0):
        try:
            names.append(f"pid {pid} ({_command(psutil.Process(pid).cmdline())})" if pid else
                         "a process of another user")
        except (psutil.Error, TypeError):
            names.append(f"pid {pid}")
    try:
        status = get_json("127.0.0.1", port, "/api/daemon/status", timeout=0.5)
        sim = status.get("simulation_enabled") if isinstance(status, dict) else None
        what = "a reachy-mini-daemon" + {True: " (simulated)", False: " (a real robot's)"}.get(sim, "")
    except (OSError, ValueError):
        what = "a process that is not a reachy-mini-daemon" if names else "another process"
    return what + (f": {', '.join(names)}" if names else "")


def _command(cmdline: list[str]) -> str:
    """A process's command as a person would name it: programs by their file name, a Python interpreter left out
    ("reachy-mini-daemon --sim --headless ..."), cut at 60 characters."""
    words = [Path(w).name if "/" in w else w for w in cmdline]
    if words and words[0].startswith("python") and len(words) > 1:
        words = words[1:]
    text = " ".join(words)
    return text if len(text) <= 60 else text[:57] + "..."


def daemon_executable() -> str | None:
    """The daemon's console script next to this interpreter (the venv), else on PATH."""
    here = Path(sys.executable).parent / "reachy-mini-daemon"
    return str(here) if here.exists() else shutil.which("reachy-mini-daemon")


def get_json(host: str, port: int, path: str, timeout: float = 1.0):
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as r:
        return json.loads(r.read())


def post_json(host: str, port: int, path: str, body: dict | None = None, timeout: float = 2.0):
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=json.dumps(body or {}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when we die, even by SIGKILL (Linux), so no simulator outlives us."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class SimDaemon:
    """One simulated Reachy Mini. `port=0` picks a free port. sleep_on_stop=False skips the daemon's ~5 s walk to
    its sleep pose at exit (tests)."""

    def __init__(self, port: int = 0, *, sleep_on_stop: bool = True, log_path: str | os.PathLike | None = None,
                 extra_args: tuple[str, ...] = ()):
        self.host, self.port = "127.0.0.1", port or free_port()
        self.sleep_on_stop = sleep_on_stop
        self.log_path = Path(log_path) if log_path else None
        self.extra_args = extra_args
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        exe = daemon_executable()
        if exe is None:
            raise DaemonError("reachy-mini-daemon is not installed (run scripts/setup_reachy_mini.sh)")
        return [exe, "--sim", "--headless", "--no-media", "--dataset-update-interval", "0",
                "--fastapi-port", str(self.port),
                *([] if self.sleep_on_stop else ["--no-goto-sleep-on-stop"]), *self.extra_args]

    def start(self, timeout: float = 60.0) -> SimDaemon:
        if not port_free(self.port):  # else we would wait for, and then drive, whoever holds it
            raise PortTaken(self.port)
        # Telemetry off; MUJOCO_GL unset for the daemon, it renders nothing headless. os.environ is inherited
        # whole: the ROS wheels re-exec Python with LD_LIBRARY_PATH set.
        env = {**os.environ, "REACHY_MINI_TELEMETRY": "0"}
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self._out = out
        # own process group: a Ctrl-C in our terminal reaches us, and we stop the daemon in order
        self.proc = subprocess.Popen(self.command(), env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise DaemonError(f"reachy-mini-daemon exited with status {self.proc.returncode}"
                                  + (f" (log: {self.log_path})" if self.log_path else ""))
            try:
                get_json(self.host, self.port, "/api/state/full")
            except OSError:
                time.sleep(0.2)
                continue
            if self.owns_port():
                return
            # someone took the port between our check and our child's bind: it answers, our child will exit
            self.stop()
            raise PortTaken(self.port)
        self.stop()
        raise DaemonError(f"reachy-mini-daemon did not answer on port {self.port} within {timeout:.0f} s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def owns_port(self) -> bool:
        """Our child (its process group: the console script and whatever it spawned) listens on our port."""
        if not self.alive():
            return False
        for pid in listening_pids(self.port):
            try:
                if pid is not None and os.getpgid(pid) == self.proc.pid:
                    return True
            except ProcessLookupError:
                pass
        return False

    def kill(self) -> None:
        """SIGKILL to its process group, as a crash would (the fault tests)."""
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the group is the daemon and its children
            except ProcessLookupError:
                pass
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # whatever of its group is left
        out = getattr(self, "_out", None)
        if out not in (None, subprocess.DEVNULL):
            out.close()

    def __enter__(self) -> SimDaemon:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
