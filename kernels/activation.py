"""GELU-tanh gating of the Gemma MLP: gelu_tanh(gate) * up, elementwise, fp32 math."""
from __future__ import annotations

import torch

from ._triton import tl, triton


def gelu_tanh_mul_torch(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = gate.float()
    return (torch.nn.functional.gelu(g, approximate="tanh") * up.float()).to(gate.dtype)


@triton.jit
def _tanh(x):
    # Triton has no tanh: 1 - 2 / (exp(2|x|) + 1) is exact at both saturations and never overflows to NaN
    e = tl.exp(2.0 * tl.abs(x))
    t = 1.0 - 2.0 / (e + 1.0)
    return tl.where(x < 0, -t, t)


@triton.jit
def _gelu_tanh_mul_kernel(g_ptr, u_ptr, o_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = 0.5 * g * (1.0 + _tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u  # 0.797... = sqrt(2 / pi)
    tl.store(o_ptr + offs, y.to(o_ptr.dtype.element_ty), mask=mask)


def gelu_tanh_mul_triton(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    g, u = gate.contiguous(), up.contiguous()
    out = torch.empty_like(g)
    n = g.numel()
    if n:
        _gelu_tanh_mul_kernel[(triton.cdiv(n, 1024),)](g, u, out, n, BLOCK=1024)
    return out
