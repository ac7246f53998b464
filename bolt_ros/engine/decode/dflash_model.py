"""The DFlash drafter network, loaded from a GGUF in llama.cpp's `dflash` layout.

The drafter is a small stack of Qwen3-style layers that drafts a whole block `[anchor, MASK x (B-1)]` in one
non-causal pass. It has no context of its own tokens: its KV cache holds *injected* rows, one per committed target
position, made from the target's hidden states at `dflash.target_layers` (fused by `fc` + RMSNorm, then projected by
each layer's own `k`/`v` weights, K normed and RoPE'd at the row's real position). Token embeddings and the output
head are borrowed from the target unless the file ships its own.

GGUF conventions (llama.cpp `src/models/dflash.cpp`, `conversion/qwen.py`):
  * `dflash.target_layers` holds layer *inputs* (HF `target_layer_ids` + 1); id == n_layer of the target is the final
    residual stream before the output norm. `Transformer.forward(capture=...)` uses the same convention.
  * the encoder norm is `enc.output_norm.weight` (older converters: `hidden_norm.weight`).
  * draft logits get neither the target's final norm nor its softcap (the drafter has its own `output_norm`).
"""
from __future__ import annotations

import math
from typing import Annotated

import torch
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from torch import nn

from bolt_ros.engine.gguf import validate, validate_tokenizer
from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile
from bolt_ros.engine.gguf.validate import (
    MAX_ATTN_WIDTH,
    MAX_BLOCK,
    MAX_CONTEXT,
    MAX_EMBD,
    MAX_FF,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_KV_BYTES_PER_TOKEN,
    MAX_LAYERS,
    MAX_TARGET_LAYERS,
    MAX_VOCAB,
    Int,
    PerLayer,
    Real,
)
from bolt_ros.engine.model.linear import QuantLinear
from bolt_ros.engine.model.transformer import Rope, Transformer
from bolt_ros.engine.model.weights import WeightStore
from bolt_ros.kernels import ops
from bolt_ros.kernels.rope import RopeAngles

ENC_NORM_NAMES = ("enc.output_norm.weight", "hidden_norm.weight")
EXACT_DRAFT_HEAD = 1 << 24  # draft vocabulary rows x width held in fp32 (64 MiB) at most; beyond: the head's form


class DraftConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    target_layers: list[int]  # target layer *inputs* whose residual streams are fused (GGUF +1 convention)
    target_hidden: int
    block_size: int
    mask_token_id: int
    n_vocab: int | None  # from the drafter's own tokenizer, if it has one
    embedding_scale: float | None  # dflash.embedding_scale (newer llama.cpp scales the input rows by it)
    causal: bool  # dflash.attention.causal: block-causal drafting instead of bidirectional
    sliding_window: int | None
    swa: list[bool]
    draft_vocab: list[int] | None = None  # dflash.draft_vocab (sorted, unique): the tokens it was trained to predict


