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
from bolt_ros.engine.decode.sampling import SamplingParams, distribution
from bolt_ros.engine.gguf.quants import dequantize_rows
from bolt_ros.engine.model import linear
from bolt_ros.kernels.cpu import native

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernels are not built")


@pytest.fixture(scope="module")
def head():
    e = Engine.load("default-chat", n_ctx=256, threads=2)
    h = e.model.output
    assert h.scheme in ("blocks", "q4_0") and h.role == "head"
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


def _exact(head, x: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    w = dequantize_rows(head._raw, head.ggml_type, head.shape, cols).double()
    return (w * x.double()[rows]).sum(-1)


def test_a_flat_row_refines_its_best_ones(head, monkeypatch):
    """A flat row (more than HEAD_MAX_CANDIDATES logits within the margin) gets its HEAD_MAX_CANDIDATES best
    refined, in C, not handed to the torch form; an all-equal row the first columns (ties by column)."""
    x = _x(head, 1) * 0.4  # logits ~2.5x flatter: ~400 within the margin
    y = head.approximate(x)
    assert (y >= y.amax() - linear.HEAD_MARGIN).sum() > linear.HEAD_MAX_CANDIDATES
    got = y.clone()
    assert native.head_refine(x, got, head._raw, head.ggml_type, linear.HEAD_MARGIN, linear.HEAD_MAX_CANDIDATES)
    cols = y[0].topk(linear.HEAD_MAX_CANDIDATES).indices
    rows = torch.zeros_like(cols)
    exact = _exact(head, x, rows, cols)
    assert ((got[0, cols].double() - exact).abs() <= exact.abs() * 2 ** -23).all()
    rest = torch.ones_like(y, dtype=torch.bool)
    rest[0, cols] = False
    assert torch.equal(got[rest], y[rest])
    flat = torch.zeros(1, head.out_features)
    assert native.head_refine(x, flat, head._raw, head.ggml_type, linear.HEAD_MARGIN, linear.HEAD_MAX_CANDIDATES)
    first = torch.arange(linear.HEAD_MAX_CANDIDATES)
    assert torch.equal(flat[0, first], _exact(head, x, torch.zeros_like(first), first).float())
    assert not flat[0, linear.HEAD_MAX_CANDIDATES:].any()
    # the torch form (where the C form declines) keeps the same candidates, within its fp32 sum's rounding
    monkeypatch.setattr(native, "head_refine", lambda *a: False)
    ref = y.clone()
    ref[0, cols] = exact.float()
    assert torch.allclose(head(x), ref, rtol=1e-5, atol=1e-5)


def test_a_rows_candidates_depend_on_that_row_alone(head, monkeypatch):
    """A DFlash verify block's row gets the logits a decode step gets for it: a flat row refined beside a peaked
    one equals that row refined alone, bit for bit. Negative control: the flat row has more candidates than a row's
    cap but fewer than the pair's pooled cap minus the peaked row's, so a rule over the block's pooled count (the one
    this replaced) refined all of them in the block and only its best alone."""
    peaked, flat = _x(head, 1), _x(head, 1) * 0.4
    x = torch.cat([peaked, flat])
    y = head.approximate(x)
    counts = (y >= y.amax(-1, keepdim=True) - linear.HEAD_MARGIN).sum(-1)
    assert linear.HEAD_MAX_CANDIDATES < counts[1] <= 2 * linear.HEAD_MAX_CANDIDATES - counts[0]
    both = y.clone()
    assert native.head_refine(x, both, head._raw, head.ggml_type, linear.HEAD_MARGIN, linear.HEAD_MAX_CANDIDATES)
    for t in range(2):
        alone = y[t:t + 1].clone()
        assert native.head_refine(x[t:t + 1], alone, head._raw, head.ggml_type, linear.HEAD_MARGIN,
                                  linear.HEAD_MAX_CANDIDATES)
        assert torch.equal(both[t:t + 1], alone)
    monkeypatch.setattr(native, "head_refine", lambda *a: False)  # the torch form's rule is per row too
    torch_both, torch_flat = head(x), head(flat)
    near = lambda v: v >= v.amax(-1, keepdim=True) - linear.HEAD_MARGIN  # noqa: E731
    assert torch.equal(torch_both[1] != y[1], torch_flat[0] != y[1])
    assert near(y)[1].sum() > (torch_both[1] != y[1]).sum()


def test_a_nan_is_left_to_the_torch_form(head):
    x = _x(head, 1)
    y = head.approximate(x)
    y[0, 7] = float("nan")
    kept = y.clone()
    assert not native.head_refine(x, y, head._raw, head.ggml_type, linear.HEAD_MARGIN, linear.HEAD_MAX_CANDIDATES)
    assert torch.equal(y[:, :7], kept[:, :7]) and torch.equal(y[:, 8:], kept[:, 8:])


def test_the_q4_0_head_samples_as_the_exact_head_under_the_assistants_settings():
    """A Q8_0 head requantized to Q4_0 tiles ranks candidates less well (its logits are off by up to ~2 nats on real
    hidden states, ~0.2 for the Q8_0 blocks), but every token within HEAD_MARGIN of the best is then refined exactly:
    the argmax and the distribution the assistant samples (config/assistant.yaml: temperature 0.7, top-k 20, top-p
    0.8) equal the float64 head's on the real hidden states of a text. Bound: the refined logits are the float64 ones
    rounded to fp32 (module docstring), which moves probabilities by ~1e-6 at most; 1e-5 of total variation allows
    for it. Negative control: the Q4_0 logits unrefined put mass elsewhere."""
    if native.tiled_type(2) is None:
        pytest.skip("no Q4_0 tiles on this level: the head stays in its GGUF blocks")
    e = Engine.load("default-chat", n_ctx=320, threads=2)
    h = e.model.output
    assert h.scheme == "q4_0" and h.blocks.numel() * 1.8 < h._raw.numel()  # Q4_0 (4.5 bits) for Q8_0 (8.5)
    xs = []
    hook = h.register_forward_pre_hook(lambda m, inp: xs.append(inp[0].reshape(-1, h.in_features).clone()))
    text = "The robot looked at the person in front of it and said that it would be happy to help with the garden."
    e.forward(e.new_session(), e.tok.encode(text * 4, add_bos=e.tok.add_bos)[:96], logits="all")
    hook.remove()
    x = torch.cat(xs)[-64:].contiguous()
    exact = x.double() @ h.dequantized().double().t()  # [64, V]
    got, rough = h(x), h.approximate(x)
    params = SamplingParams(temperature=0.7, top_k=20, top_p=0.8)
    tv = [0.5 * float((distribution(got[i], params, []) - distribution(exact[i].float(), params, [])).abs().sum())
          for i in range(64)]
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
    assert max(tv) <= 1e-5, max(tv)
    tv_rough = [0.5 * float((distribution(rough[i], params, []) - distribution(exact[i].float(), params, []))
                            .abs().sum()) for i in range(64)]
    assert max(tv_rough) > 1e-2
