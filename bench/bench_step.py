"""A decode step and a DFlash verify pass on one thread, timed by the thread's own CPU time: the engine-level A/B that
holds on a shared machine (other processes' load does not count, as in bench_hot.py for single kernels).

    python bench/bench_step.py [--models default-chat default] [--rows 8] [--prompt-tokens 1100] [--repeats 25]

Per model: a text prompt (docs/performance.md's own words) prefilled once, then from the same cache position a
1-token step and a --rows verify pass with every row's logits, each the minimum of --repeats. Compare two commits by
running this file from each checkout (a worktree, PYTHONPATH first) in turn, a few times each.
"""
from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

import torch

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.default_models import resolve_model

TEXT = Path(__file__).resolve().parents[1] / "docs" / "performance.md"


def step_and_verify(model: str, rows: int, prompt_tokens: int, repeats: int) -> tuple[float, float]:
    eng = Engine.load(resolve_model(model), n_ctx=prompt_tokens + 64, threads=1)
    gc.collect()
    gc.freeze()  # as a node process does once built (nodes/common.tune_interpreter): no full pass over the model
    ids = eng.tok.encode(TEXT.read_text(), add_bos=eng.tok.add_bos)[:prompt_tokens + rows]
    if len(ids) < prompt_tokens + rows:
        raise SystemExit(f"{TEXT} has fewer than {prompt_tokens + rows} tokens for {model}")
    s = eng.new_session()
    eng.prefill(s, ids[:prompt_tokens])
    best = {}
    for m in (1, rows):
        b = float("inf")
        for _ in range(repeats):
            s.truncate(prompt_tokens)
            t0 = time.thread_time()
            eng.forward(s, ids[prompt_tokens:prompt_tokens + m], logits="all")
            b = min(b, time.thread_time() - t0)
        best[m] = b * 1e3
    return best[1], best[rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["default-chat", "default"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=1100)
    ap.add_argument("--repeats", type=int, default=25)
    args = ap.parse_args()
    torch.set_num_threads(1)
    for model in args.models:
        step, verify = step_and_verify(model, args.rows, args.prompt_tokens, args.repeats)
        print(f"{model}: step {step:.2f} ms, {args.rows}-row verify {verify:.2f} ms, ratio {verify / step:.2f} "
              f"(1 thread, thread-time minima of {args.repeats})")


if __name__ == "__main__":
    main()
