"""Triton import shim: the engine-only install (`pip install .` without the `gpu` extra) has no Triton, and a CPU
that will never launch a kernel should not pay for importing it (~70 MiB of RSS, ~1 s).

Kernel modules import `triton`/`tl` from here so their torch references stay importable; a Triton kernel launched
without Triton raises a clear error instead of failing at import time. Triton is imported when something can use it:
a CUDA device, the interpreter (TRITON_INTERPRET=1), BOLT_KERNELS=triton, or BOLT_TRITON=1 (compiling for a GPU on a
machine without one, as `gpu_check.py --compile-only` does). This is decided once, at import.
"""
from __future__ import annotations

import os


def _wanted() -> bool:
    env = os.environ
    if env.get("TRITON_INTERPRET", "0") not in ("", "0") or env.get("BOLT_TRITON", "0") not in ("", "0"):
        return True
    if env.get("BOLT_KERNELS", "").strip().lower() == "triton":
        return True
    import torch

    return torch.cuda.is_available()


try:
    if not _wanted():
        raise ImportError("no CUDA device, no interpreter: the torch references serve this machine")
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only on engine-only installs
    HAVE_TRITON = False

    class _Missing:
        """Stands in for `triton` and `triton.language`: decorators work, launches fail loudly."""

        constexpr = object

        def __getattr__(self, name):
            return self

        def __call__(self, *args, **kwargs):
            raise RuntimeError("Triton is not installed: pip install triton (the `gpu` extra of bolt_ros)")

        def jit(self, fn=None, **kwargs):  # @triton.jit and @triton.jit(...) both yield a launch-time error
            return self

        def __getitem__(self, grid):
            return self

    triton = _Missing()
    tl = _Missing()

__all__ = ["HAVE_TRITON", "tl", "triton"]
