"""Model hyper-parameters from GGUF metadata alone (llama.cpp key names), one typed record for every architecture.

Per-layer quantities (head dim, KV heads, FFN width, rope base, sliding or not, KV source) are lists so that
Gemma 4's mixed layers and the uniform llama/Gemma 3/Qwen2 layers go through the same model code.
"""
from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from bolt_ros.engine.gguf import validate, validate_tokenizer
from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile
from bolt_ros.engine.gguf.validate import (
    MAX_CONTEXT,
    MAX_EMBD,
    MAX_FF,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_PLE,
    MAX_VOCAB,
    MIN_CONTEXT,
    Int,
    PerLayer,
    Real,
)

SUPPORTED_ARCHS = ("llama", "qwen2", "gemma3", "gemma4")


class ModelConfig(BaseModel):
    model_config = ConfigDict(frozen=True)

    arch: Literal["llama", "qwen2", "gemma3", "gemma4"]
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
    rope_style: Literal["neox", "norm"]  # neox: rotate halves (Gemma, Qwen2); norm: adjacent pairs (llama GGUF layout)
    swa: list[bool]  # sliding-window attention per layer
    sliding_window: int | None
    kv_source: list[int]  # layer whose cache a layer reads (itself unless KV-shared)
    attn_scale: float
    embed_scale: float  # multiplies token embeddings (sqrt(n_embd) for Gemma)
    activation: Literal["silu", "gelu_tanh"]
    post_norms: bool  # Gemma: post-attention / post-FFN norms
    qk_norm: bool
    attn_bias: bool = False  # Qwen2: biases on the Q/K/V projections (blk.N.attn_{q,k,v}.bias)
    v_norm: bool  # Gemma 4: weightless RMS norm of V
    final_softcap: float | None
    ple_dim: int  # Gemma 4 per-layer embedding width (0 = none)
    tied_output: bool

    @model_validator(mode="after")
    def _per_layer_lists(self) -> ModelConfig:
        # a backstop for configs built by hand: the model indexes every per-layer list by layer
        for name in ("n_head_kv", "head_dim", "n_ff", "rope_base", "rope_dim", "swa", "kv_source"):
            if len(getattr(self, name)) != self.n_layer:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {self.n_layer} layers")
        if any(not 0 <= src <= il for il, src in enumerate(self.kv_source)):
            raise ValueError(f"kv_source {self.kv_source} must name the layer itself or an earlier one")
        return self

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


class _Hparams(BaseModel):
    """The `{arch}.*` keys config_from_gguf reads, typed and bounded (aliases: the key names after the prefix)."""

    model_config = ConfigDict(strict=True, frozen=True)

    n_layer: Int(1, MAX_LAYERS) = Field(alias="block_count")
    n_embd: Int(1, MAX_EMBD) = Field(alias="embedding_length")
    n_head: Int(1, MAX_HEADS) = Field(alias="attention.head_count")
    n_head_kv: PerLayer(Int(1, MAX_HEADS)) | None = Field(None, alias="attention.head_count_kv")
    n_ff: PerLayer(Int(1, MAX_FF)) = Field(alias="feed_forward_length")
    vocab_size: Int(1, MAX_VOCAB) | None = Field(None, alias="vocab_size")
    n_ctx_train: Int(MIN_CONTEXT, MAX_CONTEXT) = Field(4096, alias="context_length")
    head_dim: Int(1, MAX_HEAD_DIM) | None = Field(None, alias="attention.key_length")
    head_dim_swa: Int(1, MAX_HEAD_DIM) | None = Field(None, alias="attention.key_length_swa")
    rope_dim: Int(1, MAX_HEAD_DIM) | None = Field(None, alias="rope.dimension_count")
    rope_dim_swa: Int(1, MAX_HEAD_DIM) | None = Field(None, alias="rope.dimension_count_swa")
    rope_base: Real(0, 1e12, open_lo=True) = Field(10000.0, alias="rope.freq_base")
    rope_base_swa: Real(0, 1e12, open_lo=True) = Field(10000.0, alias="rope.freq_base_swa")
    rms_eps: Real(0, 1, open_lo=True) = Field(1e-6, alias="attention.layer_norm_rms_epsilon")
    sliding_window: Int(0, MAX_CONTEXT) = Field(0, alias="attention.sliding_window")  # 0: none
    swa_pattern: PerLayer(bool) | None = Field(None, alias="attention.sliding_window_pattern")
    n_shared: Int(0, MAX_LAYERS) = Field(0, alias="attention.shared_kv_layers")
    softcap: Real(0, 1e6) = Field(0.0, alias="final_logit_softcapping")  # 0: none
    ple_dim: Int(0, MAX_PLE) = Field(0, alias="embedding_length_per_layer_input")


