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
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .device import kernel_attention, kernel_block, kernel_head, spans
from .gguf_file import GGUFError
from .kv_cache import KVCache
from .linear import QuantLinear
from .weights import WeightStore


class Interrupted(Exception):
    """A forward step abandoned because its `stop` callback said so (a barge-in during a long prefill)."""


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    # GGUF stores Gemma norm weights with the +1 already folded in, so every arch is plain x_hat * w
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x if weight is None else x * weight


class Rope:
    """Rotary embedding for one (base, rotated dims, head dim, freq factors) combination."""

    def __init__(self, head_dim: int, rot_dim: int, base: float, style: str, freq_factors: torch.Tensor | None):
        inv_freq = base ** (-torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim)  # [rot_dim/2]
        if freq_factors is not None:  # Gemma 4 "proportional" rope: factors of 1e30 switch pairs off
            inv_freq = inv_freq / freq_factors.to(torch.float64)[: inv_freq.shape[0]]
        self.inv_freq = inv_freq
        self.head_dim, self.rot_dim, self.style = head_dim, rot_dim, style

    def cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = positions.to(torch.float64)[:, None] * self.inv_freq[None, :]  # [T, rot/2]
        return ang.cos().float(), ang.sin().float()

    def apply(self, x: torch.Tensor, cs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        # x: [n, T, head_dim]
        cos, sin = cs
        rot, rest = x[..., : self.rot_dim], x[..., self.rot_dim:]
        if self.style == "neox":  # pairs (i, i + rot/2)
            x1, x2 = rot.chunk(2, dim=-1)
            out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:  # pairs (2i, 2i+1)
            x1, x2 = rot[..., 0::2], rot[..., 1::2]
            out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Grouped-query attention. q [n_head, T, hd], k/v [n_kv, S, hd], mask [T, S] bool (True = visible) or None."""
    n_head, T, hd = q.shape
    n_kv, S = k.shape[0], k.shape[1]
    if T > 16:  # prefill: the fused SDPA kernel wins
        return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=scale,
                                              enable_gqa=n_kv != n_head)[0]
    # decode / verify blocks: a few batched matmuls beat SDPA's per-call overhead (heads h*g..h*g+g-1 share kv h)
    g = n_head // n_kv
    s = torch.bmm(q.reshape(n_kv, g * T, hd), k.transpose(1, 2)) * scale  # [n_kv, g*T, S]
    if mask is not None:
        s = s.view(n_kv, g, T, S).masked_fill(~mask, float("-inf")).view(n_kv, g * T, S)
    return torch.bmm(torch.softmax(s, dim=-1), v).view(n_head, T, hd)


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
        self.kernels = w.kernels  # Triton kernels instead of the torch code below (device.kernels_on)
        self.attn_norm = w.vector(p + "attn_norm.weight")
        wq = w.linear(p + "attn_q.weight")
        if self.owns_kv:
            wk, wv = w.linear(p + "attn_k.weight"), w.linear(p + "attn_v.weight")
            self.wqkv = QuantLinear.fuse([wq, wk, wv]) or _Split([wq, wk, wv])  # one matmul where forms allow
            self.k_norm = w.vector(p + "attn_k_norm.weight") if cfg.qk_norm else None
        else:
            self.wqkv = _Split([wq])
        # Qwen2: Q/K/V biases, concatenated in wqkv's output order ([nq (+ 2 * nkv)]) and added after the matmul,
        # so the fused packed matmul stays bias-free
        parts = ("q", "k", "v") if self.owns_kv else ("q",)
        self.qkv_bias = torch.cat([w.vector(f"{p}attn_{n}.bias") for n in parts]) if cfg.attn_bias else None
        width = self.n_head * self.hd + (2 * self.n_kv * self.hd if self.owns_kv else 0)
        if self.qkv_bias is not None and self.qkv_bias.shape[0] != width:
            raise GGUFError(f"{p}attn_q/k/v biases have {self.qkv_bias.shape[0]} values for {width} outputs")
        self.q_norm = w.vector(p + "attn_q_norm.weight") if cfg.qk_norm else None
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

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x) if self.cfg.activation == "silu" else F.gelu(x, approximate="tanh")

    def attention(self, x, positions, cache: KVCache, rope: Rope, cs, mask) -> torch.Tensor:
        if self.kernels:
            return kernel_attention(self, x, positions, cache, rope, mask)
        cfg, T = self.cfg, x.shape[0]
        nq, nkv = self.n_head * self.hd, self.n_kv * self.hd
        qkv = self.wqkv(x)  # [T, nq (+ 2 * nkv)]
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        q = qkv[:, :nq].reshape(T, self.n_head, self.hd).transpose(0, 1)  # [n_head, T, hd]
        if self.q_norm is not None:
            q = rms_norm(q, self.q_norm, cfg.rms_eps)
        q = rope.apply(q, cs)
        lc = cache.layer(self.il)
        if self.owns_kv:
            k = qkv[:, nq:nq + nkv].reshape(T, self.n_kv, self.hd).transpose(0, 1)  # [n_kv, T, hd]
            v = qkv[:, nq + nkv:].reshape(T, self.n_kv, self.hd).transpose(0, 1)
            if self.k_norm is not None:
                k = rms_norm(k, self.k_norm, cfg.rms_eps)
            if cfg.v_norm:
                v = rms_norm(v, None, cfg.rms_eps)
            lc.write(rope.apply(k, cs), v, positions)
        k, v, _ = lc.view(int(positions[-1]) + 1)  # [n_kv, S, hd]
        o = attend(q, k.to(q.dtype), v.to(q.dtype), mask, cfg.attn_scale)  # [n_head, T, hd]
        return self.wo(o.transpose(0, 1).reshape(T, self.n_head * self.hd))

    def forward(self, h, positions, cache, rope, cs, mask, ple) -> torch.Tensor:
        if self.kernels:  # mask is a device.Span there, cs unused
            return kernel_block(self, h, positions, cache, rope, mask, ple)
        cfg = self.cfg
        a = self.attention(rms_norm(h, self.attn_norm, cfg.rms_eps), positions, cache, rope, cs, mask)
        h = h + (rms_norm(a, self.post_attn_norm, cfg.rms_eps) if cfg.post_norms else a)
        m = rms_norm(h, self.ffn_norm, cfg.rms_eps)
        gate, up = self.w_gate_up(m).chunk(2, dim=-1)  # [T, n_ff] each
        f = self.w_down(self.act(gate) * up)
        h = h + (rms_norm(f, self.post_ffn_norm, cfg.rms_eps) if cfg.post_norms else f)
        if cfg.ple_dim:
            g = self.act(self.ple_gate(h)) * ple[:, self.il]  # [T, ple_dim]
            h = h + rms_norm(self.ple_proj(g), self.ple_norm, cfg.rms_eps)
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
        self.tok_embd = w.embedding("token_embd.weight")
        self.blocks = nn.ModuleList(Block(cfg, il, w) for il in range(cfg.n_layer))
        self.out_norm = w.vector("output_norm.weight")
        self.output = w.linear("token_embd.weight" if cfg.tied_output else "output.weight", role="head")
        freq_factors = w.vector("rope_freqs.weight") if w.has("rope_freqs.weight") else None
        self.ropes: list[Rope] = []
        by_key: dict[tuple, Rope] = {}
        for il in range(cfg.n_layer):
            ff = freq_factors if (freq_factors is not None and not cfg.swa[il]) else None  # full layers only
            key = (cfg.head_dim[il], cfg.rope_dim[il], cfg.rope_base[il], ff is not None)
            if key not in by_key:
                by_key[key] = Rope(cfg.head_dim[il], cfg.rope_dim[il], cfg.rope_base[il], cfg.rope_style, ff)
            self.ropes.append(by_key[key])
        # Gemma 4: layers from here on only read earlier layers' KV (n_layer when none do)
        self.first_shared = next((il for il in range(cfg.n_layer) if not cfg.owns_kv(il)), cfg.n_layer)
        if cfg.ple_dim:
            self.ple_embd = w.embedding("per_layer_token_embd.weight")
            self.ple_model_proj = w.linear("per_layer_model_proj.weight")
            self.ple_proj_norm = w.vector("per_layer_proj_norm.weight")

    def new_cache(self, n_ctx: int, max_step: int = 512, dtype: torch.dtype = torch.float32) -> KVCache:
        return KVCache(self.cfg, n_ctx, max_step, dtype, device=self.device, flat=self.kernels)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok_embd(tokens) * self.cfg.embed_scale  # [T, n_embd]

    def per_layer_inputs(self, tokens: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        cfg, T = self.cfg, tokens.shape[0]
        tok = self.ple_embd(tokens).view(T, cfg.n_layer, cfg.ple_dim) * math.sqrt(cfg.ple_dim)
        ctx = (self.ple_model_proj(e) * cfg.n_embd ** -0.5).view(T, cfg.n_layer, cfg.ple_dim)
        ctx = rms_norm(ctx, self.ple_proj_norm, cfg.rms_eps)
        return (ctx + tok) * 2 ** -0.5  # [T, n_layer, ple_dim]

    def masks(self, positions: torch.Tensor, cache: KVCache) -> dict[bool, torch.Tensor | None]:
        """Attention masks per layer type (swa or not), [T, S] bool; None where plain causal over a prefix works."""
        out: dict[bool, torch.Tensor | None] = {}
        q = positions[:, None]  # [T, 1]
        for il in range(self.cfg.n_layer):
            swa = self.cfg.swa[il]
            if swa in out:
                continue
            kpos = cache.layer(il).slot_positions_after(positions)  # [S]
            allowed = (kpos[None, :] >= 0) & (kpos[None, :] <= q)
            if swa:
                allowed &= (q - kpos[None, :]) < self.cfg.sliding_window
            out[swa] = None if (positions.shape[0] == 1 and bool(allowed.all())) else allowed
        return out

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: KVCache, *, logits: str | None = "last",
                capture: tuple[int, ...] = (), embeddings: torch.Tensor | None = None,
                stop: Callable[[], bool] | None = None) -> ForwardOut:
        """Run T new tokens at positions cache.n_past.. and commit them to the cache.

        logits: "last" (next-token logits of the last position), "all" (every position) or None.
        capture: layer indices whose *input* residual stream to return (DFlash features; n_layer = final stream).
        stop: checked before every layer; when it returns True the step is abandoned with `Interrupted` and nothing
        is committed (cache.n_past unchanged; the slots written are beyond it, and a sliding ring holds window +
        max_step slots, so no key a later query needs was overwritten).
        """
        cfg, T = self.cfg, tokens.shape[0]
        if T == 0:
            raise ValueError("forward() needs at least one token")
        if T > cache.max_step:
            raise ValueError(f"step of {T} tokens exceeds the cache's max_step {cache.max_step}; chunk the prompt")
        start = cache.n_past
        if start + T > cache.n_ctx:
            raise ValueError(f"context full: {start} + {T} tokens > n_ctx {cache.n_ctx}")
        positions = torch.arange(start, start + T, device=self.device)
        e = self.embed(tokens) if embeddings is None else embeddings
        ple = self.per_layer_inputs(tokens, e) if cfg.ple_dim else None
        masks = spans(cfg, start, start + T) if self.kernels else self.masks(positions, cache)
        cs_cache: dict[int, tuple] = {}
        hidden: dict[int, torch.Tensor] = {}
        h = e
        for il, block in enumerate(self.blocks):
            if stop is not None and stop():
                raise Interrupted(f"forward step stopped before layer {il}")
            if il == self.first_shared and logits != "all" and not any(c >= il for c in capture):
                # KV-shared layers write no cache: only rows that feed the logits still matter (as in HF)
                if logits is None:
                    break
                h, positions, ple = h[-1:], positions[-1:], None if ple is None else ple[-1:]
                masks = {k: None if m is None else m[-1:] for k, m in masks.items()}
                cs_cache = {k: (c[-1:], s[-1:]) for k, (c, s) in cs_cache.items()}
            if il in capture:
                hidden[il] = h
            rope = self.ropes[il]
            cs = cs_cache.get(id(rope))
            if cs is None and not self.kernels:
                cs = cs_cache[id(rope)] = rope.cos_sin(positions)
            h = block(h, positions, cache, rope, cs, masks[cfg.swa[il]], ple)
        if cfg.n_layer in capture:
            hidden[cfg.n_layer] = h
        cache.n_past = start + T
        if logits is None:
            return ForwardOut(None, hidden)
        rows = h[-1:] if logits == "last" else h
        return ForwardOut(self.head(rows), hidden)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Final norm, output projection and softcap: [T, n_embd] -> [T, vocab]."""
        if self.kernels:
            return kernel_head(self, h)
        out = self.output(rms_norm(h, self.out_norm, self.cfg.rms_eps))
        if self.cfg.final_softcap:
            cap = self.cfg.final_softcap
            out = torch.tanh(out / cap) * cap
        return out
