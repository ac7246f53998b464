"""Attention over a KV cache: decode (one query token), causal prefill, and the DFlash non-causal block.

Layouts (any strides; the last dim must be contiguous):
  q        [T, Hq, D]          queries at absolute positions start .. start+T-1
  k, v     [Hkv, S, D]         cache slot p holds position p; keys 0 .. start+T-1 are valid
GQA: query head h reads kv head h // (Hq // Hkv). `scale` multiplies q.k (Gemma 4: 1.0, Gemma 3: 256**-0.5).
`window` > 0 keeps only keys with 0 <= q_pos - k_pos < window (sliding layers); in the non-causal DFlash block keys
after the query (inside the block) stay visible. Softmax runs in fp32 with an online (flash) rescale.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._triton import tl, triton
from .visibility import Span

_LOG2E = 1.4426950408889634
_NO_WINDOW = 1 << 30  # passed as the window of full-attention layers: keeps the kernels branch-free


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_kv: int) -> tuple[int, int, int, int]:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"expected q [T, Hq, D], k/v [Hkv, S, D]; got {tuple(q.shape)}, {tuple(k.shape)}")
    t, hq, d = q.shape
    hkv, s, dk = k.shape
    if dk != d or v.shape != k.shape:
        raise ValueError(f"head dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if hq % hkv:
        raise ValueError(f"{hq} query heads are not a multiple of {hkv} kv heads")
    if t == 0:
        raise ValueError("attention needs at least one query")
    if not 0 < n_kv <= s:
        raise ValueError(f"{n_kv} valid keys do not fit a cache of {s} slots")
    return t, hq, hkv, d


def attend_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The torch attention every path shares: q [T, Hq, D] over k/v [Hkv, S, D] with mask [T, S] bool (True =
    visible) or None -> [T, Hq, D] in q.dtype. sinks [Hq]: one extra logit per head that takes probability mass but
    carries no value (DFlash drafters)."""
    t, hq, d = q.shape
    hkv, s = k.shape[0], k.shape[1]
    qh = q.transpose(0, 1)  # [Hq, T, D]
    if t > 1:  # the model's rows are [T, Hq, D]: SDPA and bmm want each head's rows contiguous (a strided q costs more)
        qh = qh.contiguous()
    k, v = k.to(q.dtype), v.to(q.dtype)
    if sinks is None and t > 16:  # prefill: the fused SDPA kernel wins
        out = F.scaled_dot_product_attention(qh[None], k[None], v[None], attn_mask=mask, scale=scale,
                                             enable_gqa=hkv != hq)[0]
        return out.transpose(0, 1)
    # decode / verify blocks: a few batched matmuls beat SDPA's per-call overhead (heads h*g..h*g+g-1 share kv h)
    g = hq // hkv
    sc = torch.bmm(qh.reshape(hkv, g * t, d), k.transpose(1, 2)) * scale  # [Hkv, g*T, S]
    if mask is not None:
        sc = sc.view(hkv, g, t, s).masked_fill(~mask, float("-inf")).view(hkv, g * t, s)
    if sinks is None:
        p = torch.softmax(sc, dim=-1)
    else:
        sink = sinks.to(sc.dtype).view(hkv, g, 1, 1).expand(hkv, g, t, 1).reshape(hkv, g * t, 1)
        p = torch.softmax(torch.cat((sc, sink), dim=-1), dim=-1)[..., :-1]
    return torch.bmm(p, v).view(hq, t, d).transpose(0, 1)


def attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, *,
                    causal: bool = True, window: int = 0) -> torch.Tensor:
    """Reference for every kernel entry point: [T, Hq, D] out in q.dtype."""
    t = q.shape[0]
    _check(q, k, v, start + t)
    span = Span(start, start + t, window, causal, q.device)
    return attend_masked(q, k[:, : span.end], v[:, : span.end], span.mask(), scale)


def attention_decode_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_ctx: int, scale: float, *,
                           window: int = 0) -> torch.Tensor:
    """q [Hq, D] at position n_ctx-1 over keys 0..n_ctx-1 -> [Hq, D]."""
    return attention_torch(q[None], k, v, n_ctx - 1, scale, causal=True, window=window)[0]


def attention_prefill_torch(q, k, v, start: int, scale: float, *, window: int = 0) -> torch.Tensor:
    return attention_torch(q, k, v, start, scale, causal=True, window=window)


