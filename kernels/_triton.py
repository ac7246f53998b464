"""Triton import shim: the engine-only install (`pip install .` without the `gpu` extra) has no Triton.

Kernel modules import `triton`/`tl` from here so their torch references stay importable; a Triton kernel launched
without Triton raises a clear error instead of failing at import time.
"""
from __future__ import annotations

try:
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