def config_from_gguf(gf: GGUFFile) -> ModelConfig:
    """The ModelConfig of a model file. Every key it reads is typed and bounded (_Hparams; the tokenizer's:
    validate_tokenizer), cross-checked, and every tensor the model will read is checked against it
    (validate.check_model_tensors): a malformed file gives a GGUFError naming the file and the key or tensor, before
    anything is allocated."""
    arch = gf.arch()
    name = gf.path.name
    if arch not in SUPPORTED_ARCHS:
        raise GGUFError(f"{name}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    tok = validate_tokenizer.check_tokenizer(gf)
    if tok.tokens is None and any(k.startswith("tokenizer.ggml.") for k in gf.metadata):
        # a tokenizer without its vocabulary (a file with no tokenizer keys at all is a layout-only test file)
        raise GGUFError(f"{name}: missing metadata key 'tokenizer.ggml.tokens'")
    validate_tokenizer.check_chat_template(gf, arch, tok)
    hp = validate.read_metadata(gf, _Hparams, f"{arch}.")

    def key(field: str) -> str:
        return f"{arch}.{_Hparams.model_fields[field].alias}"

    L = hp.n_layer
    n_head_kv = validate.per_layer(gf, hp.n_head_kv if hp.n_head_kv is not None else hp.n_head, L, key("n_head_kv"))
    n_ff = validate.per_layer(gf, hp.n_ff, L, key("n_ff"))
    for il, n_kv in enumerate(n_head_kv):
        if hp.n_head % n_kv:  # grouped-query attention shares each KV head among n_head / n_kv query heads
            raise GGUFError(f"{name}: {key('n_head')} = {hp.n_head} is not a multiple of {key('n_head_kv')} = "
                            f"{n_kv} (layer {il})")
    n_vocab = _n_vocab(gf, tok)
    head_dim_full = hp.head_dim if hp.head_dim is not None else hp.n_embd // hp.n_head
    if head_dim_full < 1:
        raise GGUFError(f"{name}: missing metadata key {key('head_dim')!r} ({key('n_embd')} {hp.n_embd} < "
                        f"{key('n_head')} {hp.n_head})")
    window = hp.sliding_window or None
    common = dict(arch=arch, n_layer=L, n_embd=hp.n_embd, n_vocab=n_vocab, n_head=hp.n_head, n_head_kv=n_head_kv,
                  n_ff=n_ff, rms_eps=hp.rms_eps, n_ctx_train=hp.n_ctx_train, tied_output="output.weight" not in
                  gf.tensors)

    if arch in ("llama", "qwen2"):
        # The same pre-norm SiLU-gated block. Qwen2 differs in data only: llama.cpp rotates it NEOX-style
        # (LLM_ARCH_QWEN2 -> LLAMA_ROPE_TYPE_NEOX; the llama converter permutes Q/K rows for its adjacent pairs,
        # the qwen2 one does not) and its Q/K/V projections carry biases. llama.cpp also loads llama's biases when
        # a file has them, hence the presence test rather than the arch name.
        rope_dim = hp.rope_dim if hp.rope_dim is not None else head_dim_full
        fields = dict(
            head_dim=[head_dim_full] * L, rope_base=[hp.rope_base] * L, rope_dim=[rope_dim] * L,
            rope_style="neox" if arch == "qwen2" else "norm", swa=[False] * L, sliding_window=None,
            kv_source=list(range(L)), attn_scale=1 / math.sqrt(head_dim_full), embed_scale=1.0, activation="silu",
            post_norms=False, qk_norm=False, v_norm=False, final_softcap=None, ple_dim=0,
            attn_bias="blk.0.attn_q.bias" in gf.tensors)
    elif arch == "gemma3":
        # llama.cpp: every 6th layer is global; local layers use theta 1e4 (not stored in the file)
        swa = [il % 6 < 5 for il in range(L)] if window else [False] * L
        fields = dict(
            head_dim=[head_dim_full] * L, rope_base=[hp.rope_base_swa if s else hp.rope_base for s in swa],
            rope_dim=[head_dim_full] * L, rope_style="neox", swa=swa, sliding_window=window,
            kv_source=list(range(L)), attn_scale=1 / math.sqrt(head_dim_full), embed_scale=math.sqrt(hp.n_embd),
            activation="gelu_tanh", post_norms=True, qk_norm=True, v_norm=False, final_softcap=hp.softcap or None,
            ple_dim=0)
    else:
        fields = _gemma4(gf, hp, key, head_dim_full, window)
    cfg = _build(gf, common, fields)
    _check_sizes(gf, cfg, key)
    validate.check_model_tensors(gf, cfg)
    return cfg


def _gemma4(gf: GGUFFile, hp: _Hparams, key, head_dim_full: int, window: int | None) -> dict:
    name, L = gf.path.name, hp.n_layer
    if hp.swa_pattern is None:
        raise GGUFError(f"{name}: missing metadata key {key('swa_pattern')!r}")
    swa = validate.per_layer(gf, hp.swa_pattern, L, key("swa_pattern"))
    if any(swa) and window is None:  # the sliding layers' masks and ring caches need the window
        raise GGUFError(f"{name}: missing metadata key {key('sliding_window')!r} (the file has sliding layers)")
    head_dim_swa = hp.head_dim_swa if hp.head_dim_swa is not None else head_dim_full
    rope_full = hp.rope_dim if hp.rope_dim is not None else head_dim_full
    rope_swa = hp.rope_dim_swa if hp.rope_dim_swa is not None else head_dim_swa
    if not hp.n_shared < L:
        raise GGUFError(f"{name}: {key('n_shared')} = {hp.n_shared} with {key('n_layer')} = {L}")
    first_shared = L - hp.n_shared
    kv_source = []
    last_owner: dict[bool, int] = {}  # the last KV-owning layer of each attention type
    for il in range(L):
        if il < first_shared:
            kv_source.append(il)
            last_owner[swa[il]] = il
        elif swa[il] in last_owner:  # a shared layer reads the cache of the last owning layer of its own type
            kv_source.append(last_owner[swa[il]])
        else:
            raise GGUFError(f"{name}: layer {il} shares KV ({key('n_shared')} = {hp.n_shared}) but no earlier layer "
                            f"has its attention type ({key('swa_pattern')})")
    return dict(
        head_dim=[head_dim_swa if s else head_dim_full for s in swa],
        rope_base=[hp.rope_base_swa if s else hp.rope_base for s in swa],
        rope_dim=[rope_swa if s else rope_full for s in swa], rope_style="neox", swa=swa, sliding_window=window,
        kv_source=kv_source, attn_scale=1.0, embed_scale=math.sqrt(hp.n_embd), activation="gelu_tanh",
        post_norms=True, qk_norm=True, v_norm=True, final_softcap=hp.softcap or None, ple_dim=hp.ple_dim)


def _n_vocab(gf: GGUFFile, tok) -> int:
    """The model's vocabulary = the embedding's rows, which must be the tokenizer's (ids outside either would index
    past the table or decode to nothing); layout-only files without a tokenizer take the embedding as it is."""
    emb = validate.check_tensor(gf, "token_embd.weight", (None, None), "[vocab, embedding_length]")
    rows = emb.shape[1]
    if rows > validate.MAX_VOCAB:
        raise GGUFError(f"{gf.path.name}: tensor 'token_embd.weight' has {rows} rows (at most {validate.MAX_VOCAB})")
    if tok.tokens is not None and len(tok.tokens) != rows:
        raise GGUFError(f"{gf.path.name}: tensor 'token_embd.weight' has {rows} rows for the {len(tok.tokens)} "
                        "tokens of 'tokenizer.ggml.tokens'")
    return rows


def _build(gf: GGUFFile, common: dict, fields: dict) -> ModelConfig:
    try:
        return ModelConfig(**common, **fields)
    except ValidationError as e:  # a backstop: the checks above should have caught it with the key's name
        raise GGUFError(validate.describe(gf, e, "config.")) from None


def _check_sizes(gf: GGUFFile, cfg: ModelConfig, key) -> None:
    """Cross-key bounds: rotations within heads, and per-token costs that no single key bounds (see validate)."""
    name = gf.path.name
    for il in range(cfg.n_layer):
        hd, rot = cfg.head_dim[il], cfg.rope_dim[il]
        if rot % 2 or rot > hd:  # RoPE rotates pairs of the head's first rot dims
            which = key("rope_dim_swa") if cfg.swa[il] and cfg.arch == "gemma4" else key("rope_dim")
            raise GGUFError(f"{name}: {which} = {rot} must be even and at most the head dim {hd} (layer {il})")
        if cfg.n_head * hd > validate.MAX_ATTN_WIDTH:
            raise GGUFError(f"{name}: {key('n_head')} {cfg.n_head} x head dim {hd} exceeds "
                            f"{validate.MAX_ATTN_WIDTH} (layer {il})")
    per_token = cfg.kv_bytes(1, dtype_bytes=4)
    if per_token > validate.MAX_KV_BYTES_PER_TOKEN:
        raise GGUFError(f"{name}: the KV cache would take {per_token} bytes per token ({key('n_layer')}, "
                        f"{key('n_head_kv')}, head dims; at most {validate.MAX_KV_BYTES_PER_TOKEN})")
