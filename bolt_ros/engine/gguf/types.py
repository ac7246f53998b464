"""Every ggml tensor type a GGUF file may name: id -> (name, elements per block, bytes per block).

The facts are ggml's (`ggml.h`, `ggml-common.h`); the reader validates tensor sizes of any type with this table, so
files holding types this engine cannot compute are still opened and inspected. The table lives with the block
formats in kernels/gguf_blocks.py (the kernels read it too, and sit below the engine).
"""
from __future__ import annotations

from bolt_ros.kernels.gguf_blocks import GGML_TYPES, block_size, type_name

__all__ = ["GGML_TYPES", "block_size", "type_name"]
