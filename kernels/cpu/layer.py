"""A whole decoder layer of a decode step or a DFlash verify block as one C call (layer_step.c).

`LayerPlan` holds what never changes between steps (the GGUF parts of the four projections, the norms, the
attention heads, the activation), laid out as layer_step.c's `BoltLayer`; `layer_step` runs it on one step's rows
against one session's cache. The op-by-op layer (Block.mix, Block.ffn) stays the reference and the path for every
other case (prefill chunks, CUDA, torch.compile, Gemma 4's per-layer inputs).
"""
from __future__ import annotations

import ctypes

import torch

from . import native

ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}  # layer_step.c's act codes

_p, _i32, _i64, _f32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_float


class _Linear(ctypes.Structure):  # BoltLinear
    _fields_ = [("n_parts", _i32), ("types", _p), ("w", _p), ("rows", _p), ("n_out", _i64)]


class _Layer(ctypes.Structure):  # BoltLayer
    _fields_ = [("matmul", _p), ("n_embd", _i64), ("n_ff", _i64), ("eps", _f32), ("act", _i32),
                ("attn_norm", _p), ("ffn_norm", _p), ("post_attn_norm", _p), ("post_ffn_norm", _p),
                ("qkv", _Linear), ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
                ("n_head", _i64), ("n_kv", _i64), ("head_dim", _i64), ("window", _i64),
                ("bias", _p), ("q_norm", _p), ("k_norm", _p), ("v_norm", _i32), ("writes_kv", _i32),
                ("head_eps", _f32), ("scale", _f32)]


def _linear(parts: native.BlockParts) -> _Linear:
    return _Linear(parts.n_parts, ctypes.addressof(parts.types), ctypes.addressof(parts.ptrs),
                   ctypes.addressof(parts.rows), parts.n_out)


def _vector(t: torch.Tensor | None) -> int | None:
    if t is None:
        return None
    if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
        raise ValueError("a layer plan's vectors are contiguous fp32 CPU tensors")
    return t.data_ptr()


class LayerPlan:
    """One layer's fixed inputs to layer_step.c. `qkv`, `o`, `gate_up`, `down`: the projections' GGUF parts
    (gate|up: gate's n_ff outputs, then up's); `heads`: ops.AttnHeads; the post norms None where the layer adds plainly.
    The tensors and parts must outlive the plan (they are the model's)."""

    def __init__(self, *, n_embd: int, n_ff: int, eps: float, activation: str, attn_norm: torch.Tensor,
                 ffn_norm: torch.Tensor, post_attn_norm: torch.Tensor | None, post_ffn_norm: torch.Tensor | None,
                 qkv: native.BlockParts, o: native.BlockParts, gate_up: native.BlockParts, down: native.BlockParts,
                 heads):
        if activation not in ACTIVATIONS:
            raise ValueError(f"layer_step has no activation {activation!r}")
        if gate_up.n_out != 2 * n_ff or o.n_out != n_embd or down.n_out != n_embd:
            raise ValueError("a layer plan's projections do not match its sizes")
        self._keep = (attn_norm, ffn_norm, post_attn_norm, post_ffn_norm, qkv, o, gate_up, down, heads)
        matmul = ctypes.cast(native._parts_call(None), _p).value  # the level this CPU runs
        self.spec = _Layer(matmul, n_embd, n_ff, eps, ACTIVATIONS[activation], _vector(attn_norm), _vector(ffn_norm),
                           _vector(post_attn_norm), _vector(post_ffn_norm), _linear(qkv), _linear(o),
                           _linear(gate_up), _linear(down), heads.n_head, heads.n_kv, heads.head_dim, heads.window,
                           _vector(heads.bias), _vector(heads.q_norm), _vector(heads.k_norm), int(heads.v_norm),
                           int(heads.writes_kv), heads.eps, heads.scale)
        self.address = ctypes.addressof(self.spec)


def layer_step(plan: LayerPlan, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, neox: bool,
               k_cache: torch.Tensor, v_cache: torch.Tensor, slot_pos: torch.Tensor, ring: bool,
               positions: torch.Tensor, n_scan: int) -> torch.Tensor:
    """h [T, n_embd] fp32 -> the layer's output [T, n_embd] (a new tensor); writes this step's K/V as
    native.attention_step does. The caller checks devices, dtypes and contiguity (ops.decoder_layer)."""
    out = torch.empty_like(h)
    if native.library().bolt_layer_step(plan.address, h.data_ptr(), out.data_ptr(), h.shape[0], cos.data_ptr(),
                                        sin.data_ptr(), cos.shape[-1], int(neox), k_cache.data_ptr(),
                                        v_cache.data_ptr(), slot_pos.data_ptr(), k_cache.shape[1], int(ring),
                                        positions.data_ptr(), n_scan, torch.get_num_threads()):
        raise ValueError(f"layer_step refused T={h.shape[0]} over {n_scan} of {k_cache.shape[1]} slots")
    return out


def act_mul(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """layer_step.c's gated activation alone: gate_up [T, 2F] fp32 (gate | up) -> act(gate) * up [T, F]."""
    t, f = gate_up.shape[0], gate_up.shape[1] // 2
    x = gate_up.float().contiguous()
    out = torch.empty(t, f, dtype=torch.float32)
    if native.library().bolt_act_mul(ACTIVATIONS[activation], x.data_ptr(), out.data_ptr(), t, f):
        raise ValueError(f"act_mul refused {activation!r} on {tuple(gate_up.shape)}")
    return out
