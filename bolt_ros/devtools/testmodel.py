"""GGUF writer for test models: gemma3, gemma4, llama and dflash drafters, from a state dict or random weights.

(Over 400 lines on purpose: one table of names, shapes and converter transforms per architecture, read by the
writer, the random-weight maker and the layout checks alike. A dev tool: the runtime never imports it.)

Files use llama.cpp's key and tensor names (the ones `convert_hf_to_gguf.py` writes), so llama.cpp, gguf-py,
transformers' GGUF loader and our engine all read them.

State dicts (`write_model`) may use either naming; the first key decides:
  * HF names (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`, z-lab `fc.weight`/`layers.0...` for dflash)
    in HF's conventions. They get the converter's transforms: Gemma 3 norms are stored as 1 + w, llama q/k rows are
    permuted to ggml's interleaved RoPE layout, a tied `lm_head` is dropped, Gemma 4's `layer_scalar` becomes
    `blk.N.layer_output_scale` and its `rope_freqs` is generated.
  * GGUF names (`blk.0.attn_q.weight`) in GGUF conventions (norms as stored), written as given.
Either way tensors are PyTorch-shaped ([out, in]); the writer checks every name and shape against the architecture.

Hyper-parameters are `ModelSpec` fields (see there); `random_model(arch, preset, seed)` gives (hparams, state dict)
for the small presets, and `write_random_model` streams any preset (E4B included) tensor by tensor: each tensor comes
from its own seeded generator (seed, name), so a streamed file equals `write_model(random_model(...))` bit for bit.

Tokenizers are copied from real models: `gemma` = Gemma 3 270M's 262144-token SentencePiece vocabulary (for gemma4,
Gemma 4's control tokens replace the `<unusedN>`/turn tokens at Gemma 4's ids, see `GEMMA4_TOKENS`); `smollm2` =
SmolLM2-135M-Instruct's GPT-2 BPE vocabulary with merges and chat template. Drafters copy their target's tokenizer.
"""
from __future__ import annotations

import argparse
import math
import struct
import sys
import time
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT
from gguf.constants import GGML_QUANT_SIZES
from pydantic import BaseModel, ConfigDict, model_validator

from bolt_ros.engine.gguf import kquant_pack
from bolt_ros.engine.gguf.reader import GGUFFile, StringArray

Arch = Literal["gemma3", "gemma4", "llama", "dflash"]
Quant = Literal["f32", "f16", "q8_0", "q4_k_m", "q4_0", "q4_1", "q5_0"]
ARCHS: tuple[str, ...] = ("gemma3", "gemma4", "llama", "dflash")
QUANTS: tuple[str, ...] = ("f32", "f16", "q8_0", "q4_k_m", "q4_0", "q4_1", "q5_0")
_FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k_m": 15, "q4_0": 2, "q4_1": 3, "q5_0": 8}  # llama_ftype
# "pure" files: every matrix of one type (llama-quantize --pure), for smoke runs over each type
_PURE = {"q8_0": QT.Q8_0, "q4_0": QT.Q4_0, "q4_1": QT.Q4_1, "q5_0": QT.Q5_0}

# Gemma 4's control tokens at their ids in the Gemma 4 vocabulary. The Gemma 3 vocabulary has `<unusedN>` (id N+6)
# at 46..52, 98, 100, 101 and <start_of_turn>/<end_of_turn> at 105/106; a gemma4 test model gets these instead.
# Types follow llama.cpp's Gemma 4 converter: the tokens the chat parser must see as text are USER_DEFINED (4).
GEMMA4_TOKENS: dict[int, tuple[str, int]] = {
    46: ("<|tool>", 3), 47: ("<tool|>", 3), 48: ("<|tool_call>", 4), 49: ("<tool_call|>", 4),
    50: ("<|tool_response>", 4), 51: ("<tool_response|>", 4), 52: ('<|"|>', 4), 98: ("<|think|>", 3),
    100: ("<|channel>", 4), 101: ("<channel|>", 4), 105: ("<|turn>", 3), 106: ("<turn|>", 3),
}


class ModelSpec(BaseModel):
    """Hyper-parameters of a test model (also the `hparams` dict of `write_model`)."""

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


