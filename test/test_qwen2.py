"""Qwen2 on the real Qwen2.5-Coder-0.5B-Instruct Q4_K_M file: config from its metadata, Q/K/V biases, a greedy chat
answer through its own chat template, and logits equal to HF transformers' fp32 Qwen2 under our exact policy.

The reference is transformers' GGUF loader (gguf-py dequantizes, transformers' Qwen2 modelling runs) on a copy of the
file without the tokenizer arrays: its GGUFReader spends ~15 s per open parsing 151k tokens and 151k merges in Python,
and from_pretrained opens the file twice, while the model needs none of it. Tensors and hyper-parameters are the same
bytes and values. One fp32 model is in memory at a time (ours, then theirs: ~2 GB each).
"""
from __future__ import annotations

import dataclasses
import gc
import math

import numpy as np
import pytest
import torch

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.engine.default_models import resolve_model
from bolt_ros.engine.gguf.reader import GGUFFile, torch_shape
from bolt_ros.engine.model.config import config_from_gguf

QWEN = "qwen2.5-coder-0.5b"  # by its own name: "default-chat" may point at another model while that choice changes
QUESTION = [{"role": "user", "content": "What is 2 + 3? Reply with just the number."}]


@pytest.fixture(scope="module")
def gguf():
    gf = GGUFFile(resolve_model(QWEN))
    yield gf
    gf.close()


def test_config_from_qwen2_metadata(gguf):
    cfg = config_from_gguf(gguf)
    n = cfg.n_layer
    assert (cfg.arch, n, cfg.n_embd, cfg.n_head, cfg.n_vocab, cfg.n_ctx_train) == ("qwen2", 24, 896, 14, 151936, 32768)
    assert cfg.n_head_kv == [2] * n and cfg.head_dim == [64] * n and cfg.n_ff == [4864] * n
    assert cfg.rope_style == "neox"  # llama.cpp: LLM_ARCH_QWEN2 -> LLAMA_ROPE_TYPE_NEOX (HF: rotate_half)
    assert cfg.rope_base == [1e6] * n and cfg.rope_dim == [64] * n
    assert cfg.rms_eps == pytest.approx(1e-6, rel=1e-6)  # stored as f32 9.99999997e-07
    assert cfg.attn_bias and not (cfg.qk_norm or cfg.v_norm or cfg.post_norms)
    assert cfg.activation == "silu" and cfg.embed_scale == 1.0 and cfg.attn_scale == pytest.approx(1 / 8)
    assert not any(cfg.swa) and cfg.sliding_window is None and cfg.final_softcap is None and cfg.ple_dim == 0
    assert cfg.tied_output == ("output.weight" not in gguf.tensors)  # this file ships its own output.weight
    for il in (0, n - 1):  # biases: [n_head * hd] for Q, [n_kv * hd] for K and V, f32
        shapes = [torch_shape(gguf.info(f"blk.{il}.attn_{x}.bias")) for x in "qkv"]
        assert shapes == [(896,), (128,), (128,)]


@pytest.fixture(scope="module")
def ours():
    """Our exact-policy engine: a greedy chat answer, then teacher-forced logits over prompt + answer [T, vocab]."""
    engine = Engine.load(QWEN, n_ctx=256, policy="exact")
    tok = engine.tok
    prompt = tok.encode_segments(engine.chat_format.render(QUESTION), add_bos=True)
    res = engine.generate(prompt, SamplingParams(max_tokens=12))
    answer = res.completion_ids + ([tok.eos_id] if res.finish_reason == "eos" else [])  # the stop token is not kept
    ids = prompt + answer
    logits = engine.forward(engine.new_session(), ids, logits="all")  # [T, vocab]
    # the Q bias alone is what makes these logits: dropping it changes them far beyond any rounding error
    heads = [b.heads for b in engine.model.blocks]
    for b in engine.model.blocks:
        b.heads = dataclasses.replace(b.heads, bias=None)
    unbiased = engine.forward(engine.new_session(), ids, logits="all")
    for b, h in zip(engine.model.blocks, heads):
        b.heads = h
    out = dict(prompt=prompt, result=res, answer=answer, ids=ids, logits=logits, unbiased=unbiased, tok=tok)
    del engine
    gc.collect()
    return out


