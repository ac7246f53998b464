"""A validating, memory-mapped, lazy GGUF reader.

Every length, count and offset in the file is checked against the bytes that are actually there before anything is
allocated or read, so a truncated or hostile file fails fast with a GGUFError that names the problem. Tensor data is
never copied: `raw(name)` returns a read-only view into the mapping.
"""
from __future__ import annotations

import mmap
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bolt_ros.engine.gguf.types import block_size, type_name

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEY_BYTES = 1 << 16
MAX_ELEMENTS = 1 << 50  # per tensor; far above any real model, far below int64 overflow
MAX_ARRAY_DEPTH = 2  # writers nest at most one level (arrays of arrays); deeper is hostile


class GGUFError(ValueError):
    """A GGUF file is malformed, truncated, unsupported or inconsistent."""


# value type id -> (numpy dtype or None for strings/arrays/bools handled separately)
_SCALARS: dict[int, np.dtype] = {
    0: np.dtype("<u1"), 1: np.dtype("<i1"), 2: np.dtype("<u2"), 3: np.dtype("<i2"),
    4: np.dtype("<u4"), 5: np.dtype("<i4"), 6: np.dtype("<f4"), 7: np.dtype("<u1"),
    10: np.dtype("<u8"), 11: np.dtype("<i8"), 12: np.dtype("<f8"),
}
_BOOL, _STRING, _ARRAY = 7, 8, 9
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int
    shape: tuple[int, ...]  # ggml order: shape[0] (ne0) is the contiguous dimension
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def torch_shape(info: TensorInfo) -> tuple[int, ...]:
    """PyTorch order of a ggml shape: a 2-D weight {ne0=in, ne1=out} becomes [out, in]."""
    return tuple(reversed(info.shape))


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes a tensor of this type and ggml shape occupies; validates that rows split into whole blocks."""
    sizes = block_size(ggml_type)
    if sizes is None:
        raise GGUFError(f"unknown ggml tensor type {ggml_type}")
    block, block_bytes = sizes
    if shape[0] % block:
        raise GGUFError(f"row length {shape[0]} is not a multiple of the {block}-element block of type "
                        f"{type_name(ggml_type)}")
    n = 1
    for d in shape:
        n *= d
    return n // block * block_bytes


class _Cursor:
    """Bounds-checked little-endian reads over the mapping."""

    def __init__(self, buf: mmap.mmap, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GGUFError(f"truncated file: {what} needs {n} bytes at offset {self.pos}, file has {self.size}")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.u64(f"{what} length")
        if limit is not None and n > limit:
            raise GGUFError(f"{what} is {n} bytes long (limit {limit})")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{what} is not valid UTF-8 ({e})") from None

    def scalar(self, vtype: int, what: str) -> Any:
        dt = _SCALARS[vtype]
        self.need(dt.itemsize, what)
        v = np.frombuffer(self.buf, dt, 1, self.pos)[0]
        self.pos += dt.itemsize
        return bool(v) if vtype == _BOOL else v.item()

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            return self.scalar(vtype, what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            etype = self.u32(f"{what} element type")
            count = self.u64(f"{what} element count")
            if depth >= MAX_ARRAY_DEPTH:
                raise GGUFError(f"{what}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels")
            return self.array(etype, count, what, depth + 1)
        raise GGUFError(f"{what}: unknown value type {vtype}")

    def array(self, etype: int, count: int, what: str, depth: int = 1) -> Any:
        if etype in _SCALARS:
            dt = _SCALARS[etype]
            self.need(count * dt.itemsize, f"{what} ({count} elements)")
            arr = np.frombuffer(self.buf, dt, count, self.pos).copy()
            self.pos += count * dt.itemsize
            return arr.astype(bool) if etype == _BOOL else arr
        if etype == _STRING:
            # every string needs at least its 8-byte length: bound the count before looping
            self.need(count * 8, f"{what} ({count} strings)")
            return self._strings(count, what)
        if etype == _ARRAY:
            self.need(count * 12, f"{what} ({count} nested arrays)")
            return [self.value(_ARRAY, f"{what}[{i}]", depth) for i in range(count)]
        raise GGUFError(f"{what}: unknown array element type {etype}")

    def _strings(self, count: int, what: str) -> StringArray:
        """A string array as one compact StringArray: the 262k-entry vocabularies would otherwise cost ~20 MiB of
        str objects for the life of the process."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        first = pos
        starts = array("q", bytes(8 * count))  # payload offsets; count * 8 <= the file's remaining bytes
        for i in range(count):  # keep this loop minimal
            if pos + 8 > size:
                raise GGUFError(f"truncated file: {what}[{i}] length at offset {pos}")
            (n,) = unpack(buf, pos)
            pos += 8
            if pos + n > size:
                raise GGUFError(f"truncated file: {what}[{i}] needs {n} bytes at offset {pos}")
            starts[i] = pos
            pos += n
        self.pos = pos
        if count == 0:
            return StringArray(b"", [0])
        # drop the 8-byte length prefixes from the region in one vectorized pass (no per-string objects)
        region = np.frombuffer(buf, np.uint8, pos - first, first)
        rel = np.frombuffer(starts, np.int64) - first
        edge = np.zeros(len(region) + 1, np.int8)
        edge[rel - 8] = 1  # each index list is duplicate-free; an empty string's end is the next one's prefix start
        edge[rel] -= 1
        payload = np.cumsum(edge[:-1], dtype=np.int8) == 0
        lengths = np.diff(np.append(rel, len(region))) - 8
        lengths[-1:] += 8  # the last string runs to the region's end
        return StringArray(region[payload].tobytes(), np.concatenate(([0], np.cumsum(lengths))))


