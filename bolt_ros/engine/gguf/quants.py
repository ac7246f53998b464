"""GGUF tensors as torch values: byte counts, zero-copy views, whole tensors or chosen rows dequantized (through the
C kernels where built, else the torch reference of kernels/gguf_blocks.py, bit for bit the same as gguf-py's).

The block formats themselves (GGMLType, GGML_BLOCK[t] = (elements, bytes), the per-type decoders) live in
kernels/gguf_blocks.py, below the engine; they are re-exported here.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from bolt_ros.kernels.cpu import native
from bolt_ros.kernels.gguf_blocks import (  # noqa: F401  (the block formats, re-exported for the engine's users)
    F16_FIELDS,
    GGML_BLOCK,
    QK_K,
    GGMLType,
    _bits,
    _bits_le32,
    _f16,
    _k_scale_min,
    _nibbles,
    check_type,
    dequantize_blocks,
    type_name,
)


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
