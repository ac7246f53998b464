"""The engine's math facade: the only math the model definition calls, Triton on CUDA (or when forced), torch
elsewhere.

Model code calls `ops.rms_norm(...)`, `ops.rope(x, angles)`, `ops.attention(q, k, v, visibility, scale)` etc.
identically on every device; the choice is `backend.use_triton(tensor.device)` and nothing else. Where a Triton kernel
does not cover a case (llama's interleaved RoPE, a mask over a sliding ring, attention sinks, SiLU gating) the torch
form runs on the same device. Shapes and semantics are documented in each kernel module.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from . import activation, logits, norm, qmatmul
from . import attention as attention_mod
from . import rope as rope_mod
from .backend import use_triton
from .cpu import layer as layer_mod
from .cpu import native
from .rope import RopeAngles
from .visibility import GraphSpan, Masked, Span, Visibility

__all__ = ["AttnHeads", "GraphSpan", "LayerKV", "Masked", "RopeAngles", "Span", "Visibility"]


def _pick(x: torch.Tensor, triton_fn: Callable, torch_fn: Callable) -> Callable:
    return triton_fn if use_triton(x.device) else torch_fn


def qmatmul_gguf(x: torch.Tensor, raw_blocks: torch.Tensor, ggml_type: int, n: int, k: int) -> torch.Tensor:
    """x [..., K] @ W[N, K]^T with W packed as GGUF blocks (uint8 [N, row_bytes]) -> [..., N]."""
    return _pick(x, qmatmul.qmatmul_triton, qmatmul.qmatmul_torch)(x, raw_blocks, ggml_type, n, k)


# decode steps and DFlash verify blocks (at most this many tokens or rows) take the C kernels on the CPU; prefill
# chunks stay in torch (SDPA, one dispatch per op amortized over many rows)
NATIVE_MAX_T = 16


def _native_rows_fit(*ts: torch.Tensor | None) -> bool:
    """Whether a few fp32 CPU rows go to the C kernels (kernels/cpu): one call instead of a torch dispatch that costs
    ~10x their arithmetic."""
    x = ts[0]
    return (x.device.type == "cpu" and x.dim() >= 1 and x.numel() <= NATIVE_MAX_T * x.shape[-1] and x.numel() > 0
            and all(t is None or (t.dtype == torch.float32 and t.is_contiguous() and t.device.type == "cpu")
                    for t in ts)
            and not use_triton(x.device) and not torch.compiler.is_compiling() and native.available())


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    if _native_rows_fit(x, weight):
        return native.rms_norm(x, weight, eps)
    return _pick(x, norm.rms_norm_triton, norm.rms_norm_torch)(x, weight, eps)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) * w, x + residual)."""
    return _pick(x, norm.add_rms_norm_triton, norm.add_rms_norm_torch)(x, residual, weight, eps)


def rms_norm_add(x: torch.Tensor, weight: torch.Tensor | None, residual: torch.Tensor, eps: float) -> torch.Tensor:
    """residual + norm(x) * w (Gemma post-norms)."""
    if residual.shape == x.shape and _native_rows_fit(x, weight, residual):
        return native.rms_norm(x, weight, eps, residual)
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



@dataclass(frozen=True)
class AttnHeads:
    """One attention layer's heads as `self_attention` reads its QKV output: q | k | v per token ([T, W] with
    W = n_head*head_dim, + 2*n_kv*head_dim when the layer writes its own KV), the biases added after the matmul,
    the per-head norms (weights [head_dim] or None; v_norm: the weightless one) and the layer's softmax scale."""

    n_head: int
    n_kv: int
    head_dim: int
    writes_kv: bool
    bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    v_norm: bool
    eps: float
    scale: float
    window: int  # > 0: a sliding layer


