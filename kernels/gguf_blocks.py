"""GGUF block formats in torch: every ggml type id (name, elements and bytes per block) and the reference
dequantizer of the types the engine computes, on whole arrays of blocks at once (no per-block Python loop).

It reproduces `gguf.quants.dequantize` bit for bit: the float32 operations are done in the same order as gguf-py
(two separate roundings for `d * q - m`, never a fused multiply-add), so results compare with `torch.equal`. Byte
layouts follow ggml-common.h. It lives with the kernels, below the engine: the kernels' references read it, and the
engine's GGUF reader (engine/gguf/quants.py, types.py) builds on it. The type table is kept here rather than
imported from gguf-py: that package (and the yaml it loads) costs a few MiB in every engine process for one table.
"""
from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

import torch

GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}


def type_name(ggml_type: int) -> str:
    entry = GGML_TYPES.get(ggml_type)
    return entry[0] if entry else f"ggml type {ggml_type}"


def block_size(ggml_type: int) -> tuple[int, int] | None:
    """(elements, bytes) per block, None for a type id ggml does not define."""
    entry = GGML_TYPES.get(ggml_type)
    return entry[1:] if entry else None


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


# byte offsets of the fp16 scale/min fields inside one block (every other byte is a code or a packed scale)
F16_FIELDS: dict[int, tuple[int, ...]] = {
    GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2), GGMLType.Q8_0: (0,),
    GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,), GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208,),
}