class _DraftHparams(BaseModel):
    """The `dflash.*` keys draft_config_from_gguf reads, typed and bounded (aliases: the key names after the prefix)."""

    model_config = ConfigDict(strict=True, frozen=True)

    n_layer: Int(1, MAX_LAYERS) = Field(alias="block_count")
    n_embd: Int(1, MAX_EMBD) = Field(alias="embedding_length")
    n_head: Int(1, MAX_HEADS) = Field(alias="attention.head_count")
    n_head_kv: Int(1, MAX_HEADS) | None = Field(None, alias="attention.head_count_kv")
    head_dim: Int(1, MAX_HEAD_DIM) | None = Field(None, alias="attention.key_length")
    n_ff: Int(1, MAX_FF) = Field(alias="feed_forward_length")
    rms_eps: Real(0, 1, open_lo=True) = Field(1e-6, alias="attention.layer_norm_rms_epsilon")
    rope_base: Real(0, 1e12, open_lo=True) = Field(1e4, alias="rope.freq_base")
    rope_dim: Int(1, MAX_HEAD_DIM) | None = Field(None, alias="rope.dimension_count")
    target_layers: Annotated[list[Int(0, MAX_LAYERS)], BeforeValidator(validate.as_list),
                             Field(min_length=1, max_length=MAX_TARGET_LAYERS)] = Field(alias="target_layers")
    target_hidden: Int(1, MAX_EMBD) | None = Field(None, alias="target_hidden_size")
    block_size: Int(2, MAX_BLOCK) = Field(16, alias="block_size")
    embedding_scale: Real(-1e6, 1e6) | None = Field(None, alias="embedding_scale")
    causal: bool = Field(False, alias="attention.causal")
    sliding_window: Int(0, MAX_CONTEXT) = Field(0, alias="attention.sliding_window")  # 0: none
    swa_pattern: PerLayer(bool) | None = Field(None, alias="attention.sliding_window_pattern")
    draft_vocab: Annotated[list[Int(0, MAX_VOCAB - 1)], BeforeValidator(validate.as_id_list),
                           Field(min_length=1, max_length=MAX_VOCAB)] | None = Field(None, alias="draft_vocab")


def draft_config_from_gguf(gf: GGUFFile) -> DraftConfig:
    """The DraftConfig of a drafter file: typed, bounded keys (_DraftHparams) and every tensor the drafter reads
    checked against it (validate.check_draft_tensors), so a malformed file is a GGUFError naming the key or tensor."""
    name = gf.path.name
    if gf.arch() != "dflash":
        raise GGUFError(f"{name}: a DFlash drafter has architecture 'dflash', not {gf.arch()!r}")
    tok = validate_tokenizer.check_tokenizer(gf)
    hp = validate.read_metadata(gf, _DraftHparams, "dflash.")
    head_dim = hp.head_dim if hp.head_dim is not None else hp.n_embd // hp.n_head
    if head_dim < 1:
        raise GGUFError(f"{name}: missing metadata key 'dflash.attention.key_length' (embedding_length "
                        f"{hp.n_embd} < head_count {hp.n_head})")
    n_head_kv = hp.n_head_kv if hp.n_head_kv is not None else hp.n_head
    if hp.n_head % n_head_kv:
        raise GGUFError(f"{name}: {hp.n_head} heads are not a multiple of {n_head_kv} KV heads "
                        "(dflash.attention.head_count, dflash.attention.head_count_kv)")
    rope_dim = hp.rope_dim if hp.rope_dim is not None else head_dim
    if rope_dim % 2 or rope_dim > head_dim:
        raise GGUFError(f"{name}: dflash.rope.dimension_count = {rope_dim} must be even and at most the head dim "
                        f"{head_dim}")
    if hp.n_head * head_dim > MAX_ATTN_WIDTH or 8 * hp.n_layer * n_head_kv * head_dim > MAX_KV_BYTES_PER_TOKEN:
        raise GGUFError(f"{name}: dflash head_count {hp.n_head} / head_count_kv {n_head_kv} x key_length {head_dim}"
                        f" x {hp.n_layer} layers is too large")
    window = hp.sliding_window or None
    if window and hp.swa_pattern is not None:
        swa = validate.per_layer(gf, hp.swa_pattern, hp.n_layer, "dflash.attention.sliding_window_pattern")
    else:
        swa = [window is not None] * hp.n_layer
    if tok.mask is None:
        raise GGUFError(f"{name}: missing metadata key 'tokenizer.ggml.mask_token_id' (the DFlash mask token)")
    cfg = DraftConfig(
        n_layer=hp.n_layer, n_embd=hp.n_embd, n_head=hp.n_head, n_head_kv=n_head_kv, head_dim=head_dim, n_ff=hp.n_ff,
        rms_eps=hp.rms_eps, rope_base=hp.rope_base, rope_dim=rope_dim, target_layers=hp.target_layers,
        target_hidden=hp.target_hidden if hp.target_hidden is not None else hp.n_embd, block_size=hp.block_size,
        mask_token_id=tok.mask, n_vocab=len(tok.tokens) if tok.tokens is not None else None,
        embedding_scale=hp.embedding_scale, causal=hp.causal, sliding_window=window, swa=swa,
        draft_vocab=sorted(set(hp.draft_vocab)) if hp.draft_vocab is not None else None)
    validate.check_draft_tensors(gf, cfg, ENC_NORM_NAMES)
    return cfg


