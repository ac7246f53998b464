"""Our Q4_K / Q6_K packers write bytes that gguf-py's reference dequantizer reads back as the input (within error)."""
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import quants as gguf_quants

from bolt_ros.engine.gguf import kquant_pack


def rel_rms(y: np.ndarray, x: np.ndarray) -> float:
    return float(np.sqrt(np.mean((y - x) ** 2)) / np.sqrt(np.mean(x**2)))


def roundtrip(x: np.ndarray, qtype: QT, **kw) -> np.ndarray:
    raw = kquant_pack.quantize(x, qtype, **kw)
    assert raw.dtype == np.uint8
    return gguf_quants.dequantize(raw, qtype)


@pytest.fixture(scope="module")
def normal():
    return np.random.default_rng(0).standard_normal((64, 1024)).astype(np.float32)


@pytest.mark.parametrize("qtype,nbytes", [(QT.Q4_K, 144), (QT.Q6_K, 210)], ids=["Q4_K", "Q6_K"])
def test_byte_shape_follows_block_layout(qtype, nbytes):
    x = np.random.default_rng(1).standard_normal((3, 2, 512)).astype(np.float32)
    raw = kquant_pack.quantize(x, qtype)
    assert raw.shape == (3, 2, 2 * nbytes)
    assert gguf_quants.dequantize(raw, qtype).shape == x.shape


def test_kquant_accuracy_vs_legacy_types(normal):
    err = {q: rel_rms(roundtrip(normal, q), normal) for q in (QT.Q4_0, QT.Q4_K, QT.Q6_K, QT.Q8_0)}
    # K-quants beat the legacy type of the same width, and keep the expected bits of precision
    assert err[QT.Q4_K] < err[QT.Q4_0]
    assert 0.05 < err[QT.Q4_K] < 0.08
    assert err[QT.Q8_0] < err[QT.Q6_K] < 0.022
    assert err[QT.Q6_K] < err[QT.Q4_K] / 3


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K])
def test_scale_search_reduces_error(normal, qtype):
    fast = rel_rms(roundtrip(normal, qtype, search=False), normal)
    full = rel_rms(roundtrip(normal, qtype, search=True), normal)
    assert full < fast
    assert fast < full * 1.2  # the cheap guess is still a usable quantization


@pytest.mark.parametrize("qtype,tol", [(QT.Q4_K, 0.1), (QT.Q6_K, 0.03)])
@pytest.mark.parametrize("kind", ["uniform_pos", "negative", "outliers", "scaled_tiny", "scaled_huge", "mixed"])
def test_distributions(qtype, tol, kind):
    rng = np.random.default_rng(zlib.crc32(kind.encode()))
    x = rng.standard_normal((16, 512)).astype(np.float32)
    if kind == "uniform_pos":
        x = rng.random((16, 512), dtype=np.float32) + 0.5  # all positive: Q4_K's min is clamped to 0
    elif kind == "negative":
        x = -np.abs(x) - 0.1
    elif kind == "outliers":
        x[:, ::97] *= 50
    elif kind == "scaled_tiny":
        x *= 1e-3
    elif kind == "scaled_huge":
        x *= 1e3
    elif kind == "mixed":
        x *= np.exp(rng.standard_normal((16, 1)).astype(np.float32) * 2)  # rows of very different scale
    y = roundtrip(x, qtype)
    # judge each 256-block against its own magnitude so outliers/scales don't hide bad blocks
    xb, yb = x.reshape(-1, 256), y.reshape(-1, 256)
    block_err = np.sqrt(((yb - xb) ** 2).mean(1)) / np.sqrt((xb**2).mean(1))
    limit = tol * (3 if kind == "outliers" else 1)
    assert block_err.max() < limit, block_err.max()


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K])
def test_degenerate_blocks(qtype):
    x = np.zeros((4, 256), np.float32)
    x[1] = 3.25  # constant block
    x[2, :32] = -1.0  # one non-zero group, the rest zero
    x[3] = np.linspace(-2, 2, 256, dtype=np.float32)
    y = roundtrip(x, qtype)
    assert np.all(y[0] == 0)
    np.testing.assert_allclose(y[1], 3.25, rtol=0.02)
    np.testing.assert_allclose(y[2, :32], -1.0, rtol=0.05)
    np.testing.assert_allclose(y[2, 32:], 0.0, atol=0.05)
    assert rel_rms(y[3], x[3]) < 0.05


def test_small_integers_are_exact_in_q6_k():
    # 6-bit levels with a power-of-two scale are representable: the packer must find them exactly
    rng = np.random.default_rng(5)
    x = (rng.integers(-31, 32, size=(8, 256)).astype(np.float32)) * 0.25
    x[:, 0] = -32 * 0.25  # pin the extreme so the block scale is exact
    y = roundtrip(x, QT.Q6_K)
    assert rel_rms(y, x) < 1e-2


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_0, QT.Q5_0, QT.Q4_1, QT.BF16])
def test_other_types_delegate_to_gguf_py(qtype):
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(kquant_pack.quantize(x, qtype), gguf_quants.quantize(x, qtype))


def test_bad_row_length_is_rejected():
    with pytest.raises(ValueError, match="multiple of the 256"):
        kquant_pack.quantize(np.zeros((2, 100), np.float32), QT.Q4_K)


def test_dequantize_helper_matches_gguf(normal):
    raw = kquant_pack.quantize(normal[:2], QT.Q4_K)
    np.testing.assert_array_equal(kquant_pack.dequantize(raw, QT.Q4_K), gguf_quants.dequantize(raw, QT.Q4_K))
