"""The CPU RMSNorm rows (kernels/cpu/rms_norm.c) against their reference, kernels/norm.py's torch form, through the
facade the model calls (`ops.rms_norm`, `ops.rms_norm_add`), and the facade's choice of path.

Tolerance: the C sum of squares runs in double and the reference's in fp32; over D terms the reference's relative
error is at most ~D*u/2 in the norm's scale (u = 6e-8; D <= 1024 here: 3e-5), typically sqrt(D)*u. The products
after it are the same fp32 operations in the same order."""
from __future__ import annotations

import pytest
import torch

from bolt_ros.kernels import norm, ops
from bolt_ros.kernels.cpu import native

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernels are not built")
TOL = 3e-5


@pytest.mark.parametrize("shape", [(1, 640), (8, 896), (3, 4, 256), (1, 1)])
@pytest.mark.parametrize("weighted", [True, False])
def test_native_norm_equals_the_torch_form(shape, weighted):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(*shape, generator=g) * 4
    w = torch.rand(shape[-1], generator=g) + 0.5 if weighted else None
    r = torch.randn(*shape, generator=g)
    assert ops._native_rows_fit(x, w)
    got, ref = ops.rms_norm(x, w, 1e-6), norm.rms_norm_torch(x, w, 1e-6)
    assert got.shape == ref.shape and torch.allclose(got, ref, rtol=TOL, atol=TOL), (got - ref).abs().max()
    got, ref = ops.rms_norm_add(x, w, r, 1e-6), norm.rms_norm_add_torch(x, w, r, 1e-6)
    assert torch.allclose(got, ref, rtol=TOL, atol=TOL), (got - ref).abs().max()
    # negative control: the residual is really added (and eps really used: a zero row stays finite)
    assert (got - ops.rms_norm(x, w, 1e-6)).sub(r).abs().max() < TOL
    assert torch.isfinite(ops.rms_norm(torch.zeros(*shape), w, 1e-6)).all()


def test_what_takes_the_c_rows():
    """Prefill-sized, strided and non-fp32 inputs keep the torch form (the same values within TOL)."""
    x = torch.randn(ops.NATIVE_MAX_T + 1, 64)
    assert not ops._native_rows_fit(x) and ops._native_rows_fit(x[:ops.NATIVE_MAX_T])
    assert not ops._native_rows_fit(torch.randn(4, 128)[:, :64])
    assert not ops._native_rows_fit(torch.randn(2, 64, dtype=torch.bfloat16))
    s = torch.randn(4, 128)[:, :64]
    assert torch.allclose(ops.rms_norm(s, None, 1e-6), norm.rms_norm_torch(s, None, 1e-6))