def attention_block_torch(q, k, v, start: int, scale: float, *, window: int = 0) -> torch.Tensor:
    return attention_torch(q, k, v, start, scale, causal=False, window=window)


# ----------------------------------------------------------------------------------------------------------------
# prefill / DFlash block: one program per (BLOCK_M queries, query head)


@triton.jit
def _attn_fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, T, start, window, qk_scale,
                     sq_t, sq_h, sk_h, sk_s, sv_h, sv_s, so_t, so_h,
                     GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    q_pos = start + offs_m  # [BM]
    q = tl.load(q_ptr + offs_m[:, None] * sq_t + h * sq_h + offs_d[None, :],
                mask=(offs_m < T)[:, None] & dmask[None, :], other=0.0)  # [BM, BD]
    n_kv = start + T
    hi = n_kv
    if CAUSAL:
        hi = tl.minimum(n_kv, start + (pid_m + 1) * BLOCK_M)
    # skip key blocks no query of this tile can see (window is a huge sentinel when there is none)
    lo = tl.maximum(0, start + pid_m * BLOCK_M - window + 1) // BLOCK_N * BLOCK_N
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: a fully masked tile gives exp2(-inf)=0, not NaN
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for s0 in range(lo, hi, BLOCK_N):
        k_pos = s0 + tl.arange(0, BLOCK_N)
        kv_mask = (k_pos < n_kv)[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kvh * sk_h + k_pos[:, None] * sk_s + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale  # [BM, BN] in log2 units
        rel = q_pos[:, None] - k_pos[None, :]
        vis = (k_pos < n_kv)[None, :] & (rel < window)
        if CAUSAL:
            vis = vis & (rel >= 0)
        s = tl.where(vis, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kvh * sv_h + k_pos[:, None] * sv_s + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    l_i = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_i[:, None]
    tl.store(o_ptr + offs_m[:, None] * so_t + h * so_h + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=(offs_m < T)[:, None] & dmask[None, :])


def _fwd_config(d: int) -> tuple[int, int, int]:
    # (BLOCK_M, BLOCK_N, num_warps): the fp32 accumulator is BLOCK_M x D, so wide heads take shorter tiles
    return (32, 32, 8) if d > 256 else (64, 32, 4)


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, *,
                     causal: bool = True, window: int = 0) -> torch.Tensor:
    t, hq, hkv, d = _check(q, k, v, start + q.shape[0])
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("attention kernels need a contiguous head dim")
    out = torch.empty_like(q)
    bm, bn, warps = _fwd_config(d)
    grid = (triton.cdiv(t, bm), hq)
    _attn_fwd_kernel[grid](q, k, v, out, t, start, window if window > 0 else _NO_WINDOW, scale * _LOG2E,
                           q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                           out.stride(0), out.stride(1),
                           GROUP=hq // hkv, D=d, BLOCK_D=triton.next_power_of_2(d), CAUSAL=causal,
                           BLOCK_M=bm, BLOCK_N=bn, num_warps=warps)
    return out


def attention_prefill_triton(q, k, v, start: int, scale: float, *, window: int = 0) -> torch.Tensor:
    """Causal prefill of T queries at start.. (keys of the chunk must already be in the cache)."""
    return attention_triton(q, k, v, start, scale, causal=True, window=window)


def attention_block_triton(q, k, v, start: int, scale: float, *, window: int = 0) -> torch.Tensor:
    """DFlash block: every block query sees the injected context (< start) and the whole block."""
    return attention_triton(q, k, v, start, scale, causal=False, window=window)


# ----------------------------------------------------------------------------------------------------------------
# decode: split-K (flash-decoding). One program per (kv head, key split) serves all GROUP query heads of that kv
# head with a tl.dot; a second kernel merges the splits' partial softmaxes.


@triton.jit
def _decode_partial_kernel(q_ptr, k_ptr, v_ptr, m_ptr, l_ptr, acc_ptr, lo, n_kv, split_len, qk_scale,
                           sq_h, sk_h, sk_s, sv_h, sv_s, n_splits,
                           GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_S: tl.constexpr):
    kvh = tl.program_id(0)
    split = tl.program_id(1)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    heads = kvh * GROUP + offs_g  # [BG] query heads of this kv head
    gmask = offs_g < GROUP
    q = tl.load(q_ptr + heads[:, None] * sq_h + offs_d[None, :], mask=gmask[:, None] & dmask[None, :], other=0.0)
    s_lo = lo + split * split_len
    s_hi = tl.minimum(n_kv, s_lo + split_len)
    m_i = tl.full([BLOCK_G], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    for s0 in range(s_lo, s_hi, BLOCK_S):
        k_pos = s0 + tl.arange(0, BLOCK_S)
        kmask = k_pos < s_hi
        kv_mask = kmask[:, None] & dmask[None, :]
        k = tl.load(k_ptr + kvh * sk_h + k_pos[:, None] * sk_s + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k.to(q.dtype))) * qk_scale  # [BG, BS]
        s = tl.where(kmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kvh * sv_h + k_pos[:, None] * sv_s + offs_d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    part = heads * n_splits + split  # [BG] row of (head, split) in the partial buffers
    tl.store(m_ptr + part, m_i, mask=gmask)
    tl.store(l_ptr + part, l_i, mask=gmask)
    tl.store(acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=gmask[:, None] & dmask[None, :])


@triton.jit
def _decode_merge_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, so_h, n_splits,
                         D: tl.constexpr, BLOCK_DC: tl.constexpr, BLOCK_SPLITS: tl.constexpr):
    # one program per (query head, chunk of BLOCK_DC dims): keeps the [splits, dims] tile small for 512-wide heads
    h = tl.program_id(0)
    offs_s = tl.arange(0, BLOCK_SPLITS)
    offs_d = tl.program_id(1) * BLOCK_DC + tl.arange(0, BLOCK_DC)
    smask = offs_s < n_splits
    m = tl.load(m_ptr + h * n_splits + offs_s, mask=smask, other=-1.0e30)
    l_s = tl.load(l_ptr + h * n_splits + offs_s, mask=smask, other=0.0)
    acc = tl.load(acc_ptr + (h * n_splits + offs_s)[:, None] * D + offs_d[None, :],
                  mask=smask[:, None] & (offs_d < D)[None, :], other=0.0)  # [SPLITS, BDC]
    w = tl.exp2(m - tl.max(m, axis=0))  # empty splits carry m = -1e30 and l = 0: weight 0
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l_s * w, axis=0)
    tl.store(o_ptr + h * so_h + offs_d, out.to(o_ptr.dtype.element_ty), mask=offs_d < D)


