"""Torch dequantizers for the ggml tensor types found in GGUF files.

Every function works on whole arrays of blocks at once (no per-block Python loop) and reproduces
`gguf.quants.dequantize` bit for bit: the float32 operations are done in the same order as gguf-py
(two separate roundings for `d * q - m`, never a fused multiply-add), so results compare with `torch.equal`.

Byte layouts follow ggml-common.h; a block is `GGML_BLOCK[t] = (elements, bytes)`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from enum import IntEnum

import numpy as np
import torch

from bolt_ros.engine.gguf.types import block_size, type_name
from bolt_ros.kernels.cpu import native

QK_K = 256  # super-block size of the K-quants


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


# ggml_type -> (elements per block, bytes per block) of the types this engine computes
GGML_BLOCK: dict[int, tuple[int, int]] = {t: block_size(t) for t in GGMLType}


def check_type(ggml_type: int) -> tuple[int, int]:
    """(elements, bytes) per block; ValueError naming the type when this engine can't read it."""
    if ggml_type not in GGML_BLOCK:
        supported = ", ".join(t.name for t in GGMLType)
        raise ValueError(f"unsupported tensor type {type_name(ggml_type)}; supported: {supported}")
    return GGML_BLOCK[ggml_type]


def row_nbytes(ggml_type: int, ne0: int) -> int:
    """Bytes of one row of `ne0` elements (the innermost ggml dimension)."""
    block, nbytes = check_type(ggml_type)
    if ne0 % block:
        raise ValueError(f"{type_name(ggml_type)} rows must be a multiple of {block} elements, got {ne0}")
    return ne0 // block * nbytes


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor with torch shape `shape` (the last dim is ggml's ne0, the contiguous one)."""
    shape = tuple(int(d) for d in shape)
    if not shape or any(d < 0 for d in shape):
        raise ValueError(f"bad tensor shape {list(shape)}")
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows * row_nbytes(ggml_type, shape[-1])


def as_uint8(raw: torch.Tensor | np.ndarray | bytes | bytearray | memoryview) -> torch.Tensor:
    """A flat uint8 tensor over `raw` without copying (read-only mmap views are shared, never written)."""
    if isinstance(raw, torch.Tensor):
        if raw.dtype != torch.uint8:
            raise ValueError(f"raw tensor data must be uint8, got {raw.dtype}")
        return raw.reshape(-1)
    arr = np.asarray(raw if isinstance(raw, np.ndarray) else memoryview(raw).cast("B"))
    if arr.dtype != np.uint8:
        raise ValueError(f"raw tensor data must be uint8, got {arr.dtype}")
    with warnings.catch_warnings():  # torch warns about read-only arrays; we only ever read them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr.reshape(-1))


# ---- helpers on [n_blocks, bytes] uint8 tensors ------------------------------------------------------------


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """fp16 scalar at byte `at` of every block -> [n, 1] float32."""
    return b[:, at : at + 2].contiguous().view(torch.float16).float()


def _shifts(values: tuple[int, ...], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8, device=device)


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """[n, m] bytes -> [n, m // width, 2, width]: low nibbles of each `width`-byte run, then the high nibbles."""
    n = qs.shape[0]
    return (qs.reshape(n, -1, 1, width) >> _shifts((0, 4), qs.device).view(1, 1, 2, 1)) & 0x0F


def _crumbs(qs: torch.Tensor, width: int) -> torch.Tensor:
    """[n, m] bytes -> [n, m // width, 4, width]: 2-bit fields at shifts 0, 2, 4, 6."""
    n = qs.shape[0]
    return (qs.reshape(n, -1, 1, width) >> _shifts((0, 2, 4, 6), qs.device).view(1, 1, 4, 1)) & 0x03


def _bits(qh: torch.Tensor, width: int) -> torch.Tensor:
    """[n, m] bytes -> [n, m // width, 8, width]: bit b of byte i at [.., b, i]."""
    n = qh.shape[0]
    return (qh.reshape(n, -1, 1, width) >> _shifts(tuple(range(8)), qh.device).view(1, 1, 8, 1)) & 0x01


def _bits_le32(qh: torch.Tensor) -> torch.Tensor:
    """[n, 4] bytes of a little-endian uint32 -> [n, 32] bits, bit i at column i."""
    n = qh.shape[0]
    return ((qh.reshape(n, 4, 1) >> _shifts(tuple(range(8)), qh.device).view(1, 1, 8)) & 0x01).reshape(n, 32)


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K 12-byte packed 6-bit scales and mins -> two [n, 8] uint8."""
    d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


# ---- per-type block dequantizers: [n, bytes] uint8 -> [n, elements] float32 ----------------------------------


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    q = _nibbles(b[:, 2:], 16).reshape(n, 32).to(torch.int8) - 8
    return _f16(b, 0) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    q = _nibbles(b[:, 4:], 16).reshape(n, 32).float()
    return _f16(b, 0) * q + _f16(b, 2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    q = _nibbles(b[:, 6:], 16).reshape(n, 32) | (_bits_le32(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.to(torch.int8) - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    q = _nibbles(b[:, 8:], 16).reshape(n, 32) | (_bits_le32(b[:, 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b, 0)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    dl = (_f16(b, 80) * (scales & 0x0F).float()).reshape(n, 16, 1)
    ml = (_f16(b, 82) * (scales >> 4).float()).reshape(n, 16, 1)
    q = _crumbs(qs, 32).reshape(n, 16, 16).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, s = b[:, :32], b[:, 32:96], b[:, 96:108]
    # 16 6-bit scales: low 4 bits in bytes 0..7 (low nibbles first), high 2 bits in bytes 8..11 (2-bit fields)
    lo = (s[:, :8].reshape(n, 1, 8) >> _shifts((0, 4), b.device).view(1, 2, 1)).reshape(n, 16) & 0x0F
    hi = (s[:, 8:].reshape(n, 1, 4) >> _shifts((0, 2, 4, 6), b.device).view(1, 4, 1)).reshape(n, 16) & 0x03
    scales = ((lo | (hi << 4)).to(torch.int8) - 32).float()
    dl = (_f16(b, 108) * scales).reshape(n, 16, 1)
    ql = _crumbs(qs, 32).reshape(n, 16, 16).to(torch.int8)
    # a set hmask bit means "no -4 offset"
    qh = (_bits(hmask, 32).reshape(n, 16, 16) ^ 1).to(torch.int8)
    return (dl * (ql - (qh << 2)).float()).reshape(n, QK_K)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b, 0) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b, 2) * mn.float()).reshape(n, 8, 1)
    q = _nibbles(b[:, 16:], 32).reshape(n, 8, 32).float()
    return (d * q - dm).reshape(n, QK_K)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b, 0) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b, 2) * mn.float()).reshape(n, 8, 1)
    ql = _nibbles(b[:, 48:], 32).reshape(n, 8, 32)
    qh = _bits(b[:, 16:48], 32).reshape(n, 8, 32)
    return (d * (ql | (qh << 4)).float() - dm).reshape(n, QK_K)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh, scales = b[:, :128], b[:, 128:192], b[:, 192:208]
    d = (_f16(b, 208) * scales.contiguous().view(torch.int8).float()).reshape(n, 16, 1)
    lo = _nibbles(ql, 64).reshape(n, 8, 32)
    hi = _crumbs(qh, 32).reshape(n, 8, 32)
    q = ((lo | (hi << 4)).to(torch.int8) - 32).reshape(n, 16, 16).float()
    return (d * q).reshape(n, QK_K)


def _f32(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def _f16_elems(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _bf16(b: torch.Tensor) -> torch.Tensor:
    return (b.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)


_BLOCK_DEQUANT: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.F32: _f32,
    GGMLType.F16: _f16_elems,
    GGMLType.BF16: _bf16,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0,
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
}

# blocks per chunk: bounds the temporaries of one pass to ~100 MB however big the tensor is
_CHUNK_BYTES = 16 << 20


def dequantize_blocks(blocks: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """[n_blocks, block_bytes] uint8 -> [n_blocks, block_elements] float32."""
    block, nbytes = check_type(ggml_type)
    if blocks.dim() != 2 or blocks.shape[1] != nbytes or blocks.dtype != torch.uint8:
        raise ValueError(f"{type_name(ggml_type)} blocks must be uint8 [n, {nbytes}], got "
                         f"{blocks.dtype} {list(blocks.shape)}")
    fn = _BLOCK_DEQUANT[ggml_type]
    n = blocks.shape[0]
    step = max(1, _CHUNK_BYTES // nbytes)
    if n <= step:
        return fn(blocks).reshape(n, block)
    out = torch.empty(n, block, dtype=torch.float32, device=blocks.device)
    for i in range(0, n, step):
        out[i : i + step] = fn(blocks[i : i + step]).reshape(-1, block)
    return out


def dequantize(raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Raw GGUF bytes -> float32 tensor of torch shape `shape` (= reversed ggml shape, `torch_shape(info)`).

    Bit-exact vs `gguf.quants.dequantize`. ValueError for unsupported types and byte counts that don't match."""
    shape = tuple(int(d) for d in shape)
    expected = tensor_nbytes(ggml_type, shape)
    data = as_uint8(raw)
    if data.numel() != expected:
        raise ValueError(f"{type_name(ggml_type)} tensor of shape {list(shape)} needs {expected} bytes, "
                         f"got {data.numel()}")
    if len(shape) and data.device.type == "cpu" and ggml_type in native.TYPES and native.available():
        return native.dequantize_rows(data.contiguous(), ggml_type, expected // row_nbytes(ggml_type, shape[-1]),
                                      shape[-1]).reshape(shape)  # the same values, ~10x faster (kernels/cpu)
    nbytes = GGML_BLOCK[ggml_type][1]
    return dequantize_blocks(data.reshape(-1, nbytes), ggml_type).reshape(shape)


def dequantize_rows(raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, int],
                    rows: torch.Tensor) -> torch.Tensor:
    """Rows `rows` of a 2-D tensor of torch shape [n_rows, width], dequantizing only those -> [len(rows), width]."""
    if len(shape) != 2:
        raise ValueError(f"row gather needs a 2-D tensor, got shape {list(shape)}")
    n_rows, width = int(shape[0]), int(shape[1])
    rb = row_nbytes(ggml_type, width)
    data = as_uint8(raw)
    if data.numel() != rb * n_rows:
        raise ValueError(f"{type_name(ggml_type)} tensor of shape {list(shape)} needs {rb * n_rows} bytes, "
                         f"got {data.numel()}")
    rows = rows.reshape(-1).long()
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n_rows):
        raise IndexError(f"row index out of range [0, {n_rows}): min {int(rows.min())}, max {int(rows.max())}")
    picked = data.view(n_rows, rb).index_select(0, rows)  # [R, row_bytes]
    nbytes = GGML_BLOCK[ggml_type][1]
    return dequantize_blocks(picked.reshape(-1, nbytes), ggml_type).reshape(rows.numel(), width)


