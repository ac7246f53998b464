"""Decode speed when another process wants a core, as on a robot where speech recognition and synthesis run beside
the language model: `bolt bench` tg at --threads threads, alone and beside one busy process, under each OpenMP wait
policy of our kernels' runtime (`OMP_WAIT_POLICY` unset = GOMP's spinning default, `passive` = sleep at once).

    python bench/bench_contention.py [--model default-chat] [--threads 2] [--gen-tokens 64] [--rounds 2] [--json F]

Why it matters: a parallel region ends at a barrier, and a decode step runs ~100 of them. With every core taken, a
spinning thread holds the core its descheduled partner needs to reach the barrier, so each region can wait a
scheduler time slice. Same statistic everywhere: bench's mean tok/s over its repeats, conditions in turn per round.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

POLICIES = {"spin (default)": {}, "passive": {"OMP_WAIT_POLICY": "passive"}}


def tg(model: str, threads: int, n: int, env: dict) -> float:
    cmd = [sys.executable, "-m", "bolt_ros.cli", "bench", "--model", model, "--threads", str(threads),
           "--prompt-tokens", "0", "--gen-tokens", str(n), "--repeats", "5", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=600, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])[f"tg{n}_tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default-chat")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    res: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for busy in (False, True):
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
            try:
                for name, env in POLICIES.items():
                    key = f"{name}, {'beside a busy process' if busy else 'alone'}"
                    res.setdefault(key, []).append(tg(args.model, args.threads, args.gen_tokens, env))
            finally:
                if hog:
                    hog.kill()
    for key, v in res.items():
        rounds = ", ".join(f"{x:.1f}" for x in v)
        print(f"{key:40s} tg{args.gen_tokens} {sum(v) / len(v):6.1f} tok/s  (rounds: {rounds})")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "threads": args.threads, "tok_s": res}, indent=1))


if __name__ == "__main__":
    main()
