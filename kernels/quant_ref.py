"""GGUF block formats the fused kernels read, with a vectorized torch dequantizer as their reference.

Layouts follow llama.cpp `ggml-common.h` (see gemma-dflash-spec / peers-and-anchors C.1); the dequantizer matches
`gguf.quants.dequantize` bit for bit (test_kernels checks it). Weights are raw rows: uint8 [N, K / QK * block_bytes].
"""
from __future__ import annotations

import torch

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 30

# ggml_type -> (elements per block, bytes per block, elements per scale group the kernels dequantize at once)
BLOCKS: dict[int, tuple[int, int, int]] = {
    Q4_0: (32, 18, 32),
    Q4_1: (32, 20, 32),
    Q5_0: (32, 22, 32),
    Q5_1: (32, 24, 32),
    Q8_0: (32, 34, 32),
    Q4_K: (256, 144, 32),
    Q5_K: (256, 176, 32),
    Q6_K: (256, 210, 16),
}
TYPE_NAMES = {Q4_0: "Q4_0", Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q8_0: "Q8_0", Q4_K: "Q4_K", Q5_K: "Q5_K",
              Q6_K: "Q6_K"}
# byte offsets of the fp16 fields (scale d, and min/dmin where present) inside one block
_F16_FIELDS = {Q4_0: (0,), Q4_1: (0, 2), Q5_0: (0,), Q5_1: (0, 2), Q8_0: (0,), Q4_K: (0, 2), Q5_K: (0, 2),
               Q6_K: (208,)}


def row_bytes(ggml_type: int, k: int) -> int:
    """Bytes of one weight row of `k` elements; raises for unsupported types or ragged rows."""
    if ggml_type not in BLOCKS:
        raise ValueError(f"ggml type {ggml_type} has no fused kernel (supported: {sorted(TYPE_NAMES.values())})")
    qk, nbytes, _ = BLOCKS[ggml_type]
    if k <= 0 or k % qk:
        raise ValueError(f"{TYPE_NAMES[ggml_type]} rows need K to be a positive multiple of {qk}, got K={k}")
    return k // qk * nbytes


def check_raw(raw: torch.Tensor, ggml_type: int, n: int, k: int) -> torch.Tensor:
    """Validate packed weights and return them as a contiguous uint8 [n, row_bytes] view."""
    rb = row_bytes(ggml_type, k)
    if raw.dtype != torch.uint8:
        raise TypeError(f"packed weights must be uint8, got {raw.dtype}")
    if raw.numel() != n * rb:
        raise ValueError(f"{TYPE_NAMES[ggml_type]} [{n}, {k}] needs {n * rb} bytes, got {raw.numel()}")
    return raw.reshape(n, rb).contiguous()


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    # [nb, 1] float32 from the little-endian fp16 at `offset` of every block
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    # [nb, G, L] bytes -> [nb, G, 2, L]: a group's low nibbles are its first L elements, the high nibbles the next L
    return torch.stack([qs & 0x0F, qs >> 4], dim=-2)


