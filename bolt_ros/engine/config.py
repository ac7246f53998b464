"""Model hyper-parameters from GGUF metadata alone (llama.cpp key names), one typed record for every architecture.

Per-layer quantities (head dim, KV heads, FFN width, rope base, sliding or not, KV source) are lists so that
Gemma 4's mixed layers and the uniform llama/Gemma 3 layers go through the same model code.
"""
from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from .gguf_file import GGUFError, GGUFFile

SUPPORTED_ARCHS = ("llama", "gemma3", "gemma4")


class ModelConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    arch: Literal["llama", "gemma3", "gemma4"]
    n_layer: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int
    n_head: int
    n_head_kv: list[int]
    head_dim: list[int]
    n_ff: list[int]
    rms_eps: float
    rope_base: list[float]
    rope_dim: list[int]
    rope_style: Literal["neox", "norm"]  # neox: rotate halves (Gemma); norm: adjacent pairs (llama GGUF layout)
    swa: list[bool]  # sliding-window attention per layer
    sliding_window: int | None
    kv_source: list[int]  # layer whose cache a layer reads (itself unless KV-shared)
    attn_scale: float
    embed_scale: float  # multiplies token embeddings (sqrt(n_embd) for Gemma)
    activation: Literal["silu", "gelu_tanh"]
    post_norms: bool  # Gemma: post-attention / post-FFN norms
    qk_norm: bool
    v_norm: bool  # Gemma 4: weightless RMS norm of V
    final_softcap: float | None
    ple_dim: int  # Gemma 4 per-layer embedding width (0 = none)
    tied_output: bool

    def owns_kv(self, il: int) -> bool:
        return self.kv_source[il] == il

    def kv_slots(self, il: int, n_ctx: int, max_step: int = 0) -> int:
        """Cache slots layer il owns: none if it reads another layer's KV; a sliding layer needs only its window plus
        one forward step (max_step) so a step never overwrites a key its own queries still see; others n_ctx."""
        if not self.owns_kv(il):
            return 0
        if self.swa[il] and self.sliding_window:
            return min(n_ctx, self.sliding_window + max_step)
        return n_ctx

    def kv_bytes(self, n_ctx: int, dtype_bytes: int = 2, max_step: int = 0) -> int:
        """K + V bytes for a context of n_ctx tokens (max_step: the sliding layers' step margin, see kv_slots)."""
        return sum(2 * self.kv_slots(il, n_ctx, max_step) * self.n_head_kv[il] * self.head_dim[il] * dtype_bytes
                   for il in range(self.n_layer))


def _per_layer(value, n_layer: int, key: str) -> list:
    if isinstance(value, np.ndarray | list):
        vals = [v.item() if hasattr(v, "item") else v for v in value]
        if len(vals) != n_layer:
            raise GGUFError(f"{key} has {len(vals)} entries for {n_layer} layers")
        return vals
    return [value] * n_layer


