"""Where a decode step and a prefill spend their time: the head, linears by GGUF type and form, attention, norms and
the rest, and the host's own share (Python, dispatch: wall time not covered by any op).

    python bench/profile_engine.py [--models default default-chat] [--threads 2] [--prompt-tokens 512] [--json F]

torch.profiler records every aten op; forward hooks (installed by this script only) label each QuantLinear call
with its role, GGUF type and form, so op time is attributed to `head`, `linear Q4_K/int4` etc. Decode: the mean of
`--steps` single-token steps after a short prompt; prefill: one `--prompt-tokens` prompt. Shares are of the profiled
wall time; the unprofiled time is printed beside (the profiler's per-op cost lands in the host share).
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.gguf.quants import type_name
from bolt_ros.engine.model.linear import QuantLinear


def _label_linears(model) -> list:
    handles = []
    for m in model.modules():
        if not isinstance(m, QuantLinear):
            continue
        label = "head" if m.role == "head" else f"linear {type_name(m.ggml_type)}/{m.scheme}"
        ctx = {}

        def pre(mod, inp, label=label, ctx=ctx):
            ctx["rf"] = record_function(f"@{label}")
            ctx["rf"].__enter__()

        def post(mod, inp, out, ctx=ctx):
            ctx["rf"].__exit__(None, None, None)

        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    return handles


_ATTENTION = ("bmm", "softmax", "scaled_dot_product", "masked_fill", "_flash_attention")
_NORM = ("rsqrt", "pow", "mean")


def _group(op: str) -> str:
    name = op.removeprefix("aten::")
    if any(k in name for k in _ATTENTION):
        return "attention (bmm/softmax/SDPA)"
    if any(k in name for k in _NORM):
        return "norms"
    if name in ("gelu", "silu", "tanh", "mul", "add", "sub", "div", "cat", "copy_", "index_put_", "clone", "cos",
                "sin", "neg", "to", "_to_copy", "stack", "where", "index", "index_select", "lt", "ge", "le",
                "bitwise_and", "arange", "remainder", "contiguous"):
        return "elementwise / copies"
    return "other ops"


def _attribute(prof, wall_ms: float, n: int) -> dict[str, float]:
    """ms per step by group: labelled ranges first (linears, head), the remaining ops by kind, and the host's share."""
    by: dict[str, float] = defaultdict(float)
    events = prof.events()
    ranges = [e for e in events if e.name.startswith("@")]
    for r in ranges:
        by[r.name[1:]] += r.cpu_time_total / 1e3 / n
    # ops outside the labelled ranges: their self time, grouped by kind (top-level ops only)
    labelled_ids = set()

    def mark(e):
        for c in e.cpu_children:
            labelled_ids.add(id(c))
            mark(c)

    for r in ranges:
        mark(r)
    for e in events:
        if e.name.startswith("@") or id(e) in labelled_ids or e.cpu_parent is not None:
            continue
        by[_group(e.name)] += e.cpu_time_total / 1e3 / n
    accounted = sum(by.values())
    by["host (Python, dispatch)"] = max(0.0, wall_ms / n - accounted)
    return dict(sorted(by.items(), key=lambda kv: -kv[1]))


def profile_model(name: str, threads: int, prompt_tokens: int, steps: int) -> dict:
    engine = Engine.load(name, n_ctx=max(1024, prompt_tokens + steps + 16), threads=threads)
    handles = _label_linears(engine.model)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(1000, 20000, (prompt_tokens,), generator=g).tolist()
    out = {"model": engine.gguf.path.name, "threads": torch.get_num_threads()}
    # decode: warm up, then profile `steps` single-token steps
    s = engine.new_session()
    tok = int(engine.prefill(s, prompt[:16]).argmax())
    for _ in range(3):
        tok = int(engine.forward(s, [tok]).argmax())
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = int(engine.forward(s, [tok]).argmax())
    out["decode_ms_per_token_unprofiled"] = round((time.perf_counter() - t0) * 1e3 / steps, 3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            tok = int(engine.forward(s, [tok]).argmax())
        wall = (time.perf_counter() - t0) * 1e3
    out["decode_ms_per_token"] = round(wall / steps, 3)
    out["decode"] = {k: round(v, 3) for k, v in _attribute(prof, wall, steps).items()}
    # prefill: one prompt
    engine.prefill(engine.new_session(), prompt[:64])  # warm-up of the GEMM path
    t0 = time.perf_counter()
    engine.forward(engine.new_session(), prompt)
    out["prefill_ms_unprofiled"] = round((time.perf_counter() - t0) * 1e3, 1)
    s = engine.new_session()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        engine.forward(s, prompt)
        wall = (time.perf_counter() - t0) * 1e3
    out["prefill_ms"] = round(wall, 1)
    out["prefill_tok_s"] = round(prompt_tokens / wall * 1e3, 1)
    out["prefill"] = {k: round(v, 2) for k, v in _attribute(prof, wall, 1).items()}
    for h in handles:
        h.remove()
    return out


def _print(res: dict) -> None:
    print(f"\n{res['model']}, {res['threads']} threads")
    for phase, total, unit, plain in (("decode", res["decode_ms_per_token"], "ms/token",
                                       res["decode_ms_per_token_unprofiled"]),
                                      ("prefill", res["prefill_ms"], "ms/prompt", res["prefill_ms_unprofiled"])):
        print(f"  {phase}: {total} {unit} profiled ({plain} unprofiled: the profiler's own cost is in 'host')")
        for k, v in res[phase].items():
            print(f"    {k:<34} {v:>9.2f} ms  {100 * v / total:5.1f} %")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["default", "default-chat"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = [profile_model(m, args.threads, args.prompt_tokens, args.steps) for m in args.models]
    for r in results:
        _print(r)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
