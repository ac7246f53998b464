"""The layout of a model in a GGUF file as llama.cpp has it: hyper-parameters, tensor names and shapes, ggml types.

One table per architecture (gemma3, gemma4, llama, dflash drafters): `tensor_plan(spec)` lists every tensor in
llama.cpp's file order and `tensor_type` gives each its ggml type in a file of a given quant (llama.cpp's Q4_K_M recipe,
its fallbacks, and llama-quantize --pure's single-type files). `writer.py` writes files to this layout (drafters from
`bolt train-drafter`, test models from devtools/testmodel.py), and checks every state dict against it; it is a module of
its own so the writer stays one file about bytes and names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf.constants import GGML_QUANT_SIZES
from pydantic import BaseModel, ConfigDict, model_validator

Arch = Literal["gemma3", "gemma4", "llama", "dflash"]
Quant = Literal["f32", "f16", "q8_0", "q4_k_m", "q4_0", "q4_1", "q5_0"]
ARCHS: tuple[str, ...] = ("gemma3", "gemma4", "llama", "dflash")
QUANTS: tuple[str, ...] = ("f32", "f16", "q8_0", "q4_k_m", "q4_0", "q4_1", "q5_0")
# "pure" files: every matrix of one type (llama-quantize --pure), for smoke runs over each type
_PURE = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1, "q5_0": QT.Q5_0}


class ModelSpec(BaseModel):
    """Hyper-parameters of a model to write (also the `hparams` dict of `writer.write_model`)."""

    model_config = ConfigDict(extra="forbid")

    arch: Arch
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int  # gemma4: the full-attention head dim (GGUF attention.key_length)
    n_ff: int
    vocab_size: int
    context_length: int = 8192
    rms_eps: float = 1e-6
    rope_base: float = 10000.0  # gemma3/gemma4: the full-attention layers' theta
    rope_base_swa: float = 10000.0  # gemma3 (fixed in llama.cpp) / gemma4 sliding layers
    sliding_window: int | None = None  # gemma3/gemma4
    swa_layers: list[bool] | None = None  # gemma4 (required); gemma3: fixed to llama.cpp's `il % 6 < 5`
    head_dim_swa: int | None = None  # gemma4 sliding layers
    shared_kv_layers: int = 0  # gemma4: the last N layers reuse earlier KV
    ple_dim: int = 0  # gemma4 per-layer-embedding width (0 = none)
    rope_partial_full: float = 0.25  # gemma4: rotated fraction of full-layer head dims ("proportional" RoPE)
    final_logit_softcap: float | None = None
    tie_embeddings: bool = True
    # dflash
    target_layers: list[int] | None = None  # HF layer ids (output of layer i); written +1 like llama.cpp
    target_hidden: int | None = None
    block_size: int = 8
    mask_token_id: int = 4
    embedding_scale: float | None = None  # dflash.embedding_scale (llama.cpp scales draft input embeddings by it)
    draft_vocab: list[int] | None = None  # dflash.draft_vocab: the tokens the drafter was trained to predict

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        positive = ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ff", "vocab_size")
        for f in positive:
            if getattr(self, f) <= 0:
                raise ValueError(f"{f} must be positive")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"n_head {self.n_head} is not a multiple of n_head_kv {self.n_head_kv}")
        if self.arch == "gemma3":
            pattern = [il % 6 < 5 for il in range(self.n_layer)]
            if self.swa_layers is not None and self.swa_layers != pattern:
                raise ValueError("gemma3 layers follow llama.cpp's fixed pattern (il % 6 < 5 is sliding)")
            self.swa_layers = pattern
            if self.sliding_window is None:
                raise ValueError("gemma3 needs sliding_window")
        if self.arch == "gemma4":
            if self.swa_layers is None or len(self.swa_layers) != self.n_layer:
                raise ValueError("gemma4 needs swa_layers with one bool per layer")
            if self.head_dim_swa is None or self.sliding_window is None:
                raise ValueError("gemma4 needs head_dim_swa and sliding_window")
            owners = self.swa_layers[: self.n_layer - self.shared_kv_layers]
            if not 0 <= self.shared_kv_layers < self.n_layer or (
                    self.shared_kv_layers and not (any(owners) and not all(owners))):
                raise ValueError("gemma4 shared_kv_layers needs a sliding and a full layer before the shared ones")
            if self.shared_kv_layers and owners[-1]:
                # llama.cpp maps each shared layer onto the last owner of its kind and asserts the last owner is a
                # full layer (llama-kv-cache.cpp `map_layer_ids.find(il_reuse)`), as in E4B (layer 23 of 24 owners)
                raise ValueError("gemma4 with shared_kv_layers needs its last KV-owning layer to be a full one")
        if self.arch == "dflash":
            if not self.target_layers or self.target_hidden is None:
                raise ValueError("dflash needs target_layers and target_hidden")
            if self.block_size < 2:
                raise ValueError("dflash block_size must be >= 2")
            if self.draft_vocab is not None and not all(0 <= t < self.vocab_size for t in self.draft_vocab):
                raise ValueError("dflash draft_vocab holds ids outside the vocabulary")
        return self

    def layer_head_dim(self, il: int) -> int:
        if self.arch == "gemma4" and self.swa_layers[il]:
            return self.head_dim_swa
        return self.head_dim

    def owns_kv(self, il: int) -> bool:
        return il < self.n_layer - self.shared_kv_layers


# --- tensor plan ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TensorSpec:
    name: str  # GGUF name
    shape: tuple[int, ...]  # PyTorch order ([out, in] for matrices)
    kind: Literal["matrix", "embd", "norm", "scale", "rope_freqs"]
    layer: int | None = None


def tensor_plan(spec: ModelSpec) -> list[TensorSpec]:
    """Every tensor the architecture has, in llama.cpp's file order."""
    E, V = spec.n_embd, spec.vocab_size
    plan: list[TensorSpec] = []

    def add(name, shape, kind, layer=None):
        plan.append(TensorSpec(name, tuple(shape), kind, layer))

    if spec.arch == "dflash":
        add("fc.weight", (E, len(spec.target_layers) * spec.target_hidden), "matrix")
        add("enc.output_norm.weight", (E,), "norm")
    else:
        add("token_embd.weight", (V, E), "embd")
    if spec.arch == "gemma4":
        L, P = spec.n_layer, spec.ple_dim
        add("rope_freqs.weight", (spec.head_dim // 2,), "rope_freqs")
        if P:
            add("per_layer_token_embd.weight", (V, L * P), "embd")
            add("per_layer_model_proj.weight", (L * P, E), "matrix")
            add("per_layer_proj_norm.weight", (P,), "norm")
    for il in range(spec.n_layer):
        hd = spec.layer_head_dim(il)
        b = f"blk.{il}."
        add(b + "attn_norm.weight", (E,), "norm", il)
        add(b + "attn_q.weight", (spec.n_head * hd, E), "matrix", il)
        if spec.owns_kv(il):
            add(b + "attn_k.weight", (spec.n_head_kv * hd, E), "matrix", il)
            add(b + "attn_v.weight", (spec.n_head_kv * hd, E), "matrix", il)
        add(b + "attn_output.weight", (E, spec.n_head * hd), "matrix", il)
        if spec.arch != "llama":
            add(b + "attn_q_norm.weight", (hd,), "norm", il)
            if spec.owns_kv(il):
                add(b + "attn_k_norm.weight", (hd,), "norm", il)
        if spec.arch in ("gemma3", "gemma4"):
            add(b + "post_attention_norm.weight", (E,), "norm", il)
        add(b + "ffn_norm.weight", (E,), "norm", il)
        add(b + "ffn_gate.weight", (spec.n_ff, E), "matrix", il)
        add(b + "ffn_up.weight", (spec.n_ff, E), "matrix", il)
        add(b + "ffn_down.weight", (E, spec.n_ff), "matrix", il)
        if spec.arch in ("gemma3", "gemma4"):
            add(b + "post_ffw_norm.weight", (E,), "norm", il)
        if spec.arch == "gemma4":
            if spec.ple_dim:
                add(b + "inp_gate.weight", (spec.ple_dim, E), "matrix", il)
                add(b + "proj.weight", (E, spec.ple_dim), "matrix", il)
                add(b + "post_norm.weight", (E,), "norm", il)
            add(b + "layer_output_scale.weight", (1,), "scale", il)
    add("output_norm.weight", (E,), "norm")
    if not spec.tie_embeddings and spec.arch != "dflash":
        add("output.weight", (V, E), "matrix")
    return plan


def gemma4_rope_freqs(spec: ModelSpec) -> np.ndarray:
    """llama.cpp's freq factors for proportional RoPE: 1 for rotated pairs, 1e30 (no rotation) for the rest."""
    half = spec.head_dim // 2
    n_rot = int(spec.head_dim * spec.rope_partial_full / 2)
    return np.array([1.0] * n_rot + [1e30] * (half - n_rot), np.float32)


# --- type mix -------------------------------------------------------------------------------------------------------
def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(qtype: QT, ne0: int) -> QT:
    """llama.cpp's fallback when a row does not split into the type's blocks."""
    chain = {QT.Q4_K: QT.Q5_0, QT.Q6_K: QT.Q8_0, QT.Q5_0: QT.F16, QT.Q8_0: QT.F16}
    while ne0 % GGML_QUANT_SIZES[qtype][0]:
        qtype = chain[qtype]
    return qtype


def tensor_type(t: TensorSpec, spec: ModelSpec, quant: str) -> QT:
    """The ggml type of a tensor in a file of this `quant` (llama.cpp's Q4_K_M recipe for q4_k_m)."""
    if t.kind not in ("matrix", "embd") or quant == "f32":
        return QT.F32  # norms, scales and rope factors stay F32, as llama.cpp keeps 1-D tensors
    if quant == "f16" or t.name == "per_layer_model_proj.weight":  # llama.cpp leaves the PLE projection unquantized
        return QT.F16
    if quant in _PURE:
        qtype = _PURE[quant]
        return qtype if t.shape[-1] % GGML_QUANT_SIZES[qtype][0] == 0 else QT.F16
    qtype = QT.Q4_K
    if t.kind == "embd" or t.name == "output.weight":
        qtype = QT.Q6_K  # the output head (or the tied embedding, and Gemma 4's PLE table with it)
    elif t.layer is not None and t.name.endswith(("attn_v.weight", "ffn_down.weight")):
        # llama.cpp counts attn_v tensors (shared-KV layers have none), and ffn_down by layer
        if t.name.endswith("attn_v.weight"):
            owners = sum(spec.owns_kv(i) for i in range(spec.n_layer))
            more = _use_more_bits(t.layer, owners)
        else:
            more = _use_more_bits(t.layer, spec.n_layer)
        qtype = QT.Q6_K if more else QT.Q4_K
    return _fallback(qtype, t.shape[-1])


def tensor_nbytes(qtype: QT, shape: tuple[int, ...]) -> int:
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * block_bytes

