"""The C GGUF kernel at 1 row (a decode step) and at M rows (a DFlash verify block), per GGUF type, in GB/s of weight
bytes against the machine's copy bandwidth.

    python bench/bench_rows.py [--model default-chat] [--threads 2] [--rows 8] [--json F] [--png F]

The kernel's instruction-set level is printed (BOLT_CPU_LEVEL lowers it), and beside our engine ratio llama.cpp's own on
the same model and threads: an 8-token batch against one decoded token, 8 * tg / pp8 from `llama-bench -p 8 -n 32`
(the same statistic: the cost of a pass of 8 rows over the cost of a step).

Every matrix of the model whose type has a vectorized kernel goes through `gguf_matmul` once per pass, in the form the
engine holds it (Q5_0, Q4_K and Q6_K tiled on the vectorized levels, the Q8_0 head as Q4_0 tiles), as a decode step
meets them (the model is larger than the L3 cache, so the bytes come from memory), at 1 row and at --rows rows; a
type's time is the best of --repeats passes. Then the engine: a whole decode step (1 row) against a verify pass
(--rows rows, every row's logits) from the same cache position, medians. Copy bandwidth: the best of several
`Tensor.copy_` of 512 MiB with the same threads (bytes read + written). The head is its own line (`output.weight`,
or the tied embedding).
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import time
from collections import defaultdict
from pathlib import Path

import torch

from bolt_ros.engine.default_models import resolve_model
from bolt_ros.engine.gguf.quants import type_name
from bolt_ros.engine.gguf.reader import GGUFFile, torch_shape
from bolt_ros.engine.model.linear import QuantLinear
from bolt_ros.kernels.cpu import native


def copy_gbps(mib: int = 512, repeats: int = 5) -> float:
    src = torch.ones(mib << 18)  # fp32
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.numel() * 4 / best / 1e9


def matrices(gf: GGUFFile) -> list[tuple[str, int, tuple[int, int], torch.Tensor]]:
    tied = "output.weight" not in gf.tensors
    out = []
    for name, info in gf.tensors.items():
        shape = torch_shape(info)
        if len(shape) != 2 or not native.gguf_matmul_fast(info.ggml_type):
            continue
        if name == "token_embd.weight" and not tied:
            continue  # an embedding table is read a row at a time, not multiplied
        group = "head" if name in ("output.weight", "token_embd.weight") else type_name(info.ggml_type)
        # in the form the engine holds it (QuantLinear: tiles, a head requantized to Q4_0 tiles)
        q = QuantLinear(gf.raw(name), info.ggml_type, shape, role="head" if group == "head" else "matrix")
        if q.scheme in ("blocks", "q4_0"):
            out.append((group, q.blocks_type, shape, q.blocks))
    return out


def time_pass(mats, xs: dict[int, torch.Tensor]) -> dict[str, float]:
    t: dict[str, float] = defaultdict(float)
    for group, ty, shape, raw in mats:
        t0 = time.perf_counter()
        native.gguf_matmul(xs[shape[1]], raw, ty, shape[0])
        t[group] += time.perf_counter() - t0
    return t


def engine_ratio(model: str, threads: int, rows: int, n: int = 15) -> dict:
    """A whole step at 1 row (plain decoding) and at `rows` rows with every row's logits (a DFlash verify pass) on
    an assistant prompt, in turn from the same cache position; medians, ms."""
    import statistics

    from bolt_ros.engine.decode.generate import Engine
    from bolt_ros.train.prompts import HELD_OUT, assistant_prompt_ids

    engine = Engine.load(model, threads=threads)
    gc.collect()
    gc.freeze()  # as a node process does once built (nodes/common.tune_interpreter): no full pass over the model
    session = engine.new_session()
    prompt = assistant_prompt_ids(engine, HELD_OUT[0])
    engine.forward(session, prompt)
    block = prompt[-rows:]  # any tokens: the cost does not depend on them
    times: dict[int, list[float]] = {1: [], rows: []}
    for i in range(n + 2):
        for m in (1, rows):
            t0 = time.perf_counter()
            engine.forward(session, block[:m], logits="last" if m == 1 else "all")
            if i >= 2:  # the first two: warm-up
                times[m].append(time.perf_counter() - t0)
            session.truncate(len(prompt))
    step, verify = (statistics.median(times[m]) * 1e3 for m in (1, rows))
    return {"prompt_tokens": len(prompt), "step_ms": step, "verify_ms": verify, "ratio": verify / step}


KERNEL_FLAGS = frozenset({"avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                          "avx512_bf16", "amx_int8", "amx_bf16"})


def llama_ratio(model: str, threads: int, rows: int, repeats: int = 5) -> dict | None:
    """llama.cpp's own cost of a `rows`-token batch over one decoded token (llama-bench pp`rows` and tg32)."""
    import bench_engine

    rec = bench_engine.referee()
    res = bench_engine.llama(resolve_model(model), rows, 32, threads, repeats, rec)
    if not res:
        return None
    pp, tg = res[f"pp{rows}_tok_s"], res["tg32_tok_s"]
    return {"pp_tok_s": pp, "tg_tok_s": tg, "ratio": rows * tg / pp, "cpu_features": res["cpu_features"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default-chat")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if not native.available():
        raise SystemExit("the C kernels are not built here (no compiler, or BOLT_NATIVE=0)")
    copy = copy_gbps()
    with GGUFFile(resolve_model(args.model)) as gf:
        mats = matrices(gf)
        g = torch.Generator().manual_seed(0)
        xs = {m: {k: torch.randn(m, k, generator=g) for k in {s[1] for _, _, s, _ in mats}} for m in (1, args.rows)}
        best: dict[int, dict[str, float]] = {}
        for m in (1, args.rows):
            time_pass(mats, xs[m])  # warm-up: builds the library, faults the mmap in
        for _ in range(args.repeats):  # in turn, so both row counts meet the same machine state
            for m in (1, args.rows):
                t = time_pass(mats, xs[m])
                best[m] = {k: min(v, best.get(m, {}).get(k, float("inf"))) for k, v in t.items()}
    size: dict[str, int] = defaultdict(int)
    for group, _, _, raw in mats:
        size[group] += raw.numel()
    one, many = best[1], best[args.rows]
    rows = [{"type": k, "MB": size[k] / 1e6, "ms_1": one[k] * 1e3, f"ms_{args.rows}": many[k] * 1e3,
             "GBps_1": size[k] / one[k] / 1e9, f"GBps_{args.rows}": size[k] / many[k] / 1e9,
             "ratio": many[k] / one[k]} for k in sorted(one, key=lambda k: -size[k])]
    total = {"ms_1": sum(one.values()) * 1e3, f"ms_{args.rows}": sum(many.values()) * 1e3}
    total["ratio"] = total[f"ms_{args.rows}"] / total["ms_1"]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    print(f"{args.model}, {cpu}, {args.threads} threads; copy bandwidth {copy:.1f} GB/s (read + write); kernel level "
          f"{native.level()} (flags {' '.join(sorted(native.cpu_flags() & KERNEL_FLAGS))})")
    print(f"{'type':8s} {'MB':>7s} {'M=1 ms':>8s} {'GB/s':>6s} {f'M={args.rows} ms':>8s} {'GB/s':>6s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['type']:8s} {r['MB']:7.1f} {r['ms_1']:8.2f} {r['GBps_1']:6.1f} {r[f'ms_{args.rows}']:8.2f} "
              f"{r[f'GBps_{args.rows}']:6.1f} {r['ratio']:6.2f}")
    print(f"{'all':8s} {sum(size.values()) / 1e6:7.1f} {total['ms_1']:8.2f} {'':6s} {total[f'ms_{args.rows}']:8.2f} "
          f"{'':6s} {total['ratio']:6.2f}")
    eng = engine_ratio(args.model, args.threads, args.rows)
    print(f"engine, {eng['prompt_tokens']}-token prompt: a step {eng['step_ms']:.1f} ms, a {args.rows}-row verify pass "
          f"{eng['verify_ms']:.1f} ms (medians): {eng['ratio']:.2f}x")
    ref = llama_ratio(args.model, args.threads, args.rows)
    if ref:
        print(f"llama.cpp, same model and threads: pp{args.rows} {ref['pp_tok_s']:.1f} tok/s, tg32 "
              f"{ref['tg_tok_s']:.1f} tok/s: a {args.rows}-token batch costs {ref['ratio']:.2f}x a decoded token "
              f"({ref['cpu_features']})")
    result = {"model": args.model, "engine": eng, "llama_cpp": ref, "cpu": cpu, "level": native.level(),
              "flags": sorted(native.cpu_flags() & KERNEL_FLAGS), "threads": args.threads, "rows": args.rows,
              "copy_GBps": copy, "types": rows, "total": total}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.png:
        plot(result, args.png)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = result["rows"]
    types = [r["type"] for r in result["types"]]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = range(len(types))
    ax.bar([x - 0.2 for x in xs], [r["GBps_1"] for r in result["types"]], 0.4, label="1 row (decode)")
    ax.bar([x + 0.2 for x in xs], [r[f"GBps_{m}"] for r in result["types"]], 0.4, label=f"{m} rows (verify)")
    ax.axhline(result["copy_GBps"], color="k", ls="--", lw=1, label="copy bandwidth (read + write)")
    ax.set_xticks(list(xs), types)
    ax.set_ylabel("weight GB/s")
    ax.set_title(f"{result['model']}: C GGUF kernel, {result['threads']} threads ({result['cpu']})", fontsize=9)
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
