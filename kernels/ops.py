"""The engine's math facade: the only math the model definition calls, Triton on CUDA (or when forced), torch
elsewhere.

Model code calls `ops.rms_norm(...)`, `ops.rope(x, angles)`, `ops.attention(q, k, v, visibility, scale)` etc.
identically on every device; the choice is `backend.use_triton(tensor.device)` and nothing else. Where a Triton kernel
does not cover a case (llama's interleaved RoPE, a mask over a sliding ring, attention sinks, SiLU gating) the torch
form runs on the same device. Shapes and semantics are documented in each kernel module.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from . import activation, logits, norm, qmatmul
from . import attention as attention_mod
from . import rope as rope_mod
from .backend import use_triton
from .rope import RopeAngles
from .visibility import GraphSpan, Masked, Span, Visibility

__all__ = ["GraphSpan", "Masked", "RopeAngles", "Span", "Visibility"]


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


def rope(x: torch.Tensor, angles: RopeAngles) -> torch.Tensor:
    """x [T, H, D] rotated by one step's angles (rope.RopeAngles) -> [T, H, D]."""
    if angles.style == "neox" and use_triton(x.device):
        return rope_mod.rope_triton(x, angles.positions, angles.inv_freq32, angles.inv_freq32.shape[0])
    return rope_mod.rope_angles_torch(x, angles)


def gelu_tanh_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return _pick(gate, activation.gelu_tanh_mul_triton, activation.gelu_tanh_mul_torch)(gate, up)


def act_mul(gate: torch.Tensor, up: torch.Tensor, activation_name: str) -> torch.Tensor:
    """The gated MLP's act(gate) * up: "gelu_tanh" (Gemma) or "silu" (llama, Qwen)."""
    if activation_name == "gelu_tanh":
        return gelu_tanh_mul(gate, up)
    return F.silu(gate) * up


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: Visibility, scale: float, *,
              sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D] over cache slots k/v [Hkv, >= vis.extent, D] as `vis` (visibility.py) allows -> [T, Hq, D].

    Triton: decode (one query), causal prefill or the DFlash block, for a Span over position-indexed slots. Torch
    (and Triton's other cases): batched matmuls or SDPA over the extent with vis.mask()."""
    k, v = k[:, : vis.extent], v[:, : vis.extent]
    if isinstance(vis, Span) and sinks is None and use_triton(q.device):
        if not vis.causal:
            return attention_mod.attention_block_triton(q, k, v, vis.start, scale, window=vis.window)
        if q.shape[0] == 1:
            return attention_mod.attention_decode_triton(q[0], k, v, vis.end, scale, window=vis.window)[None]
        return attention_mod.attention_prefill_triton(q, k, v, vis.start, scale, window=vis.window)
    return attention_mod.attend_masked(q, k, v, vis.mask(), scale, sinks)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma's final logits); cap <= 0: x unchanged."""
    if cap <= 0:
        return x
    if use_triton(x.device):
        return logits.softcap_argmax_triton(x, cap)[0]
    return torch.tanh(x / cap) * cap


def attention_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_ctx: int, scale: float, *,
                     window: int = 0) -> torch.Tensor:
    """q [Hq, D] at position n_ctx-1 over k/v [Hkv, S, D] slots 0..n_ctx-1 -> [Hq, D]."""
    fn = _pick(q, attention_mod.attention_decode_triton, attention_mod.attention_decode_torch)
    return fn(q, k, v, n_ctx, scale, window=window)


def attention_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, *,
                      window: int = 0) -> torch.Tensor:
    """Causal: q [T, Hq, D] at positions start.. over k/v slots 0..start+T-1 -> [T, Hq, D]."""
    fn = _pick(q, attention_mod.attention_prefill_triton, attention_mod.attention_prefill_torch)
    return fn(q, k, v, start, scale, window=window)


def attention_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float, *,
                    window: int = 0) -> torch.Tensor:
    """DFlash block (non-causal): q [T, Hq, D] at start.. sees context slots < start and the whole block."""
    fn = _pick(q, attention_mod.attention_block_triton, attention_mod.attention_block_torch)
    return fn(q, k, v, start, scale, window=window)


def softcap_argmax(x: torch.Tensor, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [M, V] -> (cap * tanh(x / cap), argmax ids [M]); cap <= 0 skips the cap."""
    return _pick(x, logits.softcap_argmax_triton, logits.softcap_argmax_torch)(x, cap)