# --- tensor sources -------------------------------------------------------------------------------------------------
class Source:
    """Rows of one tensor as float32 [rows, ne0] chunks (so huge tensors never sit in RAM at once)."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.ne0 = shape[-1]
        self.rows = math.prod(shape[:-1]) if len(shape) > 1 else 1

    def chunks(self, max_elems: int) -> Iterator[np.ndarray]:
        raise NotImplementedError

    def full(self) -> np.ndarray:
        return np.concatenate(list(self.chunks(1 << 62)), axis=0).reshape(self.shape)


class ArraySource(Source):
    def __init__(self, arr: np.ndarray):
        super().__init__(tuple(arr.shape))
        self.arr = np.ascontiguousarray(arr, dtype=np.float32).reshape(self.rows, self.ne0)

    def chunks(self, max_elems: int) -> Iterator[np.ndarray]:
        step = max(1, max_elems // self.ne0)
        for r in range(0, self.rows, step):
            yield self.arr[r:r + step]


class RandomSource(Source):
    """Seeded uniform values with a given mean and std; the stream does not depend on the chunk size."""

    def __init__(self, shape: tuple[int, ...], seed: int, name: str, mean: float, std: float):
        super().__init__(shape)
        self.seed_seq = np.random.SeedSequence([seed, zlib.crc32(name.encode())])
        self.mean, self.half = mean, std * math.sqrt(3.0)

    def chunks(self, max_elems: int) -> Iterator[np.ndarray]:
        rng = np.random.Generator(np.random.PCG64(self.seed_seq))
        step = max(1, max_elems // self.ne0)
        for r in range(0, self.rows, step):
            n = min(step, self.rows - r)
            u = rng.random((n, self.ne0), dtype=np.float32)  # [n, ne0] in [0, 1)
            u *= 2 * self.half
            u += self.mean - self.half
            yield u


def _random_source(t: TensorSpec, spec: ModelSpec, seed: int) -> Source:
    if t.kind == "rope_freqs":
        return ArraySource(gemma4_rope_freqs(spec))
    if t.kind == "norm":
        # gemma3 stores 1 + w; gemma4/llama/dflash weights sit around 1 too
        return RandomSource(t.shape, seed, t.name, 1.0, 0.1)
    if t.kind == "scale":
        return RandomSource(t.shape, seed, t.name, 0.75, 0.1)
    fan_in = t.shape[-1]
    std = 1.0 / math.sqrt(spec.n_embd) if t.kind == "embd" else 1.0 / math.sqrt(fan_in)
    return RandomSource(t.shape, seed, t.name, 0.0, std)


# --- HF -> GGUF names -----------------------------------------------------------------------------------------------
_LAYER_HF = {  # HF suffix after `model.layers.N.` -> GGUF suffix after `blk.N.`, per arch family
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_HF_GEMMA = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "per_layer_input_gate.weight": "inp_gate.weight",  # gemma4
    "per_layer_projection.weight": "proj.weight",
    "post_per_layer_input_norm.weight": "post_norm.weight",
    "layer_scalar": "layer_output_scale.weight",
}
_LAYER_HF_LLAMA = {"post_attention_layernorm.weight": "ffn_norm.weight"}  # llama/qwen3: the pre-FFN norm
_GLOBAL_HF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
    "fc.weight": "fc.weight",  # z-lab DFlashDraftModel
    "hidden_norm.weight": "enc.output_norm.weight",
}


def hf_to_gguf_name(arch: str, hf: str) -> str:
    """HF parameter name -> GGUF tensor name (Gemma3/Gemma4/Llama ForCausalLM, z-lab DFlashDraftModel)."""
    name = hf.replace("model.language_model.", "model.")  # multimodal Gemma checkpoints
    if arch == "dflash" and not name.startswith("model."):
        name = "model." + name if name.startswith(("layers.", "norm.")) else name
    if name in _GLOBAL_HF:
        return _GLOBAL_HF[name]
    parts = name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[2].isdigit():
        table = {**_LAYER_HF, **(_LAYER_HF_GEMMA if arch in ("gemma3", "gemma4") else _LAYER_HF_LLAMA)}
        if parts[3] in table:
            return f"blk.{parts[2]}.{table[parts[3]]}"
    raise ValueError(f"{arch}: no GGUF name for HF tensor {hf!r}")


def _llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half q/k rows -> ggml's interleaved RoPE pairs (convert_hf_to_gguf's LlamaModel.permute)."""
    out_dim = w.shape[0]
    return w.reshape(n_head, 2, out_dim // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _from_hf(spec: ModelSpec, state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for hf, value in state_dict.items():
        if spec.tie_embeddings and hf == "lm_head.weight":
            continue  # tied: the GGUF carries only token_embd
        if hf.endswith(("rotary_emb.inv_freq", "v_norm.weight")):
            continue  # buffers, not weights
        name = hf_to_gguf_name(spec.arch, hf)
        arr = _as_numpy(value)
        if spec.arch == "gemma3" and name.endswith("norm.weight"):
            arr = arr + 1.0  # Gemma3RMSNorm multiplies by (1 + w); llama.cpp stores 1 + w
        if spec.arch == "llama" and name.endswith("attn_q.weight"):
            arr = _llama_permute(arr, spec.n_head)
        if spec.arch == "llama" and name.endswith("attn_k.weight"):
            arr = _llama_permute(arr, spec.n_head_kv)
        out[name] = arr.reshape(-1) if name.endswith("layer_output_scale.weight") else arr
    if spec.arch == "gemma4" and "rope_freqs.weight" not in out:
        out["rope_freqs.weight"] = gemma4_rope_freqs(spec)
    return out


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor (torch is only needed by callers that pass tensors)
        value = value.detach().to("cpu").float().numpy()
    return np.asarray(value, dtype=np.float32)


def _is_hf_names(keys: Sequence[str]) -> bool:
    return not any(k.startswith("blk.") or k in ("token_embd.weight", "output_norm.weight") for k in keys)


# --- tokenizer metadata ---------------------------------------------------------------------------------------------
class _Packed(Sequence):
    """A metadata array already in GGUF encoding, written verbatim (the 262k-token arrays pack in ~0.1 s)."""

    def __init__(self, etype: VT, count: int, payload: bytes):
        self.etype, self.count, self.payload = etype, count, payload

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i):
        raise TypeError("packed GGUF array")


