"""Fused dequantize + matmul straight from GGUF blocks: y[M, N] = x[M, K] @ W[N, K]^T.

Three launch shapes, one dequantizer (`_dequant_tile`):
  M == 1        GEMV: each program streams BLOCK_N weight rows once and reduces with elementwise FMAs;
  2 <= M <= 16  small-M (DFlash verify block): tl.dot with a 16-row query tile, so every weight byte is read once
                for the whole block and M=8 costs about what M=1 does;
  M > 16        GEMM (prefill): tl.dot with 64-row tiles.
Weights are dequantized in [BLOCK_N, G, SUB] tiles where SUB elements share one scale, so the scale bytes are read
once per SUB elements instead of once per element.
"""
from __future__ import annotations

import torch

from ._triton import tl, triton
from .quant_ref import BLOCKS, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, check_raw, dequantize_torch

SMALL_M = 16  # the largest M served by the small-M path (DFlash verify blocks are k+1 <= 16 tokens)


@triton.jit
def _f16_at(w16_ptr, byte_off, mask):
    # fp16 field at an even byte offset -> fp32 (w16_ptr is the same buffer viewed as fp16)
    return tl.load(w16_ptr + byte_off // 2, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _byte_at(w_ptr, byte_off, mask):
    return tl.load(w_ptr + byte_off, mask=mask, other=0).to(tl.int32)


@triton.jit
def _kquant_scale_min(w_ptr, sc_off, j, mask):
    # 6-bit (scale, min) of sub-block j (0..7) from the 12-byte Q4_K/Q5_K pack; llama.cpp get_scale_min_k4
    a = _byte_at(w_ptr, sc_off + j + 4, mask)
    c = _byte_at(w_ptr, sc_off + (j & 3), mask)
    qj = _byte_at(w_ptr, sc_off + j, mask)
    lo = j < 4
    scale = tl.where(lo, c & 63, (a & 15) | ((c >> 6) << 4))
    mn = tl.where(lo, a & 63, (a >> 4) | ((qj >> 6) << 4))
    return scale.to(tl.float32), mn.to(tl.float32)


@triton.jit
def _dequant_tile(w_ptr, w16_ptr, rows, row_bytes, n_rows, sub0, n_sub,
                  TYPE: tl.constexpr, BB: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, SUB: tl.constexpr):
    """Weights of rows `rows` [BLOCK_N], scale groups sub0..sub0+G-1 -> fp32 [BLOCK_N, G, SUB] (0 outside).

    TYPE is the ggml type and BB its block bytes; the branches are resolved at compile time (Triton allows at most
    two operands per `and`/`or`, hence the `<` tests on the type ids 2, 3, 6, 7 < 8 = Q8_0 < 12, 13 < 14 = Q6_K).
    """
    r = rows[:, None, None].to(tl.int64) * row_bytes  # [BN, 1, 1] byte offset of each row
    s = sub0 + tl.arange(0, G)[None, :, None]  # [1, G, 1] scale-group index within the row
    lane = tl.arange(0, SUB)[None, None, :]  # [1, 1, SUB]
    gm = (rows < n_rows)[:, None, None] & (s < n_sub)  # [BN, G, 1]
    m = gm & (lane < SUB)  # [BN, G, SUB]
    if TYPE == 8:  # Q8_0: d, int8[32]
        base = r + s * BB
        q = tl.load(w_ptr + base + 2 + lane, mask=m, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        w = _f16_at(w16_ptr, base, gm) * q
    elif TYPE < 8:  # Q4_0 / Q4_1 / Q5_0 / Q5_1: d, (m), (qh u32), qs[16]; 32-element blocks
        base = r + s * BB
        q = (_byte_at(w_ptr, base + BB - 16 + (lane % 16), m) >> ((lane // 16) * 4)) & 15
        if TYPE > 5:  # Q5_0 / Q5_1: fifth bit = bit `lane` of the little-endian u32 qh just before qs
            q = q | (((_byte_at(w_ptr, base + BB - 20 + lane // 8, m) >> (lane % 8)) & 1) << 4)
        d = _f16_at(w16_ptr, base, gm)
        if TYPE == 3 or TYPE == 7:  # with a min: w = d * q + m
            w = d * q.to(tl.float32) + _f16_at(w16_ptr, base + 2, gm)
        elif TYPE == 2:
            w = d * (q - 8).to(tl.float32)
        else:
            w = d * (q - 16).to(tl.float32)
    elif TYPE < 14:  # Q4_K / Q5_K: d, dmin, scales[12], (qh[32]), qs[128]; 8 groups of 32
        j = s % 8
        base = r + (s // 8) * BB
        scale, mn = _kquant_scale_min(w_ptr, base + 4, j, gm)
        q = (_byte_at(w_ptr, base + BB - 128 + (j // 2) * 32 + lane, m) >> ((j % 2) * 4)) & 15
        if TYPE == 13:
            q = q | (((_byte_at(w_ptr, base + 16 + lane, m) >> j) & 1) << 4)
        w = (_f16_at(w16_ptr, base, gm) * scale) * q.to(tl.float32) - _f16_at(w16_ptr, base + 2, gm) * mn
    else:  # Q6_K: ql[128], qh[64], int8 scales[16], d; 16 groups of 16
        t = s % 16
        base = r + (s // 16) * BB
        half = t // 8
        quarter = (t // 2) % 4
        col = (t % 2) * 16 + lane  # position inside the 32-wide ql/qh rows
        ql = (_byte_at(w_ptr, base + half * 64 + (quarter % 2) * 32 + col, m) >> ((quarter // 2) * 4)) & 15
        qh = (_byte_at(w_ptr, base + 128 + half * 32 + col, m) >> (quarter * 2)) & 3
        scale = tl.load(w_ptr + base + 192 + t, mask=gm, other=0).to(tl.int8, bitcast=True).to(tl.float32)
        w = (_f16_at(w16_ptr, base + 208, gm) * scale) * ((ql | (qh << 4)) - 32).to(tl.float32)
    return w


@triton.jit
def _qgemv_kernel(x_ptr, w_ptr, w16_ptr, out_ptr, N, K, row_bytes, stride_xm, stride_om,
                  TYPE: tl.constexpr, BB: tl.constexpr, SUB: tl.constexpr, BLOCK_N: tl.constexpr,
                  G: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_sub = K // SUB
    acc = tl.zeros([BLOCK_N, G, SUB], dtype=tl.float32)
    for sub0 in range(0, n_sub, G):
        w = _dequant_tile(w_ptr, w16_ptr, rows, row_bytes, N, sub0, n_sub, TYPE, BB, BLOCK_N, G, SUB)
        kk = (sub0 + tl.arange(0, G))[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [G, SUB]
        x = tl.load(x_ptr + pid_m * stride_xm + kk, mask=kk < K, other=0.0).to(tl.float32)
        acc += w * x[None, :, :]
    out = tl.sum(tl.sum(acc, axis=2), axis=1)  # [BN]
    tl.store(out_ptr + pid_m * stride_om + rows, out.to(out_ptr.dtype.element_ty), mask=rows < N)


@triton.jit
def _qmm_kernel(x_ptr, w_ptr, w16_ptr, out_ptr, M, N, K, row_bytes, stride_xm, stride_om,
                TYPE: tl.constexpr, BB: tl.constexpr, SUB: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, G: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_sub = K // SUB
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for sub0 in range(0, n_sub, G):
        w = _dequant_tile(w_ptr, w16_ptr, rows, row_bytes, N, sub0, n_sub, TYPE, BB, BLOCK_N, G, SUB)
        w = tl.reshape(w, [BLOCK_N, G * SUB])  # [BN, BK]
        kk = sub0 * SUB + tl.arange(0, G * SUB)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :],
                    mask=(offs_m < M)[:, None] & (kk < K)[None, :], other=0.0)  # [BM, BK]
        acc = tl.dot(x, tl.trans(w.to(x.dtype)), acc)
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + rows[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m < M)[:, None] & (rows < N)[None, :])


def default_config(m: int, n: int, k: int, ggml_type: int) -> dict:
    """Tile sizes per path; BLOCK_K = G * SUB elements per loop step (a multiple of every block size used)."""
    if m == 1:
        return {"BLOCK_N": 8, "BLOCK_K": 256, "num_warps": 4}
    if m <= SMALL_M:
        return {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4}
    return {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4}


def qmatmul_triton(x: torch.Tensor, raw_blocks: torch.Tensor, ggml_type: int, n: int, k: int, *,
                   config: dict | None = None) -> torch.Tensor:
    """x [..., k] @ dequant(raw_blocks)[n, k]^T -> [..., n] in x.dtype (fp32 accumulation)."""
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, weight has K={k}")
    raw = check_raw(raw_blocks, ggml_type, n, k)
    if raw.device != x.device:
        raise ValueError(f"x on {x.device} but packed weights on {raw.device}")
    x2 = x.reshape(-1, k).contiguous()  # [M, K]
    m = x2.shape[0]
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    _, block_bytes, sub = BLOCKS[ggml_type]
    cfg = {**default_config(m, n, k, ggml_type), **(config or {})}
    g = cfg["BLOCK_K"] // sub
    w16 = raw.view(torch.float16)  # every block size is even, so fp16 fields are 2-aligned
    common = dict(TYPE=ggml_type, BB=block_bytes, SUB=sub, BLOCK_N=cfg["BLOCK_N"], G=g, num_warps=cfg["num_warps"])
    if m == 1 and "BLOCK_M" not in (config or {}):
        grid = (triton.cdiv(n, cfg["BLOCK_N"]), 1)
        _qgemv_kernel[grid](x2, raw, w16, out, n, k, raw.shape[1], x2.stride(0), out.stride(0), **common)
    else:
        bm = cfg.get("BLOCK_M", 16)
        grid = (triton.cdiv(n, cfg["BLOCK_N"]), triton.cdiv(m, bm))
        _qmm_kernel[grid](x2, raw, w16, out, m, n, k, raw.shape[1], x2.stride(0), out.stride(0), BLOCK_M=bm,
                          **common)
    return out.reshape(*x.shape[:-1], n)


def qmatmul_torch(x: torch.Tensor, raw_blocks: torch.Tensor, ggml_type: int, n: int, k: int) -> torch.Tensor:
    """Reference: dequantize to fp32, then a plain matmul."""
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, weight has K={k}")
    w = dequantize_torch(raw_blocks, ggml_type, n, k)  # [N, K] fp32
    return (x.float() @ w.T).to(x.dtype)


SUPPORTED_TYPES = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
