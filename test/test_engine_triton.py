"""The engine's Triton path (device.py) vs its torch path, on the CPU under the Triton interpreter.

BOLT_KERNELS=triton forces the kernel path on CPU tensors: WeightStore keeps raw GGUF blocks (fused dequant-matmul),
norms/RoPE/attention/GELU gating/softcap go through kernels.ops, and the KV cache is position-indexed. The reference is
the torch path with policy "exact" (the same fp32 weight values, dense). Both run a prefill (GEMM path, longer than
the sliding window), single-token decode steps (GEMV + split-K decode attention), a 4-token verify-style step (small-M
path + causal prefill attention) followed by a rollback, and steps of the static (CUDA-graph) decode body.

Tolerance: fp32 on both sides; only the summation order and RoPE's fp32 angles differ, so logits agree to
2e-5 * max|logit| + 1e-5 (measured: <= 9e-6 at max|logit| ~ 5) and every greedy token is identical. Tiny shapes
(vocab 256, 2-3 layers): the interpreter runs each Triton program in numpy.
"""
from __future__ import annotations

import importlib
import math
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: kernels defined from here on are interpreted

import numpy as np
import pytest
import torch

from bolt_ros.devtools.testmodel import preset_spec, write_model
from bolt_ros.engine import device as dev
from bolt_ros.engine.decode import decoders
from bolt_ros.engine.gguf.layout import ModelSpec, gemma4_rope_freqs, tensor_plan
from bolt_ros.engine.gguf.reader import GGUFFile
from bolt_ros.engine.model.config import config_from_gguf
from bolt_ros.engine.model.transformer import Transformer
from bolt_ros.engine.model.weights import WeightStore
from bolt_ros.kernels import activation, attention, logits, norm, ops, qmatmul, quant_ref, rope

if type(qmatmul._qgemv_kernel).__name__ != "InterpretedFunction":  # imported earlier without the interpreter
    for mod in (quant_ref, qmatmul, attention, norm, rope, activation, logits, ops):
        importlib.reload(mod)

VOCAB, WINDOW = 256, 8


def _spec(arch: str) -> ModelSpec:
    """The tiny preset, cut down: a 256-token vocabulary (the real one makes a 262144-row head) and 2-3 layers."""
    base = preset_spec(arch, "tiny").model_dump()
    base.update(vocab_size=VOCAB, sliding_window=WINDOW)
    if arch == "gemma3":  # both layers sliding (llama.cpp's il % 6 < 5 pattern)
        base.update(n_layer=2, swa_layers=None)
    else:  # sliding, full (proportional RoPE, head dim 64), then one layer reading the sliding layer's KV
        base.update(n_layer=3, swa_layers=[True, False, True], shared_kv_layers=1, ple_dim=8)
    return ModelSpec(**base)


def _state(spec: ModelSpec, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for t in tensor_plan(spec):
        if t.kind == "rope_freqs":
            out[t.name] = gemma4_rope_freqs(spec)
        elif t.kind in ("norm", "scale"):
            out[t.name] = rng.normal(1.0, 0.1, t.shape).astype(np.float32)
        else:
            std = 1 / math.sqrt(spec.n_embd if t.kind == "embd" else t.shape[-1])
            out[t.name] = rng.normal(0.0, std, t.shape).astype(np.float32)
    return out


@pytest.fixture(scope="module", params=[("gemma3", "q8_0"), ("gemma4", "q4_k_m")], ids=lambda p: "-".join(p))
def gguf_path(request, tmp_path_factory):
    arch, quant = request.param
    spec = _spec(arch)
    path = tmp_path_factory.mktemp("triton") / f"{arch}-{quant}.gguf"
    return write_model(path, arch, spec, _state(spec, seed=3), quant, tokenizer="none")


def _model(gf: GGUFFile, policy: str) -> Transformer:
    return Transformer(config_from_gguf(gf), WeightStore(gf, policy))


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5 + 2e-5 * float(ref.abs().max()))


