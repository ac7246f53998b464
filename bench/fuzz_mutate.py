"""GGUF files as editable structure, and the seeded structural mutations of the hostile-file fuzz (fuzz_load.py).

A file is parsed into its metadata entries (key, value type, encoded value) and tensors (name, ggml dims, type,
bytes) and written back with fresh offsets, so a mutation can change one value's type, a per-layer array's length, a
tensor's shape or type, or drop either, and still produce a file that parses as far as that change allows. Byte flips
and truncation work on the written bytes. `mutate(raw, rng)` is what the fuzz runs and the tests replay.
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field, replace

from bolt_ros.engine.gguf.types import GGML_TYPES, block_size

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
        I64: "<q", F64: "<d"}
_SIZE = {t: struct.calcsize(f) for t, f in _FMT.items()}
_INT_RANGE = {U8: (0, 255), I8: (-128, 127), U16: (0, 65535), I16: (-32768, 32767), U32: (0, 2**32 - 1),
              I32: (-2**31, 2**31 - 1), U64: (0, 2**64 - 1), I64: (-2**63, 2**63 - 1)}


@dataclass
class KV:
    key: str
    vtype: int
    payload: bytes  # the encoded value (an array: element type, count, elements)


@dataclass
class Tensor:
    name: str
    dims: list[int]  # ggml order (ne0 first)
    ggml_type: int
    data: bytes


@dataclass
class Raw:
    version: int = 3
    kvs: list[KV] = field(default_factory=list)
    tensors: list[Tensor] = field(default_factory=list)

    def get(self, key: str) -> KV | None:
        return next((kv for kv in self.kvs if kv.key == key), None)

    def set(self, key: str, vtype: int, payload: bytes) -> None:
        kv = self.get(key)
        if kv is None:
            self.kvs.append(KV(key, vtype, payload))
        else:
            kv.vtype, kv.payload = vtype, payload

    def tensor(self, name: str) -> Tensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    def copy(self) -> Raw:
        return Raw(self.version, [replace(kv) for kv in self.kvs], [replace(t, dims=list(t.dims))
                                                                    for t in self.tensors])


# --- encoding ------------------------------------------------------------------------------------------------------
def enc_str(text: str | bytes) -> bytes:
    b = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text  # invalid UTF-8 on purpose too
    return struct.pack("<Q", len(b)) + b


def enc_scalar(vtype: int, v) -> bytes:
    return struct.pack(_FMT[vtype], v)


def enc_array(etype: int, items: list) -> bytes:
    body = b"".join(enc_str(x) if etype == STRING else enc_scalar(etype, x) for x in items)
    return struct.pack("<IQ", etype, len(items)) + body


def tensor_nbytes(ggml_type: int, dims: list[int]) -> int | None:
    sizes = block_size(ggml_type)
    if sizes is None or not dims or dims[0] % sizes[0]:
        return None
    n = 1
    for d in dims:
        n *= d
    return n // sizes[0] * sizes[1]


def _value_end(buf: bytes, pos: int, vtype: int) -> int:
    if vtype in _SIZE:
        return pos + _SIZE[vtype]
    if vtype == STRING:
        return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
    etype, count = struct.unpack_from("<IQ", buf, pos)
    pos += 12
    if etype in _SIZE:
        return pos + count * _SIZE[etype]
    for _ in range(count):
        pos = _value_end(buf, pos, etype)
    return pos


def parse(buf: bytes) -> Raw:
    """A well-formed file (our corpora) as structure; no validation: that is the reader's job."""
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, raw = 24, Raw(version)
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + n].decode()
        vtype = struct.unpack_from("<I", buf, pos + 8 + n)[0]
        start = pos + 12 + n
        pos = _value_end(buf, start, vtype)
        raw.kvs.append(KV(key, vtype, bytes(buf[start:pos])))
    infos = []
    for _ in range(n_tensors):
        n = struct.unpack_from("<Q", buf, pos)[0]
        name = buf[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        n_dims = struct.unpack_from("<I", buf, pos)[0]
        dims = list(struct.unpack_from(f"<{n_dims}Q", buf, pos + 4))
        pos += 4 + 8 * n_dims
        ggml_type, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        infos.append((name, dims, ggml_type, offset))
    align = alignment(raw)
    data0 = -(-pos // align) * align
    for name, dims, ggml_type, offset in infos:
        nbytes = tensor_nbytes(ggml_type, dims)
        raw.tensors.append(Tensor(name, dims, ggml_type, bytes(buf[data0 + offset:data0 + offset + nbytes])))
    return raw


def alignment(raw: Raw) -> int:
    kv = raw.get("general.alignment")
    if kv is not None and kv.vtype == U32:
        a = struct.unpack("<I", kv.payload)[0]
        if 0 < a <= 1 << 20 and not a & (a - 1):
            return a
    return 32


def serialize(raw: Raw) -> bytes:
    align = alignment(raw)
    out = [b"GGUF", struct.pack("<IQQ", raw.version, len(raw.tensors), len(raw.kvs))]
    for kv in raw.kvs:
        out += [enc_str(kv.key), struct.pack("<I", kv.vtype), kv.payload]
    offset = 0
    for t in raw.tensors:
        out += [enc_str(t.name), struct.pack("<I", len(t.dims)), struct.pack(f"<{len(t.dims)}Q", *t.dims),
                struct.pack("<IQ", t.ggml_type, offset)]
        offset += -(-len(t.data) // align) * align
    head = b"".join(out)
    body = [head, b"\0" * (-len(head) % align)]
    for t in raw.tensors:
        body += [t.data, b"\0" * (-len(t.data) % align)]
    return b"".join(body)


def array_items(kv: KV) -> tuple[int, int, bytes]:
    """(element type, count, element bytes) of an array entry."""
    etype, count = struct.unpack_from("<IQ", kv.payload, 0)
    return etype, count, kv.payload[12:]


def slice_array(kv: KV, n: int) -> None:
    """Keep an array entry's first n elements."""
    etype, count, body = array_items(kv)
    n = min(n, count)
    if etype in _SIZE:
        body = body[:n * _SIZE[etype]]
    else:
        end = 0
        for _ in range(n):
            end = _value_end(body, end, etype)
        body = body[:end]
    kv.payload = struct.pack("<IQ", etype, n) + body


# --- mutations -----------------------------------------------------------------------------------------------------
_EXTREME_INTS = [0, 1, 2, 3, 7, 31, 33, 255, 65535, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**63 - 1, 2**64 - 1]
_EXTREME_SIGNED = [-1, -2, -2**31, -2**63]
_EXTREME_FLOATS = [0.0, -0.0, -1.0, 1e-45, 1e-30, 0.5, 1.0, 2.0, 1e30, 3.4e38, float("nan"), float("inf"),
                   float("-inf")]
_WRONG_TYPES = [
    (STRING, lambda rng: enc_str(rng.choice(["", "x", "12", "\u00e9", "llama"]))),
    (STRING, lambda rng: enc_str(bytes([0xff, 0xfe, 0x80]))),  # invalid UTF-8
    (F32, lambda rng: enc_scalar(F32, rng.choice([1.5, float("nan"), -3.0, 64.0]))),
    (F64, lambda rng: enc_scalar(F64, rng.choice([2.0, 1e300, float("inf")]))),
    (BOOL, lambda rng: enc_scalar(BOOL, rng.randrange(2))),
    (I64, lambda rng: enc_scalar(I64, rng.choice([-1, 2**62, 5]))),
    (U8, lambda rng: enc_scalar(U8, rng.randrange(256))),
    (ARRAY, lambda rng: enc_array(U32, [rng.randrange(8) for _ in range(rng.randrange(5))])),
    (ARRAY, lambda rng: enc_array(BOOL, [1, 0, 1])),
    (ARRAY, lambda rng: enc_array(STRING, ["a", "b"])),
    (ARRAY, lambda rng: enc_array(F32, [1.0, float("nan")])),
    (ARRAY, lambda rng: struct.pack("<IQ", ARRAY, 1) + enc_array(U32, [1, 2])),  # an array of arrays
]
# keys the engine reads or that change what it reads; injected into files that lack them
_ENGINE_KEYS = ["block_count", "embedding_length", "attention.head_count", "attention.head_count_kv",
                "feed_forward_length", "vocab_size", "context_length", "attention.key_length",
                "attention.key_length_swa", "rope.dimension_count", "rope.dimension_count_swa", "rope.freq_base",
                "rope.freq_base_swa", "attention.layer_norm_rms_epsilon", "attention.sliding_window",
                "attention.sliding_window_pattern", "attention.shared_kv_layers", "final_logit_softcapping",
                "embedding_length_per_layer_input", "target_layers", "target_hidden_size", "block_size",
                "embedding_scale", "attention.causal"]
_TOKENIZER_KEYS = ["tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                   "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.mask_token_id", "tokenizer.ggml.add_bos_token",
                   "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.pre", "tokenizer.ggml.model",
                   "tokenizer.chat_template", "general.alignment"]


def _pick_kv(raw: Raw, rng: random.Random) -> KV | None:
    if not raw.kvs:
        return None
    arch = _arch(raw)
    engine = [kv for kv in raw.kvs if kv.key.startswith(f"{arch}.") or kv.key.startswith("tokenizer.")]
    return rng.choice(engine if engine and rng.random() < 0.85 else raw.kvs)


def _arch(raw: Raw) -> str:
    kv = raw.get("general.architecture")
    try:
        return kv.payload[8:].decode() if kv is not None and kv.vtype == STRING else ""
    except UnicodeDecodeError:
        return ""


def _extreme_payload(kv: KV, rng: random.Random) -> tuple[int, bytes]:
    """An extreme value of the entry's own kind: numbers at and past their bounds, arrays of the wrong length."""
    if kv.vtype in _INT_RANGE or kv.vtype == BOOL:
        vtype = rng.choice([kv.vtype, kv.vtype, U32, I32, U64, I64]) if kv.vtype != BOOL else kv.vtype
        lo, hi = _INT_RANGE.get(vtype, (0, 255))
        v = rng.choice(_EXTREME_INTS + (_EXTREME_SIGNED if lo < 0 else []))
        return vtype, enc_scalar(vtype, min(max(v, lo), hi))
    if kv.vtype in (F32, F64):
        return kv.vtype, enc_scalar(kv.vtype, rng.choice(_EXTREME_FLOATS))
    if kv.vtype == STRING:
        return STRING, enc_str(rng.choice(["", " ", "a" * 70000, "{{", "{% for %}", "\x00"]))
    etype, count, body = array_items(kv)
    choice = rng.randrange(5)
    if choice == 0 and count:  # one entry short
        c = replace(kv)
        slice_array(c, count - 1)
        return ARRAY, c.payload
    if choice == 1 and etype in _SIZE and count:  # one entry more (a copy of the last)
        size = _SIZE[etype]
        return ARRAY, struct.pack("<IQ", etype, count + 1) + body + body[-size:]
    if choice == 2:  # empty
        return ARRAY, struct.pack("<IQ", etype, 0)
    if choice == 3 and etype in _SIZE and etype != BOOL and count:  # an extreme element
        items = list(struct.iter_unpack(_FMT[etype], body))
        lo, hi = _INT_RANGE.get(etype, (-2**63, 2**64))
        v = rng.choice(_EXTREME_FLOATS) if etype in (F32, F64) else min(max(rng.choice(_EXTREME_INTS +
                                                                                          _EXTREME_SIGNED), lo), hi)
        items[rng.randrange(count)] = (v,)
        return ARRAY, struct.pack("<IQ", etype, count) + b"".join(enc_scalar(etype, x) for (x,) in items)
    # a count that claims far more elements than the file holds
    return ARRAY, struct.pack("<IQ", etype, rng.choice([count * 2 + 1, 2**32, 2**60])) + body


def _resize(data: bytes, nbytes: int, rng: random.Random) -> bytes:
    if len(data) >= nbytes:
        return data[:nbytes]
    fill = rng.choice([b"\0", b"\xff", None])
    pad = bytes(rng.randrange(256) for _ in range(min(nbytes - len(data), 4096))) if fill is None else b""
    tail = nbytes - len(data)
    return data + (pad * (tail // max(len(pad), 1) + 1))[:tail] if pad else data + fill * tail


def _mutate_tensor_shape(t: Tensor, rng: random.Random) -> str:
    old = list(t.dims)
    op = rng.randrange(6)
    block = (block_size(t.ggml_type) or (1, 1))[0]
    i = rng.randrange(len(t.dims))
    if op == 0 and len(t.dims) > 1:
        t.dims[0], t.dims[1] = t.dims[1], t.dims[0]
    elif op == 1:
        t.dims[i] = max(1, t.dims[i] + rng.choice([-1, 1]) * (block if i == 0 else 1))
    elif op == 2:
        t.dims[i] = t.dims[i] * 2
    elif op == 3:
        t.dims[i] = max(1, t.dims[i] // 2)
    elif op == 4:
        t.dims.insert(rng.randrange(len(t.dims) + 1), 1) if len(t.dims) < 4 else t.dims.pop()
    else:
        t.dims = t.dims[:-1] if len(t.dims) > 1 else [*t.dims, 2]
    nbytes = tensor_nbytes(t.ggml_type, t.dims)
    if nbytes is not None and rng.random() < 0.85 and nbytes < 1 << 26:  # keep the file consistent for the reader
        t.data = _resize(t.data, nbytes, rng)
    return f"shape {t.name} {old}->{t.dims}"


def _mutate_tensor_type(t: Tensor, rng: random.Random) -> str:
    old = t.ggml_type
    t.ggml_type = rng.choice([*list(GGML_TYPES), 99, 2 ** 31]) if rng.random() < 0.9 else rng.choice([0, 1, 8, 30])
    nbytes = tensor_nbytes(t.ggml_type, t.dims)
    if nbytes is not None and rng.random() < 0.85 and nbytes < 1 << 26:
        t.data = _resize(t.data, nbytes, rng)
    return f"type {t.name} {old}->{t.ggml_type}"


def _mutate_tensor_data(t: Tensor, rng: random.Random) -> str:
    n = len(t.data)
    if not n:
        return f"data {t.name} (empty)"
    fill = rng.choice([b"\xff", b"\0", b"\x7f", None])
    k = rng.choice([1, 8, n])
    at = rng.randrange(max(n - k, 0) + 1)
    chunk = bytes(rng.randrange(256) for _ in range(min(k, 4096))) * (k // 4096 + 1) if fill is None else fill * k
    t.data = t.data[:at] + chunk[:k] + t.data[at + k:]
    return f"data {t.name} {k}B@{at}"


def mutate_structure(raw: Raw, rng: random.Random) -> list[str]:
    """One structural mutation of raw (in place); returns its description."""
    kind = rng.choices(["value_type", "value_extreme", "drop_key", "add_key", "tensor_shape", "tensor_type",
                        "drop_tensor", "tensor_data", "rename_tensor"],
                       [14, 20, 12, 8, 14, 10, 8, 8, 3])[0]
    if kind in ("value_type", "value_extreme", "drop_key"):
        kv = _pick_kv(raw, rng)
        if kv is None:
            return [f"{kind}: no keys"]
        if kind == "drop_key":
            raw.kvs.remove(kv)
            return [f"drop_key {kv.key}"]
        vtype, payload = (rng.choice(_WRONG_TYPES) if kind == "value_type" else (None, None))
        if kind == "value_type":
            payload = payload(rng)
        else:
            vtype, payload = _extreme_payload(kv, rng)
        kv.vtype, kv.payload = vtype, payload
        return [f"{kind} {kv.key} type {vtype}"]
    if kind == "add_key":
        arch = _arch(raw) or "llama"
        key = rng.choice([f"{arch}.{k}" for k in _ENGINE_KEYS] + _TOKENIZER_KEYS)
        vtype, payload = rng.choice([(U32, lambda r: enc_scalar(U32, r.choice(_EXTREME_INTS[:-3]))), *_WRONG_TYPES])
        raw.set(key, vtype, payload(rng))
        return [f"add_key {key} type {vtype}"]
    if not raw.tensors:
        return [f"{kind}: no tensors"]
    t = rng.choice(raw.tensors)
    if kind == "drop_tensor":
        raw.tensors.remove(t)
        return [f"drop_tensor {t.name}"]
    if kind == "rename_tensor":
        old, t.name = t.name, t.name.replace("blk.", "blk.1") if "blk." in t.name else t.name + ".x"
        return [f"rename {old}->{t.name}"]
    return [{"tensor_shape": _mutate_tensor_shape, "tensor_type": _mutate_tensor_type,
             "tensor_data": _mutate_tensor_data}[kind](t, rng)]


def mutate_bytes(data: bytes, rng: random.Random, header_end: int) -> tuple[bytes, str]:
    """Byte flips (mostly in the header, where they change structure) or a truncation."""
    if rng.random() < 0.35:
        cut = rng.randrange(len(data)) if rng.random() < 0.3 else rng.randrange(min(header_end, len(data)))
        return data[:cut], f"truncate {cut}/{len(data)}"
    buf = bytearray(data)
    n = rng.choice([1, 1, 2, 4, 16])
    for _ in range(n):
        at = rng.randrange(len(buf)) if rng.random() < 0.3 else rng.randrange(min(header_end, len(buf)))
        buf[at] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
    return bytes(buf), f"flip {n}"


def header_size(raw: Raw) -> int:
    """Bytes before the tensor data."""
    return len(serialize(Raw(raw.version, raw.kvs, [replace(t, data=b"") for t in raw.tensors])))


def mutate(raw: Raw, rng: random.Random, *, structural: bool = True) -> tuple[bytes, list[str]]:
    """A mutated copy of raw as file bytes: 1-3 structural mutations, then byte flips or a truncation sometimes
    (always, and only those, when structural is False)."""
    what: list[str] = []
    if structural:
        m = raw.copy()
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            what += mutate_structure(m, rng)
        data = serialize(m)
        if rng.random() < 0.15:
            data, how = mutate_bytes(data, rng, header_size(m))
            what.append(how)
        return data, what
    data = serialize(raw)
    data, how = mutate_bytes(data, rng, header_size(raw))
    return data, [how]
