"""Checks that a model file is safe to build a model from: typed, bounded metadata, and tensors that match the config.

Model files are untrusted input. The config (config.py, dflash_model.py) reads metadata through pydantic schemas made
of the types below, and every tensor the model will read is checked here for presence, shape and type against that
config before anything is allocated. So a broken or hostile file fails with a GGUFError naming the file and the key
or tensor, instead of a shape error deep in model.py, a hang in a loop over 2**32 layers, or a 4 TB allocation.

Why bounds at all when shapes are checked: the tensors bound the weights by the file's size, but some allocations
scale with products of hyper-parameters (the KV cache: n_ctx x layers x heads x head dim; activations: tokens x heads
x head dim) that a small file with a tiny embedding width could still make huge. The limits are far above any real
model (largest dims noted next to each) and far below what would exhaust memory.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, BeforeValidator, Field, ValidationError

from bolt_ros.engine.gguf.quants import F16_FIELDS, GGML_BLOCK, GGMLType
from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile, TensorInfo, torch_shape

MAX_LAYERS = 1024  # real: <= 126
MAX_EMBD = 1 << 16  # real: <= 18432
MAX_HEADS = 1024  # real: <= 128
MAX_HEAD_DIM = 4096  # real: <= 512
MAX_ATTN_WIDTH = 1 << 16  # n_head * head_dim, the per-token Q width; real: <= 16384
MAX_FF = 1 << 18  # real dense: <= 53248
MAX_VOCAB = 1 << 22  # real: <= 262144
MAX_PLE = 1 << 14  # Gemma 4 per-layer-input width; real: 256
MAX_CONTEXT = 1 << 32  # only sanity: the caller's n_ctx, not this, sizes the KV cache
MIN_CONTEXT = 64  # a smaller context cannot hold a chat prompt; real: >= 2048
MAX_KV_BYTES_PER_TOKEN = 1 << 22  # fp32 K+V of one position over all layers; real: ~1 MiB (405B), 115 KiB (E4B)
MAX_BLOCK = 256  # DFlash block size (one verify pass must fit the KV cache's 512-token step); real: 16
MAX_TARGET_LAYERS = 64  # DFlash fused target layers; real: 5

SUPPORTED_TYPES = frozenset(GGML_BLOCK)  # what quants.py dequantizes and linear.py packs
_SUPPORTED_NAMES = ", ".join(t.name for t in GGMLType)


def as_list(v: Any) -> Any:
    """GGUF numeric arrays arrive as numpy arrays: validate them as plain lists (bool arrays become bools, which a
    strict int field refuses). Per-layer arrays are short; a long one is refused before it is copied."""
    if isinstance(v, np.ndarray):
        if v.size > MAX_LAYERS:
            raise ValueError(f"an array of {v.size} entries (at most {MAX_LAYERS})")
        return v.tolist()
    return v


def as_id_list(v: Any) -> Any:
    """A GGUF array of token ids (up to MAX_VOCAB entries) as a plain list of ints; other kinds are left to the
    field's own validation (a float or bool array is refused there)."""
    if isinstance(v, np.ndarray):
        if v.size > MAX_VOCAB:
            raise ValueError(f"an array of {v.size} token ids (at most {MAX_VOCAB})")
        if v.dtype.kind not in "iu":
            raise ValueError(f"token ids of type {v.dtype}, not integers")
        return v.tolist()
    return v


def Int(lo: int, hi: int):  # reads as a type in the schemas
    """An integer in [lo, hi] (the schemas are strict: no bools, floats or strings)."""
    return Annotated[int, Field(ge=lo, le=hi)]


def Real(lo: float, hi: float, *, open_lo: bool = False):
    """A finite float in [lo, hi] ((lo, hi] with open_lo); ints are accepted, as llama.cpp writers mix them."""
    return Annotated[float, Field(gt=lo, le=hi, allow_inf_nan=False) if open_lo else
                     Field(ge=lo, le=hi, allow_inf_nan=False)]


def PerLayer(item):
    """One value for every layer, or an array with one per layer (the length is checked by per_layer())."""
    return Annotated[item | list[item], BeforeValidator(as_list)]



