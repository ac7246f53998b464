"""The output head's exact refinement of its top candidates in C (kernels/cpu/head_refine.c) against float64 on the
default chat model's real Q8_0 head: the same candidates as the torch form (every logit within HEAD_MARGIN of its
row's best), their values the float64 dot of the dequantized row (the same dequantized values as the reference, bit
for bit) rounded once, everything else untouched; and the cases it leaves to the torch form.

Tolerance: a float64 sum of 896 products differs from the exact one by far less than fp32's half-ulp, and the
partial sums' order moves only the double's last bits, so each refined logit is the float64 value rounded: within one
fp32 ulp of it (assert |d| <= 2^-23 |v|)."""
from __future__ import annotations

import pytest
import torch

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.gguf.quants import dequantize_rows
from bolt_ros.engine.model import linear
from bolt_ros.kernels.cpu import native

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernels are not built")


@pytest.fixture(scope="module")
def head():
    e = Engine.load("default-chat", n_ctx=256, threads=2)
    h = e.model.output
    assert h.scheme == "blocks" and h.role == "head"
    return h


def _x(head, t: int) -> torch.Tensor:
    """Rows of x whose logits peak as a real model's do: each along the sum of two tokens' head rows (those two lead
    by ~20 nats), plus noise."""
    g = torch.Generator().manual_seed(t)
    ids = torch.randint(0, head.out_features, (t * 2,), generator=g)
    w = dequantize_rows(head._raw, head.ggml_type, head.shape, ids).view(t, 2, -1).sum(1)
    return w / w.norm(dim=-1, keepdim=True) * 60 + torch.randn(t, head.in_features, generator=g) * 0.3


@pytest.mark.parametrize("t", [1, 8])
def test_candidates_get_their_float64_value_and_nothing_else_moves(head, t):
    x = _x(head, t)
    y = head.approximate(x)
    got = y.clone()
    assert native.head_refine(x, got, head._raw, head.ggml_type, linear.HEAD_MARGIN, linear.HEAD_MAX_CANDIDATES)
    near = y >= y.amax(-1, keepdim=True) - linear.HEAD_MARGIN
    rows, cols = near.nonzero(as_tuple=True)
    assert 0 < cols.numel() <= linear.HEAD_MAX_CANDIDATES * t
    w = dequantize_rows(head._raw, head.ggml_type, head.shape, cols).double()
    exact = (w * x.double()[rows]).sum(-1)
    assert ((got[rows, cols].double() - exact).abs() <= exact.abs() * 2 ** -23).all()
    assert torch.equal(got[~near], y[~near])
    # negative control: the int8 product itself is off by far more than a rounding
    assert (y[rows, cols].double() - exact).abs().max() > 1e3 * exact.abs().max() * 2 ** -23
    # the layer's forward takes this path: the torch form gives the same logits within its fp32 sum's rounding
    ref = y.clone()
    ref[rows, cols] = (w.float() * x[rows]).sum(-1)
    assert torch.allclose(head(x), ref, rtol=1e-5, atol=1e-5)


def test_a_flat_row_or_a_nan_is_left_to_the_torch_form(head):
    x = _x(head, 1)
    flat = torch.zeros(1, head.out_features)  # every logit a candidate: more than HEAD_MAX_CANDIDATES
    assert not native.head_refine(x, flat, head._raw, head.ggml_type, linear.HEAD_MARGIN, linear.HEAD_MAX_CANDIDATES)
    assert not flat.any()
    y = head.approximate(x)
    y[0, 7] = float("nan")
    kept = y.clone()
    assert not native.head_refine(x, y, head._raw, head.ggml_type, linear.HEAD_MARGIN, linear.HEAD_MAX_CANDIDATES)
    assert torch.equal(y[:, :7], kept[:, :7]) and torch.equal(y[:, 8:], kept[:, 8:])
