"""The C GGUF matmul (kernels/cpu/q8_matmul.c) against the fp64 product with the dequantized weight, at every
instruction-set level this CPU can run.

The kernel quantizes x to int8 as llama.cpp does: per block of B = 32 (Q8_0; for Q4_0 .. Q8_0 weights) or B = 256
(Q8_K; for the K-quants), step d = amax_block / 127, each element rounded to nearest, so off by at most d / 2. Products
then sum exactly in int32, and the float side (one product per block, sums of 8) adds a relative ~1e-6. So for output
n the error is at most sum over blocks b of (amax_b(x) / 254) * ||W[n, b]||_1 (the bound the tests compute), plus
1e-5 of sum |W x| for the float side. The bound is tight enough to catch a kernel with one scale per row of x
(negative control below: one outlier channel, as real activations have, breaks it by far).
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from bolt_ros.engine.gguf.quants import as_uint8, dequantize, random_raw
from bolt_ros.engine.gguf.types import type_name
from bolt_ros.engine.model.linear import QuantLinear
from bolt_ros.kernels.cpu import native

pytestmark = pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")),
                                reason="no C compiler: the torch forms are used")
K_TYPES = (12, 13, 14)
LEVELS = native.runnable_levels()


def _bound(x: torch.Tensor, w: torch.Tensor, t: int) -> torch.Tensor:
    """[M, N] the largest error int8 blocks of x can cause (module docstring)"""
    bs = 256 if t in K_TYPES else 32
    m, k = x.shape
    step = x.double().reshape(m, k // bs, bs).abs().amax(-1) / 127  # [M, K/B]
    l1 = w.abs().reshape(w.shape[0], k // bs, bs).sum(-1)  # [N, K/B]
    return step / 2 @ l1.t() + 1e-5 * (x.double().abs() @ w.abs().t())


def _case(t: int, shape=(80, 768), seed=0):
    raw = random_raw(t, shape, seed=seed + t, max_scale=0.05)
    return as_uint8(raw).contiguous(), dequantize(raw, t, shape).double()


def test_this_cpu_runs_its_best_level():
    """x86-64 with AVX2/FMA/F16C (every such CPU since 2013-2015) runs a vectorized level; the flags choose the
    highest, and BOLT_CPU_LEVEL only ever lowers it."""
    flags = native.cpu_flags()
    assert LEVELS[0] == "portable"
    if {"avx2", "fma", "f16c"} <= flags:
        assert "avx2" in LEVELS
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        assert "avx512vnni" in LEVELS
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512vbmi"} <= flags:
        assert "avx512vbmi" in LEVELS
    assert native.level() in LEVELS
    if not os.environ.get("BOLT_CPU_LEVEL"):
        assert native.level() == LEVELS[-1]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("t", native.TYPES, ids=type_name)
@pytest.mark.parametrize("m", [1, 3, 8, 9, 17])
def test_matches_the_fp64_product_within_the_int8_bound(level, t, m):
    blocks, w = _case(t)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, w.shape[1], generator=g) * torch.rand(m, 1, generator=g) * 4
    x[:, 5] *= 30  # an outlier channel, as real activations have
    err = (native.gguf_matmul(x, blocks, t, w.shape[0], level=level).double() - x.double() @ w.t()).abs()
    assert (err <= _bound(x, w, t)).all(), f"{level}: worst error / bound {float((err / _bound(x, w, t)).max()):.2f}"


def test_one_scale_per_row_would_break_the_bound():
    """The negative control: x quantized with one int8 scale per row (not per block) misses the bound by far on a
    row with an outlier channel; per block, as the kernel does, it holds."""
    _, w = _case(6)
    x = torch.randn(4, w.shape[1])
    x[:, 5] = 60.0
    per_row = torch.round(x / (x.abs().amax(-1, keepdim=True) / 127)) * (x.abs().amax(-1, keepdim=True) / 127)
    assert ((per_row.double() @ w.t() - x.double() @ w.t()).abs() > _bound(x, w, 6)).any()


@pytest.mark.parametrize("t", native.TYPES, ids=type_name)
def test_every_level_gives_the_portable_bits(t):
    """Integer sums are exact and every level applies the scales in one float order, so each level's result is the
    portable loop's bit for bit, at one row and at a verify block of rows."""
    blocks, _ = _case(t, shape=(45, 1024), seed=3)
    for m in (1, 5, 16):
        x = torch.randn(m, 1024, generator=torch.Generator().manual_seed(m))
        ref = native.gguf_matmul(x, blocks, t, 45, level="portable")
        for level in LEVELS:
            assert torch.equal(native.gguf_matmul(x, blocks, t, 45, level=level), ref), f"{level} M={m}"


