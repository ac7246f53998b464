"""The engine's device switch: the torch model code on CPU, the Triton kernels of `bolt_ros.kernels.ops` on CUDA.

`kernels_on(device)` is the one switch (it defers to `kernels.backend.use_triton`: `BOLT_KERNELS=auto|triton|torch`,
auto = Triton on CUDA only). Where it is on, for the same Transformer/Block objects:
  * WeightStore keeps matrices as raw GGUF blocks (`weight_policy`: "fast" -> "gguf", the fused dequant-matmul);
  * KV caches are position-indexed on every layer (`flat`): the attention kernels read slot p = position p, so a
    sliding layer holds n_ctx slots instead of a ring and its window is applied inside the kernel;
  * masks become `Span`s (which keys a query row sees, as ints), and `kernel_block` / `kernel_head` run RMSNorm
    (fused with the residual adds), RoPE, attention, GELU gating and the final softcap through `kernels.ops`.
On a CUDA device `CudaGraphDecoder` then replays one captured graph per decode token (static token/position buffers,
static cache, static logits), so a token costs the host two fills and one replay.

Nothing here imports Triton unless the switch is on, so CPU-only installs never load it.
"""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def resolve_device(spec: str) -> torch.device:
    """`auto` -> the first CUDA device when torch sees one, else the CPU; `cpu`, `cuda`, `cuda:N` as given, checked
    (a CUDA device that is not there is a clear error, not a late one inside the first matmul)."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as e:
        raise ValueError(f"unknown device {spec!r} (auto, cpu, cuda or cuda:N)") from e
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {spec!r} (auto, cpu, cuda or cuda:N)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r}: no CUDA device available (torch.cuda.is_available() is False)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return device


def kernels_on(device: torch.device | str) -> bool:
    """True when a model on `device` runs the Triton kernels."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device}: no CUDA device available (torch.cuda.is_available() is False)")
    if device.type != "cuda" and os.environ.get("BOLT_KERNELS", "auto").strip().lower() in ("", "auto", "torch"):
        return False  # the common CPU case, decided without importing Triton
    from bolt_ros.kernels.backend import use_triton
    return use_triton(device)


def weight_policy(policy: str, device: torch.device | str) -> str:
    """The WeightStore policy to use: "fast" means the fused GGUF kernels where they run; "exact" stays dense fp32."""
    return "gguf" if policy == "fast" and kernels_on(device) else policy


# ---- masks of the kernel path --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """Query rows at positions start..end-1 see cached keys 0..end-1 causally (within `window` when > 0).

    The kernel path's stand-in for a [T, S] bool mask; slicing selects query rows as slicing the mask would."""

    start: int
    end: int
    window: int = 0

    def __getitem__(self, rows: slice) -> Span:
        r = range(self.start, self.end)[rows]
        return Span(r.start, r.stop, self.window)


@dataclass(frozen=True)
class GraphSpan:
    """One decode query at the device position `position` [1], keys in slots 0..n_slots-1 (a CUDA graph can't take
    the position as a launch argument, so visibility is computed on the device)."""

    position: torch.Tensor
    n_slots: int
    window: int = 0


def spans(cfg, start: int, end: int) -> dict[bool, Span]:
    """Per layer type (sliding or not), what `Transformer.masks` gives the torch path."""
    return {False: Span(start, end), True: Span(start, end, cfg.sliding_window or 0)}


# ---- the layers on the kernel path ---------------------------------------------------------------------------------


def _inv_freq(rope, device: torch.device) -> torch.Tensor:
    inv = getattr(rope, "_kernel_inv_freq", None)
    if inv is None or inv.device != device:
        inv = rope._kernel_inv_freq = rope.inv_freq.float().to(device)  # [rot_dim/2]
    return inv