def decode_splits(n_keys: int, n_kv_heads: int, block_s: int = 32) -> int:
    """Enough key splits to give ~128 programs (a GPU's worth of SMs) without splits shorter than 2 blocks."""
    return max(1, min(triton.cdiv(n_keys, 2 * block_s), max(1, 128 // n_kv_heads)))


def attention_decode_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_ctx: int, scale: float, *,
                            window: int = 0, n_splits: int | None = None) -> torch.Tensor:
    """q [Hq, D] at position n_ctx-1 over cached keys 0..n_ctx-1 -> [Hq, D]."""
    _, hq, hkv, d = _check(q[None], k, v, n_ctx)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("attention kernels need a contiguous head dim")
    group = hq // hkv
    lo = max(0, n_ctx - window) if window > 0 else 0
    block_s = 32
    splits = n_splits or decode_splits(n_ctx - lo, hkv, block_s)
    split_len = triton.cdiv(triton.cdiv(n_ctx - lo, splits), block_s) * block_s
    m = torch.empty((hq, splits), dtype=torch.float32, device=q.device)
    l_s = torch.empty_like(m)
    acc = torch.empty((hq, splits, d), dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(d)
    _decode_partial_kernel[(hkv, splits)](q, k, v, m, l_s, acc, lo, n_ctx, split_len, scale * _LOG2E,
                                          q.stride(0), k.stride(0), k.stride(1), v.stride(0), v.stride(1), splits,
                                          GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), D=d,
                                          BLOCK_D=block_d, BLOCK_S=block_s, num_warps=4 if d <= 256 else 8)
    out = torch.empty_like(q)
    block_dc = min(block_d, 128)
    _decode_merge_kernel[(hq, triton.cdiv(d, block_dc))](m, l_s, acc, out, out.stride(0), splits, D=d,
                                                         BLOCK_DC=block_dc,
                                                         BLOCK_SPLITS=max(2, triton.next_power_of_2(splits)))
    return out


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
