"""Quantized linear layers built straight from GGUF bytes, and row-gather embeddings.

(Over 400 lines on purpose: the int4 decompositions, the packers and QuantLinear's forms are one concern, a weight
held in the form its matmul wants; split, each half would need the other's private layout rules.)

`QuantLinear` keeps a weight W [out, in] in one of these forms (`scheme`):
  "f32"     dense fp32, the exact GGUF values (policy "exact": the numerical reference)
  "bf16"    dense bf16
  "int4"    torch's CPU int4 weight-only kernel (group 32, w = (q - 8) * scale + zero, bf16 scales/zeros).
            Q4_0 / Q4_1 / Q4_K *are* this format (one 4-bit code and one affine map per 32 weights), so only the
            scales/zeros round to bf16. Other types are requantized to 4 bits (lossy; see bench/bench_linear.py).
  "int4x2"  two int4 codes per weight, concatenated along K in one kernel call: Q5_0/Q5_1/Q5_K/Q8_0 codes split
            exactly into a low nibble and a high part (q = lo + 16 * hi), so again only scales round to bf16.
  "int8"    torch's int8 weight-only kernel, one scale per output row (requantized: lossy for block types)
  "blocks"  the GGUF blocks as they are (the mmap view: no copy), multiplied on the CPU by kernels/cpu/q8_matmul.c: x
            quantized to int8 per block as llama.cpp does (Q8_0 per 32, Q8_K per 256), int32 dots with the codes.
            Needs the C library and a vectorized kernel for the type (AVX2 + F16C + FMA: Q5_0, Q8_0, Q4_K, Q6_K).
            Q5_0, Q4_K and Q6_K are held as tiles of 8 or 16 rows (kernels/cpu/q8_tiles.h), the same blocks reordered.
  "q4_0"    an output head of more than 4.5 bits a weight requantized to Q4_0 tiles for the same kernel (lossy: it
            only ranks candidates, which _refine_top recomputes exactly from the GGUF rows); half the bytes a step.
  "gguf"    the GGUF blocks as they are, multiplied by `bolt_ros.kernels.ops.qmatmul_gguf` (fused Triton kernel on
            CUDA, a dequantize + matmul reference elsewhere)
The int kernels take bf16 activations (their fp32/fp16 paths are unvectorized and 10-100x slower on CPU), so the
fast path rounds x to bf16 and returns y rounded to bf16, then widened to fp32; accumulation is fp32 inside.
From DENSE_FROM_ROWS rows on (prefill), the int schemes instead dequantize the GGUF bytes (kept as an mmap view) to
bf16 for a dense bf16 GEMM (fp32 accumulation): the same bf16 level of error as the int kernels, 2-3x faster than
them at 64 rows and more beyond.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bolt_ros.engine.gguf.quants import (
    GGML_BLOCK,
    GGMLType,
    _bits,
    _bits_le32,
    _f16,
    _k_scale_min,
    _nibbles,
    as_uint8,
    dequantize,
    dequantize_blocks,
    dequantize_rows,
    row_nbytes,
)
from bolt_ros.engine.gguf.quants import type_name as _type_name
from bolt_ros.kernels.cpu import native

Policy = Literal["fast", "exact", "gguf"]
Scheme = Literal["f32", "bf16", "int4", "int4x2", "int8", "blocks", "q4_0", "gguf"]
SCHEMES: tuple[str, ...] = ("f32", "bf16", "int4", "int4x2", "int8", "blocks", "q4_0", "gguf")

GROUP = 32  # int4 kernel group size = the legacy block size = the K-quant sub-block size
# the output head's 4-bit copy only ranks candidates (_refine_top recomputes them exactly): coarser groups cost it
# nothing in exactness and save 15 MiB of scales on Gemma's 262144-row head
HEAD_GROUP = 128
# From this many rows on (prefill), the int schemes dequantize the GGUF bytes to bf16 (kernels/cpu, into a reused
# buffer) and run a dense bf16 GEMM instead: the int kernels cost ~linear in T. Crossovers measured on Qwen2.5 0.5B's
# tensors (2 threads, AMD EPYC Zen 4): 4864x896 Q5_0 int4x2 3.9 ms vs dense 2.6 ms at T=32 (1.0 vs 2.3 at T=8);
# 896x4864 Q4_K int4 4.0 vs 3.3 ms at T=64 (2.1 vs 2.7 at T=32). Never for the vocab-sized head.
# "blocks": the C kernel takes up to 64 rows with 16 weight rows as lanes (q8_rows16.h), so it stays: a 32-token
# chunk of Qwen2.5 0.5B after 1100 tokens, 2 threads, Zen 5: 69-75 ms against 211-282 dense, 64 tokens 125-135
# against 256-321.
DENSE_FROM_ROWS = {"int4": 64, "int4x2": 32, "int8": 32, "blocks": 65}
# output-head candidates recomputed exactly (QuantLinear._refine_top): every logit within HEAD_MARGIN of the row's
# approximate best (4-bit head error is well below it), at most HEAD_MAX_CANDIDATES per row
HEAD_MARGIN = 6.0
HEAD_MAX_CANDIDATES = 256
_CHUNK_ROWS = 8192  # repack this many output rows at a time: bounds load-time temporaries for the 262144-row head

# "fast" policy per ggml type: the fastest form whose error stays at bf16-rounding level where one exists.
# Measured on the real Gemma 3 270M / SmolLM2 tensors with bench/bench_linear.py (2 threads). Where the C kernels
# are built with a vectorized kernel for the type, BLOCKS_TYPES take "blocks" instead (pick_scheme).
FAST_SCHEME: dict[int, str] = {
    GGMLType.Q4_0: "int4",
    GGMLType.Q4_1: "int4",
    GGMLType.Q4_K: "int4",
    GGMLType.Q5_0: "int4x2",
    GGMLType.Q5_1: "int4x2",
    GGMLType.Q5_K: "int4x2",
    GGMLType.Q8_0: "int4x2",
    GGMLType.Q6_K: "bf16",
    GGMLType.Q2_K: "bf16",
    GGMLType.Q3_K: "bf16",
    GGMLType.BF16: "bf16",
    GGMLType.F16: "f32",
    GGMLType.F32: "f32",
}
# Types whose GGUF blocks the C kernel multiplies faster than any torch form, decode measured cold (24 distinct
# weights in turn, as a decode step meets them; 2 threads, AMD EPYC Zen 4): Qwen2.5 0.5B 4864x896 Q5_0 0.23 ms vs
# int4x2 0.34 ms; whole decode steps Qwen2.5 0.5B 22.1 -> 27.4 tok/s, Gemma 3 270M 32.5 -> 39.6 tok/s.
# Q4_K too since its mins are one vector per superblock and row: Qwen2.5 0.5B's 12 ffn_down in turn, 2 threads,
# AMD EPYC Zen 3, 1 row 3.00 ms vs torch int4 4.84, 8 rows 10.96 vs 12.77 (on a Zen 4 int4 had led at 1 row, 0.15
# vs 0.23 ms a matrix, before that change). The C kernel also gives each row of a verify block the 1-row bits.
BLOCKS_TYPES = (GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q6_K, GGMLType.Q4_K)
# heads the "q4_0" scheme requantizes: the block types of more than 4.5 bits a weight the C dequantizer reads
HEAD_REQUANT = (GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q5_K, GGMLType.Q6_K)
# types the fused GGUF kernels read (= kernels.qmatmul.SUPPORTED_TYPES; not imported: CPU users never load Triton)
GGUF_KERNEL_TYPES = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.Q4_K,
                     GGMLType.Q5_K, GGMLType.Q6_K)
# types whose 32-blocks split exactly into int4 codes (see _int4_parts)
_INT4_EXACT = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K)
_INT4X2_EXACT = (GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q8_0)


# ---- decomposing GGUF blocks into int4 codes: w = (q - 8) * s + z per group of 32 -----------------------------

Int4Part = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q [R, K] uint8 in 0..15, s [R, K/32], z [R, K/32] f32


def _lo_nibbles(b: torch.Tensor, width: int) -> torch.Tensor:
    """[n, m] bytes -> [n, 2m] codes: each `width`-byte run gives its low nibbles, then its high nibbles."""
    return _nibbles(b, width).reshape(b.shape[0], -1)


def _le_bits(qh: torch.Tensor, width: int) -> torch.Tensor:
    """[n, m] bytes -> [n, 8m] bits: for each `width`-byte run, bit 0 of every byte, then bit 1, ..."""
    return _bits(qh, width).reshape(qh.shape[0], -1)


def _int4_parts(blocks: torch.Tensor, t: int, rows: int) -> list[Int4Part]:
    """GGUF blocks of `rows` rows -> one (Q4_*) or two (Q5_*, Q8_0) exact int4 decompositions that sum to W."""
    n = blocks.shape[0]
    zero = torch.zeros(n, 1)

    def part(q, s, z):  # q [n, G, 32] or [n, 32*G]; s, z [n, G]
        return (q.reshape(rows, -1).to(torch.uint8), s.reshape(rows, -1), z.reshape(rows, -1))

    if t == GGMLType.Q4_0:  # (q - 8) d
        return [part(_lo_nibbles(blocks[:, 2:], 16), _f16(blocks, 0), zero)]
    if t == GGMLType.Q4_1:  # d q + m = (q - 8) d + (8 d + m)
        d = _f16(blocks, 0)
        return [part(_lo_nibbles(blocks[:, 4:], 16), d, 8 * d + _f16(blocks, 2))]
    if t == GGMLType.Q4_K:  # per sub-block j: (d sc_j) q - dmin m_j
        sc, mn = (t.float() for t in _k_scale_min(blocks[:, 4:16]))
        s = _f16(blocks, 0) * sc
        return [part(_lo_nibbles(blocks[:, 16:], 32), s, 8 * s - _f16(blocks, 2) * mn)]
    # 5- and 8-bit codes: q = lo + 16 hi; the low nibble is one int4 part, (hi + 8) with scale 16 s the other
    if t == GGMLType.Q5_0:  # (q - 16) d = (lo - 8) d + (hi + 8 - 8) 16 d - 8 d
        d = _f16(blocks, 0)
        hi = _bits_le32(blocks[:, 2:6])
        return [part(_lo_nibbles(blocks[:, 6:], 16), d, zero), part(hi + 8, 16 * d, -8 * d)]
    if t == GGMLType.Q5_1:  # d q + m
        d = _f16(blocks, 0)
        hi = _bits_le32(blocks[:, 4:8])
        return [part(_lo_nibbles(blocks[:, 8:], 16), d, 8 * d + _f16(blocks, 2)), part(hi + 8, 16 * d, zero)]
    if t == GGMLType.Q5_K:
        sc, mn = (t.float() for t in _k_scale_min(blocks[:, 4:16]))
        s = _f16(blocks, 0) * sc
        hi = _le_bits(blocks[:, 16:48], 32)
        return [part(_lo_nibbles(blocks[:, 48:], 32), s, 8 * s - _f16(blocks, 2) * mn),
                part(hi + 8, 16 * s, torch.zeros_like(s))]
    if t == GGMLType.Q8_0:  # q d, q int8 = lo + 16 hi with hi = q >> 4 in -8..7
        d = _f16(blocks, 0)
        q = blocks[:, 2:].contiguous().view(torch.int8)
        return [part(q & 0x0F, d, 8 * d), part((q >> 4) + 8, 16 * d, zero)]
    raise ValueError(f"{_type_name(t)} has no exact int4 decomposition")


def _requant_int4(w: torch.Tensor, group: int = GROUP) -> Int4Part:
    """Any fp32 W [R, K] -> asymmetric 4-bit codes per `group` weights (lossy)."""
    g = w.reshape(w.shape[0], -1, group)
    lo, hi = g.amin(-1), g.amax(-1)
    s = (hi - lo) / 15
    inv = torch.where(s > 0, 1 / s, torch.zeros_like(s))
    q = torch.round((g - lo[..., None]) * inv[..., None]).clamp(0, 15).to(torch.uint8)
    return q.reshape(w.shape), s, lo + 8 * s


def _requant_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 W [R, K] -> per-row symmetric int8 codes and scales (lossy for block-scaled types)."""
    s = w.abs().amax(-1) / 127
    inv = torch.where(s > 0, 1 / s, torch.zeros_like(s))
    return torch.round(w * inv[:, None]).clamp(-127, 127).to(torch.int8), s


