"""Single kernels on one thread, hot in cache, timed by the time the thread ran: a measure that holds on a shared
machine, where other processes' load would swamp wall-clock figures of a 2-thread pass.

    python bench/bench_hot.py [--model default-chat] [--matrices blk.0.ffn_up.weight,...] [--rows 8] [--keys 1200]

For each named matrix: `gguf_matmul` at 1 row and at --rows rows, the minimum over --repeats calls of
`time.thread_time()` around the call (the thread's own CPU time: preemption does not count, cache and SMT sharing
still do). Then one layer of `attention_step` with the model's head shapes over --keys cached keys, at 1 and --rows
queries. Compare two commits by running this file from each checkout (a worktree) in turn, a few times each.
"""
from __future__ import annotations

import argparse
import functools
import time

import torch

from bolt_ros.engine.default_models import resolve_model
from bolt_ros.engine.gguf.quants import as_uint8, type_name
from bolt_ros.engine.gguf.reader import GGUFFile, torch_shape
from bolt_ros.kernels.cpu import native


def thread_min(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best * 1e6


def attention_layer(n_head: int, n_kv: int, hd: int, keys: int, t: int, repeats: int) -> float:
    s, pairs = keys + 64, hd // 2
    kc, vc = torch.randn(n_kv, s, hd), torch.randn(n_kv, s, hd)
    pos = torch.full((s,), -1, dtype=torch.long)
    pos[:keys] = torch.arange(keys)
    qkv = torch.randn(t, (n_head + 2 * n_kv) * hd)
    cos, sin = torch.randn(t, pairs), torch.randn(t, pairs)
    positions = torch.arange(keys, keys + t)
    return thread_min(lambda: native.attention_step(
        qkv, n_head, n_kv, hd, bias=None, q_norm=None, k_norm=None, v_norm=False, eps=1e-6, cos=cos, sin=sin,
        neox=True, k_cache=kc, v_cache=vc, slot_pos=pos, write=True, positions=positions, ring=False,
        n_scan=keys + t, window=0, scale=hd ** -0.5), repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default-chat")
    ap.add_argument("--matrices", default="blk.0.ffn_up.weight,blk.0.attn_q.weight,blk.0.ffn_down.weight,"
                                          "blk.11.ffn_down.weight")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--keys", type=int, default=1200)
    ap.add_argument("--repeats", type=int, default=60)
    args = ap.parse_args()
    torch.set_num_threads(1)
    gf = GGUFFile(resolve_model(args.model))
    print(f"{args.model}, 1 thread, kernel level {native.level()}; thread-time minima of {args.repeats} calls, us")
    for name in args.matrices.split(","):
        info = gf.tensors[name]
        n, k = torch_shape(info)
        w = as_uint8(gf.raw(name)).clone()
        us = [thread_min(functools.partial(native.gguf_matmul, torch.randn(m, k), w, info.ggml_type, n),
                         args.repeats) for m in (1, args.rows)]
        print(f"{name:26s} {type_name(info.ggml_type):5s} {n}x{k}: 1 row {us[0]:7.0f}  {args.rows} rows "
              f"{us[1]:7.0f}  ratio {us[1] / us[0]:.2f}")
    md = gf.metadata
    arch = md["general.architecture"]
    n_head, n_kv = int(md[f"{arch}.attention.head_count"]), int(md[f"{arch}.attention.head_count_kv"])
    hd = int(md.get(f"{arch}.attention.key_length") or int(md[f"{arch}.embedding_length"]) // n_head)
    us = [attention_layer(n_head, n_kv, hd, args.keys, t, args.repeats) for t in (1, args.rows)]
    print(f"attention {n_head}/{n_kv} heads x {hd}, {args.keys} keys, a layer: 1 query row {us[0]:7.0f}  "
          f"{args.rows} rows {us[1]:7.0f}  ratio {us[1] / us[0]:.2f}")


if __name__ == "__main__":
    main()
