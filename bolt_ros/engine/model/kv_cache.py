"""KV cache with positions per slot.

Each KV-owning layer has fixed buffers. Full-attention layers index slots by position; sliding-window layers keep a
ring of `window + max_step` slots, enough that writing one forward step never overwrites a key that a query of that
step (or of the step after a rollback) can still see. Because every slot records its position, masks, rollback and
ring wrap-around are all the same comparison: a slot is visible to query position p iff 0 <= slot_pos <= p (and
p - slot_pos < window on sliding layers). Layers that share KV (Gemma 4) own no buffers.
"""
from __future__ import annotations

import torch

from bolt_ros.engine.model.config import ModelConfig


class LayerCache:
    def __init__(self, n_kv: int, n_slots: int, head_dim: int, dtype: torch.dtype, ring: bool,
                 device: torch.device | str = "cpu"):
        self.k = torch.zeros(n_kv, n_slots, head_dim, dtype=dtype, device=device)  # [n_kv, S, hd]
        self.v = torch.zeros(n_kv, n_slots, head_dim, dtype=dtype, device=device)
        # [S] position held by each slot, -1 = empty
        self.pos = torch.full((n_slots,), -1, dtype=torch.long, device=device)
        self.ring = ring

    @property
    def n_slots(self) -> int:
        return self.pos.shape[0]

    def write(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor) -> None:
        # k, v: [n_kv, T, hd]; positions: [T]
        slots = positions % self.n_slots if self.ring else positions
        self.k[:, slots] = k.to(self.k.dtype)
        self.v[:, slots] = v.to(self.v.dtype)
        self.pos[slots] = positions

    def slot_positions_after(self, positions: torch.Tensor) -> torch.Tensor:
        """Slot positions as they will be once `positions` are written (masks are built before the write)."""
        end = int(positions[-1]) + 1
        pos = (self.pos if self.ring else self.pos[:end]).clone()
        pos[positions % self.n_slots if self.ring else positions] = positions
        return pos

    def view(self, end: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Keys, values and slot positions that can matter for queries before position `end`."""
        if self.ring:
            return self.k, self.v, self.pos
        return self.k[:, :end], self.v[:, :end], self.pos[:end]

    def truncate(self, n: int) -> None:
        self.pos.masked_fill_(self.pos >= n, -1)  # no boolean indexing: no host sync on a GPU


class KVCache:
    """The cache of one sequence. `n_past` positions are committed; `truncate(n)` rolls back to n."""

    def __init__(self, cfg: ModelConfig, n_ctx: int, max_step: int = 512, dtype: torch.dtype = torch.float32, *,
                 device: torch.device | str = "cpu", flat: bool = False):
        """flat: every layer indexes slots by position (no rings), as the Triton attention kernels read them."""
        self.cfg, self.n_ctx, self.max_step = cfg, n_ctx, max_step
        self.layers: list[LayerCache | None] = []
        for il in range(cfg.n_layer):
            if not cfg.owns_kv(il):
                self.layers.append(None)
                continue
            n_slots = n_ctx if flat else cfg.kv_slots(il, n_ctx, max_step)  # < n_ctx only for a sliding ring
            self.layers.append(LayerCache(cfg.n_head_kv[il], n_slots, cfg.head_dim[il], dtype, n_slots < n_ctx,
                                          device))
        self.n_past = 0

    def layer(self, il: int) -> LayerCache:
        return self.layers[self.cfg.kv_source[il]]

    def truncate(self, n: int) -> None:
        if not 0 <= n <= self.n_past:
            raise ValueError(f"cannot truncate a cache of {self.n_past} positions to {n}")
        for lc in self.layers:
            if lc is not None:
                lc.truncate(n)
        self.n_past = n

    def reset(self) -> None:
        self.truncate(0)

    @property
    def nbytes(self) -> int:
        return sum(lc.k.nbytes + lc.v.nbytes for lc in self.layers if lc is not None)
