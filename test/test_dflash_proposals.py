"""What a DFlash draft may propose: the drafter file's draft vocabulary (`dflash.draft_vocab`, the tokens it was
trained to predict) and nothing past a stop token. Both only change what is verified, never what is committed.

The agreeing pair of test_dflash.py (an echo target, a copy drafter that proposes "repeat the anchor") makes the
proposals predictable: on PROMPTS[0] the target writes 45458 x 7, 2947, then 10904 over and over.
"""
from __future__ import annotations

import pytest
from gguf import GGUFValueType as VT
from test_dflash import PROMPTS, _copy_gguf, _drafter, _target, _write_pair

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import Sampler, SamplingParams
from bolt_ros.engine.gguf.reader import GGUFError

GATED = {"p_min": 1e-9, "anchor_min": 0.0}  # every slot passes the gate: drafts are the drafter's proposals


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("proposals")
    target = _target(2, echo=0.2)
    return (*_write_pair(root, "agree", target, _drafter(3, target, copy=True, n_kv=4)), root)


def _with_vocab(pair, name: str, vocab) -> str:
    out = pair[2] / f"{name}.gguf"
    _copy_gguf(pair[1], out, set_kv={"dflash.draft_vocab": (vocab, VT.ARRAY, VT.UINT32)})
    return str(out)


def _drafted(engine: Engine, prompt: list[int], n: int = 24):
    plain = engine.generate(prompt, SamplingParams(max_tokens=n), use_draft=False)
    dec_log = []
    decoder = engine.draft.decoder

    def keep_log(*a, **k):
        d = decoder(*a, **k)
        dec_log.append(d)
        return d

    engine.draft.decoder = keep_log
    try:
        spec = engine.generate(prompt, SamplingParams(max_tokens=n))
    finally:
        del engine.draft.decoder
    assert spec.completion_ids == plain.completion_ids  # whatever is proposed, the output is the target's
    return spec, [t for drafts, _ in dec_log[0].log for t in drafts]


def test_drafts_come_from_the_draft_vocabulary(pair):
    full = Engine.load(pair[0], draft=pair[1], n_ctx=512, draft_options=GATED)
    spec_full, drafted_full = _drafted(full, PROMPTS[0])
    assert {2947, 10904} <= set(drafted_full)  # the copy drafter proposes every anchor it meets
    vocab = [45458, 10904, 2947, 17]
    engine = Engine.load(pair[0], draft=_with_vocab(pair, "vocab", vocab), n_ctx=512, draft_options=GATED)
    assert engine.draft.model.cfg.draft_vocab == sorted(vocab) and engine.draft.model.draft_head.out_features == 4
    spec, drafted = _drafted(engine, PROMPTS[0])
    assert set(drafted) <= set(vocab) and spec.spec["tokens_per_pass"] == spec_full.spec["tokens_per_pass"]
    # negative control: a vocabulary without the reply's later tokens proposes wrong ones, so less is accepted
    narrow = Engine.load(pair[0], draft=_with_vocab(pair, "narrow", [45458, 17]), n_ctx=512, draft_options=GATED)
    spec_narrow, drafted_narrow = _drafted(narrow, PROMPTS[0])
    assert set(drafted_narrow) <= {45458, 17} and spec_narrow.spec["tokens_per_pass"] < 0.5 * spec.spec[
        "tokens_per_pass"]
    # the option turns it off; the fixed policy without a grammar (the reference loop) keeps the whole head anyway
    off = Engine.load(pair[0], draft=_with_vocab(pair, "off", [45458, 17]), n_ctx=512,
                      draft_options={**GATED, "draft_vocab": False})
    assert off.draft.model.draft_ids is None and _drafted(off, PROMPTS[0])[1] == drafted_full
    ref = Engine.load(pair[0], draft=_with_vocab(pair, "ref", [45458, 17]), n_ctx=512,
                      draft_options={"adaptive": False, "p_min": 0.0})
    assert {2947, 10904} <= set(_drafted(ref, PROMPTS[0])[1])


@pytest.mark.parametrize("vocab, vt, match", [([45458, 49152], VT.UINT32, "outside the target"),
                                              ([1.5, 2.0], VT.FLOAT32, "integers"), ([True], VT.BOOL, "integers")])
def test_a_bad_draft_vocabulary_is_refused(pair, vocab, vt, match):
    bad = pair[2] / "bad.gguf"
    _copy_gguf(pair[1], bad, set_kv={"dflash.draft_vocab": (vocab, VT.ARRAY, vt)})
    with pytest.raises(GGUFError, match=match):
        Engine.load(pair[0], draft=bad, n_ctx=512)


def test_a_draft_ends_at_a_stop_token_which_the_row_before_it_verifies(pair, monkeypatch):
    """Stop = 45458, the target's next token after the prompt: the first step's anchor is that stop, the copy
    drafter proposes it seven times, the draft keeps one, and the verify pass is the anchor's row alone."""
    engine = Engine.load(pair[0], draft=pair[1], n_ctx=512, draft_options=GATED)
    rows: list[int] = []
    forward = engine.model.forward
    monkeypatch.setattr(engine.model, "forward", lambda ids, *a, **k: rows.append(len(ids)) or forward(ids, *a, **k))
    for stops, drafts, verify_rows in ((frozenset({45458}), [45458], 1), (frozenset(), [45458] * 7, 8)):
        dec = engine.draft.decoder(engine, engine.new_session(), Sampler(SamplingParams()), stops)
        dec.prefill(PROMPTS[0])
        first = dec.step(list(PROMPTS[0]))
        rows.clear()
        new = dec.step(list(PROMPTS[0]) + first)
        assert first == [45458] and dec.log == [(drafts, 1 if stops else 6)]
        assert rows == [verify_rows]
        assert new == ([45458] if stops else [45458] * 6 + [2947])  # nothing is committed after a stop
        assert dec.session.cache.n_past == len(PROMPTS[0]) + len(first) + len(new) - 1
    # end to end with a stop inside a reply: the same tokens as plain decoding
    plain = engine.generate(PROMPTS[0], SamplingParams(max_tokens=24, stop_token_ids=[10904]), use_draft=False)
    spec = engine.generate(PROMPTS[0], SamplingParams(max_tokens=24, stop_token_ids=[10904]))
    assert spec.completion_ids == plain.completion_ids and spec.finish_reason == plain.finish_reason == "eos"