# ---- building the packed forms, a chunk of output rows at a time ----------------------------------------------


def _row_chunks(blocks: torch.Tensor, n_out: int) -> Iterator[tuple[torch.Tensor, int]]:
    """[n_out * blocks_per_row, bytes] -> (blocks of up to _CHUNK_ROWS rows, rows in chunk); chunks are multiples of
    64 rows so the int4 packer (64-row tiles) gives the same bytes as packing the whole matrix."""
    per_row = blocks.shape[0] // n_out
    for r0 in range(0, n_out, _CHUNK_ROWS):
        rows = min(_CHUNK_ROWS, n_out - r0)
        yield blocks[r0 * per_row : (r0 + rows) * per_row], rows


def pack_int4_codes(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (0..15) -> torch's CPU int4 layout [N, K/2], the bytes `_convert_weight_to_int4pack_for_cpu`
    makes: tiles of B rows, and for every k of a tile B/2 bytes holding rows j (low nibble) and j + B/2 (high).
    Done here in uint8 because the op wants int32 codes (4x the memory, and slow for the 262144-row head)."""
    n = q.shape[0]
    tile = int4_tile_rows()
    if not tile or n % tile:
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
    return _pack_tiles(q, tile)


def _pack_tiles(q: torch.Tensor, tile: int) -> torch.Tensor:
    n, k = q.shape
    t = q.view(n // tile, tile, k).transpose(1, 2)  # [tiles, K, tile]
    return (t[..., : tile // 2] | (t[..., tile // 2 :] << 4)).reshape(n, k // 2)


@functools.cache
def int4_tile_rows() -> int:
    """Rows per tile of torch's CPU int4 layout. It follows the vector width of the kernel ATen dispatches to (four
    float vectors: 64 rows under AVX-512, 32 under AVX2; an AVX2-only EPYC gave garbage from 64-row tiles), so it is
    read off torch's own packer once; 0 (never seen) = always use that packer."""
    q = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))  # no pattern
    ref = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.contiguous(), 1)
    return next((t for t in (64, 32, 16, 128) if torch.equal(_pack_tiles(q.to(torch.uint8), t), ref)), 0)


