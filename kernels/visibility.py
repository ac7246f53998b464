"""Which cached keys the query rows of one step see: the argument `ops.attention` takes instead of a raw mask.

Three forms, one contract (`extent`: the leading cache slots the step reads; `mask()`: a [T, extent] bool tensor, or
None when every key in the extent is visible; `rows(sl)`: the same for a subset of query rows):
  Span       position-indexed caches (slot p holds position p): queries at start..end-1 over keys 0..end-1, causal or
             not (the DFlash block), within `window` when > 0. The Triton kernels read it as ints: no mask tensor.
  GraphSpan  one decode query whose position lives in a device tensor (a CUDA graph can't take it as an argument).
  Masked     an explicit mask over a sliding-window ring (slots hold positions modulo the ring), torch path only.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    window: int = 0
    causal: bool = True
    device: torch.device | str = "cpu"

    @property
    def extent(self) -> int:
        return self.end

    def rows(self, sl: slice) -> Span:
        r = range(self.start, self.end)[sl]
        # the keys a query row sees don't depend on which other rows run with it, except in a non-causal block
        return Span(r.start, self.end if not self.causal else r.stop, self.window, self.causal, self.device)

    def mask(self) -> torch.Tensor | None:
        t = self.end - self.start
        if self.causal and t == 1 and self.window <= 0:
            return None  # one query at the newest position sees every key
        q = torch.arange(self.start, self.end, device=self.device)[:, None]  # [T, 1]
        rel = q - torch.arange(self.end, device=self.device)[None, :]  # [T, S]
        if self.causal:
            vis = rel >= 0
            if self.window > 0:
                vis &= rel < self.window
            return vis
        # DFlash block: the context (keys < start) and the whole block. A window bounds only keys behind the query,
        # as the kernel does; z-lab's symmetric window is the same whenever window >= block size (keys ahead of a
        # query are inside the block)
        return rel < self.window if self.window > 0 else None


@dataclass(frozen=True)
class GraphSpan:
    position: torch.Tensor  # [1] long, on the device
    n_slots: int
    window: int = 0

    @property
    def extent(self) -> int:
        return self.n_slots

    def rows(self, sl: slice) -> GraphSpan:
        return self

    def mask(self) -> torch.Tensor:
        rel = self.position[:, None] - torch.arange(self.n_slots, device=self.position.device)[None, :]  # [1, S]
        return (rel >= 0) & (rel < self.window) if self.window > 0 else rel >= 0


@dataclass(frozen=True)
class Masked:
    visible: torch.Tensor | None  # [T, S] bool, None = all
    n_slots: int

    @property
    def extent(self) -> int:
        return self.n_slots

    def rows(self, sl: slice) -> Masked:
        return self if self.visible is None else Masked(self.visible[sl], self.n_slots)

    def mask(self) -> torch.Tensor | None:
        return self.visible


Visibility = Span | GraphSpan | Masked