def test_greedy_chat_answer(ours):
    res, tok = ours["result"], ours["tok"]
    prompt_text = tok.decode(ours["prompt"])
    assert prompt_text.startswith("<|im_start|>system\n") and prompt_text.endswith("<|im_start|>assistant\n")
    assert res.finish_reason == "eos" and ours["answer"][-1] == tok.token_id("<|im_end|>")
    assert res.text.strip() == "5", res.text


def _strip_tokenizer(src: GGUFFile, dst) -> None:
    """A copy of src without tokenizer.* keys (same tensor bytes, same hyper-parameters) for transformers' loader."""
    import gguf as ggufpy

    w = ggufpy.GGUFWriter(str(dst), src.arch())
    for key, value in src.metadata.items():
        if key.startswith("tokenizer.") or key == "general.architecture":
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:  # this file has no array-valued hyper-parameters; a silently dropped one would skew the reference
            raise TypeError(f"{key}: unexpected metadata value {type(value).__name__}")
    w.add_uint32(f"{src.arch()}.vocab_size", len(src.metadata["tokenizer.ggml.tokens"]))  # else from the tokens
    for name, info in src.tensors.items():
        raw = np.asarray(src.raw(name))
        qtype = ggufpy.GGMLQuantizationType(info.ggml_type)
        if qtype == ggufpy.GGMLQuantizationType.F32:
            w.add_tensor(name, raw.view(np.float32).reshape(torch_shape(info)))
        else:  # quantized: raw blocks, byte shape [rows, bytes per row]
            rows = math.prod(info.shape[1:])
            w.add_tensor(name, raw.reshape(rows, -1), raw_shape=raw.reshape(rows, -1).shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def theirs(ours, gguf, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("qwen2_ref") / "qwen2-no-tokenizer.gguf"
    _strip_tokenizer(gguf, path)
    ref = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    path.unlink()
    assert type(ref).__name__ == "Qwen2ForCausalLM" and ref.model.layers[0].self_attn.q_proj.bias is not None
    with torch.no_grad():
        logits = ref(torch.tensor([ours["ids"]])).logits[0]  # [T, vocab]
    del ref
    gc.collect()
    return logits


def test_exact_policy_equals_transformers(ours, theirs):
    """Both sides are fp32 over the same dequantized weights; only summation order differs (our fused QKV and
    gate/up matmuls, attention kernels, the chunked head). fp32 rounding is ~6e-8 relative per operation; over 24
    layers of 896-4864-wide sums and a residual stream that grows to a few hundred, differences stay near 1e-5 of
    the logit scale (|logit| <= ~35 here): measured max 9.2e-5 on the logits. 1e-3 leaves a 10x margin, while any
    real mistake (a missing bias, the wrong rope pairing, eps) moves logits by whole units."""
    mine = ours["logits"]
    assert mine.shape == theirs.shape
    diff = float((mine - theirs).abs().max())
    lp_diff = float((torch.log_softmax(mine, -1) - torch.log_softmax(theirs, -1)).abs().max())
    assert diff < 1e-3 and lp_diff < 1e-3, (diff, lp_diff)
    top2 = theirs.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-3  # rows whose best token is not a near-tie
    assert torch.equal(mine.argmax(-1)[clear], theirs.argmax(-1)[clear])
    # the greedy answer (prefill + cached decode steps) is transformers' argmax at every clear step
    k = len(ours["prompt"])
    steps = slice(k - 1, len(ours["ids"]) - 1)  # rows predicting the completion tokens
    answer = torch.tensor(ours["answer"])
    assert torch.equal(answer[clear[steps]], theirs[steps].argmax(-1)[clear[steps]])
    # and the biases matter: without them our logits are far from the reference
    assert float((ours["unbiased"] - theirs).abs().max()) > 1.0
