"""The one switch between Triton kernels and torch references.

`BOLT_KERNELS` = `auto` (default: Triton on CUDA devices, torch elsewhere), `triton` (force Triton, e.g. on CPU
under `TRITON_INTERPRET=1` for tests) or `torch` (force the references, e.g. to bisect a GPU mismatch).
"""
from __future__ import annotations

import os

import torch

from ._triton import HAVE_TRITON

_MODES = ("auto", "triton", "torch")


def kernel_mode() -> str:
    mode = os.environ.get("BOLT_KERNELS", "auto").strip().lower() or "auto"
    if mode not in _MODES:
        raise ValueError(f"BOLT_KERNELS={mode!r}: expected one of {', '.join(_MODES)}")
    return mode


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def use_triton(device: torch.device | str) -> bool:
    """True when tensors on `device` should go through the Triton kernels."""
    if not isinstance(device, torch.device):
        device = torch.device(device)
    raw = os.environ.get("BOLT_KERNELS")
    if raw is None and device.type == "cpu":  # the hot path of every op on a CPU: one lookup, no parsing
        return False
    mode = kernel_mode()
    if mode == "torch":
        return False
    if mode == "auto":
        return device.type == "cuda" and HAVE_TRITON
    if not HAVE_TRITON:
        raise RuntimeError("BOLT_KERNELS=triton but Triton is not loaded: install it (the `gpu` extra), and on a CPU "
                           "set BOLT_KERNELS=triton or TRITON_INTERPRET=1 before bolt_ros.kernels is imported")
    if device.type != "cuda" and not interpreter_on():
        raise RuntimeError(
            f"BOLT_KERNELS=triton on a {device.type} tensor needs TRITON_INTERPRET=1 set before triton is imported"
        )
    return True