@pytest.mark.parametrize("t", [2, 6], ids=type_name)
@pytest.mark.parametrize("k", [96, 160, 896])
def test_a_row_whose_blocks_end_inside_a_group_gives_the_portable_bits(t, k):
    """One row of Q4_0 / Q5_0 takes its blocks 4 at a time (avx512vbmi: 4 contiguous blocks by byte permutes) and a
    last group of fewer by the block-by-block loads: 3, 5 and 28 blocks a row (Qwen2.5's 896) take both."""
    blocks, _ = _case(t, shape=(9, k), seed=5)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k))
    ref = native.gguf_matmul(x, blocks, t, 9, level="portable")
    for level in LEVELS:
        assert torch.equal(native.gguf_matmul(x, blocks, t, 9, level=level), ref), level


def test_vectorized_types_on_this_machine():
    """The types "fast" sends to this kernel have a vectorized path wherever AVX2/F16C/FMA exist; elsewhere
    pick_scheme keeps the torch forms."""
    if {"avx2", "fma", "f16c"} <= native.cpu_flags():
        assert all(native.gguf_matmul_fast(t) for t in (2, 6, 8, 12, 14))
    assert not native.gguf_matmul_fast(3)  # Q4_1: portable loops only


def test_threads_change_no_bit_and_bad_shapes_are_refused():
    blocks, _ = _case(14, shape=(37, 512))
    x = torch.randn(2, 512)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.gguf_matmul(x, blocks, 14, 37)
        torch.set_num_threads(max(2, n))
        two = native.gguf_matmul(x, blocks, 14, 37)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, two)
    with pytest.raises(ValueError, match="M <= 64"):
        native.gguf_matmul(torch.randn(65, 512), blocks, 14, 37)
    q5 = as_uint8(random_raw(6, (4, 96))).contiguous()
    with pytest.raises(ValueError, match="K=80"):  # not whole 32-blocks
        native.gguf_matmul(torch.randn(1, 80), q5, 6, 4)


def _within(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, t: int) -> bool:
    return bool(((y.double() - x.double() @ w.t()).abs() <= _bound(x, w, t)).all())


def test_quant_linear_blocks_scheme_chunks_and_fuses():
    if not native.gguf_matmul_fast(6):
        pytest.skip("no vectorized Q5_0 kernel on this CPU")
    raw = random_raw(6, (64, 512), seed=5, max_scale=0.05)
    a = QuantLinear(raw, 6, (64, 512), scheme="blocks")
    w = dequantize(raw, 6, (64, 512)).double()
    x = torch.randn(31, 512)  # below the dense threshold: the C kernel
    assert _within(a(x), x, w, 6) and a.weight_bytes == len(raw)
    head = QuantLinear(raw, 6, (64, 512), scheme="blocks", role="head")  # no dense path: > MAX_M rows go in chunks
    x70 = torch.randn(native.MAX_M + 6, 512)
    assert head.prefill_dense_rows is None and _within(head(x70), x70, w, 6)
    fused = QuantLinear.fuse([a, QuantLinear(raw, 6, (64, 512), scheme="blocks")])
    assert torch.equal(fused(x), torch.cat([a(x), a(x)], -1))
    with pytest.raises(ValueError, match="vectorized Q4_1"):
        QuantLinear(random_raw(3, (16, 64)), 3, (16, 64), scheme="blocks")


def test_parts_of_different_types_fuse_into_one_call():
    """q|k|v whose GGUF types differ (Q5_0, Q8_0, Q6_K in the shipped models' layers): one gguf_matmul_parts call, the
    same bits as each part's own call side by side, at 1 row, a verify block and the last row count before the dense
    prefill path; the parts stay the GGUF bytes (no copy)."""
    types = [t for t in (6, 8, 14) if native.gguf_matmul_fast(t)]
    if len(types) < 2:
        pytest.skip("fewer than two vectorized kernels on this CPU")
    layers = [QuantLinear(random_raw(t, (32 * (i + 1), 512), seed=t, max_scale=0.05), t, (32 * (i + 1), 512),
                          scheme="blocks") for i, t in enumerate(types)]
    fused = QuantLinear.fuse(layers)
    assert fused is not None and fused.out_features == sum(m.out_features for m in layers)
    assert fused.weight_bytes == sum(m.weight_bytes for m in layers)
    for m in (1, 8, layers[0].prefill_dense_rows - 1):
        x = torch.randn(m, 512, generator=torch.Generator().manual_seed(m))
        assert torch.equal(fused(x), torch.cat([layer(x) for layer in layers], -1))
    # negative control: the parts' order matters (a swapped call gives other columns)
    x = torch.randn(1, 512)
    swapped = QuantLinear.fuse(layers[::-1])
    assert not torch.equal(swapped(x), fused(x))