class StringArray(Sequence):
    """An immutable sequence of strings stored as one UTF-8 blob plus offsets; items are decoded on access.

    Invalid UTF-8 decodes with surrogateescape (GPT-2/SPM vocabularies are valid; anything else stays decodable and
    round-trips to the same bytes)."""

    __slots__ = ("_blob", "_offsets")

    def __init__(self, blob: bytes, offsets: Sequence[int] | np.ndarray):
        self._blob = blob
        self._offsets = array("q", np.asarray(offsets, np.int64).tobytes())

    @classmethod
    def from_strings(cls, strings: Iterable[str]) -> StringArray:
        enc = [t.encode("utf-8", "surrogateescape") for t in strings]
        return cls(b"".join(enc), np.concatenate(([0], np.cumsum([len(b) for b in enc], dtype=np.int64))))

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        o = self._offsets
        return str(self._blob[o[i]:o[i + 1]] if i >= 0 else self._blob[o[i - 1]:o[i]], "utf-8", "surrogateescape")

    def byte_lengths(self) -> np.ndarray:
        return np.diff(np.frombuffer(self._offsets, np.int64))

    def buffers(self) -> tuple[np.ndarray, np.ndarray]:
        """(blob as uint8, offsets as int64: item i is blob[offsets[i]:offsets[i + 1]]) for vectorized checks."""
        return np.frombuffer(self._blob, np.uint8), np.frombuffer(self._offsets, np.int64)

    def raw(self, i: int) -> bytes:
        """The stored bytes of item i (0 <= i < len)."""
        return self._blob[self._offsets[i]:self._offsets[i + 1]]

    def __iter__(self) -> Iterator[str]:
        blob, o = self._blob, self._offsets
        for i in range(len(self)):
            yield str(blob[o[i]:o[i + 1]], "utf-8", "surrogateescape")

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None

    def __repr__(self) -> str:
        head = ", ".join(repr(t) for t in self[:3])
        return f"StringArray([{head}{', ...' if len(self) > 3 else ''}], len={len(self)})"


