"""Setup's llama.cpp referee check (bolt_ros/devtools/llamacpp_referee.py) and crash reports (llamacpp.py).

On an Intel Xeon with AMX, llama.cpp b11434's AMX repack path dies (SIGILL in llama-bench, SIGSEGV in llama-server).
These tests do not need such a machine: stand-in binaries die with those signals, so the fallback is exercised on any
CPU, and the real build (wrapped, so the record lands in a temporary folder) shows the normal build is kept.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from bolt_ros.devtools.llamacpp import LlamaCppFailure, LlamaServer, describe_exit, llama_bin_dir, signal_of
from bolt_ros.devtools.llamacpp_referee import (
    BUILDS,
    NO_AMX,
    RUNTIMES,
    Smoke,
    ensure,
    load_record,
    next_step,
    smoke_models,
)

REAL = llama_bin_dir()
needs_llama = pytest.mark.skipif(REAL is None, reason="llama.cpp is installed by scripts/setup_env.sh")
BINARIES = ("llama-bench", "llama-server", "llama-completion")


def _write_bins(folder: Path, body: str) -> Path:
    folder.mkdir(parents=True)
    for name in BINARIES:
        p = folder / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return folder


def crashing_bins(folder: Path, sig: str = "ILL") -> Path:
    """Dies as llama.cpp's AMX path does: a start-up log, then a signal."""
    return _write_bins(folder, 'echo "load_tensors:          AMX model buffer size =     9.00 MiB" >&2\n'
                               f'echo "ggml_backend_amx_mul_mat: tilezero" >&2\nkill -{sig} $$\n')


def wrapped_real_bins(folder: Path) -> Path:
    """The real llama.cpp behind wrappers, so that its record is written under `folder`, not beside the real
    binaries."""
    folder.mkdir(parents=True)
    for name in BINARIES:
        p = folder / name
        p.write_text(f'#!/bin/sh\nexec "{REAL / name}" "$@"\n')
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return folder


@pytest.fixture(scope="module")
def models() -> list[Path]:
    return smoke_models()


def test_choice_logic():
    ok, crash = Smoke("llama-bench q4_0", True, False), Smoke("llama-bench q4_k_m", False, True, "CRASHED SIGILL")
    failure = Smoke("llama-bench q8_0", False, False, "failed with exit code 1: unknown model architecture")
    assert next_step("native", "repack", [ok, ok]).action == "keep"
    step = next_step("native", "repack", [ok, crash])
    assert (step.action, step.build, step.runtime) == ("rebuild", "native-no-amx", "repack")
    step = next_step("native-no-amx", "repack", [crash])
    assert (step.action, step.build, step.runtime) == ("runtime", "native-no-amx", "no-repack")
    assert next_step("native-no-amx", "no-repack", [crash]).action == "fail"
    # a failure that is not a crash is never papered over by a fallback
    assert next_step("native", "repack", [crash, failure]).action == "fail"


def test_crash_is_reported_as_a_crash():
    assert signal_of(-4).name == "SIGILL" and signal_of(139).name == "SIGSEGV" and signal_of(1) is None
    msg = describe_exit(["/x/llama-bench", "-m", "m.gguf"], -4, "line 1\nggml_backend_amx_mul_mat\n")
    assert msg.startswith("llama-bench CRASHED with SIGILL (signal 4")
    assert "command: /x/llama-bench -m m.gguf" in msg and msg.rstrip().endswith("ggml_backend_amx_mul_mat")
    assert "CRASHED" not in describe_exit(["llama-bench"], 1, "error: bad model")  # negative control


def test_llama_server_that_crashes_names_the_signal(tmp_path, models):
    bins = crashing_bins(tmp_path / "bin", "SEGV")
    with pytest.raises(LlamaCppFailure) as e:
        with LlamaServer(models[0], bindir=bins, runtime="repack"):
            pass
    assert e.value.crashed
    text = str(e.value)
    assert "llama-server CRASHED with SIGSEGV" in text and str(bins / "llama-server") in text
    assert "ggml_backend_amx_mul_mat: tilezero" in text  # the log's last lines


@needs_llama
def test_sigill_stand_in_takes_the_no_amx_fallback(tmp_path, models):
    rebuilt: list[str] = []

    def rebuild(build: str) -> Path:  # stands in for the ~10 min pip rebuild: the "new build" is the real one
        rebuilt.append(build)
        return wrapped_real_bins(tmp_path / "rebuilt" / "bin")

    logs: list[str] = []
    rec = ensure(crashing_bins(tmp_path / "amx" / "bin"), models=models, rebuild=rebuild, log=logs.append)
    assert rebuilt == ["native-no-amx"]
    assert (rec["build"], rec["runtime"]) == ("native-no-amx", "repack")  # repacking, llama.cpp's fast path, kept
    assert rec["history"][0]["decision"]["action"] == "rebuild"
    assert any("CRASHED with SIGILL" in line for line in logs)
    assert load_record(tmp_path / "rebuilt" / "bin") == rec


@needs_llama
def test_working_build_is_kept(tmp_path, models):
    def rebuild(build: str):
        raise AssertionError(f"a working build must not be rebuilt (asked for {build})")

    bins = wrapped_real_bins(tmp_path / "bin")
    rec = ensure(bins, models=models, rebuild=rebuild, log=lambda s: None)
    assert (rec["build"], rec["runtime"], rec["args"]) == ("native", "repack", RUNTIMES["repack"])
    results = rec["history"][0]["results"]
    assert len(results) == len(models) + 1 and all(r["ok"] for r in results)
    # checked once per build and CPU: the second call reads the record
    assert ensure(bins, models=models, rebuild=rebuild, log=lambda s: None) == rec


def test_smoke_models_hold_each_quantized_type(models):
    from collections import Counter

    from bolt_ros.engine.gguf.reader import GGUFFile
    seen = Counter()
    for m in models:
        f = GGUFFile(m)
        seen.update(t.type_name for t in f.tensors.values())
        f.close()
    assert {"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0"} <= set(seen)


@pytest.mark.parametrize("with_flags", [True, False])
def test_no_amx_flags_remove_amx_from_a_native_build(with_flags):
    """The fallback's flags do what it claims under GCC: -march of an AMX CPU (sapphirerapids) stands in for
    -march=native there; explicit -mno-amx-* win over it, and every other feature stays (AVX-512, VNNI, BF16)."""
    flags = BUILDS["native-no-amx"][1].split("=", 1)[1].split() if with_flags else []
    assert not with_flags or " ".join(flags) == NO_AMX
    out = subprocess.run(["gcc", "-march=sapphirerapids", *flags, "-dM", "-E", "-"], input="", capture_output=True,
                         text=True, check=True, env=dict(os.environ, LC_ALL="C")).stdout
    assert ("__AMX_INT8__" in out) is not with_flags and ("__AMX_TILE__" in out) is not with_flags
    assert "__AVX512F__" in out and "__AVX512VNNI__" in out and "__AVX512BF16__" in out