def _real_layers(max_rows: int = 512) -> list[tuple[str, int, torch.Tensor, int, int]]:
    """The first few rows of the default chat model's vectorized-type layers (one per type): (name, type, blocks,
    rows, K), read from the GGUF mmap."""
    from bolt_ros.engine.default_models import resolve_model
    from bolt_ros.engine.gguf.quants import tensor_nbytes
    from bolt_ros.engine.gguf.reader import GGUFFile, torch_shape

    out, seen = [], set()
    gf = GGUFFile(resolve_model("default-chat"))
    for name, info in gf.tensors.items():
        shape = torch_shape(info)
        if len(shape) != 2 or info.ggml_type in seen or not native.gguf_matmul_fast(info.ggml_type):
            continue
        seen.add(info.ggml_type)
        rows = min(max_rows, shape[0])
        blocks = as_uint8(gf.raw(name))[: tensor_nbytes(info.ggml_type, (rows, shape[1]))].clone()
        out.append((name, info.ggml_type, blocks, rows, shape[1]))
    return out


@pytest.mark.parametrize("source", ["random", "default-chat"])
def test_each_row_of_a_verify_block_is_bit_identical_to_one_row(source):
    """DFlash verifies up to 16 rows in one call; greedy DFlash equals plain decoding exactly (not only at margins
    above a tolerance) when each row's result is the 1-row kernel's, bit for bit: the same integer sums and the same
    fp32 operations in the same order, whatever M. Random shapes of every vectorized type and real layers.
    Negative control: the portable loop, which applies the scales in another order, differs in the last bits."""
    g = torch.Generator().manual_seed(7)
    if source == "random":
        cases = []
        for t in (t for t in native.TYPES if native.gguf_matmul_fast(t)):
            n, k = int(torch.randint(3, 70, (1,), generator=g)), 256 * int(torch.randint(1, 5, (1,), generator=g))
            cases.append((type_name(t), t, _case(t, shape=(n, k), seed=n)[0], n, k))
    else:
        cases = _real_layers()
    assert cases, "no vectorized kernel on this CPU"
    reordered_differs = False
    for name, t, blocks, n, k in cases:
        w = dequantize(blocks, t, (n, k)).float()
        for m in (2, 7, 8, 9, 16):
            x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4  # rows of unlike scales
            for level in LEVELS:
                many = native.gguf_matmul(x, blocks, t, n, level=level)
                one = torch.cat([native.gguf_matmul(x[i : i + 1], blocks, t, n, level=level) for i in range(m)])
                assert torch.equal(many, one), f"{name} {level} M={m}: rows differ from the 1-row kernel's"
            reordered_differs |= not torch.equal(_int8_x(x, t) @ w.t(), many)
    assert reordered_differs, "torch's order gave the same bits: the check would catch nothing"


def _int8_x(x: torch.Tensor, t: int) -> torch.Tensor:
    """x rounded to int8 blocks as the kernel rounds it, back in fp32"""
    bs = 256 if t in K_TYPES else 32
    m, k = x.shape
    xb = x.reshape(m, k // bs, bs)
    d = xb.abs().amax(-1, keepdim=True) / 127
    return (torch.round(xb / torch.where(d > 0, d, 1)).clamp(-127, 127) * d).reshape(m, k)


def test_the_library_is_the_same_build_in_every_process():
    """The build key must not follow the process's string hash seed (PYTHONHASHSEED): a frozenset's repr did, and
    nearly every process compiled the kernels anew. The negative control: the levels' repr itself varies."""
    import subprocess
    import sys
    code = ("import hashlib; from bolt_ros.kernels.cpu import native; print(native.library_key('cc 1').hexdigest(), "
            "hashlib.sha256(repr(native.LEVELS).encode()).hexdigest())")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.split() for seed in range(6)]
    assert len({o[0] for o in outs}) == 1, outs
    assert len({o[1] for o in outs}) > 1, outs
