"""The CPU attention step (kernels/cpu/attention_step.c) against its reference, the composition of torch ops that
`ops.self_attention` runs everywhere else: bias, per-head norms, RoPE, the cache write and masked softmax attention.

Real layer caches (kv_cache.LayerCache), position-indexed and sliding rings past their wrap-around, full and partial
rotation in both pair layouts, GQA, Qwen2's biases, Gemma's q/k norms and Gemma 4's weightless v norm and shared
(read-only) layers, steps of 1 and of a DFlash-sized block.

Tolerance: the rotation and the cache copies are the reference's own fp32 operations in its order, so K without a
norm and V without one are compared bit for bit. The norms and the softmax sum 32-64 terms in another order: fp32
rounding (u = 6e-8) over n terms bounds the relative difference by ~n*u ~ 4e-6 per sum; 3e-5 leaves room for the
two sums chained in a norm and the exp rescale, and is still 100x below the smallest effect checked here (a key
moved out of the window changes the output by > 1e-2).
"""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from bolt_ros.engine.model.kv_cache import LayerCache
from bolt_ros.kernels import ops
from bolt_ros.kernels.cpu import native
from bolt_ros.kernels.rope import RopeAngles

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernels are not built")
TOL = 3e-5


def _heads(n_head=4, n_kv=2, hd=32, writes=True, bias=False, qk_norm=False, v_norm=False, window=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    width = n_head * hd + (2 * n_kv * hd if writes else 0)
    return ops.AttnHeads(
        n_head, n_kv, hd, writes, torch.randn(width, generator=g) if bias else None,
        torch.rand(hd, generator=g) + 0.5 if qk_norm else None,
        torch.rand(hd, generator=g) + 0.5 if qk_norm and writes else None, v_norm, 1e-6, hd ** -0.5, window)


def _angles(positions: torch.Tensor, hd: int, pairs: int, style: str) -> RopeAngles:
    inv = 1e4 ** (-torch.arange(0, 2 * pairs, 2, dtype=torch.float64) / (2 * pairs))
    return RopeAngles(positions, inv, inv.float(), style)


def _vis(cache: LayerCache, positions: torch.Tensor, window: int) -> ops.Visibility:
    """What Transformer.visibility gives: a span over a position-indexed cache, a mask over a ring."""
    if not cache.ring:
        return ops.Span(int(positions[0]), int(positions[-1]) + 1, window)
    kpos = cache.slot_positions_after(positions)
    q = positions[:, None]
    allowed = (kpos[None, :] >= 0) & (kpos[None, :] <= q)
    if window > 0:
        allowed &= (q - kpos[None, :]) < window
    return ops.Masked(allowed, cache.n_slots)


def _step(heads, cache, qkv, positions, pairs, style, *, native_on: bool, monkeypatch):
    monkeypatch.setattr(ops, "_native_attention_fits", lambda *a: native_on)
    angles = _angles(positions, heads.head_dim, pairs, style)
    return ops.self_attention(qkv, heads, cache, positions, angles, _vis(cache, positions, heads.window))


def _filled(heads, n_slots, ring, history, seed):
    """A cache holding `history` positions written through the reference (on a ring: wrapped around)."""
    g = torch.Generator().manual_seed(seed)
    cache = LayerCache(heads.n_kv, n_slots, heads.head_dim, torch.float32, ring)
    for p in range(history):
        k = torch.randn(heads.n_kv, 1, heads.head_dim, generator=g)
        cache.write(k, torch.randn(heads.n_kv, 1, heads.head_dim, generator=g), torch.tensor([p]))
    return cache


def _clone(c: LayerCache) -> LayerCache:
    out = LayerCache(c.k.shape[0], c.n_slots, c.k.shape[2], c.k.dtype, c.ring)
    out.k.copy_(c.k), out.v.copy_(c.v), out.pos.copy_(c.pos)
    return out


CASES = {
    "gemma3-like decode": dict(heads=dict(n_head=4, n_kv=1, hd=64, qk_norm=True), T=1, pairs=32, style="neox"),
    "qwen2-like verify block": dict(heads=dict(n_head=4, n_kv=2, hd=32, bias=True), T=8, pairs=16, style="neox"),
    "llama pairs, partial rotation": dict(heads=dict(n_head=2, n_kv=2, hd=32), T=3, pairs=8, style="norm"),
    "gemma4 v norm, sliding window": dict(heads=dict(n_head=4, n_kv=2, hd=32, qk_norm=True, v_norm=True, window=8),
                                          T=4, pairs=16, style="neox"),
    "sliding ring past wrap-around": dict(heads=dict(n_head=2, n_kv=1, hd=32, window=8), T=3, pairs=16, style="neox",
                                          ring=8 + 8),
    "shared layer (reads only)": dict(heads=dict(n_head=4, n_kv=2, hd=32, writes=False, qk_norm=True), T=2,
                                      pairs=16, style="neox"),
}


@pytest.mark.parametrize("name", CASES)
def test_native_step_equals_the_composed_ops(name, monkeypatch):
    c = CASES[name]
    heads = _heads(**c["heads"])
    hd, T, history = heads.head_dim, c["T"], 37
    ring = c.get("ring")
    base = _filled(heads, ring or 64, ring is not None, history, seed=1)
    width = heads.n_head * hd + (2 * heads.n_kv * hd if heads.writes_kv else 0)
    qkv = torch.randn(T, width, generator=torch.Generator().manual_seed(2)) * 3
    start = history if heads.writes_kv else history - T  # a shared layer's queries are already in its source cache
    positions = torch.arange(start, start + T)
    ref_cache, nat_cache = _clone(base), _clone(base)
    ref = _step(heads, ref_cache, qkv, positions, c["pairs"], c["style"], native_on=False, monkeypatch=monkeypatch)
    out = _step(heads, nat_cache, qkv, positions, c["pairs"], c["style"], native_on=True, monkeypatch=monkeypatch)
    assert out.shape == ref.shape == (T, heads.n_head * hd)
    assert torch.allclose(out, ref, rtol=TOL, atol=TOL), (out - ref).abs().max()
    assert torch.equal(nat_cache.pos, ref_cache.pos)
    exact_k = heads.k_norm is None
    assert torch.equal(nat_cache.k, ref_cache.k) if exact_k else torch.allclose(nat_cache.k, ref_cache.k, atol=TOL)
    assert torch.equal(nat_cache.v, ref_cache.v) if not heads.v_norm else torch.allclose(nat_cache.v, ref_cache.v,
                                                                                         atol=TOL)
    if not heads.writes_kv:
        assert torch.equal(nat_cache.k, base.k) and torch.equal(nat_cache.v, base.v)


def test_the_window_and_the_cache_rule_matter(monkeypatch):
    """Negative controls: without its window the same step attends to more keys (the output moves by far more than
    TOL), and a slot marked empty (-1, as a rollback leaves it) is not read."""
    heads = _heads(n_head=2, n_kv=1, hd=32, window=4)
    base = _filled(heads, 64, False, 20, seed=3)
    qkv = torch.randn(1, 4 * 32, generator=torch.Generator().manual_seed(4))
    pos = torch.tensor([20])
    windowed = _step(heads, _clone(base), qkv, pos, 16, "neox", native_on=True, monkeypatch=monkeypatch)
    whole = _step(replace(heads, window=0), _clone(base), qkv, pos, 16, "neox", native_on=True,
                  monkeypatch=monkeypatch)
    assert (windowed - whole).abs().max() > 1e-2
    # a slot marked empty inside the window: on a ring, where the reference masks by slot positions too (a
    # position-indexed cache never holds an empty slot below its end: truncate clears only what gets rewritten)
    ring = _filled(heads, 64, True, 20, seed=3)
    assert torch.equal(ring.k, base.k)
    windowed = _step(heads, _clone(ring), qkv, pos, 16, "neox", native_on=True, monkeypatch=monkeypatch)
    emptied = _clone(ring)
    emptied.pos[18] = -1
    gone = _step(heads, emptied, qkv, pos, 16, "neox", native_on=True, monkeypatch=monkeypatch)
    ref = _step(heads, _clone(emptied), qkv, pos, 16, "neox", native_on=False, monkeypatch=monkeypatch)
    assert (gone - windowed).abs().max() > 1e-2
    assert torch.allclose(gone, ref, rtol=TOL, atol=TOL)


def test_bad_positions_are_refused_before_anything_is_written():
    heads = _heads(n_head=2, n_kv=1, hd=32)
    cache = _filled(heads, 16, False, 4, seed=5)
    before = _clone(cache)
    qkv = torch.randn(2, 4 * 32)
    angles = _angles(torch.tensor([15, 16]), 32, 16, "neox")
    cos, sin = angles.cos_sin()
    with pytest.raises(ValueError, match="attention_step refused"):
        native.attention_step(qkv, 2, 1, 32, bias=None, q_norm=None, k_norm=None, v_norm=False, eps=1e-6, cos=cos,
                              sin=sin, neox=True, k_cache=cache.k, v_cache=cache.v, slot_pos=cache.pos, write=True,
                              positions=torch.tensor([15, 16]), ring=False, n_scan=16, window=0,
                              scale=1 / math.sqrt(32))
    assert torch.equal(cache.k, before.k) and torch.equal(cache.pos, before.pos)


@pytest.mark.parametrize("n_head, n_kv, hd, window, spread", [(14, 2, 64, 0, 1.0), (14, 2, 64, 40, 30.0),
                                                              (4, 1, 256, 0, 1.0), (6, 3, 32, 0, 1.0)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_verify_block_equals_its_single_steps_bit_for_bit(n_head, n_kv, hd, window, spread, threads):
    """The kernel runs all the queries of a kv head together (T rows x the group's heads, in groups of a few per key
    tile), so a row's neighbours change with T; each query's arithmetic must not (greedy DFlash == plain decoding).
    Qwen2.5 0.5B's shapes (7 queries a kv head at one row, 56 at eight: groups with remainders), a window, scores
    spread so far apart that weights underflow to 0 (skipped keys), a head of 256 and one of 32."""
    g = torch.Generator().manual_seed(7)
    n_slots, history, T = 160, 101, 8
    kc, vc = torch.randn(n_kv, n_slots, hd, generator=g) * spread, torch.randn(n_kv, n_slots, hd, generator=g)
    pos = torch.full((n_slots,), -1, dtype=torch.long)
    pos[:history] = torch.arange(history)
    qkv = torch.randn(T, (n_head + 2 * n_kv) * hd, generator=g) * 2
    cos, sin = torch.rand(T, hd // 2, generator=g), torch.rand(T, hd // 2, generator=g)
    positions = torch.arange(history, history + T)

    def run(rows, k, v, p):
        return native.attention_step(
            qkv[rows], n_head, n_kv, hd, bias=None, q_norm=None, k_norm=None, v_norm=False, eps=1e-6,
            cos=cos[rows], sin=sin[rows], neox=True, k_cache=k, v_cache=v, slot_pos=p, write=True,
            positions=positions[rows], ring=False, n_scan=history + T, window=window, scale=hd ** -0.5)

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        block = run(slice(0, T), kc.clone(), vc.clone(), pos.clone())
        k, v, p = kc.clone(), vc.clone(), pos.clone()
        steps = torch.cat([run(slice(t, t + 1), k, v, p) for t in range(T)])
    finally:
        torch.set_num_threads(before)
    assert torch.equal(block, steps), (block - steps).abs().max()