def _pack_int4(parts_of_chunk: Callable[[torch.Tensor, int], list[Int4Part]], blocks: torch.Tensor,
               n_out: int, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """-> packed uint8 [N, n_parts*K/2] and scale/zeros bf16 [n_parts*K/group, N, 2] for
    _weight_int4pack_mm_for_cpu.
    Outputs are allocated once and filled chunk by chunk (no full-size concatenations: the head is 262144 rows)."""
    packed = sz = None
    r0 = 0
    for chunk, rows in _row_chunks(blocks, n_out):
        parts = parts_of_chunk(chunk, rows)
        q = torch.cat([p[0] for p in parts], dim=1)  # [rows, n_parts*K]: the parts sit side by side along K
        if packed is None:
            packed = torch.empty(n_out, q.shape[1] // 2, dtype=torch.uint8)
            sz = torch.empty(q.shape[1] // group, n_out, 2, dtype=torch.bfloat16)
        packed[r0 : r0 + rows] = pack_int4_codes(q)
        for i, col in enumerate((1, 2)):  # scales, then zeros
            sz[:, r0 : r0 + rows, i] = torch.cat([p[col] for p in parts], dim=1).t()  # [G, rows]
        r0 += rows
    return packed, sz


def pick_scheme(ggml_type: int, shape: tuple[int, int], policy: Policy, role: str = "matrix") -> str:
    """The storage form for `policy`; falls back where a kernel's shape rule isn't met."""
    if policy == "exact":
        return "f32"
    if policy == "gguf":  # off the CPU: the fused kernels' blocks, else a dense exact form (no CPU-only op there)
        if ggml_type in GGUF_KERNEL_TYPES:
            return "gguf"
        return "bf16" if ggml_type == GGMLType.BF16 else "f32"
    # The vocab-sized output head dominates a decode step. As its GGUF blocks through the int8 kernel it needs no copy
    # and no exact refinement: Qwen2.5 0.5B's 151936x896 Q8_0 head, 2 threads, AMD EPYC Zen 5 (AVX-512 VNNI), the
    # same busy minute: blocks 6.4 ms a step against 10.9 ms for torch's int4 kernel plus ~5 ms of refinement
    # (nonzero, amax, index); 8 rows 12.6 vs 11.7 ms plus refinement. Where no vectorized kernel exists for the type,
    # a 4-bit copy ranks candidates and the ones near the top get exact logits from the GGUF rows (_refine_top).
    # A head of more than 4.5 bits a weight reads half its bytes or less as Q4_0 tiles: Qwen2.5 0.5B's Q8_0 head
    # (144 MB) took 3.5 ms of a 10.5 ms step on 2 threads (AMD EPYC Zen 5), as Q4_0 tiles (77 MB) ~1.9 ms.
    n_out, n_in = shape
    if (role == "head" and ggml_type in HEAD_REQUANT and n_in % 32 == 0 and native.available()
            and native.tiled_type(GGMLType.Q4_0) is not None):
        return "q4_0"
    if ggml_type in BLOCKS_TYPES and native.gguf_matmul_fast(ggml_type):
        return "blocks"
    scheme = "int4" if role == "head" else FAST_SCHEME[ggml_type]
    if scheme.startswith("int4") and (n_out % 16 or n_in % GROUP):  # the int4 packer needs N % 16 == 0
        scheme = "int8"
    return scheme


_local = threading.local()


def _workspace(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A buffer of at least `numel` elements, one per thread, grown on demand: prefill dequantizes one weight
    after another into it (a fresh multi-MiB tensor per call costs page faults that outweigh the dequantization)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < numel or buf.dtype != dtype:
        buf = _local.buf = torch.empty(numel, dtype=dtype)
    return buf[:numel]


@functools.cache
def prefill_dtype() -> torch.dtype:
    """The dtype of the dense prefill product: bf16 where the CPU multiplies bf16 natively (AVX512_BF16, AMX: half the
    bytes, ~2x the speed of fp32), fp32 elsewhere: without it oneDNN emulates bf16, and on an AVX2-only EPYC a
    128x896x4864 product took 173 ms in bf16 against 59 ms in fp32 (a 700-token first prompt took minutes)."""
    return torch.bfloat16 if {"avx512_bf16", "amx_bf16"} & native.cpu_flags() else torch.float32


class QuantLinear(nn.Module):
    """y = x @ W^T for a GGUF weight of torch shape [out, in]; see the module docstring for `scheme`."""

    def __init__(self, raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, ...], *,
                 policy: Policy = "fast", role: str = "matrix", scheme: str | None = None,
                 device: torch.device | str = "cpu"):
        """device: where the "gguf" scheme's blocks go, copied there straight from `raw` (an mmap view: no host copy
        of the weight is made on the way); the packed CPU schemes are built on the host (move them with .to())."""
        super().__init__()
        self._device = torch.device(device)
        if policy not in ("fast", "exact", "gguf"):
            raise ValueError(f"unknown policy {policy!r} (fast, exact or gguf)")
        shape = tuple(int(d) for d in shape)
        if len(shape) != 2:
            raise ValueError(f"QuantLinear needs a 2-D weight [out, in], got shape {list(shape)}")
        n_out, n_in = shape
        rb = row_nbytes(ggml_type, n_in)  # validates the type and the row length
        data = as_uint8(raw)
        if data.numel() != rb * n_out:
            raise ValueError(f"{_type_name(ggml_type)} weight [{n_out}, {n_in}] needs {rb * n_out} bytes, "
                             f"got {data.numel()}")
        if scheme is None:
            scheme = pick_scheme(ggml_type, shape, policy, role)
        if scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r} (one of {', '.join(SCHEMES)})")
        self.ggml_type, self.in_features, self.out_features = int(ggml_type), n_in, n_out
        self.policy, self.role, self.scheme = policy, role, scheme
        self.prefill_dense_rows = DENSE_FROM_ROWS.get(scheme) if role != "head" else None
        self.group = GROUP  # int4 schemes: weights per scale/zero (HEAD_GROUP for a re-quantized head)
        self._raw = data  # the GGUF bytes (an mmap view: costs no memory unless read); for dequantized()
        blocks = data.view(-1, GGML_BLOCK[ggml_type][1])  # [n_blocks, block_bytes]
        getattr(self, f"_build_{scheme}")(blocks)

    # -- builders: each registers the buffers its forward uses --
    def _build_f32(self, blocks: torch.Tensor) -> None:
        self.register_buffer("weight", dequantize_blocks(blocks, self.ggml_type).reshape(self.shape))

    def _build_bf16(self, blocks: torch.Tensor) -> None:
        w = torch.empty(self.shape, dtype=torch.bfloat16)
        r0 = 0
        for chunk, rows in _row_chunks(blocks, self.out_features):
            w[r0 : r0 + rows] = dequantize_blocks(chunk, self.ggml_type).reshape(rows, -1)
            r0 += rows
        self.register_buffer("weight", w)

    def _build_int8(self, blocks: torch.Tensor) -> None:
        q, s = [], []
        for chunk, rows in _row_chunks(blocks, self.out_features):
            qc, sc = _requant_int8(dequantize_blocks(chunk, self.ggml_type).reshape(rows, -1))
            q.append(qc)
            s.append(sc)
        self.register_buffer("w8", torch.cat(q))  # [N, K] int8
        self.register_buffer("scales", torch.cat(s).to(torch.bfloat16))  # [N]

    def _build_int4(self, blocks: torch.Tensor) -> None:
        t, n_in = self.ggml_type, self.in_features
        if t in _INT4_EXACT:
            def parts(chunk, rows):
                return _int4_parts(chunk, t, rows)
        else:
            group = HEAD_GROUP if self.role == "head" and n_in % HEAD_GROUP == 0 else GROUP
            self.group = group

            def parts(chunk, rows):
                return [_requant_int4(dequantize_blocks(chunk, t).reshape(rows, n_in), group)]
        self._set_int4(*_pack_int4(parts, blocks, self.out_features, self.group))

    def _build_int4x2(self, blocks: torch.Tensor) -> None:
        if self.ggml_type not in _INT4X2_EXACT:
            raise ValueError(f"scheme int4x2 needs a 5- or 8-bit block type, not {_type_name(self.ggml_type)}")
        t = self.ggml_type
        self._set_int4(*_pack_int4(lambda chunk, rows: _int4_parts(chunk, t, rows), blocks, self.out_features))

    def _set_int4(self, packed: torch.Tensor, scale_zeros: torch.Tensor) -> None:
        self.k_parts = scale_zeros.shape[0] * self.group // self.in_features  # 1 (int4) or 2 (int4x2)
        self.register_buffer("packed", packed)  # [N, k_parts*K/2] uint8, torch's tiled layout
        self.register_buffer("scale_zeros", scale_zeros)  # [k_parts*K/group, N, 2] bf16

    def _build_blocks(self, blocks: torch.Tensor) -> None:
        if not native.gguf_matmul_fast(self.ggml_type):
            raise ValueError(f"scheme blocks needs the C CPU kernels with a vectorized {_type_name(self.ggml_type)} "
                             "kernel (kernels/cpu/native.py)")
        tiled = native.tiled_type(self.ggml_type)
        if tiled is not None:
            # [N rounded up to 16 (AVX-512) or 8 rows, row_bytes]: tiles, the layout the vectorized levels multiply
            # Q5_0, Q4_K and Q6_K fastest in at every row count (q8_tiles.h); a copy, which the prefill's
            # dequantization reads too
            self.blocks_type = tiled
            self.register_buffer("blocks", native.tile(blocks.reshape(-1), tiled, self.out_features,
                                                       self.in_features))
            return
        # [N, row_bytes]: the GGUF mmap view itself, like _raw (the file stays open while the model lives): the
        # bytes are the page cache's, shared with the prefill path's dequantization, not a second copy
        self.blocks_type = self.ggml_type
        self.register_buffer("blocks", blocks.reshape(self.out_features, -1))

    def _build_q4_0(self, blocks: torch.Tensor) -> None:
        from bolt_ros.engine.gguf.kquant_pack import quantize  # llama.cpp's quantize_row_q4_0_ref (gguf-py)

        q4 = torch.empty(self.out_features, self.in_features // 32 * 18, dtype=torch.uint8)  # [N, Q4_0 row bytes]
        r0 = 0
        for chunk, rows in _row_chunks(blocks, self.out_features):
            w = native.dequantize_rows(chunk.reshape(-1).contiguous(), self.ggml_type, rows, self.in_features)
            q4[r0 : r0 + rows] = torch.from_numpy(quantize(w.numpy(), GGMLType.Q4_0))
            r0 += rows
        self.blocks_type = native.tiled_type(GGMLType.Q4_0)
        self.register_buffer("blocks", native.tile(q4.reshape(-1), self.blocks_type, self.out_features,
                                                   self.in_features))

    def _build_gguf(self, blocks: torch.Tensor) -> None:
        # [N, row_bytes]: a copy (the mmap view must not be written or outlive the file), made on the target device
        self.register_buffer("blocks", blocks.reshape(self.out_features, -1).to(self._device, copy=True))

    @classmethod
    def fuse(cls, layers: list[QuantLinear]) -> QuantLinear | None:
        """One layer computing several layers' outputs side by side (q|k|v, gate|up): one kernel call instead of
        several. None when their forms can't be concatenated (then call them separately). GGUF blocks of different
        types fuse too (one C call over the parts); the fused layer's ggml_type is then its first part's."""
        first = layers[0]
        same = all(m.scheme == first.scheme and m.in_features == first.in_features and m.policy == first.policy
                   and m.prefill_dense_rows == first.prefill_dense_rows and m.group == first.group for m in layers)
        if not same or first.scheme not in ("f32", "bf16", "int4", "int4x2", "blocks"):
            return None
        if first.scheme.startswith("int4") and (any(m.out_features % 64 for m in layers)  # whole 64-row tiles
                                                or any(m.k_parts != first.k_parts for m in layers)):
            return None
        fused = cls.__new__(cls)
        nn.Module.__init__(fused)
        fused.ggml_type, fused.in_features = first.ggml_type, first.in_features
        fused.out_features = sum(m.out_features for m in layers)
        fused.policy, fused.role, fused.scheme = first.policy, first.role, first.scheme
        fused.prefill_dense_rows, fused.group = first.prefill_dense_rows, first.group
        fused._parts = [m._dense_source() for m in layers]  # GGUF views or tiles only: the packed parts go
        if first.scheme in ("f32", "bf16"):
            fused.register_buffer("weight", torch.cat([m.weight for m in layers]))
        elif first.scheme == "blocks":
            # the parts stay where they lie (the GGUF mmap), each in its own type: one C call over all of them
            fused._block_parts = native.BlockParts([(m.blocks, m.blocks_type, m.out_features) for m in layers])
        else:
            fused._set_int4(torch.cat([m.packed for m in layers]), torch.cat([m.scale_zeros for m in layers], dim=1))
        return fused

    # -- use --
    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def lossy(self) -> bool:
        """True when the held form rounds the GGUF values (then a head refines its top candidates exactly)."""
        return (self.scheme in ("int4", "int4x2", "int8", "blocks", "q4_0")
                or (self.scheme == "bf16" and self.ggml_type != GGMLType.BF16))

    @property
    def holds_copy(self) -> bool:
        """True when the layer multiplies with its own copy (tiles, a packed or dense form), not the GGUF bytes."""
        return self.scheme != "blocks" or self.blocks_type != self.ggml_type

    @property
    def weight_bytes(self) -> int:
        """Bytes held by this layer's buffers (the GGUF mmap it came from is not counted, except where the "blocks"
        form's buffer is that mmap: then those bytes are the page cache's, not a copy)."""
        parts = getattr(self, "_block_parts", None)  # a fused blocks layer's parts: views, not buffers
        held = sum(b.numel() for b in parts.blocks) if parts is not None else 0
        return held + sum(b.numel() * b.element_size() for b in self.buffers())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out] float32."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, layer expects {self.in_features}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)  # [T, in]
        y = self._matmul(x2) if x2.shape[0] else x2.new_zeros((0, self.out_features), dtype=torch.float32)
        if self.role == "head" and self.lossy and x2.shape[0]:
            y = self._refine_top(x2, y)
        return y.reshape(*lead, self.out_features)

    def approximate(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out] float32 in the held form, without a head's exact refinement of its top candidates:
        for estimates that need no exact ranking (a drafter's confidence)."""
        return self._matmul(x.reshape(-1, self.in_features))

    def rows(self, ids: torch.Tensor, *, policy: Policy | None = None) -> QuantLinear:
        """A layer computing only the output rows `ids` [K] of this one, built from their GGUF bytes (a drafter's
        head over the tokens it proposes); `policy` defaults to this layer's."""
        if getattr(self, "_parts", None) is not None:
            raise ValueError("a fused layer has no row subset")
        raw = self._raw.view(self.out_features, -1)[ids.cpu()]  # [K, row_bytes]: a copy of those rows' blocks
        return QuantLinear(raw.reshape(-1), self.ggml_type, (ids.numel(), self.in_features),
                           policy=policy or self.policy, role=self.role, device=self._device)

    def native_parts(self) -> native.BlockParts | None:
        """The GGUF blocks as one C matmul call takes them (the `blocks` form), else None: what a whole-layer C
        call (kernels/cpu/layer.py) multiplies with."""
        if self.scheme != "blocks":
            return None
        parts = getattr(self, "_block_parts", None) or getattr(self, "_own_parts", None)
        if parts is None:  # a single weight's parts, built once
            parts = self._own_parts = native.BlockParts([(self.blocks, self.blocks_type, self.out_features)])
        return parts

    def _refine_top(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Exact fp32 logits for every candidate within HEAD_MARGIN of its row's approximate best.

        The packed head is approximate (4-bit codes; bf16 outputs that round logits of ~20 to steps of 0.125 and
        turn near-ties into ties). Candidates that can still be the argmax or carry top-k/top-p mass get exact
        dot products with their GGUF rows (a few rows dequantized: well under a millisecond)."""
        if (self.scheme in ("blocks", "q4_0") and x.dtype == torch.float32 and x.is_contiguous() and y.is_contiguous()
                and native.head_refine(x, y, self._raw, self.ggml_type, HEAD_MARGIN, HEAD_MAX_CANDIDATES)):
            return y  # the same candidates and exact values in C (~0.05 ms against ~1 ms here)
        near = y >= y.amax(-1, keepdim=True) - HEAD_MARGIN  # [T, V]
        flat = near.sum(-1) > HEAD_MAX_CANDIDATES  # [T]: a flat row, whose best ones are enough
        if flat.any():  # per row, as in C: a verify block's row gets the candidates a step gets for it
            best = torch.zeros_like(near[flat])
            near[flat] = best.scatter_(1, y[flat].topk(HEAD_MAX_CANDIDATES, dim=-1).indices, True)
        rows, cols = near.nonzero(as_tuple=True)
        if not cols.numel():  # all-NaN rows (weights that overflow fp32) have no candidate: nothing to refine
            return y
        w = dequantize_rows(self._raw, self.ggml_type, self.shape, cols)  # [C, in]
        y[rows, cols] = (w * x.float()[rows]).sum(-1)  # y is this call's own output: update in place
        return y

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        s = self.scheme
        if self.prefill_dense_rows and x.shape[0] >= self.prefill_dense_rows:
            return F.linear(x.to(prefill_dtype()), self._dense()).float()
        if s == "f32":
            return F.linear(x.float(), self.weight)
        if s == "bf16":
            return F.linear(x.to(torch.bfloat16), self.weight).float()
        if s == "int8":
            return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), self.w8, self.scales).float()
        if s in ("blocks", "q4_0"):
            parts = getattr(self, "_block_parts", None)
            if torch.compiler.is_compiling():  # a compiled step (engine/model/compiled.py) calls the operator
                if parts is None:
                    return native.gguf_matmul_op(x, self.blocks, self.blocks_type, self.out_features)
                return torch.cat([native.gguf_matmul_op(x, b, t, n) for b, t, n in
                                  zip(parts.blocks, parts.types, parts.rows)], dim=-1)
            if parts is not None:
                if x.shape[0] <= native.MAX_M:
                    return native.gguf_matmul_parts(x, parts)
                return torch.cat([native.gguf_matmul_parts(c, parts) for c in x.split(native.MAX_M)])
            if x.shape[0] <= native.MAX_M:
                return native.gguf_matmul(x, self.blocks, self.blocks_type, self.out_features)
            return torch.cat([native.gguf_matmul(c, self.blocks, self.blocks_type, self.out_features)
                              for c in x.split(native.MAX_M)])
        if s in ("int4", "int4x2"):
            xb = x.to(torch.bfloat16)
            if self.k_parts > 1:  # every part multiplies the same x
                xb = xb.repeat(1, self.k_parts)
            return torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), self.packed, self.group,
                                                             self.scale_zeros).float()
        from bolt_ros.kernels import ops  # Triton on CUDA; imported late so CPU-only users never load Triton
        return ops.qmatmul_gguf(x.float().contiguous(), self.blocks, self.ggml_type, self.out_features,
                                self.in_features)

    def _dense(self) -> torch.Tensor:
        """The GGUF weight in prefill_dtype() [out, in], in this thread's workspace (valid until the next call)."""
        parts = getattr(self, "_parts", None) or [self._dense_source()]
        dtype = prefill_dtype()
        out = _workspace(self.out_features * self.in_features, dtype).view(self.shape)
        r0 = 0
        for raw, t, (rows, cols) in parts:
            if t >= native.TILED or (native.available() and t in native.TYPES):
                native.dequantize_rows(raw.contiguous(), t, rows, cols, dtype, out=out[r0 : r0 + rows])
            else:
                out[r0 : r0 + rows] = dequantize(raw, t, (rows, cols))
            r0 += rows
        return out

    def _dense_source(self) -> tuple[torch.Tensor, int, tuple[int, int]]:
        """(bytes, type, shape) the prefill's dequantization reads: the tiles where the matmul holds them (then the
        GGUF pages are not read again), else the GGUF bytes."""
        if getattr(self, "blocks_type", self.ggml_type) != self.ggml_type:
            return self.blocks, self.blocks_type, self.shape
        return self._raw, self.ggml_type, self.shape

    def dequantized(self) -> torch.Tensor:
        """The exact GGUF weight as fp32 [out, in] (from the GGUF bytes, whatever the scheme)."""
        parts = getattr(self, "_parts", None)
        if parts is not None:
            return torch.cat([dequantize(raw, t, shape) if t < native.TILED else
                              native.dequantize_rows(raw, t, *shape) for raw, t, shape in parts])
        return dequantize(self._raw, self.ggml_type, self.shape)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, type={_type_name(self.ggml_type)}, "
                f"scheme={self.scheme}, bytes={self.weight_bytes}")


class QuantEmbedding(nn.Module):
    """Row lookup from a GGUF table of torch shape [n_rows, width]: only the requested rows are dequantized.

    The table stays the GGUF bytes (an mmap view, or a device copy after `.to("cuda")`), so a table tied to the
    output head is not held twice in fp32."""

    def __init__(self, raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, ...]):
        super().__init__()
        shape = tuple(int(d) for d in shape)
        if len(shape) != 2:
            raise ValueError(f"QuantEmbedding needs a 2-D table [rows, width], got shape {list(shape)}")
        n_rows, width = shape
        rb = row_nbytes(ggml_type, width)
        data = as_uint8(raw)
        if data.numel() != rb * n_rows:
            raise ValueError(f"{_type_name(ggml_type)} table [{n_rows}, {width}] needs {rb * n_rows} bytes, "
                             f"got {data.numel()}")
        self.ggml_type, self.num_embeddings, self.embedding_dim = int(ggml_type), n_rows, width
        # not a registered buffer: the state dict must not serialize 178 MB of mmap; moved by _apply below
        self.table = data.view(n_rows, rb)  # [n_rows, row_bytes] uint8

    def _apply(self, fn, recurse=True):
        self.table = fn(self.table)
        return super()._apply(fn, recurse)

    @property
    def weight_bytes(self) -> int:
        return self.table.numel()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [...] int -> [..., width] float32."""
        if self.table.device.type != "cpu":  # no host-side range check (a sync per token; CUDA graphs forbid it)
            picked = self.table.index_select(0, ids.reshape(-1).to(self.table.device))  # [R, row_bytes]
            rows = dequantize_blocks(picked.reshape(-1, GGML_BLOCK[self.ggml_type][1]), self.ggml_type)
            return rows.reshape(*ids.shape, self.embedding_dim)
        rows = dequantize_rows(self.table, self.ggml_type, (self.num_embeddings, self.embedding_dim),
                               ids.to(self.table.device))
        return rows.reshape(*ids.shape, self.embedding_dim)

    def dequantized(self) -> torch.Tensor:
        return dequantize(self.table, self.ggml_type, (self.num_embeddings, self.embedding_dim))

    def extra_repr(self) -> str:
        return f"rows={self.num_embeddings}, width={self.embedding_dim}, type={_type_name(self.ggml_type)}"