def _positive(name: str, v) -> int:
    if not isinstance(v, int | np.integer) or v <= 0:
        raise GGUFError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    arch = gf.arch()
    if arch not in SUPPORTED_ARCHS:
        raise GGUFError(f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")

    def key(name: str, default=None, required: bool = True):
        full = f"{arch}.{name}"
        if full not in gf.metadata:
            if required and default is None:
                raise GGUFError(f"missing metadata key {full!r}")
            return default
        return gf.metadata[full]

    n_layer = _positive("block_count", key("block_count"))
    n_embd = _positive("embedding_length", key("embedding_length"))
    n_head = _positive("attention.head_count", key("attention.head_count"))
    n_head_kv = [_positive("attention.head_count_kv", v) for v in
                 _per_layer(key("attention.head_count_kv", n_head), n_layer, "head_count_kv")]
    n_ff = [_positive("feed_forward_length", v) for v in _per_layer(key("feed_forward_length"), n_layer, "n_ff")]
    tokens = gf.get("tokenizer.ggml.tokens")
    n_vocab = int(key("vocab_size", len(tokens) if tokens is not None else None))
    emb = gf.info("token_embd.weight")
    if emb.shape[0] != n_embd:
        raise GGUFError(f"token_embd.weight width {emb.shape[0]} != embedding_length {n_embd}")
    if emb.shape[1] < n_vocab:  # Gemma files trim the embedding to the real vocabulary
        n_vocab = emb.shape[1]
    head_dim_full = int(key("attention.key_length", n_embd // n_head))
    rope_base = float(key("rope.freq_base", 10000.0))
    rms_eps = float(key("attention.layer_norm_rms_epsilon", 1e-6))
    window = key("attention.sliding_window", 0, required=False) or None
    tied = "output.weight" not in gf.tensors
    common = dict(arch=arch, n_layer=n_layer, n_embd=n_embd, n_vocab=n_vocab, n_head=n_head, n_head_kv=n_head_kv,
                  n_ff=n_ff, rms_eps=rms_eps, n_ctx_train=int(key("context_length", 4096)), tied_output=tied)
    if n_layer > 1024 or n_head > 1024 or head_dim_full > 4096:
        raise GGUFError(f"implausible hyper-parameters: {n_layer} layers, {n_head} heads, head_dim {head_dim_full}")

    if arch == "llama":
        rope_dim = int(key("rope.dimension_count", head_dim_full))
        return ModelConfig(
            **common, head_dim=[head_dim_full] * n_layer, rope_base=[rope_base] * n_layer,
            rope_dim=[rope_dim] * n_layer, rope_style="norm", swa=[False] * n_layer, sliding_window=None,
            kv_source=list(range(n_layer)), attn_scale=1 / math.sqrt(head_dim_full), embed_scale=1.0,
            activation="silu", post_norms=False, qk_norm=False, v_norm=False, final_softcap=None, ple_dim=0)

    if arch == "gemma3":
        # llama.cpp: every 6th layer is global; local layers use theta 1e4 (not stored in the file)
        swa = [il % 6 < 5 for il in range(n_layer)] if window else [False] * n_layer
        base_swa = float(key("rope.freq_base_swa", 10000.0, required=False))
        return ModelConfig(
            **common, head_dim=[head_dim_full] * n_layer,
            rope_base=[base_swa if s else rope_base for s in swa], rope_dim=[head_dim_full] * n_layer,
            rope_style="neox", swa=swa, sliding_window=window, kv_source=list(range(n_layer)),
            attn_scale=1 / math.sqrt(head_dim_full), embed_scale=math.sqrt(n_embd), activation="gelu_tanh",
            post_norms=True, qk_norm=True, v_norm=False,
            final_softcap=key("final_logit_softcapping", 0.0, required=False) or None, ple_dim=0)

    # gemma4
    pattern = key("attention.sliding_window_pattern")
    swa = [bool(v) for v in _per_layer(pattern, n_layer, "sliding_window_pattern")]
    head_dim_swa = int(key("attention.key_length_swa", head_dim_full))
    head_dim = [head_dim_swa if s else head_dim_full for s in swa]
    base_swa = float(key("rope.freq_base_swa", 10000.0, required=False))
    rope_dim_full = int(key("rope.dimension_count", head_dim_full))
    rope_dim_swa = int(key("rope.dimension_count_swa", head_dim_swa))
    n_shared = int(key("attention.shared_kv_layers", 0, required=False))
    if not 0 <= n_shared < n_layer:
        raise GGUFError(f"attention.shared_kv_layers={n_shared} with {n_layer} layers")
    first_shared = n_layer - n_shared
    kv_source = []
    for il in range(n_layer):
        if il < first_shared:
            kv_source.append(il)
            continue
        # a shared layer reads the cache of the last KV-owning layer of its own type
        src = [j for j in range(first_shared) if swa[j] == swa[il]]
        if not src:
            raise GGUFError(f"layer {il} shares KV but no earlier layer has its attention type")
        kv_source.append(src[-1])
    return ModelConfig(
        **common, head_dim=head_dim, rope_base=[base_swa if s else rope_base for s in swa],
        rope_dim=[rope_dim_swa if s else rope_dim_full for s in swa], rope_style="neox", swa=swa,
        sliding_window=window, kv_source=kv_source, attn_scale=1.0, embed_scale=math.sqrt(n_embd),
        activation="gelu_tanh", post_norms=True, qk_norm=True, v_norm=True,
        final_softcap=key("final_logit_softcapping", 0.0, required=False) or None,
        ple_dim=int(key("embedding_length_per_layer_input", 0, required=False)))
