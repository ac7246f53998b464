"""Q5_0, Q4_K and Q6_K tiled at load (kernels/cpu/q8_tiles.h, gguf_blocks.h): 16 weight rows' blocks interleaved
(8 on AVX2 and AVX-VNNI) so that the vectorized levels load each part of a block as one vector. A tile is a layout,
not a number format: its products must be the GGUF rows' bit for bit at every row count (a decode step and a verify
block read the same tiles), and its dequantization the GGUF rows' exactly (the prefill reads the tiles too).
"""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from bolt_ros.engine.gguf.quants import as_uint8, random_raw
from bolt_ros.engine.gguf.types import type_name
from bolt_ros.engine.model.linear import QuantLinear
from bolt_ros.kernels.cpu import native

pytestmark = pytest.mark.skipif(not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")),
                                reason="no C compiler: the torch forms are used")
LEVELS = native.runnable_levels()
TILED = [lv for lv in LEVELS if all(native.tiled_type(t, lv) for t in native.TILEABLE)]  # all but portable
KINDS = (native.TILED, native.TILED8)  # tiles of 16 rows, of 8
needs_tiles = pytest.mark.skipif(not TILED, reason="this CPU runs no vectorized level (AVX2 + FMA + F16C)")
K = 768  # whole superblocks, and 24 Q5_0 blocks: 3 groups of 8


def _raw(t: int, n: int, k: int = K, seed: int = 0) -> torch.Tensor:
    return as_uint8(random_raw(t, (n, k), seed=seed + t, max_scale=0.05)).contiguous()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("t", native.TILEABLE, ids=type_name)
@pytest.mark.parametrize("n", [16, 45])  # whole tiles; a last tile of 13 (5) rows and 3 zero padding rows
def test_tiles_dequantize_to_the_gguf_rows(kind, t, n):
    raw = _raw(t, n)
    rows = 16 if kind == native.TILED else 8
    tiles = native.tile(raw, kind + t, n, K)
    assert tiles.shape[0] == (n + rows - 1) // rows * rows and tiles.numel() == tiles.shape[0] * raw.numel() // n
    assert torch.equal(native.dequantize_rows(tiles.reshape(-1), kind + t, n, K), native.dequantize_rows(raw, t, n, K))
    with pytest.raises(ValueError, match="whole rows"):
        native.tile(raw, kind + t, n, K - 256)
    with pytest.raises(ValueError, match="not type"):
        native.tile(raw, kind + 8, n, K)


@needs_tiles
@pytest.mark.parametrize("t", native.TILEABLE, ids=type_name)
@pytest.mark.parametrize("m", [1, 2, 8, 16, 64])
def test_tiled_products_are_the_gguf_rows_bits(t, m):
    """At every M (the 1-row step, a verify block, a prefill chunk) each level's tiles give the portable loop's bits
    over the GGUF rows; rows of a short last tile included. Negative control: tiles of the rows in another order."""
    raw = _raw(t, 45, seed=1)
    x = torch.randn(m, K, generator=torch.Generator().manual_seed(m))
    ref = native.gguf_matmul(x, raw, t, 45, level="portable")
    swapped = raw.view(45, -1)[[1, 0, *range(2, 45)]].reshape(-1).contiguous()
    for level in TILED:
        tt = native.tiled_type(t, level)
        tiles = native.tile(raw, tt, 45, K)
        assert torch.equal(native.gguf_matmul(x, tiles, tt, 45, level=level), ref), level
        assert not torch.equal(native.gguf_matmul(x, native.tile(swapped, tt, 45, K), tt, 45, level=level), ref)


def test_a_level_refuses_tiles_it_does_not_read():
    """Each level reads one kind of tile (or none: portable); handed another, it refuses rather than misread it."""
    for t in native.TILEABLE:
        for level in LEVELS:
            for kind in KINDS:
                if native.tiled_type(t, level) == kind + t:
                    continue
                with pytest.raises(ValueError, match="refused"):
                    native.gguf_matmul(torch.randn(2, K), native.tile(_raw(t, 16), kind + t, 16, K), kind + t, 16,
                                       level=level)


@needs_tiles
def test_a_layer_holds_tiles_and_multiplies_as_the_gguf_rows():
    """QuantLinear's blocks form tiles Q5_0 / Q4_K / Q6_K on this level (not Q8_0); its products (1 and 8 rows),
    fused across types, and its prefill weight equal the GGUF rows' forms."""
    if native.tiled_type(6) is None:
        pytest.skip(f"BOLT_CPU_LEVEL chose {native.level()}, a level without tiles or the blocks form")
    layers, raws = [], []
    for t, n in ((6, 48), (12, 32), (14, 40), (8, 16)):
        raws.append((_raw(t, n, seed=2), t, n))
        layers.append(QuantLinear(raws[-1][0], t, (n, K), scheme="blocks"))
    assert [m.blocks_type for m in layers] == [native.tiled_type(6), native.tiled_type(12), native.tiled_type(14), 8]
    assert all(m.blocks_type > 255 for m in layers[:3])
    fused = QuantLinear.fuse(layers)
    for m in (1, 8):
        x = torch.randn(m, K, generator=torch.Generator().manual_seed(10 + m))
        ys = [native.gguf_matmul(x, raw, t, n) for raw, t, n in raws]
        for layer, y in zip(layers, ys):
            assert torch.equal(layer(x), y)
        assert torch.equal(fused(x), torch.cat(ys, dim=-1))
    for layer, (raw, t, n) in zip(layers, raws):
        dense = layer._dense()
        assert torch.equal(dense, native.dequantize_rows(raw, t, n, K).to(dense.dtype))
    assert torch.equal(fused._dense(), torch.cat([native.dequantize_rows(raw, t, n, K) for raw, t, n in raws])
                       .to(fused._dense().dtype))
