"""One readable transformer for llama, Qwen2, Gemma 3 and Gemma 4 GGUF models (batch of one sequence).

Differences between the architectures are data in ModelConfig (per-layer head dims, rope bases, sliding windows, KV
sharing, norm placement, scales, projection biases), not separate model classes. Shapes: T = tokens in this step,
S = cache slots.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from bolt_ros.engine.gguf.reader import GGUFError
from bolt_ros.engine.model.config import ModelConfig
from bolt_ros.engine.model.kv_cache import KVCache
from bolt_ros.engine.model.linear import QuantLinear
from bolt_ros.engine.model.weights import WeightStore
from bolt_ros.kernels import ops
from bolt_ros.kernels.cpu.layer import LayerPlan
from bolt_ros.kernels.rope import RopeAngles


class Interrupted(Exception):
    """A forward step abandoned because its `stop` callback said so (a barge-in during a long prefill)."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    # GGUF stores Gemma norm weights with the +1 already folded in, so every arch is plain x_hat * w
    return ops.rms_norm(x, weight, eps)


class Rope:
    """Rotary embedding for one (base, rotated dims, freq factors, style) combination, its tables on `device`."""

    def __init__(self, rot_dim: int, base: float, style: str, freq_factors: torch.Tensor | None,
                 device: torch.device | str = "cpu"):
        inv_freq = base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)  # [rot_dim/2]
        if freq_factors is not None:  # Gemma 4 "proportional" rope: factors of 1e30 switch pairs off
            inv_freq = inv_freq / freq_factors.to("cpu", torch.float64)[: inv_freq.shape[0]]
        self.inv_freq = inv_freq.to(device)  # fp64: the torch path's tables
        self.inv_freq32 = inv_freq.float().to(device)  # the Triton kernel's
        self.rot_dim, self.style = rot_dim, style

    def at(self, positions: torch.Tensor) -> RopeAngles:
        return RopeAngles(positions, self.inv_freq, self.inv_freq32, self.style)


