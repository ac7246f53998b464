"""The GGUF writer: a model's hyper-parameters, tensors and tokenizer as a GGUF file in llama.cpp's layout.

Production code, beside the reader: `bolt train-drafter` ships its dflash drafters with it (train/drafter.py), and the
test models of devtools/testmodel.py (random weights, named test tokenizers) are written by it too. Files use
llama.cpp's key and tensor names (the ones `convert_hf_to_gguf.py` writes) and the tensors of `layout.py`, so
llama.cpp, gguf-py, transformers' GGUF loader and our reader all read them.

State dicts (`write_model`) may use either naming; any GGUF name (`blk.N.…`, `token_embd.weight`, `output_norm.weight`)
marks a GGUF-named one:
  * HF names (`model.layers.0.self_attn.q_proj.weight`, `lm_head.weight`, z-lab `fc.weight`/`layers.0...` for dflash)
    in HF's conventions. They get the converter's transforms: Gemma 3 norms are stored as 1 + w, llama q/k rows are
    permuted to ggml's interleaved RoPE layout, a tied `lm_head` is dropped, Gemma 4's `layer_scalar` becomes
    `blk.N.layer_output_scale` and its `rope_freqs` is generated.
  * GGUF names (`blk.0.attn_q.weight`) in GGUF conventions (norms as stored), written as given.
Either way tensors are PyTorch-shaped ([out, in]); every name and shape is checked against the architecture.
`write_sources` takes tensors as `Source`s that are read, quantized (K-quants by kquant_pack.py) and written a chunk
at a time, so a model of any size streams through ~16 MiB of float32.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from bolt_ros.engine.gguf import kquant_pack
from bolt_ros.engine.gguf.layout import (
    QUANTS,
    ModelSpec,
    Quant,
    gemma4_rope_freqs,
    tensor_nbytes,
    tensor_plan,
    tensor_type,
)
from bolt_ros.engine.gguf.reader import GGUFFile, StringArray

_FILE_TYPE = {"f32": 0, "f16": 1, "q8_0": 7, "q4_k_m": 15, "q4_0": 2, "q4_1": 3, "q5_0": 8}  # llama_ftype


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


def tokenizer_items(metadata: Mapping[str, Any]) -> tuple[tuple[str, Any, VT], ...]:
    """The `tokenizer.*` entries of GGUF metadata (as GGUFFile reads them) as (key, value, GGUF type) to write."""
    return tuple((k, *_meta_value(v)) for k, v in metadata.items() if k.startswith("tokenizer."))


def tokenizer_of(path: str | Path) -> tuple[tuple[str, Any, VT], ...]:
    """The tokenizer of a GGUF file, ready to write (a dflash drafter's is its target's)."""
    with GGUFFile(path) as gf:
        return tokenizer_items(gf.metadata)


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


def write_sources(path: str | Path, spec: ModelSpec, sources: Mapping[str, Source], quant: str,
                  tokenizer: Sequence[tuple[str, Any, VT]], *, search: bool, name: str) -> None:
    """Write a model whose tensors (GGUF names) come as `Source`s, each read a chunk at a time while it is written.

    `tokenizer`: (key, value, GGUF type) entries (`tokenizer_of`, `tokenizer_items`), () for a layout-only file;
    `search`: llama.cpp's full K-quant scale search (slower; random weights gain nothing from it).
    """
    n_vocab = _vocab_size(tokenizer) if tokenizer else spec.vocab_size
    if spec.arch != "dflash" and n_vocab != spec.vocab_size:
        raise ValueError(f"vocab_size {spec.vocab_size} does not match the {n_vocab}-token tokenizer")
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
                state_dict: Mapping[str, Any], quant: Quant = "f32", tokenizer: Sequence[tuple[str, Any, VT]] = (), *,
                target: str | Path | None = None, search: bool = True, name: str) -> Path:
    """Write a state dict (HF or GGUF names, see the module doc) as a GGUF file; returns the path.

    `tokenizer`: its metadata as in `write_sources`, its vocabulary the size in hparams; a dflash drafter copies the
    tokenizer of its `target` GGUF instead (it drafts in its target's vocabulary).
    """
    spec = hparams if isinstance(hparams, ModelSpec) else ModelSpec(arch=arch, **dict(hparams))
    if spec.arch != arch:
        raise ValueError(f"hparams are for {spec.arch}, not {arch}")
    if spec.arch == "dflash":
        if target is None:
            raise ValueError("a dflash drafter needs its target GGUF (its tokenizer is copied)")
        tokenizer = tokenizer_of(target)
    arrays = _from_hf(spec, state_dict) if _is_hf_names(list(state_dict)) else {
        k: _as_numpy(v) for k, v in state_dict.items()}
    sources = {k: ArraySource(v) for k, v in arrays.items()}
    write_sources(path, spec, sources, quant, tokenizer, search=search, name=name)
    return Path(path)
