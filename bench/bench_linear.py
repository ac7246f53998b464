"""QuantLinear schemes on real GGUF tensors: time per call (decode and prefill sizes), memory, fidelity.

    python bench/bench_linear.py [--threads 2] [--no-head] [--model default]

Fidelity: y = layer(x) for x ~ N(0, 1) [8, in] against the exact fp64 product with the dequantized GGUF weight;
`max` = max|dy| / max|y|, `mean` = mean|dy| / mean|y|. For the output head also the log-softmax error in nats
(max over vocab and rows) and top-1 agreement on 64 rows. Times are the best of several runs (ms). `T=1 cold` is
one row through weights that are in no cache (copies of the layer in turn), which is what a decode step meets: the
plain T=1 column repeats one weight that stays in L3.
"""
from __future__ import annotations

import argparse
import time

import torch

from bolt_ros.engine.default_models import resolve_model
from bolt_ros.engine.gguf.quants import as_uint8, type_name
from bolt_ros.engine.gguf.reader import GGUFFile, torch_shape
from bolt_ros.engine.model.linear import QuantLinear, pick_scheme

TENSORS = {
    "default": ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_gate.weight", "blk.0.attn_output.weight",
                "blk.2.ffn_down.weight", "blk.0.ffn_down.weight"],
    "smollm2": ["blk.0.ffn_gate.weight", "blk.0.ffn_down.weight"],
    "default-chat": ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight",
                     "blk.1.ffn_down.weight"],
}
SCHEMES = ("f32", "bf16", "int8", "int4", "int4x2", "blocks")
COLD_BYTES = 96 << 20  # "T=1 cold" cycles through this many bytes of copies: more than the L3 cache of our CPUs


def best_ms(fn, budget_s: float = 0.4, max_runs: int = 30) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    runs = max(3, min(max_runs, int(budget_s / max(one, 1e-6))))
    best = one
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def time_layer(layer: QuantLinear, sizes: list[int]) -> list[float]:
    out = []
    for t in sizes:
        x = torch.randn(t, layer.in_features)
        out.append(best_ms(lambda x=x: layer(x), budget_s=0.3 if t < 64 else 1.0, max_runs=30 if t < 64 else 3))
    return out


def cold_ms(raw, ggml_type: int, shape, scheme: str) -> float:
    """One row through a layer whose weight is not in any cache, as in a decode step (which meets each weight once):
    the mean over copies of the layer, called in turn. A single repeated layer (the T=1 column) stays in L3 and
    flatters the forms with more bytes per weight."""
    first = QuantLinear(raw, ggml_type, shape, scheme=scheme)
    # each copy from its own bytes: the "blocks" form holds a view of them, so copies of one raw would share a cache
    layers = [first] + [QuantLinear(as_uint8(raw).clone(), ggml_type, shape, scheme=scheme)
                        for _ in range(min(31, COLD_BYTES // max(1, first.weight_bytes)))]
    x = torch.randn(1, shape[1])
    for m in layers:
        m(x)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for m in layers:
            m(x)
        best = min(best, (time.perf_counter() - t0) / len(layers))
    return best * 1e3


def fidelity(layer: QuantLinear, exact: torch.Tensor, x: torch.Tensor) -> tuple[float, float]:
    ref = x.double() @ exact.double().t()
    err = (layer(x).double() - ref).abs()
    return float(err.max() / ref.abs().max()), float(err.mean() / ref.abs().mean())


def head_fidelity(layer: QuantLinear, exact: torch.Tensor, x: torch.Tensor) -> tuple[float, float, float]:
    ref = torch.log_softmax(x.double() @ exact.double().t(), -1)  # [R, vocab]
    got = torch.log_softmax(layer(x).double(), -1)
    top1 = float((ref.argmax(-1) == got.argmax(-1)).double().mean())
    top_ref = ref.gather(-1, ref.argmax(-1, keepdim=True))
    top_got = got.gather(-1, ref.argmax(-1, keepdim=True))
    return float((got - ref).abs().max()), float((top_got - top_ref).abs().mean()), top1


def row(cells: list[str], widths: list[int]) -> str:
    return " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def bench_tensor(gf: GGUFFile, name: str, sizes: list[int], head: bool) -> list[list[str]]:
    info = gf.info(name)
    shape = torch_shape(info)
    raw = gf.raw(name)
    exact = QuantLinear(raw, info.ggml_type, shape, policy="exact").weight
    g = torch.Generator().manual_seed(0)
    x8 = torch.randn(8, shape[1], generator=g)
    out = []
    for scheme in SCHEMES:
        try:
            layer = QuantLinear(raw, info.ggml_type, shape, scheme=scheme)
        except ValueError:
            continue  # int4x2 only exists for 5/8-bit types
        times = time_layer(layer, sizes)
        cold = cold_ms(raw, info.ggml_type, shape, scheme) if not head else float("nan")
        mx, mean = fidelity(layer, exact, x8)
        extra = ""
        if head:
            lp_max, lp_top, top1 = head_fidelity(layer, exact, torch.randn(64, shape[1], generator=g))
            extra = f"logp max {lp_max:.3f} / top1-logp mean {lp_top:.4f} nat, top1 {top1:.3f}"
        mark = "*" if pick_scheme(info.ggml_type, shape, "fast", "head" if head else "matrix") == scheme else ""
        out.append([f"{name} {type_name(info.ggml_type)} {shape[0]}x{shape[1]}", scheme + mark,
                    f"{layer.weight_bytes / (shape[0] * shape[1]):.3f}",
                    *[f"{t:.3f}" for t in times], f"{cold:.3f}", f"{mx:.1e}", f"{mean:.1e}", extra])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-head", action="store_true", help="skip the tied output heads (slow to build)")
    ap.add_argument("--model", action="append", help="default, default-chat and/or smollm2 (all if not given)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [1, 8, 512]
    widths = [50, 8, 7, 8, 8, 9, 9, 8, 8, 0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; * = the 'fast' policy's choice")
    header = ["tensor", "scheme", "B/elem", *[f"T={t} ms" for t in sizes], "T=1 cold", "max err", "mean err", ""]
    print(row(header, widths))
    for model in args.model or ["default", "default-chat", "smollm2"]:
        with GGUFFile(resolve_model(model)) as gf:
            for name in TENSORS[model]:
                for r in bench_tensor(gf, name, sizes, head=False):
                    print(row(r, widths), flush=True)
            if model in ("default", "default-chat") and not args.no_head:
                for r in bench_tensor(gf, "token_embd.weight", [1, 8, 64], head=True):
                    print(row(r, widths), flush=True)
                print("(head rows: the T columns are T=1, 8, 64)")


if __name__ == "__main__":
    main()