class _Split(nn.Module):
    """Several linears applied to the same input, outputs concatenated (when they can't be fused into one)."""

    def __init__(self, layers: list[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([m(x) for m in self.layers], dim=-1) if len(self.layers) > 1 else self.layers[0](x)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, il: int, w: WeightStore):
        super().__init__()
        p = f"blk.{il}."
        self.il, self.cfg = il, cfg
        self.n_head, self.n_kv, self.hd = cfg.n_head, cfg.n_head_kv[il], cfg.head_dim[il]
        self.owns_kv = cfg.owns_kv(il)
        self.attn_norm = w.vector(p + "attn_norm.weight")
        wq = w.linear(p + "attn_q.weight")
        if self.owns_kv:
            wk, wv = w.linear(p + "attn_k.weight"), w.linear(p + "attn_v.weight")
            self.wqkv = QuantLinear.fuse([wq, wk, wv]) or _Split([wq, wk, wv])  # one matmul where forms allow
        else:
            self.wqkv = _Split([wq])
        # Qwen2: Q/K/V biases, concatenated in wqkv's output order ([nq (+ 2 * nkv)]) and added after the matmul,
        # so the fused packed matmul stays bias-free
        parts = ("q", "k", "v") if self.owns_kv else ("q",)
        bias = torch.cat([w.vector(f"{p}attn_{n}.bias") for n in parts]) if cfg.attn_bias else None
        width = self.n_head * self.hd + (2 * self.n_kv * self.hd if self.owns_kv else 0)
        if bias is not None and bias.shape[0] != width:
            raise GGUFError(f"{p}attn_q/k/v biases have {bias.shape[0]} values for {width} outputs")
        q_norm = w.vector(p + "attn_q_norm.weight") if cfg.qk_norm else None
        k_norm = w.vector(p + "attn_k_norm.weight") if cfg.qk_norm and self.owns_kv else None
        # everything between the QKV projection and the output projection: ops.self_attention
        self.heads = ops.AttnHeads(self.n_head, self.n_kv, self.hd, self.owns_kv, bias, q_norm, k_norm, cfg.v_norm,
                                   cfg.rms_eps, cfg.attn_scale, (cfg.sliding_window or 0) if cfg.swa[il] else 0)
        self.wo = w.linear(p + "attn_output.weight")
        self.ffn_norm = w.vector(p + "ffn_norm.weight")
        gate, up = w.linear(p + "ffn_gate.weight"), w.linear(p + "ffn_up.weight")
        self.w_gate_up = QuantLinear.fuse([gate, up]) or _Split([gate, up])
        self.w_down = w.linear(p + "ffn_down.weight")
        if cfg.post_norms:
            self.post_attn_norm = w.vector(p + "post_attention_norm.weight")
            self.post_ffn_norm = w.vector(p + "post_ffw_norm.weight")
        if cfg.ple_dim:
            self.ple_gate = w.linear(p + "inp_gate.weight")
            self.ple_proj = w.linear(p + "proj.weight")
            self.ple_norm = w.vector(p + "post_norm.weight")
        self.out_scale = w.vector(p + "layer_output_scale.weight") if w.has(p + "layer_output_scale.weight") else None

    def native_plan(self) -> LayerPlan | None:
        """The layer as one C call takes it (ops.decoder_layer), built once; None where that call does not cover
        the layer (weights not in the `blocks` form, Gemma 4's per-layer inputs or layer scale, another activation):
        then mix and ffn run op by op."""
        plan = getattr(self, "_plan", False)
        if plan is False:
            plan = self._plan = self._build_plan()
        return plan

    def _build_plan(self) -> LayerPlan | None:
        cfg = self.cfg

        def parts(m):
            if isinstance(m, _Split):
                m = m.layers[0] if len(m.layers) == 1 else None
            return m.native_parts() if isinstance(m, QuantLinear) else None

        lins = [parts(m) for m in (self.wqkv, self.wo, self.w_gate_up, self.w_down)]
        if any(p is None for p in lins) or cfg.ple_dim or self.out_scale is not None:
            return None
        post = cfg.post_norms
        try:  # LayerPlan refuses what layer_step.c can't take (another activation, sizes, non-fp32 vectors)
            return LayerPlan(n_embd=cfg.n_embd, n_ff=lins[2].n_out // 2, eps=cfg.rms_eps, activation=cfg.activation,
                             attn_norm=self.attn_norm, ffn_norm=self.ffn_norm,
                             post_attn_norm=self.post_attn_norm if post else None,
                             post_ffn_norm=self.post_ffn_norm if post else None, qkv=lins[0], o=lins[1],
                             gate_up=lins[2], down=lins[3], heads=self.heads)
        except ValueError:
            return None

    def attention(self, x: torch.Tensor, positions: torch.Tensor, cache: KVCache, angles: RopeAngles,
                  vis: ops.Visibility) -> torch.Tensor:
        """x [T, n_embd] -> [T, n_embd]; writes this step's K/V when the layer owns KV."""
        qkv = self.wqkv(x)  # [T, nq (+ 2 * nkv)]
        o = ops.self_attention(qkv, self.heads, cache.layer(self.il), positions, angles, vis)  # [T, nq]
        return self.wo(o)

    def mix(self, h, positions, cache, angles, vis) -> torch.Tensor:
        """The attention half: h + attention(norm(h)), post-normed on Gemma."""
        cfg = self.cfg
        a = self.attention(ops.rms_norm(h, self.attn_norm, cfg.rms_eps), positions, cache, angles, vis)
        return ops.rms_norm_add(a, self.post_attn_norm, h, cfg.rms_eps) if cfg.post_norms else h + a

    def ffn(self, h, ple) -> torch.Tensor:
        """The MLP half (and Gemma 4's per-layer input, and its layer scale)."""
        cfg, eps = self.cfg, self.cfg.rms_eps
        gate, up = self.w_gate_up(ops.rms_norm(h, self.ffn_norm, eps)).chunk(2, dim=-1)  # [T, n_ff] each
        f = self.w_down(ops.act_mul(gate, up, cfg.activation))
        h = ops.rms_norm_add(f, self.post_ffn_norm, h, eps) if cfg.post_norms else h + f
        if cfg.ple_dim:
            g = ops.act_mul(self.ple_gate(h), ple[:, self.il], cfg.activation)  # [T, ple_dim]
            h = ops.rms_norm_add(self.ple_proj(g), self.ple_norm, h, eps)
        if self.out_scale is not None:
            h = h * self.out_scale
        return h


@dataclass
class ForwardOut:
    logits: torch.Tensor | None  # [T_out, vocab]
    hidden: dict[int, torch.Tensor]  # layer index -> residual stream entering that layer, [T, n_embd]


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, w: WeightStore):
        super().__init__()
        self.cfg = cfg
        self.device, self.kernels = w.device, w.kernels
        # a step of a few rows on the CPU runs each layer as one C call where it can (ops.decoder_layer); False:
        # op by op, the reference (tests compare the two)
        self.native_layers = True
        self.tok_embd = w.embedding("token_embd.weight")
        self.blocks = nn.ModuleList(Block(cfg, il, w) for il in range(cfg.n_layer))
        self.out_norm = w.vector("output_norm.weight")
        self.output = w.linear("token_embd.weight" if cfg.tied_output else "output.weight", role="head")
        freq_factors = w.vector("rope_freqs.weight") if w.has("rope_freqs.weight") else None
        self.ropes: list[Rope] = []
        by_key: dict[tuple, Rope] = {}
        for il in range(cfg.n_layer):
            ff = freq_factors if (freq_factors is not None and not cfg.swa[il]) else None  # full layers only
            key = (cfg.rope_dim[il], cfg.rope_base[il], ff is not None)
            if key not in by_key:
                by_key[key] = Rope(cfg.rope_dim[il], cfg.rope_base[il], cfg.rope_style, ff, self.device)
            self.ropes.append(by_key[key])
        # Gemma 4: layers from here on only read earlier layers' KV (n_layer when none do)
        self.first_shared = next((il for il in range(cfg.n_layer) if not cfg.owns_kv(il)), cfg.n_layer)
        if cfg.ple_dim:
            self.ple_embd = w.embedding("per_layer_token_embd.weight")
            self.ple_model_proj = w.linear("per_layer_model_proj.weight")
            self.ple_proj_norm = w.vector("per_layer_proj_norm.weight")

    def new_cache(self, n_ctx: int, max_step: int = 512, dtype: torch.dtype = torch.float32) -> KVCache:
        # the Triton kernels (and CUDA graphs) read position-indexed slots: no sliding rings there
        return KVCache(self.cfg, n_ctx, max_step, dtype, device=self.device, flat=self.kernels)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok_embd(tokens) * self.cfg.embed_scale  # [T, n_embd]

    def per_layer_inputs(self, tokens: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        cfg, T = self.cfg, tokens.shape[0]
        tok = self.ple_embd(tokens).view(T, cfg.n_layer, cfg.ple_dim) * math.sqrt(cfg.ple_dim)
        ctx = (self.ple_model_proj(e) * cfg.n_embd ** -0.5).view(T, cfg.n_layer, cfg.ple_dim)
        ctx = ops.rms_norm(ctx, self.ple_proj_norm, cfg.rms_eps)
        return (ctx + tok) * 2 ** -0.5  # [T, n_layer, ple_dim]

    def visibility(self, positions: torch.Tensor, cache: KVCache) -> dict[bool, ops.Visibility]:
        """Per layer type (sliding or not), which cached keys this step's queries see. A position-indexed layer cache
        needs only the span; a sliding ring gets a mask from its slots' positions."""
        out: dict[bool, ops.Visibility] = {}
        start, end = cache.n_past, cache.n_past + positions.shape[0]
        for il in range(self.cfg.n_layer):
            swa = self.cfg.swa[il]
            if swa in out:
                continue
            window = (self.cfg.sliding_window or 0) if swa else 0
            lc = cache.layer(il)
            if not lc.ring:
                out[swa] = ops.Span(start, end, window, device=self.device)
                continue
            # before the ring first wraps (end <= S) position p sits in slot p, so no slot from `end` on holds a
            # key any of this step's queries sees: the scan stops there (a fresh 512-token prefill over a 1024-slot
            # ring attended to 512 empty slots)
            n = min(end, lc.n_slots)
            kpos = lc.slot_positions_after(positions)[:n]  # [n]
            q = positions[:, None]  # [T, 1]
            allowed = (kpos[None, :] >= 0) & (kpos[None, :] <= q)
            if window > 0:
                allowed &= (q - kpos[None, :]) < window
            out[swa] = ops.Masked(None if (positions.shape[0] == 1 and bool(allowed.all())) else allowed, n)
        return out

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: KVCache, *, logits: str | None = "last",
                capture: tuple[int, ...] = (), embeddings: torch.Tensor | None = None,
                stop: Callable[[], bool] | None = None) -> ForwardOut:
        """Run T new tokens at positions cache.n_past.. and commit them to the cache.

        logits: "last" (next-token logits of the last position), "all" (every position) or None.
        capture: layer indices whose *input* residual stream to return (DFlash features; n_layer = final stream).
        stop: checked before each half of every layer; when it returns True the step is abandoned with `Interrupted`
        and nothing is committed (cache.n_past unchanged; the slots written are beyond it, and a sliding ring holds
        window + max_step slots, so no key a later query needs was overwritten).
        """
        T = tokens.shape[0]
        if T == 0:
            raise ValueError("forward() needs at least one token")
        if T > cache.max_step:
            raise ValueError(f"step of {T} tokens exceeds the cache's max_step {cache.max_step}; chunk the prompt")
        start = cache.n_past
        if start + T > cache.n_ctx:
            raise ValueError(f"context full: {start} + {T} tokens > n_ctx {cache.n_ctx}")
        tokens = tokens.to(self.device)
        positions = torch.arange(start, start + T, device=self.device)
        h, hidden = self.layers(tokens, positions, cache, self.visibility(positions, cache), logits=logits,
                                capture=capture, embeddings=embeddings, stop=stop)
        cache.n_past = start + T
        if logits is None:
            return ForwardOut(None, hidden)
        return ForwardOut(self.head(h[-1:] if logits == "last" else h), hidden)

    def layers(self, tokens: torch.Tensor, positions: torch.Tensor, cache: KVCache, vis: dict[bool, ops.Visibility],
               *, logits: str | None = "last", capture: tuple[int, ...] = (), embeddings: torch.Tensor | None = None,
               stop: Callable[[], bool] | None = None) -> tuple[torch.Tensor | None, dict[int, torch.Tensor]]:
        """The residual stream through every block: (final stream [T', n_embd] or None, captured streams). Commits
        nothing; a static decode step (decoders.StaticDecodeStep) calls it with device-held token and position."""
        cfg = self.cfg
        e = self.embed(tokens) if embeddings is None else embeddings
        ple = self.per_layer_inputs(tokens, e) if cfg.ple_dim else None
        angles: dict[int, RopeAngles] = {}  # one table per rope variant per step, shared by its layers
        hidden: dict[int, torch.Tensor] = {}
        h = e
        for il, block in enumerate(self.blocks):
            if il == self.first_shared and logits != "all" and not any(c >= il for c in capture):
                # KV-shared layers write no cache: only rows that feed the logits still matter (as in HF)
                if logits is None:
                    return None, hidden
                last = slice(-1, None)
                h, positions, ple = h[last], positions[last], None if ple is None else ple[last]
                vis = {k: v.rows(last) for k, v in vis.items()}
                angles = {k: a.rows(last) for k, a in angles.items()}
            if il in capture:
                hidden[il] = h
            rope = self.ropes[il]
            a = angles.get(id(rope))
            if a is None:
                a = angles[id(rope)] = rope.at(positions)
            if stop is not None and stop():
                raise Interrupted(f"forward step stopped before layer {il}")
            whole = ops.decoder_layer(h, block.native_plan(), cache.layer(il), positions, a, vis[cfg.swa[il]]) \
                if self.native_layers and not torch.compiler.is_compiling() else None  # compiled: op by op, traced
            if whole is not None:  # the layer in one C call (decode steps, verify blocks on the CPU)
                h = whole
                continue
            h = block.mix(h, positions, cache, a, vis[cfg.swa[il]])
            if stop is not None and stop():
                raise Interrupted(f"forward step stopped inside layer {il}")
            h = block.ffn(h, ple)
        if cfg.n_layer in capture:
            hidden[cfg.n_layer] = h
        return h, hidden

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm, output projection and softcap: [T, n_embd] -> [T, vocab]."""
        out = self.output(ops.rms_norm(h, self.out_norm, self.cfg.rms_eps))
        return ops.softcap(out, self.cfg.final_softcap or 0.0)
