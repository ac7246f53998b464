"""The engine's kernel facade: one call per op, Triton on CUDA (or when forced), torch references elsewhere.

Model code calls `ops.rms_norm(...)`, `ops.attention_decode(...)` etc. identically on CPU and GPU; the choice is
`backend.use_triton(tensor.device)` and nothing else. Shapes and semantics are documented in each kernel module.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from . import activation, attention, logits, norm, qmatmul
from . import rope as rope_mod
from .backend import use_triton


def _pick(x: torch.Tensor, triton_fn: Callable, torch_fn: Callable) -> Callable:
    return triton_fn if use_triton(x.device) else torch_fn


def qmatmul_gguf(x: torch.Tensor, raw_blocks: torch.Tensor, ggml_type: int, n: int, k: int) -> torch.Tensor:
    """x [..., K] @ W[N, K]^T with W packed as GGUF blocks (uint8 [N, row_bytes]) -> [..., N]."""
    return _pick(x, qmatmul.qmatmul_triton, qmatmul.qmatmul_torch)(x, raw_blocks, ggml_type, n, k)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    return _pick(x, norm.rms_norm_triton, norm.rms_norm_torch)(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) * w, x + residual)."""
    return _pick(x, norm.add_rms_norm_triton, norm.add_rms_norm_torch)(x, residual, weight, eps)


def rms_norm_add(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor, eps: float) -> torch.Tensor:
    """residual + norm(x) * w (Gemma post-norms)."""
    return _pick(x, norm.rms_norm_add_triton, norm.rms_norm_add_torch)(x, weight, residual, eps)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, half: int | None = None) -> torch.Tensor:
    """x [T, H, D] NEOX-rotated at positions [T]; inv_freq from rope.rope_inv_freq."""
    return _pick(x, rope_mod.rope_triton, rope_mod.rope_torch)(x, positions, inv_freq, half)


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _pick(gate, activation.gelu_tanh_mul_triton, activation.gelu_tanh_mul_torch)(gate, up)


def attention_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_ctx: int, scale: float, *,
                     window: int = 0) -> torch.Tensor:
    """q [Hq, D] at position n_ctx-1 over k/v [Hkv, S, D] slots 0..n_ctx-1 -> [Hq, D]."""
    fn = _pick(q, attention.attention_decode_triton, attention.attention_decode_torch)
    return fn(q, k, v, n_ctx, scale, window=window)


def attention_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, *,
                      window: int = 0) -> torch.Tensor:
    """Causal: q [T, Hq, D] at positions start.. over k/v slots 0..start+T-1 -> [T, Hq, D]."""
    fn = _pick(q, attention.attention_prefill_triton, attention.attention_prefill_torch)
    return fn(q, k, v, start, scale, window=window)


def attention_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, *,
                    window: int = 0) -> torch.Tensor:
    """DFlash block (non-causal): q [T, Hq, D] at start.. sees context slots < start and the whole block."""
    fn = _pick(q, attention.attention_block_triton, attention.attention_block_torch)
    return fn(q, k, v, start, scale, window=window)


def softcap_argmax(x: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [M, V] -> (cap * tanh(x / cap), argmax ids [M]); cap <= 0 skips the cap."""
    return _pick(x, logits.softcap_argmax_triton, logits.softcap_argmax_torch)(x, cap)

