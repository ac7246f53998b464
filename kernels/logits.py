"""Final logit softcap (cap * tanh(x / cap), Gemma) fused with greedy argmax.

Returns (capped logits, argmax ids). Ties pick the lowest index, as torch.argmax does. The vocabulary (262144 for
Gemma) is split into chunks so a single row still spreads over the whole GPU; chunk winners merge on the host side
with two tiny torch ops. cap <= 0 means no softcap.
"""
from __future__ import annotations

import torch

from ._triton import tl, triton
from .activation import _tanh

_CHUNK = 4096


def softcap_argmax_torch(logits: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [M, V] -> (capped [M, V] in logits.dtype, ids [M] int64)."""
    x = logits.float()
    capped = (cap * torch.tanh(x / cap) if cap > 0 else x).to(logits.dtype)
    return capped, capped.argmax(dim=-1)


@triton.jit
def _softcap_argmax_kernel(x_ptr, o_ptr, pv_ptr, pi_ptr, V, n_chunks, cap, inv_cap,
                           HAS_CAP: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    best_v = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    best_i = tl.zeros([BLOCK], dtype=tl.int32)
    for off in range(0, CHUNK, BLOCK):
        idx = chunk * CHUNK + off + tl.arange(0, BLOCK)
        mask = idx < V
        x = tl.load(x_ptr + row * V + idx, mask=mask, other=0.0).to(tl.float32)
        if HAS_CAP:
            x = cap * _tanh(x * inv_cap)
        y = x.to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + row * V + idx, y, mask=mask)
        y = tl.where(mask, y.to(tl.float32), float("-inf"))
        take = y > best_v  # strict: each lane keeps its earliest maximum
        best_v = tl.where(take, y, best_v)
        best_i = tl.where(take, idx, best_i)
    m = tl.max(best_v, axis=0)
    first = tl.min(tl.where(best_v == m, best_i, 2147483647), axis=0)
    tl.store(pv_ptr + row * n_chunks + chunk, m)
    tl.store(pi_ptr + row * n_chunks + chunk, first)


def softcap_argmax_triton(logits: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    if logits.dim() != 2:
        raise ValueError(f"expected logits [M, V], got {tuple(logits.shape)}")
    x = logits.contiguous()
    m, v = x.shape
    if m == 0 or v == 0:
        raise ValueError(f"empty logits {tuple(x.shape)}")
    out = torch.empty_like(x)
    n_chunks = triton.cdiv(v, _CHUNK)
    part_v = torch.empty((m, n_chunks), dtype=torch.float32, device=x.device)
    part_i = torch.empty((m, n_chunks), dtype=torch.int32, device=x.device)
    _softcap_argmax_kernel[(m, n_chunks)](x, out, part_v, part_i, v, n_chunks, float(cap),
                                          1.0 / cap if cap > 0 else 0.0, HAS_CAP=cap > 0, CHUNK=_CHUNK, BLOCK=1024)
    best_chunk = part_v.argmax(dim=1, keepdim=True)  # first chunk holding the row maximum
    return out, part_i.gather(1, best_chunk).squeeze(1).long()
