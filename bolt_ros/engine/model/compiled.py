"""Small steps of the layer stack compiled with torch.compile (inductor) on the CPU.

A decode step on a CPU spends about a third of its time outside the matrix products: ~40 small ops per layer (norms,
RoPE, attention over a few rows, residual adds), each a Python call and a dispatch (docs/performance.md). Inductor
fuses them into a few generated C++ loops per layer and calls the matrix products as they are (torch's int4 kernel
as an aten op, our GGUF-block kernel through `native.gguf_matmul_op`). Steps of at most MAX_ROWS tokens (decode, a
DFlash verify block) go through the compiled stack; prefill chunks stay eager (large matmuls dominate there, and a
barge-in's `stop` callback is checked between layers).

Shapes are dynamic (the context grows every step), so one compilation serves a whole conversation; the first call
compiles (about 80 s on 2 cores for the default chat model, ~20 s from inductor's on-disk cache afterwards).
"""
from __future__ import annotations

import torch

MAX_ROWS = 16  # steps up to this many tokens run compiled (attention takes its bmm path up to 16 rows)


class CompiledLayers:
    """Stands in for `Transformer.layers`: the same function, compiled for small steps."""

    def __init__(self, model):
        self.eager = model.layers
        self.compiled = torch.compile(self.eager, dynamic=None)

    def __call__(self, tokens, positions, cache, vis, *, logits="last", capture=(), embeddings=None, stop=None):
        small = tokens.shape[0] <= MAX_ROWS and stop is None and embeddings is None
        fn = self.compiled if small else self.eager
        return fn(tokens, positions, cache, vis, logits=logits, capture=capture, embeddings=embeddings, stop=stop)


def compile_layers(model) -> None:
    """Route the model's small steps through a compiled copy of its layer stack (CPU only: CUDA decodes through
    CUDA graphs, decoders.GraphDecoder)."""
    if model.device.type != "cpu":
        raise ValueError(f"compile is for the CPU path; this model is on {model.device} (CUDA uses CUDA graphs)")
    if not isinstance(model.layers, CompiledLayers):
        model.layers = CompiledLayers(model)
