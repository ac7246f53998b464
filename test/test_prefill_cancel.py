"""Barge-in during a long prefill on the real engine (Gemma 3 270M, a 3K-token prompt): the cancel is seen between
layers, the generation ends "cancelled" within 100 ms, and the chunks already committed stay reusable."""
from __future__ import annotations

import threading
import time

import pytest

from bolt_ros.engine.decode.generate import Engine, GenerationResult
from bolt_ros.engine.decode.sampling import SamplingParams

PROMPT_TOKENS = 3000


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load("default", n_ctx=4096)


def _prompt(engine: Engine) -> list[int]:
    ids = engine.tok.encode("The robot walked along the beach and counted the waves one by one. " * 300, add_bos=True)
    return ids[:PROMPT_TOKENS]


def _run(engine, ids, cancel, at_s):
    session, out = engine.new_session(), {}
    if at_s is not None:
        def later():
            time.sleep(at_s)
            out["t_cancel"] = time.perf_counter()
            cancel.set()
        threading.Thread(target=later, daemon=True).start()
    for ev in engine.stream(ids, SamplingParams(max_tokens=4), session=session, cancel=cancel):
        if isinstance(ev, GenerationResult):
            out["t_end"], out["result"] = time.perf_counter(), ev
    return session, out


@pytest.mark.realtime
def test_a_cancel_during_a_3k_prefill_ends_it_within_100ms(engine):
    ids = _prompt(engine)
    assert len(ids) == PROMPT_TOKENS
    session, out = _run(engine, ids, threading.Event(), at_s=0.5)
    res = out["result"]
    assert res.finish_reason == "cancelled" and res.completion_ids == []
    latency = out["t_end"] - out["t_cancel"]
    assert latency < 0.1, f"prefill stopped {latency * 1e3:.0f} ms after the cancel"
    # the committed chunks are whole steps of the prompt, and the next prefill reuses them
    kept = len(session.tokens)
    assert kept % session.cache.max_step == 0 and kept < PROMPT_TOKENS and session.tokens == ids[:kept]
    logits = engine.prefill(session, ids)
    assert session.last_prefill == PROMPT_TOKENS - kept and logits.shape[-1] == engine.cfg.n_vocab


def test_an_uncancelled_prefill_is_unaffected_by_the_check(engine):
    ids = _prompt(engine)[:600]
    _, out = _run(engine, ids, threading.Event(), at_s=None)
    assert out["result"].finish_reason == "length" and len(out["result"].completion_ids) == 4
    ref = engine.generate(ids, SamplingParams(max_tokens=4))  # no cancel event at all
    assert ref.completion_ids == out["result"].completion_ids