def _pack_strings(strings: Sequence[str]) -> _Packed:
    enc = [s.encode("utf-8", errors="surrogateescape") for s in strings]
    lens = np.fromiter(map(len, enc), np.uint64, len(enc)).view(np.uint8).reshape(-1, 8)
    payload = b"".join(x for pair in zip(map(bytes, lens), enc) for x in pair)
    return _Packed(VT.STRING, len(enc), payload)


_NP_VT = {np.dtype(np.float32): VT.FLOAT32, np.dtype(np.int32): VT.INT32, np.dtype(np.uint32): VT.UINT32,
          np.dtype(np.int64): VT.INT64, np.dtype(np.uint8): VT.UINT8, np.dtype(bool): VT.BOOL}


def _meta_value(value: Any) -> tuple[Any, VT]:
    """A value read by GGUFFile -> (value, GGUF type) for the writer (ids as u32, as llama.cpp writes them)."""
    if isinstance(value, bool):
        return value, VT.BOOL
    if isinstance(value, int):
        return value, VT.UINT32
    if isinstance(value, float):
        return value, VT.FLOAT32
    if isinstance(value, str):
        return value, VT.STRING
    if isinstance(value, np.ndarray):
        vt = _NP_VT[value.dtype]
        return _Packed(vt, len(value), np.ascontiguousarray(value).tobytes()), VT.ARRAY
    if isinstance(value, StringArray) or (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        return _pack_strings(value), VT.ARRAY
    raise TypeError(f"cannot copy metadata value of type {type(value).__name__}")


@lru_cache(maxsize=4)
def _tokenizer_from(path: str) -> tuple[tuple[str, Any], ...]:
    with GGUFFile(path) as gf:
        return tuple((k, v) for k, v in gf.metadata.items() if k.startswith("tokenizer."))


@lru_cache(maxsize=4)
def tokenizer_metadata(name: str) -> tuple[tuple[str, Any, VT], ...]:
    """(key, value, type) of a named tokenizer: `gemma`, `gemma4` (Gemma 3 vocab + Gemma 4 tokens), `smollm2`."""
    from bolt_ros.engine.default_models import resolve_model

    if name not in ("gemma", "gemma4", "smollm2"):
        raise ValueError(f"unknown tokenizer {name!r} (gemma, gemma4, smollm2)")
    src = resolve_model("smollm2" if name == "smollm2" else "default")
    items = dict(_tokenizer_from(str(src)))
    if name == "gemma4":
        tokens = list(items["tokenizer.ggml.tokens"])
        types = items["tokenizer.ggml.token_type"].copy()
        for i, (text, ttype) in GEMMA4_TOKENS.items():
            tokens[i], types[i] = text, ttype
        items["tokenizer.ggml.tokens"], items["tokenizer.ggml.token_type"] = tokens, types
    return tuple((k, *_meta_value(v)) for k, v in items.items())


def _copy_tokenizer(target: GGUFFile) -> tuple[tuple[str, Any, VT], ...]:
    return tuple((k, *_meta_value(v)) for k, v in target.metadata.items() if k.startswith("tokenizer."))


def default_tokenizer(arch: str) -> str:
    return {"gemma3": "gemma", "gemma4": "gemma4", "llama": "smollm2"}[arch]


# --- writing --------------------------------------------------------------------------------------------------------
class _Writer(gguf.GGUFWriter):
    """GGUFWriter that writes pre-packed metadata arrays verbatim (its own packing is per item, ~seconds for 262k)."""

    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if isinstance(val, _Packed):
            head = struct.pack("<I", VT.ARRAY) if add_vtype else b""
            return head + struct.pack("<IQ", val.etype, val.count) + val.payload
        return super()._pack_val(val, vtype, add_vtype, sub_type=sub_type)


class _Deferred:
    """Stands in for a tensor's data in GGUFWriter: quantizes and writes its rows chunk by chunk on `tofile`."""

    CHUNK = 1 << 22  # elements per chunk: ~16 MiB of float32 at a time

    def __init__(self, src: Source, qtype: QT, nbytes: int, search: bool):
        self.src, self.qtype, self.nbytes, self.search = src, qtype, nbytes, search

    def tofile(self, fout) -> None:
        written = 0
        for rows in self.src.chunks(self.CHUNK):
            data = kquant_pack.quantize(rows, self.qtype, search=self.search)
            fout.write(np.ascontiguousarray(data).tobytes())
            written += data.nbytes
        if written != self.nbytes:
            raise RuntimeError(f"wrote {written} bytes for a {self.nbytes}-byte tensor")


def _add_hparams(w: _Writer, spec: ModelSpec) -> None:
    a = spec.arch
    w.add_uint32(f"{a}.context_length", spec.context_length)
    w.add_uint32(f"{a}.embedding_length", spec.n_embd)
    w.add_uint32(f"{a}.block_count", spec.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    w.add_uint32(f"{a}.attention.head_count", spec.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.rms_eps)
    w.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    w.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    w.add_float32(f"{a}.rope.freq_base", spec.rope_base)
    if a != "dflash":
        w.add_uint32(f"{a}.vocab_size", spec.vocab_size)
    if a in ("llama", "dflash", "gemma4"):
        w.add_uint32(f"{a}.rope.dimension_count", spec.head_dim)
    if a in ("gemma3", "gemma4"):
        w.add_uint32(f"{a}.attention.sliding_window", spec.sliding_window)
    if spec.final_logit_softcap and a != "dflash":
        w.add_float32(f"{a}.final_logit_softcapping", spec.final_logit_softcap)
    if a == "gemma4":
        w.add_array(f"{a}.attention.sliding_window_pattern", [bool(x) for x in spec.swa_layers])
        w.add_uint32(f"{a}.attention.shared_kv_layers", spec.shared_kv_layers)
        w.add_uint32(f"{a}.embedding_length_per_layer_input", spec.ple_dim)
        w.add_uint32(f"{a}.attention.key_length_swa", spec.head_dim_swa)
        w.add_uint32(f"{a}.attention.value_length_swa", spec.head_dim_swa)
        w.add_uint32(f"{a}.rope.dimension_count_swa", spec.head_dim_swa)
        w.add_float32(f"{a}.rope.freq_base_swa", spec.rope_base_swa)
    if a == "dflash":
        w.add_key_value(f"{a}.target_layers", [i + 1 for i in spec.target_layers], VT.ARRAY, sub_type=VT.UINT32)
        w.add_uint32(f"{a}.target_hidden_size", spec.target_hidden)
        w.add_uint32(f"{a}.block_size", spec.block_size)
        w.add_uint32("tokenizer.ggml.mask_token_id", spec.mask_token_id)
        if spec.embedding_scale is not None:
            w.add_float32(f"{a}.embedding_scale", spec.embedding_scale)
        if spec.draft_vocab is not None:  # our key (llama.cpp ignores it): see engine/decode/dflash_model.py
            w.add_key_value(f"{a}.draft_vocab", sorted(set(spec.draft_vocab)), VT.ARRAY, sub_type=VT.UINT32)


def _write(path: str | Path, spec: ModelSpec, sources: Mapping[str, Source], quant: str,
           tokenizer: Sequence[tuple[str, Any, VT]], *, search: bool, name: str) -> None:
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r} ({', '.join(QUANTS)})")
    plan = tensor_plan(spec)
    expected = {t.name: t for t in plan}
    missing = [n for n in expected if n not in sources]
    extra = [n for n in sources if n not in expected]
    if missing or extra:
        raise ValueError(f"{spec.arch} state dict does not match the architecture: missing {missing[:8]}, "
                         f"unexpected {extra[:8]}")
    for t in plan:
        if sources[t.name].shape != t.shape:
            raise ValueError(f"tensor {t.name}: shape {sources[t.name].shape}, expected {t.shape}")

    w = _Writer(path, spec.arch)
    w.add_string("general.type", "model")
    w.add_string("general.name", name)
    w.add_uint32("general.file_type", _FILE_TYPE[quant])
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    _add_hparams(w, spec)
    for key, value, vt in tokenizer:
        if key == "tokenizer.ggml.mask_token_id" and spec.arch == "dflash":
            continue  # the drafter's own mask id wins over one copied from the target
        w.add_key_value(key, value, vt)
    for t in plan:
        qtype = tensor_type(t, spec, quant)
        nbytes = tensor_nbytes(qtype, t.shape)
        w.add_tensor_info(t.name, t.shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        w.tensors[-1][t.name].tensor = _Deferred(sources[t.name], qtype, nbytes, search)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def _vocab_size(tokenizer: Sequence[tuple[str, Any, VT]]) -> int:
    for key, value, _ in tokenizer:
        if key == "tokenizer.ggml.tokens":
            return len(value)
    raise ValueError("tokenizer metadata has no tokenizer.ggml.tokens")


def write_model(path: str | Path, arch: str, hparams: Mapping[str, Any] | ModelSpec,
                state_dict: Mapping[str, Any], quant: Quant = "f32", tokenizer: str | None = None, *,
                target: str | Path | None = None, search: bool = True, name: str | None = None) -> Path:
    """Write a state dict (HF or GGUF names, see the module doc) as a GGUF file; returns the path.

    `tokenizer`: `gemma`, `gemma4` or `smollm2` (default per arch: gemma3 -> gemma, gemma4 -> gemma4,
    llama -> smollm2), or `none` for a layout-only file with any vocab_size (fast gguf-py round trips; llama.cpp
    cannot run it); a dflash drafter copies the tokenizer of its `target` GGUF. The vocabulary size in hparams must
    match the tokenizer's.
    """
    spec = hparams if isinstance(hparams, ModelSpec) else ModelSpec(arch=arch, **dict(hparams))
    if spec.arch != arch:
        raise ValueError(f"hparams are for {spec.arch}, not {arch}")
    tok = _tokenizer_for(spec, tokenizer, target)
    arrays = _from_hf(spec, state_dict) if _is_hf_names(list(state_dict)) else {
        k: _as_numpy(v) for k, v in state_dict.items()}
    sources = {k: ArraySource(v) for k, v in arrays.items()}
    _write(path, spec, sources, quant, tok, search=search, name=name or f"bolt testmodel {arch}")
    return Path(path)


def _tokenizer_for(spec: ModelSpec, tokenizer: str | None, target: str | Path | None):
    if spec.arch == "dflash":
        if target is None:
            raise ValueError("a dflash drafter needs its target GGUF (its tokenizer is copied)")
        with GGUFFile(target) as tf:
            tok = _copy_tokenizer(tf)
    elif tokenizer == "none":
        return ()  # layout-only files (gguf-py round trips): no runtime can tokenize with them
    else:
        tok = tokenizer_metadata(tokenizer or default_tokenizer(spec.arch))
    n_vocab = _vocab_size(tok) if tok else spec.vocab_size
    if spec.arch != "dflash" and n_vocab != spec.vocab_size:
        raise ValueError(f"vocab_size {spec.vocab_size} does not match the {n_vocab}-token tokenizer")
    return tok


# --- presets --------------------------------------------------------------------------------------------------------
GEMMA_VOCAB, SMOLLM2_VOCAB = 262144, 49152


def preset_spec(arch: str, preset: str) -> ModelSpec:
    """Named hyper-parameter sets. `tiny` presets keep the real vocabularies (the tokenizer needs them): gemma ones
    are 64 wide (K-quant rows need multiples of 256, so their q4_k_m falls back to Q5_0/Q8_0 as llama.cpp does),
    llama tiny is 256 wide so its q4_k_m has real Q4_K/Q6_K tensors; gemma4 `e4b` has Gemma 4 E4B's exact shapes."""
    presets: dict[tuple[str, str], dict[str, Any]] = {
        ("gemma3", "tiny"): dict(n_layer=6, n_embd=64, n_head=2, n_head_kv=1, head_dim=32, n_ff=128,
                                 vocab_size=GEMMA_VOCAB, rope_base=1e6, sliding_window=16, context_length=2048),
        ("gemma4", "tiny"): dict(n_layer=6, n_embd=64, n_head=2, n_head_kv=1, head_dim=64, head_dim_swa=32,
                                 n_ff=128, vocab_size=GEMMA_VOCAB, rope_base=1e6, sliding_window=16,
                                 swa_layers=[True, True, True, False, True, False], shared_kv_layers=2, ple_dim=16,
                                 final_logit_softcap=30.0, context_length=2048),
        ("gemma4", "e4b"): dict(n_layer=42, n_embd=2560, n_head=8, n_head_kv=2, head_dim=512, head_dim_swa=256,
                                n_ff=10240, vocab_size=GEMMA_VOCAB, rope_base=1e6, sliding_window=512,
                                swa_layers=[il % 6 != 5 for il in range(42)], shared_kv_layers=18, ple_dim=256,
                                final_logit_softcap=30.0, context_length=131072),
        ("llama", "tiny"): dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                                vocab_size=SMOLLM2_VOCAB, rope_base=1e5, rms_eps=1e-5, context_length=2048),
    }
    if (arch, preset) not in presets:
        names = ", ".join(f"{a}/{p}" for a, p in presets)
        raise ValueError(f"no preset {preset!r} for {arch!r} (have {names}; dflash drafters take --target)")
    return ModelSpec(arch=arch, **presets[(arch, preset)])


def dflash_spec(target: GGUFFile, n_layers: int = 5, *, block_size: int = 8, mask_token_id: int = 4,
                target_layers: list[int] | None = None, embedding_scale: float | str | None = "auto") -> ModelSpec:
    """A drafter for `target`: hidden = the target's hidden size, Qwen3-style layers, z-lab's default layer choice.

    embedding_scale "auto" follows llama.cpp's current converter: sqrt(hidden) for Gemma targets (their embedding
    module scales), none otherwise.
    """
    arch = target.arch()
    H = int(target.require(f"{arch}.embedding_length"))
    L = int(target.require(f"{arch}.block_count"))
    if target_layers is None:
        target_layers = [L // 2] if n_layers == 1 else [
            round(1 + i * (L - 4) / (n_layers - 1)) for i in range(n_layers)]
    if embedding_scale == "auto":
        embedding_scale = math.sqrt(H) if arch.startswith("gemma") else None
    head_dim, n_head = (128, 32) if H >= 1024 else (16, 4)
    tokens = target.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if tokens is not None else int(target.require(f"{arch}.vocab_size"))
    return ModelSpec(arch="dflash", n_layer=n_layers, n_embd=H, n_head=n_head, n_head_kv=max(1, n_head // 4),
                     head_dim=head_dim, n_ff=2 * H, vocab_size=n_vocab, rms_eps=1e-6,
                     rope_base=float(target.get(f"{arch}.rope.freq_base", 10000.0)),
                     context_length=int(target.get(f"{arch}.context_length", 8192)),
                     target_layers=target_layers, target_hidden=H, block_size=block_size,
                     mask_token_id=mask_token_id, embedding_scale=embedding_scale)


def _random_sources(spec: ModelSpec, seed: int) -> dict[str, Source]:
    return {t.name: _random_source(t, spec, seed) for t in tensor_plan(spec)}


def random_model(arch: str, preset: str = "tiny", seed: int = 0, *,
                 target: str | Path | None = None, layers: int = 5) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(hparams, state dict with GGUF names, float32 numpy) of a random model; for dflash pass `target`."""
    spec = _spec_for(arch, preset, target, layers)
    n = sum(math.prod(t.shape) for t in tensor_plan(spec))
    if n > 1 << 29:
        raise ValueError(f"{arch}/{preset} has {n / 1e9:.1f}B parameters: stream it with write_random_model")
    state = {k: s.full() for k, s in _random_sources(spec, seed).items()}
    return spec.model_dump(exclude={"arch"}), state


def _spec_for(arch: str, preset: str, target: str | Path | None, layers: int) -> ModelSpec:
    if arch == "dflash":
        if target is None:
            raise ValueError("dflash needs --target T.gguf")
        with GGUFFile(target) as tf:
            return dflash_spec(tf, layers)
    return preset_spec(arch, preset)


def write_random_model(path: str | Path, arch: str, preset: str = "tiny", seed: int = 0, quant: Quant = "f32", *,
                       target: str | Path | None = None, layers: int = 5, tokenizer: str | None = None,
                       search: bool = False) -> Path:
    """Stream a random model to GGUF, one seeded tensor at a time (any size; E4B needs ~1 GB of RAM at most).

    `search=False` (default) skips the K-quant scale search: random weights gain nothing from it and E4B-sized
    tensors would take minutes more.
    """
    spec = _spec_for(arch, preset, target, layers)
    tok = _tokenizer_for(spec, tokenizer, target)
    _write(path, spec, _random_sources(spec, seed), quant, tok, search=search,
           name=f"bolt testmodel {arch} {preset if arch != 'dflash' else 'drafter'} seed {seed}")
    return Path(path)


# --- CLI ------------------------------------------------------------------------------------------------------------
def add_testmodel_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("testmodel", help="write a random test model as GGUF (llama.cpp layout)")
    p.add_argument("--arch", required=True, choices=ARCHS)
    p.add_argument("--preset", default="tiny", help="tiny (gemma3/gemma4/llama) or e4b (gemma4)")
    p.add_argument("--quant", default="f32", choices=QUANTS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output .gguf path")
    p.add_argument("--target", help="dflash: the target model GGUF")
    p.add_argument("--layers", type=int, default=5, help="dflash: number of drafter layers")
    p.add_argument("--search", action="store_true", help="K-quants: llama.cpp's full scale search (slower)")
    p.set_defaults(func=run_testmodel)
    return p


def run_testmodel(args: argparse.Namespace) -> int:
    from bolt_ros.engine.default_models import resolve_model

    target = str(resolve_model(args.target)) if args.target else None
    if args.layers < 1:
        raise ValueError("--layers must be >= 1")
    t0 = time.perf_counter()
    path = write_random_model(args.out, args.arch, args.preset, args.seed, args.quant, target=target,
                              layers=args.layers, search=args.search)
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":  # python -m bolt_ros.devtools.testmodel --arch gemma3 --out x.gguf
    parser = argparse.ArgumentParser(prog="testmodel")
    sub = parser.add_subparsers()
    add_testmodel_parser(sub)
    ns = parser.parse_args(["testmodel", *sys.argv[1:]])
    sys.exit(ns.func(ns))
