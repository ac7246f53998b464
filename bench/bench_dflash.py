"""DFlash on CPU: tokens per target pass and wall-clock speedup vs plain decoding, plus the greedy losslessness check.

    python bench/bench_dflash.py [--target default] [--draft D.gguf] [--tokens 64] [--threads N] [--n-max 7]

Without --draft a random drafter (5 layers, the test-model writer) is written for the target first. A random drafter
is accepted almost never, so this measures the *cost* side: one drafter pass plus one B-row verify pass per committed
token, against one single-token pass in plain decoding. Greedy output with and without the drafter must be equal.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from bolt_ros.devtools.testmodel import write_random_model
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.engine.default_models import resolve_model

PROMPT = "The robot arm moved slowly toward the red cube on the table, and then"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="default", help="target GGUF or a default-model name (Gemma 3 270M)")
    ap.add_argument("--draft", help="drafter GGUF (default: write a random 5-layer drafter for the target)")
    ap.add_argument("--layers", type=int, default=5, help="layers of the random drafter")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--n-max", type=int, default=None, help="drafts per step (default block_size-1)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    target = resolve_model(args.target)
    tmp = tempfile.TemporaryDirectory()
    draft = args.draft
    if draft is None:
        draft = str(Path(tmp.name) / "random-drafter.gguf")
        t0 = time.perf_counter()
        write_random_model(draft, "dflash", target=target, layers=args.layers, seed=0)
        print(f"wrote a random {args.layers}-layer drafter in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    engine = Engine.load(target, draft=None, n_ctx=1024)
    from bolt_ros.engine.decode.dflash import attach_drafter
    attach_drafter(engine, draft, n_max=args.n_max)
    ids = engine.tok.encode(PROMPT, add_bos=engine.tok.add_bos)
    params = SamplingParams(max_tokens=args.tokens)

    engine.generate(ids[:4], SamplingParams(max_tokens=2), use_draft=False)  # warm-up
    plain = engine.generate(ids, params, use_draft=False)
    spec = engine.generate(ids, params)
    out = {
        "target": Path(target).name, "draft": Path(draft).name, "threads": torch.get_num_threads(),
        "prompt_tokens": len(ids), "completion_tokens": len(spec.completion_ids),
        "greedy_equal": plain.completion_ids == spec.completion_ids,
        "plain_decode_tok_s": round(plain.timings.decode_tok_s, 2),
        "spec_decode_tok_s": round(spec.timings.decode_tok_s, 2),
        "speedup": round(spec.timings.decode_tok_s / plain.timings.decode_tok_s, 3)
        if plain.timings.decode_tok_s else None,
        "plain_ms_per_token": round(1e3 * plain.timings.decode_s / max(1, plain.timings.decode_tokens), 2),
        "spec": spec.spec,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:>20}: {v}")
    if not out["greedy_equal"]:
        first = next(i for i, (a, b) in enumerate(zip(plain.completion_ids, spec.completion_ids)) if a != b)
        print(f"MISMATCH at completion token {first}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
