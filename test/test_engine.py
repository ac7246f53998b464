"""Generation on the real SmolLM2-135M-Instruct: streaming, stops, cancellation, prefix reuse, sampling."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from bolt_ros.engine.generate import Engine, GenerationResult, TokenEvent
from bolt_ros.engine.sampling import SamplingParams, distribution


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load("default-chat", n_ctx=1024)


def chat_ids(engine: Engine, text: str) -> list[int]:
    return engine.chat_format.encode([{"role": "user", "content": text}])


def test_chat_answer_is_sensible(engine):
    res = engine.generate(chat_ids(engine, "What is the capital of France?"), SamplingParams(max_tokens=24))
    assert "Paris" in res.text
    assert res.finish_reason == "eos"  # <|im_end|> ends the turn
    assert res.timings.ttft_s > 0 and res.timings.prefill_tokens == len(res.prompt_ids)


def close_logprobs(a: torch.Tensor, b: torch.Tensor) -> None:
    """Same next-token choice and nearly the same distribution. The fast path multiplies in bf16 (as llama.cpp
    quantizes activations), so batched and one-token steps differ by rounding, not by more."""
    la, lb = torch.log_softmax(a.float(), -1), torch.log_softmax(b.float(), -1)
    assert torch.equal(la.argmax(-1), lb.argmax(-1))
    top = la.topk(20, dim=-1).indices  # where the probability mass is
    diff = (la.gather(-1, top) - lb.gather(-1, top)).abs()
    assert diff.mean() < 0.05 and diff.max() < 0.5, (diff.mean(), diff.max())


def test_batched_prefill_matches_incremental_decode(engine):
    ids = chat_ids(engine, "Name three colours.")
    s = engine.new_session()
    full = engine.forward(s, ids, logits="all")  # [T, vocab]
    s2 = engine.new_session()
    engine.forward(s2, ids[:-4])
    steps = torch.stack([engine.forward(s2, [t]) for t in ids[-4:]])
    close_logprobs(steps, full[-4:])


def test_streaming_reassembles_text_and_never_splits_utf8(engine):
    prompt = chat_ids(engine, "Write the word 'café' and an emoji of a robot, then stop.")
    events = list(engine.stream(prompt, SamplingParams(max_tokens=40)))
    result = events[-1]
    assert isinstance(result, GenerationResult)
    deltas = [e for e in events[:-1] if isinstance(e, TokenEvent)]
    assert "".join(d.text for d in deltas) == result.text
    for d in deltas:
        d.text.encode("utf-8")  # a split character would be a lone surrogate and fail to encode


def test_max_tokens_and_stop_strings(engine):
    prompt = chat_ids(engine, "Describe a sunny day at the beach in two sentences.")
    res = engine.generate(prompt, SamplingParams(max_tokens=5))
    assert len(res.completion_ids) == 5 and res.finish_reason == "length"
    full = engine.generate(prompt, SamplingParams(max_tokens=40)).text
    words = full.split()
    assert len(words) > 6, full
    stop = " " + words[4]  # a stop string in the middle of the greedy reply
    cut = full.index(stop)
    stopped = engine.generate(prompt, SamplingParams(max_tokens=40, stop=[stop, "zzzz-never"]))
    assert stopped.finish_reason == "stop"
    assert stopped.text == full[:cut]


def test_cancel_from_another_thread(engine):
    cancel = threading.Event()
    prompt = chat_ids(engine, "Tell me a very long story about a robot.")
    n = 0
    t0 = time.perf_counter()
    for ev in engine.stream(prompt, SamplingParams(max_tokens=500, temperature=0.8, seed=1), cancel=cancel):
        if isinstance(ev, GenerationResult):
            result = ev
            break
        n += 1
        if n == 3:
            threading.Thread(target=cancel.set).start()
    assert result.finish_reason == "cancelled"
    assert len(result.completion_ids) < 20
    assert time.perf_counter() - t0 < 30


def test_prefix_reuse_prefills_only_new_tokens(engine):
    chat = engine.chat_session(system="You are a friendly robot. Answer in one short sentence.")
    history = [{"role": "user", "content": "Hi! What is your name?"}]
    first = [ev for ev in chat.stream(history, sampling=SamplingParams(max_tokens=20))][-1]
    assert first.prefill_tokens == first.prompt_tokens
    history += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And how old are you?"}]
    second = [ev for ev in chat.stream(history, sampling=SamplingParams(max_tokens=20))][-1]
    assert second.prompt_tokens > first.prompt_tokens
    # only the new turn (and at most the re-tokenized reply) is run again
    assert second.prefill_tokens <= second.prompt_tokens - first.prompt_tokens + first.completion_tokens + 2
    assert second.prefill_tokens < second.prompt_tokens // 2


def test_prefix_reuse_gives_same_logits_as_fresh_prefill(engine):
    a = chat_ids(engine, "Tell me about robots.")
    b = chat_ids(engine, "Tell me about rockets.")
    s = engine.new_session()
    engine.prefill(s, a)
    reused = engine.prefill(s, b)
    assert s.last_prefill < len(b)
    fresh = engine.prefill(engine.new_session(), b)
    close_logprobs(reused[None], fresh[None])


def test_seeded_sampling_is_reproducible_and_varies_with_seed(engine):
    prompt = chat_ids(engine, "Invent a name for a robot.")
    p = dict(max_tokens=12, temperature=1.0, top_p=0.95)
    a = engine.generate(prompt, SamplingParams(**p, seed=7)).completion_ids
    b = engine.generate(prompt, SamplingParams(**p, seed=7)).completion_ids
    others = {tuple(engine.generate(prompt, SamplingParams(**p, seed=s)).completion_ids) for s in range(8, 12)}
    assert a == b
    assert len(others | {tuple(a)}) > 1


def test_logprobs_are_teacher_forced(engine):
    prompt = chat_ids(engine, "What is the capital of France?")
    res = engine.generate(prompt, SamplingParams(max_tokens=8))
    rows = engine.logprobs(prompt, res.completion_ids, top=3)
    assert [r["top"][0][0] for r in rows] == res.completion_ids  # greedy tokens are the teacher-forced argmax
    assert all(r["logprob"] <= 0 and len(r["top"]) == 3 for r in rows)


def test_distribution_transforms():
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0])
    greedy = distribution(logits, SamplingParams(), [])
    assert greedy.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    top2 = distribution(logits, SamplingParams(temperature=1.0, top_k=2), [])
    assert (top2[2:] == 0).all() and torch.isclose(top2.sum(), torch.tensor(1.0))
    p = torch.softmax(logits, -1)
    top_p = distribution(logits, SamplingParams(temperature=1.0, top_p=float(p[0]) + 1e-3), [])
    assert (top_p > 0).tolist() == [True, True, False, False, False]
    min_p = distribution(logits, SamplingParams(temperature=1.0, min_p=0.3), [])
    assert ((min_p > 0) == (p >= 0.3 * p.max())).all()
    pen = distribution(logits, SamplingParams(repetition_penalty=4.0), [0])
    assert int(pen.argmax()) == 1  # 2.0/4 < 1.0: the repeated token loses its lead
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)


def test_bad_prompts_are_rejected(engine):
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="does not fit"):
        engine.generate([1] * 2000, SamplingParams(max_tokens=1))