def _rope(x: torch.Tensor, positions: torch.Tensor, rope) -> torch.Tensor:
    """x [T, H, hd] rotated at positions [T] (on x's device)."""
    from bolt_ros.kernels import ops

    inv = _inv_freq(rope, x.device)
    if rope.style == "neox":  # rotated pairs (i, i + rot/2) for i < rot/2; dims from rot_dim on pass through
        return ops.rope(x, positions, inv, rope.rot_dim // 2)
    ang = positions.float()[:, None] * inv[None, :]  # [T, rot/2]: llama's (2i, 2i+1) pairs have no kernel
    return rope.apply(x.transpose(0, 1), (ang.cos(), ang.sin())).transpose(0, 1)


def _attend(q: torch.Tensor, lc, span: Span | GraphSpan, scale: float) -> torch.Tensor:
    """q [T, n_head, hd] over a position-indexed layer cache -> [T, n_head, hd]."""
    from bolt_ros.kernels import ops

    if isinstance(span, GraphSpan):
        from .model import attend  # the torch decode attention, with visibility computed from the device position

        k, v = lc.k[:, : span.n_slots], lc.v[:, : span.n_slots]  # [n_kv, S, hd]
        rel = span.position[:, None] - torch.arange(span.n_slots, device=q.device)[None, :]  # [1, S]
        vis = (rel >= 0) & (rel < span.window) if span.window else rel >= 0
        return attend(q.transpose(0, 1), k.to(q.dtype), v.to(q.dtype), vis, scale).transpose(0, 1)
    if q.shape[0] == 1:
        return ops.attention_decode(q[0], lc.k, lc.v, span.end, scale, window=span.window)[None]
    return ops.attention_prefill(q, lc.k, lc.v, span.start, scale, window=span.window)


def kernel_attention(block, x: torch.Tensor, positions: torch.Tensor, cache, rope, span) -> torch.Tensor:
    """Block.attention on the kernels: x [T, n_embd] -> [T, n_embd]; writes this step's K/V when the layer owns KV."""
    from bolt_ros.kernels import ops

    cfg, T, hd = block.cfg, x.shape[0], block.hd
    nq, nkv = block.n_head * hd, block.n_kv * hd
    qkv = block.wqkv(x)  # [T, nq (+ 2 * nkv)]
    if block.qkv_bias is not None:  # Qwen2's Q/K/V biases (a device tensor, so CUDA graphs record the add)
        qkv = qkv + block.qkv_bias
    q = qkv[:, :nq].reshape(T, block.n_head, hd)  # [T, n_head, hd]: the kernels' layout
    if block.q_norm is not None:
        q = ops.rms_norm(q, block.q_norm, cfg.rms_eps)
    q = _rope(q, positions, rope)
    lc = cache.layer(block.il)
    if block.owns_kv:
        k = qkv[:, nq:nq + nkv].reshape(T, block.n_kv, hd)  # [T, n_kv, hd]
        v = qkv[:, nq + nkv:].reshape(T, block.n_kv, hd)
        if block.k_norm is not None:
            k = ops.rms_norm(k, block.k_norm, cfg.rms_eps)
        if cfg.v_norm:
            v = ops.rms_norm(v, None, cfg.rms_eps)
        lc.write(_rope(k, positions, rope).transpose(0, 1), v.transpose(0, 1), positions)  # cache is [n_kv, S, hd]
    o = _attend(q, lc, span, cfg.attn_scale)  # [T, n_head, hd]
    return block.wo(o.reshape(T, nq))


def _act_mul(cfg, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    from bolt_ros.kernels import ops

    return ops.gelu_tanh_mul(gate, up) if cfg.activation == "gelu_tanh" else F.silu(gate) * up


def kernel_block(block, h: torch.Tensor, positions: torch.Tensor, cache, rope, span, ple) -> torch.Tensor:
    """Block.forward on the kernels; the Gemma post-norms fuse with their residual adds (rms_norm_add)."""
    from bolt_ros.kernels import ops

    cfg, eps = block.cfg, block.cfg.rms_eps
    a = kernel_attention(block, ops.rms_norm(h, block.attn_norm, eps), positions, cache, rope, span)
    h = ops.rms_norm_add(a, block.post_attn_norm, h, eps) if cfg.post_norms else h + a
    gate, up = block.w_gate_up(ops.rms_norm(h, block.ffn_norm, eps)).chunk(2, dim=-1)  # [T, n_ff] each
    f = block.w_down(_act_mul(cfg, gate, up))
    h = ops.rms_norm_add(f, block.post_ffn_norm, h, eps) if cfg.post_norms else h + f
    if cfg.ple_dim:
        g = _act_mul(cfg, block.ple_gate(h), ple[:, block.il])  # [T, ple_dim]
        h = ops.rms_norm_add(block.ple_proj(g), block.ple_norm, h, eps)
    if block.out_scale is not None:
        h = h * block.out_scale
    return h


def kernel_head(model, h: torch.Tensor) -> torch.Tensor:
    """Transformer.head on the kernels: [T, n_embd] -> [T, vocab]."""
    from bolt_ros.kernels import ops

    out = model.output(ops.rms_norm(h, model.out_norm, model.cfg.rms_eps))
    cap = model.cfg.final_softcap
    return ops.softcap_argmax(out, cap)[0] if cap else out


# ---- static decode step and its CUDA graphs ------------------------------------------------------------------------


class StaticDecodeStep:
    """One decode token with every input and output at a fixed address: the token and position live in device
    buffers, the cache is position-indexed, and attention covers the first `n_slots` slots with device-computed
    visibility. Device-agnostic (the CPU runs it under the Triton interpreter in tests); CudaGraphDecoder records it.
    """

    def __init__(self, model, cache):
        if not model.kernels or any(lc is not None and lc.ring for lc in cache.layers):
            raise ValueError("a static decode step needs the kernel path's position-indexed cache (kernels_on)")
        self.model, self.cache = model, cache
        self.token = torch.zeros(1, dtype=torch.long, device=model.device)  # [1]
        self.position = torch.zeros(1, dtype=torch.long, device=model.device)  # [1]

    def n_slots(self, position: int, min_slots: int = 256) -> int:
        """Slots a step at `position` attends over: a power of two (few graphs), at most the cache size."""
        return min(self.cache.n_ctx, max(min_slots, 1 << position.bit_length()))

    def set_inputs(self, token_id: int) -> int:
        pos = self.cache.n_past
        if pos >= self.cache.n_ctx:
            raise ValueError(f"context full: {pos} + 1 tokens > n_ctx {self.cache.n_ctx}")
        self.token.fill_(token_id)  # a device fill: no host-to-device copy to wait for
        self.position.fill_(pos)
        return pos

    def run(self, n_slots: int) -> torch.Tensor:
        """The step's kernels (what a CUDA graph records): logits [1, vocab]. Does not advance cache.n_past."""
        m, cfg = self.model, self.model.cfg
        e = m.embed(self.token)  # [1, n_embd]
        ple = m.per_layer_inputs(self.token, e) if cfg.ple_dim else None
        window = {False: 0, True: cfg.sliding_window or 0}
        h = e
        for il, block in enumerate(m.blocks):
            span = GraphSpan(self.position, n_slots, window[cfg.swa[il]])
            h = kernel_block(block, h, self.position, self.cache, m.ropes[il], span, ple)
        return kernel_head(m, h)

    @torch.inference_mode()
    def step(self, token_id: int) -> torch.Tensor:
        """Eager: append `token_id` and return the next-token logits [vocab]."""
        pos = self.set_inputs(token_id)
        out = self.run(self.n_slots(pos))
        self.cache.n_past = pos + 1
        return out[0]


class CudaGraphDecoder(StaticDecodeStep):
    """StaticDecodeStep captured once per slot bucket as a CUDA graph and replayed for every token."""

    def __init__(self, model, cache):
        if model.device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"CUDA graphs need a CUDA device; this model is on {model.device}")
        super().__init__(model, cache)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None  # one memory pool shared by every bucket's graph

    def _capture(self, n_slots: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # warm-up on a side stream first: compiles the Triton kernels and allocates workspaces outside the capture.
        # It computes the real step, so its cache write is the one the replay repeats.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.run(n_slots)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.run(n_slots)
        self.pool = graph.pool()
        self.graphs[n_slots] = (graph, out)
        return graph, out

    @torch.inference_mode()
    def step(self, token_id: int) -> torch.Tensor:
        pos = self.set_inputs(token_id)
        n_slots = self.n_slots(pos)
        graph, out = self.graphs.get(n_slots) or self._capture(n_slots)
        graph.replay()
        self.cache.n_past = pos + 1
        return out[0].clone()  # the graph's output buffer is overwritten by the next replay


def cuda_graphs_on(model) -> bool:
    """CUDA graphs for decode: on for kernel-path models on CUDA unless BOLT_CUDA_GRAPHS=0."""
    return (model.device.type == "cuda" and model.kernels
            and os.environ.get("BOLT_CUDA_GRAPHS", "1").strip() not in ("0", "false", "no"))


_graph_decoders: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # KVCache -> its CudaGraphDecoder


def graph_decoder(model, cache) -> CudaGraphDecoder | None:
    """The CUDA-graph decoder bound to `cache`, or None where graphs don't apply (CPU, torch kernels, disabled)."""
    if model.device.type != "cuda" or not cuda_graphs_on(model):
        return None
    dec = _graph_decoders.get(cache)
    if dec is None:
        dec = _graph_decoders[cache] = CudaGraphDecoder(model, cache)
    return dec

