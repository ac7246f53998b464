"""Every ggml tensor type a GGUF file may name: id -> (name, elements per block, bytes per block).

The facts are ggml's (`ggml.h`, `ggml-common.h`); the reader validates tensor sizes of any type with this table,
so files holding types this engine cannot compute are still opened and inspected. Kept here rather than imported
from gguf-py: that package (and the yaml it loads) costs a few MiB in every engine process for one table.
"""
from __future__ import annotations

GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}


def type_name(ggml_type: int) -> str:
    entry = GGML_TYPES.get(ggml_type)
    return entry[0] if entry else f"ggml type {ggml_type}"


def block_size(ggml_type: int) -> tuple[int, int] | None:
    """(elements, bytes) per block, None for a type id ggml does not define."""
    entry = GGML_TYPES.get(ggml_type)
    return entry[1:] if entry else None