class GGUFFile:
    """An opened GGUF file: `metadata`, `tensors` and zero-copy `raw(name)` views. Use as a context manager."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self._fh = open(self.path, "rb")
        except OSError as e:
            raise GGUFError(f"cannot open {self.path}: {e.strerror}") from None
        try:
            size = self.path.stat().st_size
            if size < 24:
                raise GGUFError(f"{self.path}: file too small to be GGUF ({size} bytes)")
            self._mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
            self._parse(_Cursor(self._mm, size))
        except GGUFError as e:
            self.close()
            raise GGUFError(f"{self.path.name}: {e}") from None
        except BaseException:
            self.close()
            raise

    def _parse(self, cur: _Cursor) -> None:
        cur.need(4, "magic")
        magic = bytes(cur.buf[0:4])
        cur.pos = 4
        if magic != GGUF_MAGIC:
            raise GGUFError(f"not a GGUF file (magic {magic!r})")
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            hint = " (big-endian files are not supported)" if self.version.to_bytes(4, "little")[0] == 0 else ""
            raise GGUFError(f"unsupported GGUF version {self.version}{hint}")
        n_tensors = cur.u64("tensor count")
        n_kv = cur.u64("metadata count")
        # each KV needs >= 8 (key len) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 8 + 4 + 8
        cur.need(n_kv * 13 + n_tensors * 32, f"{n_kv} metadata entries and {n_tensors} tensor infos")

        self.metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}", limit=MAX_KEY_BYTES)
            if key in self.metadata:
                raise GGUFError(f"duplicate metadata key {key!r}")
            vtype = cur.u32(f"type of {key!r}")
            self.metadata[key] = cur.value(vtype, f"metadata {key!r}")

        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or isinstance(alignment, bool):
            raise GGUFError(f"general.alignment must be an integer, got {type(alignment).__name__}")
        self.alignment = alignment
        if self.alignment <= 0 or self.alignment & (self.alignment - 1) or self.alignment > 1 << 20:
            raise GGUFError(f"general.alignment must be a power of two, got {self.alignment}")

        infos = []
        names = set()
        for i in range(n_tensors):
            name = cur.string(f"tensor name #{i}", limit=MAX_KEY_BYTES)
            if name in names:
                raise GGUFError(f"duplicate tensor name {name!r}")
            names.add(name)
            n_dims = cur.u32(f"n_dims of {name!r}")
            if not 1 <= n_dims <= MAX_DIMS:
                raise GGUFError(f"tensor {name!r} has {n_dims} dims (1..{MAX_DIMS} allowed)")
            shape = tuple(cur.u64(f"dim of {name!r}") for _ in range(n_dims))
            if any(d == 0 for d in shape) or np.prod([float(d) for d in shape]) > MAX_ELEMENTS:
                raise GGUFError(f"tensor {name!r} has an invalid shape {shape}")
            ggml_type = cur.u32(f"type of {name!r}")
            rel = cur.u64(f"offset of {name!r}")
            try:
                nbytes = tensor_nbytes(ggml_type, shape)
            except GGUFError as e:
                raise GGUFError(f"tensor {name!r}: {e}") from None
            if rel % self.alignment:
                raise GGUFError(f"tensor {name!r} offset {rel} is not aligned to {self.alignment}")
            infos.append((name, ggml_type, shape, rel, nbytes))

        self.data_offset = -(-cur.pos // self.alignment) * self.alignment
        self.tensors: dict[str, TensorInfo] = {}
        end_prev, prev = self.data_offset, None
        for name, _, _, rel, nbytes in sorted(infos, key=lambda t: t[3]):
            start = self.data_offset + rel
            if start < end_prev:
                raise GGUFError(f"tensor {name!r} overlaps {prev!r}")
            if start + nbytes > cur.size:
                raise GGUFError(f"truncated file: tensor {name!r} needs bytes {start}..{start + nbytes}, "
                                f"file has {cur.size}")
            end_prev, prev = start + nbytes, name
        for name, ggml_type, shape, rel, nbytes in infos:  # keep file order
            self.tensors[name] = TensorInfo(name, ggml_type, shape, self.data_offset + rel, nbytes)

    # --- access -------------------------------------------------------------------------------------------------
    def arch(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path.name}: missing general.architecture")
        return arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path.name}: missing metadata key {key!r}")
        return self.metadata[key]

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFError(f"{self.path.name}: missing tensor {name!r}") from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the mapping (no copy)."""
        info = self.info(name)
        return np.frombuffer(self._mm, np.uint8, info.nbytes, info.offset)

    def release_pages(self) -> None:
        """Drop the file pages read so far from this process's memory (they are re-read on demand). Called after
        weights have been repacked, so the GGUF bytes are not held twice."""
        if getattr(self, "_mm", None) is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mm.madvise(mmap.MADV_DONTNEED)

    def release(self, name: str) -> None:
        """Drop the pages wholly inside tensor `name` from this process's memory (re-read on demand): after it was
        copied into another form, so that a load's peak does not hold the file and the copies at once."""
        info = self.info(name)
        ps = mmap.PAGESIZE
        start, end = -(-info.offset // ps) * ps, (info.offset + info.nbytes) // ps * ps
        if getattr(self, "_mm", None) is not None and hasattr(mmap, "MADV_DONTNEED") and end > start:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        mm = getattr(self, "_mm", None)
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # views still alive (weights in use); the mapping is freed with them
            self._mm = None
        fh = getattr(self, "_fh", None)
        if fh is not None:
            fh.close()
            self._fh = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if not hasattr(self, "tensors"):
            return f"GGUFFile({self.path.name!r}, unparsed)"
        return f"GGUFFile({self.path.name!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"
