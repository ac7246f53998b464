"""Triton kernels vs their torch references, run by the Triton interpreter on the CPU (small shapes, edge sizes).

Tolerances: fp32 everywhere; the kernels accumulate in a different order than torch, so matmuls are held to 1e-5 of
the output scale and everything else to ~1e-5 absolute. The dequantizer itself must be bit-exact vs gguf-py.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: kernels defined from here on are interpreted

import gguf
import numpy as np
import pytest
import torch

from bolt_ros.kernels import activation, attention, backend, logits, norm, ops, qmatmul, quant_ref, rope

ROOT = Path(__file__).resolve().parents[1]
if type(qmatmul._qgemv_kernel).__name__ != "InterpretedFunction":  # imported earlier without the interpreter
    for mod in (quant_ref, qmatmul, attention, norm, rope, activation, logits, ops):
        importlib.reload(mod)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _close(out: torch.Tensor, ref: torch.Tensor, rel: float = 1e-5, abs_: float = 1e-5) -> None:
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    torch.testing.assert_close(out, ref, rtol=0, atol=abs_ + rel * scale)


# ---------------------------------------------------------------------------------------------- quantized matmul

@pytest.mark.parametrize("ggml_type", sorted(quant_ref.BLOCKS))
def test_dequantize_is_bit_exact_vs_gguf(ggml_type):
    n, k = 5, 512
    raw = quant_ref.random_blocks(ggml_type, n, k, generator=_gen(ggml_type))
    ref = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType(ggml_type)).reshape(n, k)
    ours = quant_ref.dequantize_torch(raw, ggml_type, n, k).numpy()
    assert np.array_equal(ours.view(np.uint32), ref.astype(np.float32).view(np.uint32))


# each type meets every path: M=1 GEMV, small-M (2..16) and GEMM (>16); N not a multiple of any BLOCK_N, and K not
# a multiple of BLOCK_K for the legacy types (K = 288 = 9 blocks of 32; the K-quants need K % 256 == 0)
@pytest.mark.parametrize("ggml_type", sorted(quant_ref.BLOCKS))
@pytest.mark.parametrize("m", [1, 5, 16, 19])
def test_qmatmul_matches_reference(ggml_type, m):
    n, k = 37, (512 if quant_ref.BLOCKS[ggml_type][0] == 256 else 288)
    g = _gen(100 * ggml_type + m)
    raw = quant_ref.random_blocks(ggml_type, n, k, generator=g)
    x = torch.randn(m, k, generator=g)
    _close(qmatmul.qmatmul_triton(x, raw, ggml_type, n, k), qmatmul.qmatmul_torch(x, raw, ggml_type, n, k))


def test_qmatmul_keeps_leading_dims_and_accepts_tuned_configs():
    n, k = 20, 512
    raw = quant_ref.random_blocks(quant_ref.Q4_K, n, k, generator=_gen(1))
    x = torch.randn(2, 3, k, generator=_gen(2))
    ref = qmatmul.qmatmul_torch(x, raw, quant_ref.Q4_K, n, k)
    assert ref.shape == (2, 3, n)
    _close(qmatmul.qmatmul_triton(x, raw, quant_ref.Q4_K, n, k), ref)
    # a GEMV config with a K tile wider than K and a GEMM tile on the small-M path
    x1 = x[0, :1]
    _close(qmatmul.qmatmul_triton(x1, raw, quant_ref.Q4_K, n, k, config={"BLOCK_N": 4, "BLOCK_K": 1024}), ref[0, :1])
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 64}
    _close(qmatmul.qmatmul_triton(x1, raw, quant_ref.Q4_K, n, k, config=cfg), ref[0, :1])


def test_qmatmul_rejects_bad_input():
    raw = quant_ref.random_blocks(quant_ref.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        qmatmul.qmatmul_triton(torch.randn(1, 60), raw, quant_ref.Q8_0, 4, 60)
    with pytest.raises(ValueError, match="needs 272 bytes"):
        qmatmul.qmatmul_triton(torch.randn(1, 64), raw[:3], quant_ref.Q8_0, 4, 64)
    with pytest.raises(ValueError, match="no fused kernel"):
        qmatmul.qmatmul_torch(torch.randn(1, 64), raw, quant_ref.F16, 4, 64)
    with pytest.raises(ValueError, match="features"):
        qmatmul.qmatmul_triton(torch.randn(1, 32), raw, quant_ref.Q8_0, 4, 64)


# ---------------------------------------------------------------------------------------------- attention

def _cache(hkv: int, s: int, d: int, g: torch.Generator, *, seq_major: bool):
    # [Hkv, S, D]; seq_major stores it as [S, Hkv, D] (a transposed view) to exercise arbitrary strides
    if seq_major:
        k, v = torch.randn(2, s, hkv, d, generator=g).transpose(1, 2)
        return k, v
    return torch.randn(hkv, s, d, generator=g), torch.randn(hkv, s, d, generator=g)


@pytest.mark.parametrize(("d", "hq", "hkv"), [(256, 8, 2), (512, 4, 1), (64, 3, 3)])
@pytest.mark.parametrize(("start", "t", "window"), [(0, 37, 0), (21, 5, 0), (30, 40, 16), (50, 7, 9)])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_prefill_and_block(d, hq, hkv, start, t, window, causal):
    g = _gen(d + start + t)
    k, v = _cache(hkv, 96, d, g, seq_major=d == 256)
    q = torch.randn(t, hq, d, generator=g)
    scale = 1.0 if d == 512 else d ** -0.5
    out = attention.attention_triton(q, k, v, start, scale, causal=causal, window=window)
    _close(out, attention.attention_torch(q, k, v, start, scale, causal=causal, window=window))


def test_attention_block_sees_the_whole_block_and_prefill_does_not():
    g = _gen(7)
    k, v = _cache(2, 40, 64, g, seq_major=False)
    q = torch.randn(6, 4, 64, generator=g)
    block = attention.attention_block_triton(q, k, v, 30, 0.125)
    causal = attention.attention_prefill_triton(q, k, v, 30, 0.125)
    _close(block[-1], causal[-1])  # the last block row sees the same keys either way
    assert (block[0] - causal[0]).abs().max() > 1e-3  # the first row also sees the 5 block keys after it


@pytest.mark.parametrize(("d", "hq", "hkv"), [(256, 8, 2), (512, 8, 2), (128, 7, 1)])
@pytest.mark.parametrize(("n_ctx", "window", "splits"), [(1, 0, None), (77, 0, None), (77, 20, None), (33, 64, 3),
                                                         (96, 0, 7)])
def test_attention_decode(d, hq, hkv, n_ctx, window, splits):
    g = _gen(d + n_ctx)
    k, v = _cache(hkv, 96, d, g, seq_major=d == 512)
    q = torch.randn(hq, d, generator=g)
    out = attention.attention_decode_triton(q, k, v, n_ctx, 1.0, window=window, n_splits=splits)
    _close(out, attention.attention_decode_torch(q, k, v, n_ctx, 1.0, window=window))


def test_attention_rejects_bad_shapes():
    k = v = torch.zeros(2, 16, 64)
    with pytest.raises(ValueError, match="not a multiple"):
        attention.attention_triton(torch.zeros(1, 3, 64), k, v, 0, 1.0)
    with pytest.raises(ValueError, match="do not fit"):
        attention.attention_decode_triton(torch.zeros(4, 64), k, v, 17, 1.0)
    with pytest.raises(ValueError, match="head dims"):
        attention.attention_torch(torch.zeros(1, 4, 32), k, v, 0, 1.0)


# ---------------------------------------------------------------------------------------------- small ops

@pytest.mark.parametrize("d", [2560 // 8, 257])
def test_rms_norm_forms(d):
    g = _gen(d)
    x, r, w = torch.randn(3, 2, d, generator=g), torch.randn(3, 2, d, generator=g), torch.randn(d, generator=g)
    _close(norm.rms_norm_triton(x, w, 1e-6), norm.rms_norm_torch(x, w, 1e-6))
    _close(norm.rms_norm_triton(x, None, 1e-6), norm.rms_norm_torch(x, None, 1e-6))
    y, s = norm.add_rms_norm_triton(x, r, w, 1e-6)
    y_ref, s_ref = norm.add_rms_norm_torch(x, r, w, 1e-6)
    _close(s, s_ref)
    _close(y, y_ref)
    _close(norm.rms_norm_add_triton(x, w, r, 1e-6), norm.rms_norm_add_torch(x, w, r, 1e-6))
    # the raw weight is used as is (no Gemma-3-style 1 + w)
    ones = norm.rms_norm_torch(x, torch.ones(d), 1e-6)
    _close(ones.pow(2).mean(-1), torch.ones(3, 2), abs_=1e-4)


@pytest.mark.parametrize(("d", "pairs", "exp_dim", "theta"), [
    (256, None, None, 1e4),  # full rotation (Gemma 3, Gemma 4 sliding layers)
    (512, 64, 512, 1e6),  # Gemma 4 full layers: 64 pairs of 512 dims, exponent over 512
    (96, 24, 48, 1e4),  # ggml partial n_rot=48: pairs (i, i+24), dims >= 48 pass through
])
def test_rope_variants(d, pairs, exp_dim, theta):
    g = _gen(d)
    x = torch.randn(5, 3, d, generator=g)
    pos = torch.tensor([0, 1, 7, 300, 4095])
    inv = rope.rope_inv_freq(theta, d, rotary_pairs=pairs, exponent_dim=exp_dim)
    half = d // 2 if exp_dim != 48 else 24
    out = rope.rope_triton(x, pos, inv, half)
    ref = rope.rope_torch(x, pos, inv, half)
    _close(out, ref, abs_=2e-5)
    _close(out[0], x[0])  # position 0 is the identity
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5, atol=1e-5)  # rotations keep norms
    n_rot = inv.numel()
    untouched = [i for i in range(d) if not (i < n_rot or half <= i < half + n_rot)]
    assert torch.equal(out[..., untouched], x[..., untouched])


def test_rope_matches_hf_proportional_definition():
    # HF _compute_proportional_rope_parameters: 256 frequencies, the first 64 = 1e6^(-2i/512), the rest 0
    full = torch.zeros(256)
    full[:64] = 1.0 / 1e6 ** (torch.arange(64, dtype=torch.float64) * 2 / 512)
    x = torch.randn(4, 2, 512, generator=_gen(3))
    pos = torch.tensor([3, 10, 100, 1000])
    _close(rope.rope_torch(x, pos, full.float()),
           rope.rope_triton(x, pos, rope.rope_inv_freq(1e6, 512, rotary_pairs=64)), abs_=2e-5)


def test_gelu_tanh_mul():
    g = _gen(4)
    gate, up = torch.randn(3, 1500, generator=g) * 4, torch.randn(3, 1500, generator=g)
    gate[0, :4] = torch.tensor([-30.0, 30.0, 0.0, -1e-3])  # saturation and the sign of tiny inputs
    _close(activation.gelu_tanh_mul_triton(gate, up), activation.gelu_tanh_mul_torch(gate, up))


@pytest.mark.parametrize("cap", [30.0, 0.0])
def test_softcap_argmax(cap):
    g = _gen(5)
    x = torch.randn(3, 9000, generator=g) * 20  # 3 chunks, the last one ragged
    x[0, 8999] = 500.0  # winner in the ragged tail
    x[1, 17] = x[1, 4200] = 400.0  # tie across chunks: the lowest index wins
    capped, ids = logits.softcap_argmax_triton(x, cap)
    ref_capped, ref_ids = logits.softcap_argmax_torch(x, cap)
    _close(capped, ref_capped, abs_=2e-5)
    assert ids.tolist()[:2] == [8999, 17]
    assert torch.equal(ids, capped.argmax(-1)) and torch.equal(ids, ref_ids)
    if cap:
        assert capped.abs().max() <= cap


# ---------------------------------------------------------------------------------------------- dispatch

def test_backend_switch(monkeypatch):
    monkeypatch.setenv("BOLT_KERNELS", "auto")
    assert backend.use_triton("cpu") is False
    monkeypatch.setenv("BOLT_KERNELS", "triton")
    assert backend.use_triton("cpu") is True  # allowed here because TRITON_INTERPRET=1
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        backend.use_triton("cpu")
    monkeypatch.setenv("BOLT_KERNELS", "cuda-please")
    with pytest.raises(ValueError, match="BOLT_KERNELS"):
        backend.use_triton("cpu")


@pytest.mark.parametrize("mode", ["torch", "triton"])
def test_ops_facade_same_calls_both_backends(monkeypatch, mode):
    monkeypatch.setenv("BOLT_KERNELS", mode)
    g = _gen(6)
    raw = quant_ref.random_blocks(quant_ref.Q6_K, 24, 256, generator=g)
    x = torch.randn(2, 256, generator=g)
    h = ops.qmatmul_gguf(x, raw, quant_ref.Q6_K, 24, 256)
    _close(h, qmatmul.qmatmul_torch(x, raw, quant_ref.Q6_K, 24, 256))
    w = torch.rand(24, generator=g)
    y, s = ops.add_rms_norm(h, h, w, 1e-6)
    _close(ops.rms_norm(s, w, 1e-6), y)
    _close(ops.rms_norm_add(h, w, s, 1e-6), s + norm.rms_norm_torch(h, w, 1e-6))
    inv = rope.rope_inv_freq(1e4, 64)
    q = ops.rope(torch.randn(2, 4, 64, generator=g), rope.RopeAngles(torch.tensor([5, 6]), inv.double(), inv))
    k, v = _cache(2, 8, 64, g, seq_major=False)
    a = ops.attention_prefill(q, k, v, 0, 0.125)
    _close(ops.attention_block(q, k, v, 0, 0.125)[1], a[1])
    _close(ops.attention_decode(q[1], k, v, 2, 0.125), a[1])
    _close(ops.gelu_tanh_mul(h, h), activation.gelu_tanh_mul_torch(h, h))
    lg = h / h.abs().max() * 40  # below tanh saturation, so the cap keeps the raw argmax
    capped, ids = ops.softcap_argmax(lg, 30.0)
    assert torch.equal(ids, lg.argmax(-1)) and capped.abs().max() < 30


def test_torch_paths_work_without_triton():
    # the engine-only install has no Triton: the references must import and run, Triton launches must fail clearly
    code = ("import sys; sys.modules['triton'] = None\n"
            "import torch\n"
            "from bolt_ros.kernels import ops, backend, quant_ref, qmatmul\n"
            "assert not backend.use_triton('cpu')\n"
            "x = torch.randn(2, 64)\n"
            "print(ops.rms_norm(x, None, 1e-6).shape)\n"
            "raw = quant_ref.random_blocks(quant_ref.Q4_0, 3, 64)\n"
            "try:\n    qmatmul.qmatmul_triton(x, raw, quant_ref.Q4_0, 3, 64)\n"
            "except RuntimeError as e:\n    print('refused:', e)\n")
    env = {**os.environ, "BOLT_KERNELS": "auto", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "torch.Size([2, 64])" in res.stdout and "refused: Triton is not installed" in res.stdout


# ---------------------------------------------------------------------------------------------- GPU check script

def _run_check(args: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)


def test_gpu_check_dry_run_on_cpu(tmp_path):
    out_json = tmp_path / "check.json"
    res = _run_check([sys.executable, "bench/gpu_check.py", "--device", "cpu", "--json-out", str(out_json)], {})
    assert res.returncode == 0, res.stdout + res.stderr
    table = res.stdout
    for needle in ("copy", "qmatmul Q4_K", "qmatmul Q6_K", "attn decode", "attn prefill", "attn dflash-block",
                   "rms_norm", "rope", "gelu_tanh_mul", "softcap_argmax", "e2e decode"):
        assert needle in table, needle
    assert " FAIL" not in table
    import json

    rows = json.loads(out_json.read_text())["rows"]
    checked = [r for r in rows if r["check"].startswith("ok")]
    assert len(checked) >= 30
    assert all(r["check"] != "FAIL" for r in rows)
    assert all(r["check"].startswith("ok") for r in rows if r["name"].startswith("e2e"))


def test_kernels_compile_for_sm90_without_a_gpu():
    # the interpreter accepts Python the Triton compiler rejects (e.g. `a or b or c`): compile the riskiest variants
    # for an H100/H200 (sm_90) here; `gpu_check.py --compile-only` compiles all of them
    only = "qgemv Q5_1,qmm Q6_K BM=16,gelu_tanh_mul"
    res = _run_check([sys.executable, "bench/gpu_check.py", "--compile-only", "--only", only],
                     {"TRITON_INTERPRET": "0"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("local=0") == 3, res.stdout  # compiled, and without register spills


def test_gpu_check_fails_clearly_without_a_gpu():
    res = _run_check(["bash", "bench/gpu_check.sh"], {"CUDA_VISIBLE_DEVICES": ""})
    assert res.returncode != 0
    assert "no CUDA device" in res.stderr