class DraftCache:
    """Injected context K/V per drafter layer, indexed by position (row j = target position j), on the drafter's
    device; grows on demand. Rows n.. are scratch: a draft pass writes its block's own K/V there."""

    def __init__(self, cfg: DraftConfig, capacity: int = 256, device: torch.device | str = "cpu"):
        self.cfg, self.device = cfg, torch.device(device)
        shape = (cfg.n_head_kv, capacity, cfg.head_dim)
        self.k = [torch.zeros(shape, device=self.device) for _ in range(cfg.n_layer)]  # [n_kv, S, hd]
        self.v = [torch.zeros(shape, device=self.device) for _ in range(cfg.n_layer)]
        self.n = 0  # positions 0..n-1 hold context

    def reserve(self, end: int) -> None:
        cap = self.k[0].shape[1]
        if end <= cap:
            return
        new = max(end, 2 * cap)
        for kv in (self.k, self.v):
            for il, t in enumerate(kv):
                grown = t.new_zeros(t.shape[0], new, t.shape[2])
                grown[:, :cap] = t
                kv[il] = grown

    def write(self, il: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        # k, v: [n_kv, T, hd] for positions start..start+T-1
        end = start + k.shape[1]
        self.reserve(end)
        self.k[il][:, start:end] = k
        self.v[il][:, start:end] = v

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n:
            raise ValueError(f"cannot truncate a draft cache of {self.n} positions to {n}")
        self.n = n


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, il: int, w: WeightStore):
        super().__init__()
        p = f"blk.{il}."
        self.cfg, self.il = cfg, il
        self.attn_norm = w.vector(p + "attn_norm.weight")
        self.wq, self.wk = w.linear(p + "attn_q.weight"), w.linear(p + "attn_k.weight")
        self.wv, self.wo = w.linear(p + "attn_v.weight"), w.linear(p + "attn_output.weight")
        self.q_norm, self.k_norm = w.vector(p + "attn_q_norm.weight"), w.vector(p + "attn_k_norm.weight")
        self.sinks = w.vector(p + "attn_sinks.weight") if w.has(p + "attn_sinks.weight") else None
        self.ffn_norm = w.vector(p + "ffn_norm.weight")
        self.w_gate, self.w_up = w.linear(p + "ffn_gate.weight"), w.linear(p + "ffn_up.weight")
        self.w_down = w.linear(p + "ffn_down.weight")

    def context_kv(self, g: torch.Tensor, angles: RopeAngles) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of fused context rows g [T, H]: K = RoPE(k_norm(Wk g)), V = Wv g (no norm), [n_kv, T, hd] each."""
        cfg, T = self.cfg, g.shape[0]
        k = self.wk(g).view(T, cfg.n_head_kv, cfg.head_dim)  # [T, n_kv, hd]
        v = self.wv(g).view(T, cfg.n_head_kv, cfg.head_dim)
        k = ops.rope(ops.rms_norm(k, self.k_norm, cfg.rms_eps), angles)
        return k.transpose(0, 1), v.transpose(0, 1)

    def forward(self, x: torch.Tensor, cache: DraftCache, angles: RopeAngles, vis: ops.Span) -> torch.Tensor:
        """The block x [B, H] at positions vis.start..: attends to the injected context and to the whole block."""
        cfg, B = self.cfg, x.shape[0]
        n = ops.rms_norm(x, self.attn_norm, cfg.rms_eps)
        q = self.wq(n).view(B, cfg.n_head, cfg.head_dim)  # [B, n_head, hd]
        q = ops.rope(ops.rms_norm(q, self.q_norm, cfg.rms_eps), angles)
        cache.write(self.il, vis.start, *self.context_kv(n, angles))  # the block's own K/V, in scratch rows
        o = ops.attention(q, cache.k[self.il], cache.v[self.il], vis, 1.0 / math.sqrt(cfg.head_dim),
                          sinks=self.sinks)  # [B, n_head, hd]
        x = x + self.wo(o.reshape(B, cfg.n_head * cfg.head_dim))
        m = ops.rms_norm(x, self.ffn_norm, cfg.rms_eps)
        return x + self.w_down(ops.act_mul(self.w_gate(m), self.w_up(m), "silu"))


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg: DraftConfig, w: WeightStore, target: Transformer, embedding_scale: float,
                 use_draft_vocab: bool = True):
        super().__init__()
        self.cfg, self.embedding_scale = cfg, embedding_scale
        self.device = w.device
        tc = target.cfg
        validate.check_draft_fc(w.gf, cfg)  # before anything is loaded
        for name in ("token_embd.weight", "output.weight"):  # before anything is loaded
            if w.has(name) and tuple(reversed(w.gf.info(name).shape)) != (tc.n_vocab, cfg.n_embd):
                raise GGUFError(f"{w.gf.path.name}: drafter {name} has shape "
                                f"{list(reversed(w.gf.info(name).shape))}, expected [{tc.n_vocab}, {cfg.n_embd}] "
                                "(the target's vocabulary, embedding_length)")
        self.fc = w.linear("fc.weight")
        self.fc_scale = w.vector("fc.scale") if w.has("fc.scale") else None
        enc = next((n for n in ENC_NORM_NAMES if w.has(n)), None)
        if enc is None:
            raise GGUFError(f"drafter has no encoder norm ({' or '.join(ENC_NORM_NAMES)})")
        self.enc_norm = w.vector(enc)
        self.layers = nn.ModuleList(DraftLayer(cfg, il, w) for il in range(cfg.n_layer))
        self.out_norm = w.vector("output_norm.weight")
        # borrowed from the target unless the file ships its own: raw (unscaled) embedding rows, output matrix
        self.tok_embd = w.embedding("token_embd.weight") if w.has("token_embd.weight") else target.tok_embd
        self.output = w.linear("output.weight", role="head") if w.has("output.weight") else target.output
        self.rope = Rope(cfg.rope_dim, cfg.rope_base, "neox", None, self.device)
        # The head rows drafts are proposed from: dflash.draft_vocab, the tokens the drafter was trained to predict
        # (the shipped drafter's: 350 of its target's 151936; its whole-head argmax never left them on held-out
        # prompts, docs/dflash.md), held exactly in fp32 while they are few; a draft then costs no vocab-sized matmul
        # (4.6 ms for one row of the int4 head on 2 cores). Without the key: the whole head.
        self.draft_head, self.draft_ids = self.output, None
        if cfg.draft_vocab is not None and use_draft_vocab and isinstance(self.output, QuantLinear):
            ids = torch.tensor(cfg.draft_vocab)
            policy = "exact" if ids.numel() * cfg.n_embd <= EXACT_DRAFT_HEAD else None
            self.draft_head = self.output.rows(ids, policy=policy).to(self.device)
            self.draft_ids = ids.to(self.device)

    def draft_logits(self, hidden: torch.Tensor, *, exact: bool = False) -> torch.Tensor:
        """hidden [n, H] (draft_hidden's rows) -> logits [n, K] over the draft vocabulary (token_ids maps columns to
        token ids); exact=False may use the head's held form unrefined (a confidence needs no exact ranking)."""
        return self.draft_head(hidden) if exact else self.draft_head.approximate(hidden)

    def token_ids(self, cols: torch.Tensor) -> torch.Tensor:
        """Columns of draft_logits -> token ids."""
        return cols if self.draft_ids is None else self.draft_ids[cols]

    def new_cache(self) -> DraftCache:
        return DraftCache(self.cfg, device=self.device)

    def _positions(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, device=self.device)

    @torch.inference_mode()
    def inject(self, features: torch.Tensor, cache: DraftCache) -> None:
        """Append context rows for positions cache.n.. from target features [T, n_layers * target_hidden]."""
        cfg, start, T = self.cfg, cache.n, features.shape[0]
        # llama.cpp sanitises the features the same way before injecting them
        features = torch.nan_to_num(features.float(), nan=0.0, posinf=65504.0, neginf=-65504.0).clamp(-65504, 65504)
        g = self.fc(features)
        if self.fc_scale is not None:
            g = g * self.fc_scale
        g = ops.rms_norm(g, self.enc_norm, cfg.rms_eps)  # [T, H]
        angles = self.rope.at(self._positions(start, T))
        for il, layer in enumerate(self.layers):
            cache.write(il, start, *layer.context_kv(g, angles))
        cache.n = start + T

    @torch.inference_mode()
    def draft_hidden(self, tokens: list[int], cache: DraftCache) -> torch.Tensor:
        """The final normalized rows of block slots 1..B-1 of `tokens` = [anchor, MASK...] at positions cache.n..,
        [B-1, H]: `output` (the head) makes them logits. The head costs ~4x the drafter's layers per row on a CPU, so
        a caller may score the first slot alone before paying for the others."""
        cfg, start, B = self.cfg, cache.n, len(tokens)
        x = self.tok_embd(torch.tensor(tokens, dtype=torch.long, device=self.device)).float()  # [B, H]
        if self.embedding_scale != 1.0:
            x = x * self.embedding_scale
        angles = self.rope.at(self._positions(start, B))
        cache.reserve(start + B)
        for il, layer in enumerate(self.layers):
            window = (cfg.sliding_window or 0) if cfg.swa[il] else 0
            vis = ops.Span(start, start + B, window, causal=cfg.causal, device=self.device)
            x = layer(x, cache, angles, vis)
        return ops.rms_norm(x[1:], self.out_norm, cfg.rms_eps)  # slot 0 (the anchor) predicts nothing


