"""QuantLinear / QuantEmbedding on real GGUF tensors and synthetic blocks.

Tolerances: "exact" is the fp32 GGUF weight (fp32 GEMM rounding only, <= 1e-5 of the output scale). The "fast" int4 /
int4x2 / bf16 paths round x, y and the per-group scales to bf16 (8 significant bits), so they are held to bf16 level:
mean |dy| <= 6e-3 * mean |y| and max |dy| <= 2e-2 * max |y| (measured ~3e-3 / ~4e-3; int8 requantization, ~1e-2,
would fail the mean bound). The "blocks" form rounds x to int8 per block as llama.cpp does (step amax/127): for
Gaussian x the error per element is uniform with rms step/sqrt(12), and a block of 256 (Q8_K, the K-quants) has
amax ~2.9 sigma, so x and hence y carry a relative rms error of 2.9/127/3.46 = 6.6e-3 (blocks of 32: amax ~2.1 sigma,
4.8e-3); mean |dy| / mean |y| follows it. Held to 1.2e-2 (measured 7.4e-3 on Q4_K); max |dy| stays at 2e-2.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bolt_ros.engine.gguf.quants import GGML_BLOCK, GGMLType, dequantize, random_raw, row_nbytes
from bolt_ros.engine.gguf.reader import torch_shape
from bolt_ros.engine.model import linear
from bolt_ros.engine.model.linear import QuantEmbedding, QuantLinear

MEAN_TOL, MAX_TOL = 6e-3, 2e-2
MEAN_TOL_INT8 = 1.2e-2  # x rounded to int8 per block (the module docstring)
REAL = {  # one real tensor per type (Gemma 3 270M, SmolLM2-135M), first 256 output rows
    "Q5_0": ("default", "blk.0.attn_q.weight"),
    "Q8_0": ("default", "blk.0.attn_v.weight"),
    "Q4_K": ("default", "blk.0.attn_output.weight"),
    "Q6_K": ("default", "blk.0.ffn_down.weight"),
    "Q4_1": ("smollm2", "blk.0.ffn_down.weight"),
    "Q8_0 head": ("default", "token_embd.weight"),
}


def _real(real_ggufs, key: str, rows: int = 256):
    model, name = REAL[key]
    info = real_ggufs[model].info(name)
    shape = torch_shape(info)
    rows = min(rows, shape[0])
    return real_ggufs[model].raw(name)[: rows * row_nbytes(info.ggml_type, shape[1])], info.ggml_type, (rows, shape[1])


def _errors(y: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    d = (y.double() - ref).abs()
    return float(d.mean() / ref.abs().mean()), float(d.max() / ref.abs().max())


@pytest.mark.parametrize("key", list(REAL))
def test_fast_matches_exact_on_real_tensors(real_ggufs, key):
    raw, t, shape = _real(real_ggufs, key)
    exact = QuantLinear(raw, t, shape, policy="exact")
    fast = QuantLinear(raw, t, shape, policy="fast")
    assert exact.scheme == "f32" and fast.scheme == linear.pick_scheme(t, shape, "fast")
    assert torch.equal(exact.weight, dequantize(raw, t, shape))
    assert fast.weight_bytes < exact.weight_bytes
    x = torch.randn(8, shape[1], generator=torch.Generator().manual_seed(0))
    ref = x.double() @ exact.dequantized().double().t()
    assert _errors(exact(x), ref)[1] < 1e-5
    for rows in (x[:1], x):  # decode (T=1) and a small block
        mean, mx = _errors(fast(rows), ref[: rows.shape[0]])
        tol = MEAN_TOL_INT8 if fast.scheme == "blocks" else MEAN_TOL
        assert mean < tol and mx < MAX_TOL, (key, fast.scheme, mean, mx)


def test_int8_requant_is_measurably_worse(real_ggufs):
    """The per-row int8 form is not used by 'fast' because requantizing block scales costs ~3x the error."""
    raw, t, shape = _real(real_ggufs, "Q5_0")
    x = torch.randn(8, shape[1], generator=torch.Generator().manual_seed(1))
    ref = x.double() @ dequantize(raw, t, shape).double().t()
    mean8, _ = _errors(QuantLinear(raw, t, shape, scheme="int8")(x), ref)
    mean4, _ = _errors(QuantLinear(raw, t, shape, scheme="int4x2")(x), ref)
    assert mean8 > 2 * mean4 and mean8 < 3e-2


SPLIT_TYPES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K,
               GGMLType.Q8_0]


@pytest.mark.parametrize("t", SPLIT_TYPES, ids=lambda t: GGMLType(t).name)
def test_int4_decomposition_is_exact(t):
    """sum over parts of (q - 8) * s + z reproduces the GGUF weight to fp32 rounding (before any bf16 rounding)."""
    shape = (4, 512)
    raw = random_raw(t, shape, seed=t, max_scale=0.05)
    blocks = torch.from_numpy(raw).view(-1, GGML_BLOCK[t][1])
    parts = linear._int4_parts(blocks, t, shape[0])
    assert len(parts) == (1 if t in linear._INT4_EXACT else 2)
    w = sum(((q.float() - 8).view(4, -1, 32) * s[..., None] + z[..., None]).view(shape) for q, s, z in parts)
    assert all(int(q.min()) >= 0 and int(q.max()) <= 15 for q, _, _ in parts)
    ref = dequantize(raw, t, shape)
    torch.testing.assert_close(w, ref, rtol=0, atol=1e-6 * float(ref.abs().max()))


@pytest.mark.parametrize("t", [GGMLType.Q4_0, GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q2_K, GGMLType.Q3_K,
                               GGMLType.F16, GGMLType.BF16, GGMLType.F32], ids=lambda t: GGMLType(t).name)
def test_fast_matches_exact_on_synthetic_types(t):
    shape = (64, 512)
    if t in (GGMLType.F16, GGMLType.BF16, GGMLType.F32):
        w = torch.randn(shape) * 0.05
        raw = {GGMLType.F16: w.half(), GGMLType.BF16: w.bfloat16(), GGMLType.F32: w}[t].contiguous().view(torch.uint8)
    else:
        raw = random_raw(t, shape, seed=10 + t, max_scale=0.05)
    fast, exact = QuantLinear(raw, t, shape), QuantLinear(raw, t, shape, policy="exact")
    x = torch.randn(3, shape[1], generator=torch.Generator().manual_seed(2))
    ref = x.double() @ exact.weight.double().t()
    mean, mx = _errors(fast(x), ref)
    assert mean < MEAN_TOL and mx < MAX_TOL, (fast.scheme, mean, mx)


@pytest.mark.parametrize("key", ["Q4_K", "Q5_0"])
def test_prefill_rows_take_the_dense_path(real_ggufs, key):
    """From DENSE_FROM_ROWS rows on, an int scheme multiplies by its GGUF weight in prefill_dtype() (bf16 where the CPU
    has native bf16, else fp32; dequantized into the shared workspace): the product equals F.linear on the rounded
    operands exactly, and stays at bf16 level or better."""
    raw, t, shape = _real(real_ggufs, key, rows=64)
    layer = QuantLinear(raw, t, shape)
    rows = linear.DENSE_FROM_ROWS[layer.scheme]
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(3))
    w = dequantize(raw, t, shape)
    dt = linear.prefill_dtype()
    dense = torch.nn.functional.linear(x.to(dt), w.to(dt)).float()
    assert torch.equal(layer(x), dense)
    assert not torch.equal(layer(x[: rows - 1]), dense[: rows - 1])  # below the threshold: the int kernel
    mean, mx = _errors(layer(x), x.double() @ w.double().t())
    assert mean < MEAN_TOL and mx < MAX_TOL
    head = QuantLinear(raw, t, shape, role="head")  # never dequantizes the vocab-sized head per call
    assert head.prefill_dense_rows is None and not torch.equal(head(x), dense)


def test_fused_layers_take_the_dense_path_part_by_part(real_ggufs):
    raw, t, shape = _real(real_ggufs, "Q5_0", rows=64)
    a, b = QuantLinear(raw, t, shape), QuantLinear(raw, t, shape)
    fused = QuantLinear.fuse([a, b])
    x = torch.randn(64, shape[1])
    torch.testing.assert_close(fused(x), torch.cat([a(x), b(x)], -1), rtol=0, atol=0)


def test_shapes_and_batch_dims(real_ggufs):
    raw, t, shape = _real(real_ggufs, "Q5_0", rows=64)
    layer = QuantLinear(raw, t, shape)
    x = torch.randn(2, 3, shape[1])
    y = layer(x)
    assert y.shape == (2, 3, 64) and y.dtype == torch.float32
    torch.testing.assert_close(y, layer(x.reshape(6, -1)).reshape(2, 3, 64))
    assert layer(torch.zeros(0, shape[1])).shape == (0, 64)
    with pytest.raises(ValueError, match="input has 5 features, layer expects 640"):
        layer(torch.zeros(1, 5))


def test_memory_stays_packed(real_ggufs):
    raw, t, shape = _real(real_ggufs, "Q8_0 head", rows=1024)
    n = shape[0] * shape[1]
    assert QuantLinear(raw, t, shape, policy="exact").weight_bytes == 4 * n
    fast = QuantLinear(raw, t, shape)
    assert fast.scheme in ("int4x2", "blocks") and fast.weight_bytes <= 1.25 * n  # Q8_0 itself: 1.0625 bytes/weight
    raw4, t4, shape4 = _real(real_ggufs, "Q4_K")
    assert QuantLinear(raw4, t4, shape4).weight_bytes <= 0.625 * shape4[0] * shape4[1]


def test_gguf_policy_uses_the_kernel_facade(real_ggufs):
    """policy 'gguf' keeps the GGUF blocks (the Triton path on CUDA); on CPU the facade's torch reference runs."""
    raw, t, shape = _real(real_ggufs, "Q4_K", rows=32)
    layer = QuantLinear(raw, t, shape, policy="gguf")
    assert layer.scheme == "gguf" and layer.weight_bytes == len(raw)
    x = torch.randn(2, shape[1])
    torch.testing.assert_close(layer(x), x @ dequantize(raw, t, shape).t(), rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_clear_errors(real_ggufs):
    raw, t, shape = _real(real_ggufs, "Q4_K", rows=16)
    with pytest.raises(ValueError, match="needs 9216 bytes, got 9215"):
        QuantLinear(raw[:-1], t, shape)
    with pytest.raises(ValueError, match="unsupported tensor type"):
        QuantLinear(raw, 99, shape)
    with pytest.raises(ValueError, match="unknown policy"):
        QuantLinear(raw, t, shape, policy="fastest")
    with pytest.raises(ValueError, match="unknown scheme"):
        QuantLinear(raw, t, shape, scheme="int3")
    with pytest.raises(ValueError, match="int4x2 needs a 5- or 8-bit"):
        QuantLinear(raw, t, shape, scheme="int4x2")
    with pytest.raises(ValueError, match="2-D weight"):
        QuantLinear(raw, t, (16 * 1024,))
    with pytest.raises(ValueError, match="multiple of 256"):
        QuantLinear(raw, t, (32 * 1024 // 128, 128))


def test_odd_output_count_falls_back_from_int4():
    raw = random_raw(GGMLType.Q4_0, (24, 64), max_scale=0.05)  # the int4 packer needs out % 16 == 0
    layer = QuantLinear(raw, GGMLType.Q4_0, (24, 64))
    assert layer.scheme == "int8"
    x = torch.randn(2, 64)
    ref = x.double() @ dequantize(raw, GGMLType.Q4_0, (24, 64)).double().t()
    assert _errors(layer(x), ref)[0] < 3e-2


def test_embedding_gathers_rows_without_copying(real_ggufs):
    gf = real_ggufs["default"]
    info = gf.info("token_embd.weight")
    shape, raw = torch_shape(info), gf.raw("token_embd.weight")
    emb = QuantEmbedding(raw, info.ggml_type, shape)
    assert emb.weight_bytes == raw.nbytes and emb.table.data_ptr() == raw.ctypes.data  # the mmap itself
    ids = torch.tensor([[2, 105, 262143], [0, 0, 7]])
    out = emb(ids)
    assert out.shape == (2, 3, 640) and out.dtype == torch.float32
    rb = row_nbytes(info.ggml_type, shape[1])
    for r in (2, 262143, 7):
        row = dequantize(raw[r * rb : (r + 1) * rb], info.ggml_type, (shape[1],))
        assert torch.equal(out[ids == r][0], row)
    with pytest.raises(IndexError):
        emb(torch.tensor([shape[0]]))
    with pytest.raises(ValueError, match="needs"):
        QuantEmbedding(np.asarray(raw)[:-1], info.ggml_type, shape)


@pytest.mark.parametrize("n", [128, 80])
def test_int4_packing_matches_torch_packer(n):
    q = torch.randint(0, 16, (n, 96), generator=torch.Generator().manual_seed(n), dtype=torch.uint8)
    ref = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    assert torch.equal(linear.pack_int4_codes(q), ref)


_PACK_CHECK = """
import torch
from bolt_ros.engine.gguf.quants import GGMLType, dequantize, random_raw
from bolt_ros.engine.model.linear import QuantLinear, int4_tile_rows, pack_int4_codes
q = torch.randint(0, 16, (192, 96), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
ref = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
assert torch.equal(pack_int4_codes(q), ref), int4_tile_rows()
raw = random_raw(GGMLType.Q4_K, (128, 256), seed=3, max_scale=0.05)
lin = QuantLinear(raw, GGMLType.Q4_K, (128, 256), policy="fast", scheme="int4")
x = torch.randn(1, 256, generator=torch.Generator().manual_seed(1))
want = x @ dequantize(raw, GGMLType.Q4_K, (128, 256)).t()
rel = float((lin(x) - want).abs().mean() / want.abs().mean())
assert lin.scheme == "int4" and rel < 0.05, (lin.scheme, rel)
print(torch.backends.cpu.get_cpu_capability(), int4_tile_rows())
"""


@pytest.mark.parametrize("capability", ["", "avx2", "default"])
def test_int4_packing_follows_the_kernel_torch_dispatches_to(capability):
    """torch's CPU int4 layout depends on the ISA its kernel was dispatched for (64-row tiles under AVX-512, 32 under
    AVX2): an AVX2-only EPYC got garbage from 64-row tiles. ATEN_CPU_CAPABILITY makes this machine take another
    dispatch, so each layout is checked here against torch's own packer and the int4 product against the exact
    weights (the bound: int4 Q4_K is exact up to bf16 scales, ~1e-3 relative; garbage is ~1)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability) if capability else dict(os.environ)
    out = subprocess.run([sys.executable, "-c", _PACK_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