def _kquant_scale_min(sc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # 12-byte pack of 8 x (6-bit scale, 6-bit min) shared by Q4_K and Q5_K -> two [nb, 8] float tensors
    d, m, md = sc[:, 0:4], sc[:, 4:8], sc[:, 8:12]
    scale = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return scale.float(), mins.float()


def _legacy(blocks: torch.Tensor, ggml_type: int) -> torch.Tensor:
    nb = blocks.shape[0]
    d = _f16(blocks, 0)
    if ggml_type == Q8_0:
        return blocks[:, 2:].view(torch.int8).float() * d
    has_min = ggml_type in (Q4_1, Q5_1)
    pos = 4 if has_min else 2
    q = _nibbles(blocks[:, None, -16:]).reshape(nb, 32).to(torch.int32)
    if ggml_type in (Q5_0, Q5_1):
        qh = blocks[:, pos:pos + 4].to(torch.int32)  # little-endian 32 bits, bit j is element j's fifth bit
        bits = (qh[:, :, None] >> torch.arange(8, device=blocks.device)) & 1  # [nb, 4, 8]
        q = q | (bits.reshape(nb, 32) << 4)
    if has_min:
        return d * q.float() + _f16(blocks, 2)
    offset = 16 if ggml_type in (Q5_0, Q5_1) else 8
    return d * (q - offset).float()


def _kquant(blocks: torch.Tensor, ggml_type: int) -> torch.Tensor:
    nb = blocks.shape[0]
    if ggml_type == Q6_K:
        ql = _nibbles(blocks[:, 0:128].reshape(nb, 2, 64)).reshape(nb, 2, 4, 32).to(torch.int32)
        shifts = torch.tensor([0, 2, 4, 6], device=blocks.device, dtype=torch.int32)[:, None]
        qh = (blocks[:, 128:192].reshape(nb, 2, 1, 32).to(torch.int32) >> shifts) & 3
        q = ((ql | (qh << 4)) - 32).reshape(nb, 16, 16).float()
        scale = blocks[:, 192:208].view(torch.int8).float()
        return ((_f16(blocks, 208) * scale)[:, :, None] * q).reshape(nb, 256)
    d, dmin = _f16(blocks, 0), _f16(blocks, 2)
    scale, mins = _kquant_scale_min(blocks[:, 4:16])
    qs = blocks[:, -128:].reshape(nb, 4, 32)
    q = _nibbles(qs).reshape(nb, 8, 32).to(torch.int32)
    if ggml_type == Q5_K:
        qh = blocks[:, 16:48].to(torch.int32)
        q = q | (((qh[:, None, :] >> torch.arange(8, device=blocks.device)[:, None]) & 1) << 4)
    return ((d * scale)[:, :, None] * q.float() - (dmin * mins)[:, :, None]).reshape(nb, 256)


def dequantize_torch(raw: torch.Tensor, ggml_type: int, n: int, k: int) -> torch.Tensor:
    """Packed GGUF rows -> float32 [n, k], on raw's device (the reference every fused matmul is checked against)."""
    rows = check_raw(raw, ggml_type, n, k)
    qk, nbytes, _ = BLOCKS[ggml_type]
    blocks = rows.reshape(-1, nbytes)
    out = _kquant(blocks, ggml_type) if qk == 256 else _legacy(blocks, ggml_type)
    return out.reshape(n, k)


def random_blocks(ggml_type: int, n: int, k: int, *, scale: float = 0.02, generator: torch.Generator | None = None,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """Random but valid packed weights [n, row_bytes]: every quant bit random, fp16 scales finite and ~`scale`.

    Weights come out with magnitude ~`scale` * max quant, so products with unit activations stay well-conditioned.
    """
    rb = row_bytes(ggml_type, k)
    qk, nbytes, _ = BLOCKS[ggml_type]
    nb = n * (k // qk)
    # with no generator, draw on the target device (fast for the GPU check's 262144-row heads)
    dev = torch.device(device) if generator is None else torch.device("cpu")
    blocks = torch.randint(0, 256, (nb, nbytes), dtype=torch.uint8, generator=generator, device=dev)
    for i, off in enumerate(_F16_FIELDS[ggml_type]):
        # d in [0.5, 1.5] * scale; mins (second field) signed so Q4_1/Q5_1 offsets exercise both signs
        val = (torch.rand(nb, generator=generator, device=dev) + 0.5) * scale
        if i == 1 and ggml_type in (Q4_1, Q5_1):
            val = val * 8 * torch.sign(torch.rand(nb, generator=generator, device=dev) - 0.5)
        blocks[:, off:off + 2] = val.to(torch.float16).view(torch.uint8).reshape(nb, 2)
    return blocks.reshape(n, rb).to(device)