def check_compatible(cfg: DraftConfig, target: Transformer, target_gguf: GGUFFile, draft_name: str) -> None:
    """Reject a drafter made for another target: hidden sizes, vocabulary, layer ids, mask token (GGUFErrors: the
    drafter file is what does not fit)."""
    tc = target.cfg
    if cfg.target_hidden != tc.n_embd:
        raise GGUFError(f"drafter {draft_name} expects target hidden size {cfg.target_hidden}, "
                         f"the target has {tc.n_embd}")
    if cfg.n_embd != tc.n_embd:
        raise GGUFError(f"drafter {draft_name} has hidden size {cfg.n_embd} but borrows the target's embeddings "
                         f"and head of width {tc.n_embd}")
    target_tokens = target_gguf.get("tokenizer.ggml.tokens")
    n_target = len(target_tokens) if target_tokens is not None else tc.n_vocab
    if cfg.n_vocab is not None and cfg.n_vocab != n_target:
        raise GGUFError(f"drafter {draft_name} has a {cfg.n_vocab}-token vocabulary, the target {n_target}")
    bad = [i for i in cfg.target_layers if not 0 <= i <= tc.n_layer]
    if bad:
        raise GGUFError(f"drafter {draft_name} reads target layers {bad}, the target has {tc.n_layer} layers")
    if not 0 <= cfg.mask_token_id < tc.n_vocab:
        raise GGUFError(f"drafter {draft_name} mask token {cfg.mask_token_id} is outside the target vocabulary")
    if cfg.draft_vocab is not None and cfg.draft_vocab[-1] >= tc.n_vocab:
        raise GGUFError(f"drafter {draft_name} dflash.draft_vocab holds token {cfg.draft_vocab[-1]}, outside the "
                        f"target's {tc.n_vocab}-token vocabulary")