# byte offsets of the fp16 scale/min fields inside one block (every other byte is a code or a packed scale)
F16_FIELDS: dict[int, tuple[int, ...]] = {
    GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2), GGMLType.Q8_0: (0,),
    GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208,),
}


def random_raw(ggml_type: int, shape: tuple[int, int], *, seed: int = 0, max_scale: float | None = None) -> np.ndarray:
    """Random GGUF bytes for a tensor of torch shape `shape` (tests, benchmarks): every code byte uniform, fp16
    scale fields finite (any finite bit pattern, subnormals included, or |scale| <= max_scale when given)."""
    rng = np.random.default_rng(seed)
    nbytes = tensor_nbytes(ggml_type, shape)
    raw = rng.integers(0, 256, nbytes, dtype=np.uint8)
    fields = F16_FIELDS.get(ggml_type, ())
    if fields:
        blocks = raw.reshape(-1, GGML_BLOCK[ggml_type][1])
        for at in fields:
            if max_scale is None:
                h = rng.integers(0, 1 << 16, blocks.shape[0], dtype=np.uint16)
                h = np.where((h & 0x7C00) == 0x7C00, h ^ 0x4000, h).astype(np.uint16)  # inf/nan exponent -> finite
            else:
                h = rng.uniform(-max_scale, max_scale, blocks.shape[0]).astype(np.float16).view(np.uint16)
            blocks[:, at : at + 2] = h.view(np.uint8).reshape(-1, 2)
    return raw