class LayerKV(Protocol):
    """A layer's cache as `self_attention` uses it (kv_cache.LayerCache): slot p of a ring holds a position % S."""

    k: torch.Tensor  # [n_kv, S, hd]
    v: torch.Tensor
    pos: torch.Tensor  # [S] long, -1 = empty
    ring: bool

    def write(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None: ...


def _native_attention_fits(qkv: torch.Tensor, cache: LayerKV, vis: Visibility) -> bool:
    return (qkv.device.type == "cpu" and not use_triton(qkv.device) and qkv.shape[0] <= NATIVE_MAX_T
            and qkv.dtype == torch.float32 and cache.k.dtype == torch.float32 and qkv.is_contiguous()
            and (isinstance(vis, Masked) or (isinstance(vis, Span) and vis.causal))
            and not torch.compiler.is_compiling() and native.available())


def self_attention(qkv: torch.Tensor, heads: AttnHeads, cache: LayerKV, positions: torch.Tensor, angles: RopeAngles,
                   vis: Visibility) -> torch.Tensor:
    """The attention of T new tokens from their QKV projection: qkv [T, W] -> [T, n_head*head_dim].

    Adds the biases, norms q and k per head (and v when v_norm), rotates q and k, writes k and v to `cache` at
    `positions` when the layer owns its KV, and attends over what `vis` lets each query see. On the CPU a step of at
    most NATIVE_MAX_T tokens runs as one C call (cpu/attention_step.c: visibility from the cache's slot
    positions, which is what every `vis` here encodes); the composition below is its reference and every other
    device's path."""
    t, hd = qkv.shape[0], heads.head_dim
    nq, nkv = heads.n_head * hd, heads.n_kv * hd
    if _native_attention_fits(qkv, cache, vis):
        cos, sin = angles.cos_sin()
        return native.attention_step(
            qkv, heads.n_head, heads.n_kv, hd, bias=heads.bias, q_norm=heads.q_norm, k_norm=heads.k_norm,
            v_norm=heads.v_norm, eps=heads.eps, cos=cos, sin=sin, neox=angles.style == "neox", k_cache=cache.k,
            v_cache=cache.v, slot_pos=cache.pos, write=heads.writes_kv, positions=positions, ring=cache.ring,
            n_scan=vis.extent, window=heads.window, scale=heads.scale)
    if heads.bias is not None:
        qkv = qkv + heads.bias
    q = qkv[:, :nq].reshape(t, heads.n_head, hd)  # [T, n_head, hd]
    if heads.q_norm is not None:
        q = rms_norm(q, heads.q_norm, heads.eps)
    q = rope(q, angles)
    if heads.writes_kv:
        k = qkv[:, nq:nq + nkv].reshape(t, heads.n_kv, hd)  # [T, n_kv, hd]
        v = qkv[:, nq + nkv:].reshape(t, heads.n_kv, hd)
        if heads.k_norm is not None:
            k = rms_norm(k, heads.k_norm, heads.eps)
        if heads.v_norm:
            v = rms_norm(v, None, heads.eps)
        cache.write(rope(k, angles).transpose(0, 1), v.transpose(0, 1), positions)  # the cache is [n_kv, S, hd]
    o = attention(q, cache.k, cache.v, vis, heads.scale)  # [T, n_head, hd]
    return o.reshape(t, nq)


def decoder_layer(h: torch.Tensor, plan: layer_mod.LayerPlan | None, cache: LayerKV, positions: torch.Tensor,
                  angles: RopeAngles, vis: Visibility) -> torch.Tensor | None:
    """A whole decoder layer (the attention half, then the MLP half) in one C call (cpu/layer_step.c), for a step of
    at most NATIVE_MAX_T rows on the CPU whose layer has a plan (cpu/layer.py): h [T, n_embd] -> [T, n_embd]. None
    where it does not apply: the caller runs the layer op by op (the reference, and every other case)."""
    if plan is None or not _native_attention_fits(h, cache, vis):
        return None
    cos, sin = angles.cos_sin()
    return layer_mod.layer_step(plan, h, cos, sin, angles.style == "neox", cache.k, cache.v, cache.pos, cache.ring,
                                positions, vis.extent)