def test_triton_path_matches_torch_path(gguf_path, monkeypatch):
    gf = GGUFFile(gguf_path)
    monkeypatch.setenv("BOLT_KERNELS", "torch")
    ref = _model(gf, "exact")
    monkeypatch.setenv("BOLT_KERNELS", "triton")
    tri = _model(gf, "fast")
    assert not ref.kernels and tri.kernels
    schemes = {m.scheme for m in tri.modules() if hasattr(m, "scheme")}
    assert "gguf" in schemes and schemes <= {"gguf", "f32"}, schemes  # fused dequant-matmul (F16 stays dense)
    assert {int(m.ggml_type) for m in tri.modules() if hasattr(m, "scheme")} & set(quant_ref.BLOCKS)
    c_ref, c_tri = ref.new_cache(64, max_step=24), tri.new_cache(64, max_step=24)
    swa_layers = [lc for il, lc in enumerate(c_ref.layers) if lc is not None and ref.cfg.swa[il]]
    assert swa_layers and all(lc.ring for lc in swa_layers)  # the torch path wraps its sliding rings...
    assert not any(lc.ring for lc in c_tri.layers if lc is not None)  # ...the kernels read position-indexed slots

    def step(ids: list[int], mode: str = "all") -> torch.Tensor:
        a = ref(torch.tensor(ids), c_ref, logits=mode).logits
        b = tri(torch.tensor(ids), c_tri, logits=mode).logits
        _close(b, a)
        assert torch.equal(b.argmax(-1), a.argmax(-1))  # the same greedy tokens
        return b

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, VOCAB, (18,), generator=g).tolist()  # > 16 rows: the GEMM path; > WINDOW positions
    nxt = int(step(prompt)[-1].argmax())
    for _ in range(2):  # decode: GEMV + split-K decode attention
        nxt = int(step([nxt], "last")[-1].argmax())
    verify = [nxt, *torch.randint(0, VOCAB, (3,), generator=g).tolist()]
    step(verify)  # 4 rows: small-M matmuls + causal attention over the cache
    for c in (c_ref, c_tri):  # reject the last two drafts, as DFlash does
        c.truncate(c.n_past - 2)
    out = step([verify[2]], "last")
    assert c_tri.n_past == c_ref.n_past == 18 + 2 + 2 + 1

    # the CUDA-graph body (static token/position buffers, device-side visibility) on the same cache
    static = decoders.StaticDecodeStep(tri, c_tri)
    nxt = int(out[-1].argmax())
    for _ in range(2):
        a = ref(torch.tensor([nxt]), c_ref, logits="last").logits[-1]
        b = static.step(nxt)
        _close(b, a)
        assert int(b.argmax()) == int(a.argmax())
        nxt = int(b.argmax())
    assert c_tri.n_past == c_ref.n_past
    gf.close()


def test_switch_and_cuda_graphs_unavailable_on_cpu(gguf_path, monkeypatch):
    monkeypatch.setenv("BOLT_KERNELS", "auto")
    assert dev.kernels_on("cpu") is False and dev.weight_policy("fast", "cpu") == "fast"
    monkeypatch.setenv("BOLT_KERNELS", "triton")
    assert dev.kernels_on("cpu") is True  # allowed: TRITON_INTERPRET=1
    assert dev.weight_policy("fast", "cpu") == "gguf" and dev.weight_policy("exact", "cpu") == "exact"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            dev.kernels_on("cuda")
    monkeypatch.setenv("BOLT_KERNELS", "bogus")
    with pytest.raises(ValueError, match="BOLT_KERNELS"):
        dev.kernels_on("cpu")

    monkeypatch.setenv("BOLT_KERNELS", "triton")
    gf = GGUFFile(gguf_path)
    tri = _model(gf, "fast")
    cache = tri.new_cache(32, max_step=8)
    assert not decoders.cuda_graphs_on(tri)
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        decoders.CudaGraphStep(tri, cache)
    monkeypatch.setenv("BOLT_KERNELS", "torch")
    plain = _model(gf, "fast")
    with pytest.raises(ValueError, match="position-indexed"):
        decoders.StaticDecodeStep(plain, plain.new_cache(32, max_step=8))  # ring caches, torch path
    assert ops.Span(5, 9, 4).rows(slice(-1, None)) == ops.Span(8, 9, 4)  # sliced like the [T, S] mask it replaces
    gf.close()
