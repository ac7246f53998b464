"""A whole decoder layer in one C call (kernels/cpu/layer_step.c, ops.decoder_layer) against the op-by-op layer
(Block.mix then Block.ffn), on the shipped models' real layers: Qwen2.5 0.5B (q/k/v biases, SiLU, plain residuals)
and Gemma 3 270M (q/k norms, post-norms, GELU, sliding rings).

Tolerances: the layer calls the very C functions the op-by-op path calls (int8 matmul, attention step, RMSNorm) in
the same order, so with the same activation the two must agree bit for bit. The one thing the C layer does its own
way is the activation's exp (vec_f32.h's Cephes polynomial, relative error ~1e-7, where torch uses its vectorized
exp): checked alone against torch at the bound that error implies through one division and two products (a few
units of fp32 rounding, 2e-6 relative to the value's scale)."""
from __future__ import annotations

import pytest
import torch

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.kernels import ops
from bolt_ros.kernels.cpu import layer, native

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: the native kernels are not built")
ACT_TOL = 2e-6


@pytest.fixture(scope="module", params=["default-chat", "default"])
def engine(request):
    e = Engine.load(request.param, n_ctx=1024, threads=2)
    s = e.new_session()
    g = torch.Generator().manual_seed(0)
    e.prefill(s, torch.randint(1000, 20000, (300,), generator=g).tolist())  # keys to attend over, rings wrapped
    return e, s


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_the_activation_alone_equals_torch(activation):
    g = torch.Generator().manual_seed(1)
    gu = torch.cat([torch.randn(3, 2 * 1037, generator=g) * 6,  # a width that ends inside a vector: the scalar tail
                    torch.linspace(-120, 120, 2 * 1037)[None]])  # saturation on both sides: no inf, no NaN
    gate, up = gu.chunk(2, dim=-1)
    got, ref = layer.act_mul(gu, activation), ops.act_mul(gate, up, activation)
    assert torch.isfinite(got).all()
    scale = (torch.nn.functional.gelu(gate, approximate="tanh") if activation == "gelu_tanh"
             else torch.nn.functional.silu(gate)).abs().clamp_min(1.0) * up.abs()
    err = ((got - ref).abs() / scale).max()
    assert err <= ACT_TOL, err
    # negative control: the other activation is far outside the bound
    other = "silu" if activation == "gelu_tanh" else "gelu_tanh"
    assert ((layer.act_mul(gu, other) - ref).abs() / scale).max() > 100 * ACT_TOL


def _layers(e, s, il, t, *, c_activation):
    """(the C layer, the op-by-op layer) on random rows at the cache's next positions; the op-by-op one with the C
    layer's activation when `c_activation`. Each writes this step's K/V at the same slots."""
    m = e.model
    blk, cache = m.blocks[il], s.cache
    positions = torch.arange(cache.n_past, cache.n_past + t)
    vis = m.visibility(positions, cache)[m.cfg.swa[il]]
    h = torch.randn(t, m.cfg.n_embd, generator=torch.Generator().manual_seed(il * 31 + t)) * 2
    whole = ops.decoder_layer(h, blk.native_plan(), cache.layer(il), positions, m.ropes[il].at(positions), vis)
    act = ops.act_mul
    if c_activation:
        ops.act_mul = lambda gate, up, name: layer.act_mul(torch.cat([gate, up], dim=-1), name)
    try:
        ref = blk.ffn(blk.mix(h, positions, cache, m.ropes[il].at(positions), vis), None)
    finally:
        ops.act_mul = act
    return whole, ref


@pytest.mark.parametrize("t", [1, 5, 16])
def test_the_layer_equals_the_op_by_op_layer_bit_for_bit(engine, t):
    e, s = engine
    n = len(e.model.blocks)
    assert all(b.native_plan() is not None for b in e.model.blocks)  # the shipped models take the C layer throughout
    for il in (0, n // 2, n - 1):
        whole, ref = _layers(e, s, il, t, c_activation=True)
        assert whole is not None and torch.equal(whole, ref), (il, (whole - ref).abs().max())
    # with torch's own activation the two differ only by its exp's rounding, carried through the down projection
    whole, ref = _layers(e, s, n // 2, t, c_activation=False)
    assert (whole - ref).abs().max() <= 1e-3 * ref.abs().max()


def test_what_takes_the_c_layer(engine):
    e, s = engine
    m, cache = e.model, s.cache
    blk = m.blocks[0]
    positions = torch.arange(cache.n_past, cache.n_past + ops.NATIVE_MAX_T + 1)
    vis = m.visibility(positions, cache)[m.cfg.swa[0]]
    h = torch.randn(positions.shape[0], m.cfg.n_embd)
    assert ops.decoder_layer(h, blk.native_plan(), cache.layer(0), positions, m.ropes[0].at(positions), vis) is None
    p4 = positions[:4]  # a step that fits, but a layer without a plan: op by op
    vis4 = m.visibility(p4, cache)[m.cfg.swa[0]]
    assert ops.decoder_layer(h[:4], None, cache.layer(0), p4, m.ropes[0].at(p4), vis4) is None
    assert ops.decoder_layer(h[:4], blk.native_plan(), cache.layer(0), p4, m.ropes[0].at(p4), vis4) is not None


def test_greedy_decoding_is_the_same_with_and_without_it(engine):
    """The engine's own decode loop: the same tokens from the C layers as from the op-by-op ones, and a verify
    block's rows equal the single steps at their positions (DFlash's guarantee rests on it)."""
    e, _ = engine
    prompt = e.tok.encode("The robot looked at the table and", add_bos=e.tok.add_bos)
    outs = []
    for native_layers in (True, False):
        e.model.native_layers = native_layers
        try:
            s = e.new_session()
            logits = e.prefill(s, prompt)
            toks = []
            for _ in range(12):
                toks.append(int(logits.argmax()))
                logits = e.forward(s, [toks[-1]])
            s.truncate(len(prompt))
            block = e.forward(s, toks[:8], logits="all")
            s.truncate(len(prompt))
            steps = torch.stack([e.forward(s, [tok]).reshape(-1) for tok in toks[:8]])
            assert torch.equal(block, steps)
            outs.append(toks)
        finally:
            e.model.native_layers = True
    assert outs[0] == outs[1]
