"""Decoders: how tokens are proposed and committed, one object per generation (generate.Engine's outer loop drives
them). Plain decoding runs one target pass per token; on CUDA the graph decoder replays one captured CUDA graph per
token instead; DFlash (dflash.py) drafts a block and verifies it in one pass.
"""
from __future__ import annotations

import os
from typing import Protocol

import torch

from bolt_ros.engine.decode.sampling import Sampler
from bolt_ros.kernels.visibility import GraphSpan


def common_prefix(*seqs: list[int]) -> int:
    """Length of the prefix all sequences share."""
    n = 0
    for items in zip(*seqs):
        if any(x != items[0] for x in items[1:]):
            break
        n += 1
    return n


class Decoder(Protocol):
    """Proposes and commits tokens. After prefill()/step(), the cache holds every committed token but the last."""

    def prefill(self, ids: list[int]) -> None: ...
    def step(self, recent: list[int]) -> list[int]: ...
    def rollback(self, n_keep_committed: int) -> None: ...
    def stats(self) -> dict | None: ...


class PlainDecoder:
    """One target forward pass per token."""

    def __init__(self, engine, session, sampler: Sampler):
        self.engine, self.session, self.sampler = engine, session, sampler
        self.logits: torch.Tensor | None = None
        self.pending: int | None = None  # committed, not yet in the cache

    def prefill(self, ids: list[int]) -> None:
        self.logits = self.engine.prefill(self.session, ids)

    def advance(self, token: int) -> torch.Tensor:
        """Append one committed token; its next-token logits [vocab]."""
        return self.engine.forward(self.session, [token])

    def step(self, recent: list[int]) -> list[int]:
        if self.pending is not None:
            self.logits = self.advance(self.pending)
        self.pending = self.sampler.sample(self.logits, recent)
        return [self.pending]

    def rollback(self, n_keep_committed: int) -> None:
        pass  # plain decoding never commits more than it emits

    def stats(self) -> dict | None:
        return None


class StaticDecodeStep:
    """One decode token with every input and output at a fixed address: the token and position live in device
    buffers, the cache is position-indexed, and attention covers the first `n_slots` slots with device-computed
    visibility (kernels.visibility.GraphSpan). The layers are the model's own (`Transformer.layers`); CUDA graphs
    record this step, and the CPU runs it eagerly under the Triton interpreter in tests.
    """

    def __init__(self, model, cache):
        if not model.kernels or any(lc is not None and lc.ring for lc in cache.layers):
            raise ValueError("a static decode step needs the kernel path's position-indexed cache (kernels_on)")
        self.model, self.cache = model, cache
        self.token = torch.zeros(1, dtype=torch.long, device=model.device)  # [1]
        self.position = torch.zeros(1, dtype=torch.long, device=model.device)  # [1]

    def n_slots(self, position: int, min_slots: int = 256) -> int:
        """Slots a step at `position` attends over: a power of two (few graphs), at most the cache size."""
        return min(self.cache.n_ctx, max(min_slots, 1 << position.bit_length()))

    def set_inputs(self, token_id: int) -> int:
        pos = self.cache.n_past
        if pos >= self.cache.n_ctx:
            raise ValueError(f"context full: {pos} + 1 tokens > n_ctx {self.cache.n_ctx}")
        self.token.fill_(token_id)  # a device fill: no host-to-device copy to wait for
        self.position.fill_(pos)
        return pos

    def run(self, n_slots: int) -> torch.Tensor:
        """The step's kernels (what a CUDA graph records): logits [1, vocab]. Does not advance cache.n_past."""
        m = self.model
        windows = {False: 0, True: m.cfg.sliding_window or 0}
        vis = {swa: GraphSpan(self.position, n_slots, w) for swa, w in windows.items()}
        h, _ = m.layers(self.token, self.position, self.cache, vis)
        return m.head(h)

    @torch.inference_mode()
    def step(self, token_id: int) -> torch.Tensor:
        """Eager: append `token_id` and return the next-token logits [vocab]."""
        pos = self.set_inputs(token_id)
        out = self.run(self.n_slots(pos))
        self.cache.n_past = pos + 1
        return out[0]


class CudaGraphStep(StaticDecodeStep):
    """StaticDecodeStep captured once per slot bucket as a CUDA graph and replayed for every token."""

    def __init__(self, model, cache):
        if model.device.type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError(f"CUDA graphs need a CUDA device; this model is on {model.device}")
        super().__init__(model, cache)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.pool = None  # one memory pool shared by every bucket's graph

    def _capture(self, n_slots: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # warm-up on a side stream first: compiles the Triton kernels and allocates workspaces outside the capture.
        # It computes the real step, so its cache write is the one the replay repeats.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.run(n_slots)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = self.run(n_slots)
        self.pool = graph.pool()
        self.graphs[n_slots] = (graph, out)
        return graph, out

    @torch.inference_mode()
    def step(self, token_id: int) -> torch.Tensor:
        pos = self.set_inputs(token_id)
        n_slots = self.n_slots(pos)
        graph, out = self.graphs.get(n_slots) or self._capture(n_slots)
        graph.replay()
        self.cache.n_past = pos + 1
        return out[0].clone()  # the graph's output buffer is overwritten by the next replay


def cuda_graphs_on(model) -> bool:
    """CUDA graphs for decode: on for kernel-path models on CUDA unless BOLT_CUDA_GRAPHS=0."""
    return (model.device.type == "cuda" and model.kernels
            and os.environ.get("BOLT_CUDA_GRAPHS", "1").strip() not in ("0", "false", "no"))


class GraphDecoder(PlainDecoder):
    """Plain decoding whose per-token pass is a CUDA graph replay (the host fills two buffers and launches once).
    The captured graphs belong to the session's cache, so they are kept on the session across generations."""

    def __init__(self, engine, session, sampler: Sampler):
        super().__init__(engine, session, sampler)
        if session.graph_step is None or session.graph_step.cache is not session.cache:
            session.graph_step = CudaGraphStep(engine.model, session.cache)
        self.graph = session.graph_step

    def advance(self, token: int) -> torch.Tensor:
        out = self.graph.step(token)
        self.session.tokens.append(token)
        return out


def plain_decoder(engine, session, sampler: Sampler) -> PlainDecoder:
    """The non-speculative decoder for this engine's device: CUDA graphs where they apply."""
    return (GraphDecoder if cuda_graphs_on(engine.model) else PlainDecoder)(engine, session, sampler)
