"""Rotary position embedding, NEOX style (rotate-half: dim i pairs with dim i + half), full or partial.

The frequencies come in as a tensor so one kernel serves every variant (`rope_inv_freq` builds them):
  full (Gemma 3, Gemma 4 sliding):  half = D/2, inv_freq[i] = theta^(-2i/D), i < D/2
  proportional (Gemma 4 full):      half = D/2 = 256, only the first 64 pairs rotate, inv_freq[i] = theta^(-2i/512)
  ggml partial n_rot < D:           half = n_rot/2, inv_freq[i] = theta^(-2i/n_rot); dims >= n_rot pass through
Angles are computed in fp32 as pos * inv_freq (as HF and llama.cpp do).

`RopeAngles` is what the model passes (`ops.rope(x, angles)`): one step's positions and one rope variant, NEOX or
llama's interleaved pairs ("norm"). The Triton kernel reads positions and fp32 frequencies; the torch path takes
cos/sin tables computed once per step (in fp64, then rounded) and shared by every layer using that variant.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ._triton import tl, triton


def rope_inv_freq(theta: float, head_dim: int, *, rotary_pairs: int | None = None, exponent_dim: int | None = None,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """fp32 [rotary_pairs] inverse frequencies theta^(-2i/exponent_dim); defaults are the full rotation."""
    pairs = head_dim // 2 if rotary_pairs is None else rotary_pairs
    exp_dim = head_dim if exponent_dim is None else exponent_dim
    i = torch.arange(pairs, dtype=torch.float64, device=device)
    return (1.0 / theta ** (2.0 * i / exp_dim)).float()


def _check(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, half: int | None) -> int:
    if x.dim() != 3 or positions.shape != (x.shape[0],):
        raise ValueError(f"expected x [T, H, D] and positions [T]; got {tuple(x.shape)}, {tuple(positions.shape)}")
    half = x.shape[-1] // 2 if half is None else half
    if inv_freq.dim() != 1 or inv_freq.numel() > half or 2 * half > x.shape[-1]:
        raise ValueError(f"{inv_freq.numel()} rotary pairs at offset {half} do not fit head dim {x.shape[-1]}")
    return half


def rope_torch(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, half: int | None = None):
    """x [T, H, D] rotated at positions [T] -> new tensor in x.dtype."""
    half = _check(x, positions, inv_freq, half)
    p = inv_freq.numel()
    ang = positions.float()[:, None] * inv_freq.float()[None, :]  # [T, P]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]
    out = x.float().clone()
    x1, x2 = out[..., :p].clone(), out[..., half:half + p].clone()
    out[..., :p] = x1 * cos - x2 * sin
    out[..., half:half + p] = x2 * cos + x1 * sin
    return out.to(x.dtype)


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, f_ptr, o_ptr, sx_t, sx_h, so_t, so_h, P, half,
                 D: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    first = d < P  # x1 lanes: rotate with partner d + half
    second = (d >= half) & (d < half + P)  # x2 lanes: partner d - half
    partner = tl.where(first, d + half, tl.where(second, d - half, d))
    fi = tl.where(first, d, tl.where(second, d - half, 0))
    row = x_ptr + t * sx_t + h * sx_h
    x = tl.load(row + d, mask=dmask, other=0.0).to(tl.float32)
    xp = tl.load(row + partner, mask=dmask, other=0.0).to(tl.float32)
    ang = tl.load(pos_ptr + t).to(tl.float32) * tl.load(f_ptr + fi, mask=first | second, other=0.0)
    sign = tl.where(first, -1.0, 1.0)
    y = tl.where(first | second, x * tl.cos(ang) + sign * xp * tl.sin(ang), x)
    tl.store(o_ptr + t * so_t + h * so_h + d, y.to(o_ptr.dtype.element_ty), mask=dmask)


def rope_triton(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, half: int | None = None):
    half = _check(x, positions, inv_freq, half)
    if x.stride(-1) != 1:
        raise ValueError("rope needs a contiguous head dim")
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    t, h, d = x.shape
    if t and h:
        _rope_kernel[(t, h)](x, positions, inv_freq.float().contiguous(), out, x.stride(0), x.stride(1),
                             out.stride(0), out.stride(1), inv_freq.numel(), half, D=d,
                             BLOCK_D=triton.next_power_of_2(d))
    return out


@dataclass
class RopeAngles:
    """The rotation of one step: positions [T] (on the model's device) for one (inv_freq, style) variant."""

    positions: torch.Tensor  # [T] long
    inv_freq: torch.Tensor  # [P] float64, P = rotated dims / 2
    inv_freq32: torch.Tensor  # [P] float32, the same frequencies for the Triton kernel
    style: str = "neox"  # "neox": pairs (i, i + P); "norm": pairs (2i, 2i + 1)
    _cs: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    def cos_sin(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cs is None:
            ang = self.positions.to(torch.float64)[:, None] * self.inv_freq[None, :]  # [T, P]
            self._cs = (ang.cos().float()[:, None, :], ang.sin().float()[:, None, :])  # [T, 1, P]
        return self._cs

    def rows(self, sl: slice) -> RopeAngles:
        cs = None if self._cs is None else (self._cs[0][sl], self._cs[1][sl])
        return RopeAngles(self.positions[sl], self.inv_freq, self.inv_freq32, self.style, cs)


def rope_angles_torch(x: torch.Tensor, angles: RopeAngles) -> torch.Tensor:
    """x [T, H, D] rotated by `angles` (first 2P dims rotate, the rest pass through) -> new tensor."""
    cos, sin = angles.cos_sin()
    rot_dim = 2 * angles.inv_freq.shape[0]
    rot, rest = x[..., :rot_dim], x[..., rot_dim:]
    if angles.style == "neox":
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return out if rest.shape[-1] == 0 else torch.cat((out, rest), dim=-1)
