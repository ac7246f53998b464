"""Torch dequantizers vs gguf-py 0.19 (`gguf.quants.dequantize`), bit for bit.

Real tensors (row slices) from both real models cover every type they contain; synthetic random blocks (uniform code
bytes, any finite fp16 scale, subnormals included) cover every supported type, the ones no real file here has too.
"""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from bolt_ros.engine.gguf.quants import GGML_BLOCK, GGMLType, dequantize, dequantize_rows, random_raw, row_nbytes
from bolt_ros.engine.gguf.reader import torch_shape
from bolt_ros.kernels import gguf_blocks

ROWS = 300  # rows sliced out of big real tensors: enough blocks to hit every code, fast to compare


def _gguf_ref(raw: np.ndarray, ggml_type: int, shape: tuple[int, ...]) -> np.ndarray:
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    out = gguf.quants.dequantize(np.asarray(raw).reshape(rows, -1), gguf.GGMLQuantizationType(ggml_type))
    return out.astype(np.float32, copy=False).reshape(shape)


def _assert_bits_equal(ours: torch.Tensor, ref: np.ndarray) -> None:
    assert ours.dtype == torch.float32 and tuple(ours.shape) == ref.shape
    a, b = ours.numpy().view(np.uint32), ref.view(np.uint32)
    nan = np.isnan(ref)  # NaN payloads may differ between numpy and torch casts; only the F* types can produce NaN
    assert np.array_equal(np.isnan(ours.numpy()), nan)
    assert np.array_equal(a[~nan], b[~nan]), f"{int((a != b).sum())} elements differ"


def test_block_table_matches_gguf():
    for t, (elems, nbytes) in GGML_BLOCK.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t)] == (elems, nbytes), GGMLType(t).name


@pytest.mark.parametrize("ggml_type", list(GGML_BLOCK), ids=lambda t: GGMLType(t).name)
def test_synthetic_blocks_bit_exact(ggml_type):
    elems = GGML_BLOCK[ggml_type][0]
    shape = (7, max(elems, 32) * 3)  # 3 blocks per row (K-quants: 3 super-blocks), several rows
    raw = random_raw(ggml_type, shape, seed=ggml_type)
    _assert_bits_equal(dequantize(raw, ggml_type, shape), _gguf_ref(raw, ggml_type, shape))


@pytest.mark.parametrize("ggml_type", [GGMLType.Q4_1, GGMLType.Q8_0, GGMLType.Q4_K])
def test_chunked_path_bit_exact(ggml_type, monkeypatch):
    monkeypatch.setattr(gguf_blocks, "_CHUNK_BYTES", 3 * GGML_BLOCK[ggml_type][1])  # many chunks, a ragged last one
    shape = (5, GGML_BLOCK[ggml_type][0] * 4 if GGML_BLOCK[ggml_type][0] > 32 else 320)
    raw = random_raw(ggml_type, shape, seed=1)
    _assert_bits_equal(dequantize(raw, ggml_type, shape), _gguf_ref(raw, ggml_type, shape))


def test_real_tensors_bit_exact(real_ggufs):
    """Every (type, rank) in both real files: a real tensor (first ROWS rows of big ones) bit-exact vs gguf-py."""
    seen: dict[str, set[str]] = {}
    for model, gf in real_ggufs.items():
        done = set()
        for name, info in gf.tensors.items():
            key = (info.ggml_type, len(info.shape))
            if key in done:
                continue
            done.add(key)
            shape, raw = torch_shape(info), gf.raw(name)
            if len(shape) == 2 and shape[0] > ROWS:
                raw, shape = raw[: ROWS * row_nbytes(info.ggml_type, shape[1])], (ROWS, shape[1])
            _assert_bits_equal(dequantize(raw, info.ggml_type, shape), _gguf_ref(raw, info.ggml_type, shape))
            seen.setdefault(model, set()).add(GGMLType(info.ggml_type).name)
    assert seen["default"] == {"F32", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    assert seen["smollm2"] == {"F32", "Q8_0", "Q4_1"}


def test_row_gather_matches_full_dequantize(real_ggufs):
    gf = real_ggufs["default"]
    info = gf.info("token_embd.weight")  # Q8_0 [262144, 640]
    shape, raw = torch_shape(info), gf.raw("token_embd.weight")
    ids = torch.tensor([0, 2, 1000, 17, shape[0] - 1, 2])  # repeats and the last row
    rb = row_nbytes(info.ggml_type, shape[1])
    got = dequantize_rows(raw, info.ggml_type, shape, ids)
    assert got.shape == (len(ids), shape[1])
    for i, r in enumerate(ids.tolist()):
        _assert_bits_equal(got[i : i + 1], _gguf_ref(raw[r * rb : (r + 1) * rb], info.ggml_type, (1, shape[1])))
    with pytest.raises(IndexError, match="out of range"):
        dequantize_rows(raw, info.ggml_type, shape, torch.tensor([shape[0]]))


def test_accepts_tensors_bytes_and_1d_shapes():
    raw = random_raw(GGMLType.Q8_0, (2, 64), seed=3)
    ref = dequantize(raw, GGMLType.Q8_0, (2, 64))
    assert torch.equal(dequantize(torch.from_numpy(raw.copy()), GGMLType.Q8_0, (2, 64)), ref)
    assert torch.equal(dequantize(raw.tobytes(), GGMLType.Q8_0, (128,)), ref.reshape(-1))
    assert torch.equal(dequantize(raw, GGMLType.Q8_0, (1, 2, 64)), ref.reshape(1, 2, 64))


@pytest.mark.parametrize("bad_type", [9, 15, 16, 39, 99])  # Q8_1, Q8_K, IQ2_XXS, MXFP4, unknown
def test_unsupported_type_is_a_clear_error(bad_type):
    with pytest.raises(ValueError, match="unsupported tensor type"):
        dequantize(np.zeros(1024, np.uint8), bad_type, (32,))


def test_wrong_sizes_are_clear_errors():
    raw = random_raw(GGMLType.Q4_K, (2, 256))
    with pytest.raises(ValueError, match=r"needs 288 bytes, got 287"):
        dequantize(raw[:-1], GGMLType.Q4_K, (2, 256))
    with pytest.raises(ValueError, match="multiple of 256"):
        dequantize(raw, GGMLType.Q4_K, (4, 128))
    with pytest.raises(ValueError, match="must be uint8"):
        dequantize(torch.zeros(72, dtype=torch.int32), GGMLType.Q4_K, (2, 256))
    with pytest.raises(ValueError, match="bad tensor shape"):
        dequantize(raw, GGMLType.Q4_K, ())