def read_metadata(gf: GGUFFile, schema: type[BaseModel], prefix: str) -> BaseModel:
    """Validate the metadata keys prefix + alias of schema's fields (absent keys take the schema's defaults)."""
    data = {}
    for name, field in schema.model_fields.items():
        alias = field.alias or name
        if prefix + alias in gf.metadata:
            data[alias] = gf.metadata[prefix + alias]
    try:
        return schema.model_validate(data)
    except ValidationError as e:
        raise GGUFError(describe(gf, e, prefix)) from None


def describe(gf: GGUFFile, e: ValidationError, prefix: str) -> str:
    """One line naming the file, the first bad key, its value and what was wrong with it."""
    errors = e.errors()
    loc = errors[0]["loc"]
    key = prefix + str(loc[0]) if loc else prefix.rstrip(".")
    if errors[0]["type"] == "missing":
        return f"{gf.path.name}: missing metadata key {key!r}"
    msgs: dict[str, str] = {}  # message -> where it first occurred ("" for the value itself, "[i]" for an entry)
    for err in errors:  # a union reports one error per member (and per bad entry): keep each message once
        if err["loc"][:1] == loc[:1]:
            at = "".join(f"[{p}]" for p in err["loc"][1:] if isinstance(p, int))
            msgs.setdefault(err["msg"], at)
    what = "; ".join(f"{at}: {m}" if at else m for m, at in msgs.items())
    return f"{gf.path.name}: metadata {key!r} = {short(errors[0].get('input'))}: {what}"


def short(value: Any, limit: int = 60) -> str:
    if isinstance(value, np.ndarray):  # GGUF arrays: their values, not numpy's repr
        value = value.tolist() if value.size <= 16 else f"<{value.size} x {value.dtype}>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def per_layer(gf: GGUFFile, value: Any, n_layer: int, key: str) -> list:
    """A PerLayer value as one entry per layer; an array of the wrong length names the key."""
    if isinstance(value, list):
        if len(value) != n_layer:
            raise GGUFError(f"{gf.path.name}: metadata {key!r} has {len(value)} entries for {n_layer} layers")
        return list(value)
    return [value] * n_layer


# --- tensors ---------------------------------------------------------------------------------------------------------
Shape = tuple[int | None, ...]  # torch order ([out, in] for a matrix); None: any size (checked elsewhere)


def check_tensor(gf: GGUFFile, name: str, shape: Shape | Iterable[Shape], why: str, *,
                 optional: bool = False) -> TensorInfo | None:
    """The tensor `name`: present (unless optional: then None when absent), of a supported type, and of `shape` (or
    one of several allowed shapes). `why` says where the expected shape comes from, for the error message."""
    info = gf.tensors.get(name)
    if info is None:
        if optional:
            return None
        raise GGUFError(f"{gf.path.name}: missing tensor {name!r} (expected shape {why})")
    shapes = [shape] if not shape or isinstance(shape[0], int | None) else list(shape)
    got = torch_shape(info)
    if not any(len(got) == len(s) and all(w is None or w == g for w, g in zip(s, got)) for s in shapes):
        want = " or ".join(str([("*" if d is None else d) for d in s]) for s in shapes)
        raise GGUFError(f"{gf.path.name}: tensor {name!r} has shape {list(got)}, expected {want} ({why})")
    if info.ggml_type not in SUPPORTED_TYPES:
        raise GGUFError(f"{gf.path.name}: tensor {name!r} has type {info.type_name}, which this engine cannot "
                        f"compute (supported: {_SUPPORTED_NAMES})")
    return info


_EXPONENT = {GGMLType.F16: 0x7C00, GGMLType.BF16: 0x7F80}  # all-ones exponent: inf or NaN
_SCAN = 1 << 24  # bytes per step of the scan: bounds its temporaries


