"""Q5_0 tiled at load (kernels/cpu/q8_tiles.h, gguf_blocks.h's Q5_0_T16): 16 weight rows' blocks interleaved so that
the AVX-512 levels load each part of a block as one vector. A tile is a layout, not a number format: its products
must be the GGUF rows' bit for bit at every row count (a decode step and a verify block read the same tiles), and
its dequantization the GGUF rows' exactly (the prefill reads the tiles too).
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from bolt_ros.engine.gguf.quants import as_uint8, random_raw
from bolt_ros.engine.model.linear import QuantLinear
from bolt_ros.kernels.cpu import native

pytestmark = pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")),
                                reason="no C compiler: the torch forms are used")
Q5_0 = 6
LEVELS = native.runnable_levels()
TILED = [lv for lv in LEVELS if native.gguf_matmul_fast(native.Q5_0_T16, lv)]
needs_tiles = pytest.mark.skipif(not TILED, reason="this CPU runs no AVX-512 VNNI level: Q5_0 stays in GGUF rows")


def _q5(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return as_uint8(random_raw(Q5_0, (n, k), seed=seed, max_scale=0.05)).contiguous()


@pytest.mark.parametrize("n", [16, 45])  # whole tiles; a last tile of 13 rows and 3 zero padding rows
def test_tiles_dequantize_to_the_gguf_rows(n):
    raw = _q5(n, 896)
    tiles = native.tile16(raw, n, 896)
    assert tiles.shape == ((n + 15) // 16 * 16, 896 // 32 * 22)
    assert torch.equal(native.dequantize_rows(tiles.reshape(-1), native.Q5_0_T16, n, 896),
                       native.dequantize_rows(raw, Q5_0, n, 896))
    with pytest.raises(ValueError, match="whole Q5_0 rows"):
        native.tile16(raw, n, 880)


@needs_tiles
@pytest.mark.parametrize("m", [1, 2, 8, 16, 64])
def test_tiled_products_are_the_gguf_rows_bits(m):
    """At every M (the 1-row step, a verify block, a prefill chunk) the tiles give the portable loop's bits over the
    GGUF rows; rows of a short last tile included. Negative control: tiles of the rows in another order differ."""
    raw = _q5(45, 896, seed=1)
    tiles = native.tile16(raw, 45, 896)
    x = torch.randn(m, 896, generator=torch.Generator().manual_seed(m))
    ref = native.gguf_matmul(x, raw, Q5_0, 45, level="portable")
    for level in TILED:
        assert torch.equal(native.gguf_matmul(x, tiles, native.Q5_0_T16, 45, level=level), ref), level
    swapped = raw.view(45, -1)[[1, 0, *range(2, 45)]].reshape(-1).contiguous()
    y = native.gguf_matmul(x, native.tile16(swapped, 45, 896), native.Q5_0_T16, 45, level=TILED[0])
    assert not torch.equal(y, ref)


def test_levels_without_tiles_refuse_them():
    """AVX2 and AVX-VNNI keep GGUF rows: handed tiles, they refuse rather than read them as rows."""
    raw = _q5(16, 256)
    tiles = native.tile16(raw, 16, 256)
    for level in LEVELS:
        if level not in TILED:
            with pytest.raises(ValueError, match="refused"):
                native.gguf_matmul(torch.randn(2, 256), tiles, native.Q5_0_T16, 16, level=level)


@needs_tiles
def test_a_q5_0_layer_holds_tiles_and_multiplies_as_the_gguf_rows():
    """QuantLinear's blocks form tiles Q5_0 on this level; its products (1 and 8 rows), fused with another type, and
    its prefill weight equal the GGUF rows' forms."""
    if native.level() not in TILED:
        pytest.skip(f"BOLT_CPU_LEVEL chose {native.level()}, a level without tiles")
    raw_q, raw_k = _q5(48, 896, seed=2), _q5(32, 896, seed=3)
    q = QuantLinear(raw_q, Q5_0, (48, 896), scheme="blocks")
    k = QuantLinear(raw_k, Q5_0, (32, 896), scheme="blocks")
    assert q.blocks_type == native.Q5_0_T16
    for m in (1, 8):
        x = torch.randn(m, 896, generator=torch.Generator().manual_seed(10 + m))
        assert torch.equal(q(x), native.gguf_matmul(x, raw_q, Q5_0, 48))
        fused = QuantLinear.fuse([q, k])
        assert torch.equal(fused(x), torch.cat([q(x), k(x)], dim=-1))
    assert torch.equal(q._dense().float(), native.dequantize_rows(raw_q, Q5_0, 48, 896).to(q._dense().dtype).float())
    assert torch.equal(q.dequantized(), native.dequantize_rows(raw_q, Q5_0, 48, 896).double().float())
