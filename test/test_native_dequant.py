"""The C dequantizer (kernels/cpu/gguf_dequant.c) against the torch reference (quants.dequantize_blocks).

Equality is bit for bit: the C code rounds each product and difference on its own as the reference does, so no
tolerance applies. The bytes are random everywhere, fp16 scales included (subnormals; and NaN/inf in a hostile
variant), the row split across threads must not change a bit, and without a compiler the reference takes over.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from bolt_ros.engine.gguf.quants import F16_FIELDS, GGML_BLOCK, as_uint8, dequantize, dequantize_blocks, random_raw
from bolt_ros.engine.gguf.reader import torch_shape
from bolt_ros.engine.gguf.types import type_name
from bolt_ros.kernels.cpu import native

# skipped only where no C compiler exists at all; with one, a failed build fails test_the_library_builds
pytestmark = pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")),
                                reason="no C compiler: the torch reference is used")


def test_the_library_builds():
    assert native.available()


def _bits(t: torch.Tensor) -> torch.Tensor:  # NaN == NaN when its bits are equal
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def _reference(raw, t, shape) -> torch.Tensor:
    return dequantize_blocks(as_uint8(raw).reshape(-1, GGML_BLOCK[t][1]), t).reshape(shape)


@pytest.mark.parametrize("t", native.TYPES, ids=type_name)
def test_equals_the_reference_bit_for_bit(t):
    shape = (48, 512)
    raw = random_raw(t, shape, seed=t)
    ref = _reference(raw, t, shape)
    data = as_uint8(raw).contiguous()
    assert torch.equal(_bits(native.dequantize_rows(data, t, *shape)), _bits(ref))
    assert torch.equal(_bits(native.dequantize_rows(data, t, *shape, dtype=torch.bfloat16)), _bits(ref.bfloat16()))


@pytest.mark.parametrize("t", [t for t in native.TYPES if F16_FIELDS.get(t)], ids=type_name)
def test_hostile_scales_give_the_same_nan_and_inf(t):
    shape = (16, 256)
    raw = np.random.default_rng(t).integers(0, 256, len(random_raw(t, shape)), dtype=np.uint8)
    blocks = raw.reshape(-1, GGML_BLOCK[t][1])
    blocks[::3, F16_FIELDS[t][0] + 1] = 0x7C | 0x80  # -inf/NaN exponents in every third block
    ref = _reference(raw, t, shape)
    got = native.dequantize_rows(as_uint8(raw).contiguous(), t, *shape)
    assert not torch.isfinite(ref).all()
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    assert torch.equal(got[~torch.isnan(ref)], ref[~torch.isnan(ref)])
    nan_bf16 = torch.isnan(native.dequantize_rows(as_uint8(raw).contiguous(), t, *shape, dtype=torch.bfloat16))
    assert torch.equal(nan_bf16, torch.isnan(ref))


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                                  "blk.0.ffn_down.weight"])
def test_real_tensors_and_the_dispatching_dequantize(real_ggufs, name):
    f = real_ggufs["default"]
    info = f.info(name)
    shape = torch_shape(info)
    raw = f.raw(name)
    assert torch.equal(dequantize(raw, info.ggml_type, shape), _reference(raw, info.ggml_type, shape))


def test_thread_split_changes_nothing_and_out_is_checked():
    t, shape = 12, (100, 768)  # Q4_K; 100 rows split unevenly
    raw = as_uint8(random_raw(t, shape, seed=1)).contiguous()
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.dequantize_rows(raw, t, *shape)
        torch.set_num_threads(max(2, n))
        out = torch.full(shape, float("nan"))
        many = native.dequantize_rows(raw, t, *shape, out=out)
    finally:
        torch.set_num_threads(n)
    assert many.data_ptr() == out.data_ptr() and torch.equal(one, many)
    with pytest.raises(ValueError, match=r"contiguous CPU torch\.float32 tensor of 76800"):
        native.dequantize_rows(raw, t, *shape, out=torch.empty(10))
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        native.dequantize_rows(raw, t, *shape, dtype=torch.float16)


@pytest.mark.parametrize("env", [{"BOLT_NATIVE": "0"}, {"CC": "/bin/false"}])
def test_without_the_library_the_reference_serves(env, tmp_path):
    """Switched off, or no working compiler (and nothing built in this cache yet): dequantize still answers, with the
    same values."""
    code = ("import torch; from bolt_ros.kernels.cpu import native; from bolt_ros.engine.gguf.quants import *;"
            "raw = random_raw(6, (8, 64), seed=2); assert not native.available();"
            "assert torch.equal(dequantize(raw, 6, (8, 64)), dequantize_blocks(as_uint8(raw).reshape(-1, 22), 6)"
            ".reshape(8, 64)); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "XDG_CACHE_HOME": str(tmp_path), **env})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