def has_nonfinite(raw: np.ndarray, ggml_type: int) -> bool:
    """Whether a tensor's bytes hold an inf or NaN: every value of a float type, the f16 scales of a quantized one
    (its codes are integers, so finite scales give finite weights). No quantizer writes either: the file is broken,
    and NaN weights would reach the logits."""
    raw = np.asarray(raw, np.uint8).reshape(-1)
    if ggml_type == GGMLType.F32:
        return any(not np.isfinite(raw[i:i + _SCAN].view(np.float32)).all() for i in range(0, len(raw), _SCAN))
    if ggml_type in _EXPONENT:
        e = np.uint16(_EXPONENT[ggml_type])
        return any(((raw[i:i + _SCAN].view(np.uint16) & e) == e).any() for i in range(0, len(raw), _SCAN))
    fields = F16_FIELDS.get(ggml_type, ())
    if not fields:
        return False
    # every block size and scale offset of these types is even: the scales are columns of a uint16 view
    words = raw.view(np.uint16).reshape(-1, GGML_BLOCK[ggml_type][1] // 2)
    step = max(1, _SCAN // (2 * words.shape[1]))
    e = np.uint16(0x7C00)
    return any(((words[i:i + step, at // 2] & e) == e).any() for i in range(0, len(words), step) for at in fields)


def check_model_tensors(gf: GGUFFile, cfg) -> None:
    """Every tensor model.Transformer reads for this ModelConfig (and the optional ones it reads when present)."""
    E, V, L = cfg.n_embd, cfg.n_vocab, cfg.n_layer
    check_tensor(gf, "token_embd.weight", (V, E), f"[vocab {V}, embedding_length {E}]")
    check_tensor(gf, "output_norm.weight", (E,), f"[embedding_length {E}]")
    if not cfg.tied_output:
        check_tensor(gf, "output.weight", (V, E), f"[vocab {V}, embedding_length {E}]")
    full = [il for il in range(L) if not cfg.swa[il]]
    ff = check_tensor(gf, "rope_freqs.weight", (None,), "[rope dims / 2]", optional=True)
    if ff is not None and full:  # model.Rope divides the full layers' frequencies by the first rot/2 factors
        need = max(cfg.rope_dim[il] for il in full) // 2
        if ff.shape[0] < need:
            raise GGUFError(f"{gf.path.name}: tensor 'rope_freqs.weight' has {ff.shape[0]} factors, the full "
                            f"attention layers rotate {need} pairs (rope.dimension_count)")
    if cfg.ple_dim:
        P = cfg.ple_dim
        why = f"embedding_length_per_layer_input {P} x block_count {L}"
        check_tensor(gf, "per_layer_token_embd.weight", (V, L * P), f"[vocab {V}, {why}]")
        check_tensor(gf, "per_layer_model_proj.weight", (L * P, E), f"[{why}, embedding_length {E}]")
        check_tensor(gf, "per_layer_proj_norm.weight", (P,), f"[embedding_length_per_layer_input {P}]")
    for il in range(L):
        _check_block(gf, cfg, il)


def _check_block(gf: GGUFFile, cfg, il: int) -> None:
    p, E = f"blk.{il}.", cfg.n_embd
    hd, nq, nkv = cfg.head_dim[il], cfg.n_head * cfg.head_dim[il], cfg.n_head_kv[il] * cfg.head_dim[il]
    q_why = f"head_count {cfg.n_head} x head dim {hd}"
    kv_why = f"head_count_kv {cfg.n_head_kv[il]} x head dim {hd}"
    owns = cfg.owns_kv(il)
    vec = [("attn_norm", E, "embedding_length"), ("ffn_norm", E, "embedding_length")]
    mat = [("attn_q", (nq, E), f"[{q_why}, embedding_length {E}]"),
           ("attn_output", (E, nq), f"[embedding_length {E}, {q_why}]"),
           ("ffn_gate", (cfg.n_ff[il], E), f"[feed_forward_length {cfg.n_ff[il]}, embedding_length {E}]"),
           ("ffn_up", (cfg.n_ff[il], E), f"[feed_forward_length {cfg.n_ff[il]}, embedding_length {E}]"),
           ("ffn_down", (E, cfg.n_ff[il]), f"[embedding_length {E}, feed_forward_length {cfg.n_ff[il]}]")]
    if owns:
        mat += [("attn_k", (nkv, E), f"[{kv_why}, embedding_length {E}]"),
                ("attn_v", (nkv, E), f"[{kv_why}, embedding_length {E}]")]
    if cfg.qk_norm:
        vec += [("attn_q_norm", hd, "head dim")] + ([("attn_k_norm", hd, "head dim")] if owns else [])
    if cfg.post_norms:
        vec += [("post_attention_norm", E, "embedding_length"), ("post_ffw_norm", E, "embedding_length")]
    if cfg.attn_bias:
        vec += [("attn_q.bias", nq, q_why)] + ([("attn_k.bias", nkv, kv_why), ("attn_v.bias", nkv, kv_why)]
                                                if owns else [])
    if cfg.ple_dim:
        P = cfg.ple_dim
        mat += [("inp_gate", (P, E), f"[embedding_length_per_layer_input {P}, embedding_length {E}]"),
                ("proj", (E, P), f"[embedding_length {E}, embedding_length_per_layer_input {P}]")]
        vec += [("post_norm", E, "embedding_length")]
    for name, n, why in vec:
        full = p + name if name.endswith(".bias") else p + name + ".weight"
        check_tensor(gf, full, (n,), f"[{why} {n}]")
    for name, shape, why in mat:
        check_tensor(gf, p + name + ".weight", shape, why)
    # a per-layer scalar (Gemma 4) or per-channel gain: both broadcast over the residual stream
    check_tensor(gf, p + "layer_output_scale.weight", [(1,), (E,)], f"[1] or [embedding_length {E}]", optional=True)


def check_draft_fc(gf: GGUFFile, cfg) -> None:
    """The drafter's feature fusion, [embedding_length, target layers x target hidden]. Checked when the drafter is
    built (DFlashDraftModel, before it loads anything), after dflash.check_compatible has compared target_layers and
    target_hidden_size with the target: a drafter made for another target gets that, more telling, error first."""
    E, n_feat = cfg.n_embd, len(cfg.target_layers) * cfg.target_hidden
    check_tensor(gf, "fc.weight", (E, n_feat), f"[embedding_length {E}, {len(cfg.target_layers)} target_layers x "
                                               f"target_hidden_size {cfg.target_hidden}]")
    check_tensor(gf, "fc.scale", [(1,), (E,)], f"[1] or [embedding_length {E}]", optional=True)


def check_draft_tensors(gf: GGUFFile, cfg, enc_norm_names: tuple[str, ...]) -> None:
    """Every other tensor dflash_model.DFlashDraftModel reads for this DraftConfig (its own embedding/head rows are
    checked against the target's vocabulary, and fc by check_draft_fc, when it is attached)."""
    E, hd = cfg.n_embd, cfg.head_dim
    nq, nkv = cfg.n_head * hd, cfg.n_head_kv * hd
    if not any(n in gf.tensors for n in enc_norm_names):
        raise GGUFError(f"{gf.path.name}: drafter has no encoder norm ({' or '.join(enc_norm_names)})")
    for name in enc_norm_names:
        check_tensor(gf, name, (E,), f"[embedding_length {E}]", optional=True)
    check_tensor(gf, "output_norm.weight", (E,), f"[embedding_length {E}]")
    for name in ("token_embd.weight", "output.weight"):
        check_tensor(gf, name, (None, E), f"[target vocab, embedding_length {E}]", optional=True)
    q_why, kv_why = f"head_count {cfg.n_head} x key_length {hd}", f"head_count_kv {cfg.n_head_kv} x key_length {hd}"
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        for name, n, why in (("attn_norm", E, "embedding_length"), ("ffn_norm", E, "embedding_length"),
                             ("attn_q_norm", hd, "key_length"), ("attn_k_norm", hd, "key_length")):
            check_tensor(gf, p + name + ".weight", (n,), f"[{why} {n}]")
        check_tensor(gf, p + "attn_sinks.weight", (cfg.n_head,), f"[head_count {cfg.n_head}]", optional=True)
        for name, shape, why in (
                ("attn_q", (nq, E), f"[{q_why}, embedding_length {E}]"),
                ("attn_k", (nkv, E), f"[{kv_why}, embedding_length {E}]"),
                ("attn_v", (nkv, E), f"[{kv_why}, embedding_length {E}]"),
                ("attn_output", (E, nq), f"[embedding_length {E}, {q_why}]"),
                ("ffn_gate", (cfg.n_ff, E), f"[feed_forward_length {cfg.n_ff}, embedding_length {E}]"),
                ("ffn_up", (cfg.n_ff, E), f"[feed_forward_length {cfg.n_ff}, embedding_length {E}]"),
                ("ffn_down", (E, cfg.n_ff), f"[embedding_length {E}, feed_forward_length {cfg.n_ff}]")):
            check_tensor(gf, p + name + ".weight", shape, why)
