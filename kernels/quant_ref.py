"""GGUF block formats the fused kernels read, and their torch reference.

Layouts follow llama.cpp `ggml-common.h` (see gemma-dflash-spec / peers-and-anchors C.1). The reference dequantizer is
kernels/gguf_blocks.py's (bit-exact against `gguf.quants.dequantize`; test_kernels checks it).
Weights are raw rows: uint8 [N, K / QK * block_bytes].
"""
from __future__ import annotations

import torch

from .gguf_blocks import F16_FIELDS, dequantize_blocks

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


def dequantize_torch(raw: torch.Tensor, ggml_type: int, n: int, k: int) -> torch.Tensor:
    """Packed GGUF rows -> float32 [n, k], on raw's device (the reference every fused matmul is checked against):
    the engine's vectorized dequantizer, itself bit-exact against gguf-py."""
    rows = check_raw(raw, ggml_type, n, k)
    return dequantize_blocks(rows.reshape(-1, BLOCKS[ggml_type][1]), ggml_type).reshape(n, k)


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
    for i, off in enumerate(F16_FIELDS[ggml_type]):
        # d in [0.5, 1.5] * scale; mins (second field) signed so Q4_1/Q5_1 offsets exercise both signs
        val = (torch.rand(nb, generator=generator, device=dev) + 0.5) * scale
        if i == 1 and ggml_type in (Q4_1, Q5_1):
            val = val * 8 * torch.sign(torch.rand(nb, generator=generator, device=dev) - 0.5)
        blocks[:, off:off + 2] = val.to(torch.float16).view(torch.uint8).reshape(nb, 2)
    return blocks.reshape(n, rb).to(device)
