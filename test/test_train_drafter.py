"""`bolt train-drafter` end to end on a small real target (SmolLM2 135M): self-distillation data from its own replies
to assistant prompts, training steps that lower the loss, checkpoints that resume, and a drafter GGUF our engine
loads and decodes with losslessly."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.train.drafter import TrainConfig, _vocab_rows, train_drafter

TINY = dict(prompts=3, max_new=12, layers=1, anchors=4, target_layers=2, checkpoint_every=10, lr=3e-3)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "smol-drafter.gguf"
    res = train_drafter("smollm2", out, TrainConfig(steps=20, **TINY), threads=2, progress=False)
    return out, res


def test_training_lowers_the_loss_and_writes_a_drafter_the_engine_runs(trained):
    out, res = trained
    assert res["samples"] == 3 and not res["data_cached"] and res["final_loss"] < res["first_loss"], res
    engine = Engine.load("smollm2", draft=out, n_ctx=2048)
    assert engine.draft.model.cfg.n_layer == 1 and len(engine.draft.model.cfg.target_layers) == 2
    ids = engine.tok.encode("Hello, how are", add_bos=True)
    plain = engine.generate(ids, SamplingParams(max_tokens=12), use_draft=False)
    spec = engine.generate(ids, SamplingParams(max_tokens=12))
    assert spec.completion_ids == plain.completion_ids and spec.spec["target_passes"] > 0
    # the draft vocabulary written beside it: every label of the training replies
    from bolt_ros.train.data import Dataset
    ds = Dataset.from_state(torch.load(out.with_suffix(".data.pt"), weights_only=False))
    labels = {t for s in ds.samples if len(s.tokens) - s.reply_start >= 2 for t in s.tokens[s.reply_start:]}
    assert engine.draft.model.cfg.draft_vocab == sorted(labels) and engine.draft.model.draft_ids is not None


def test_resume_continues_from_the_checkpoint_and_reuses_the_data(trained):
    out, _ = trained
    assert out.with_suffix(".ckpt").exists() and out.with_suffix(".data.pt").exists()
    res = train_drafter("smollm2", out, TrainConfig(steps=24, **TINY), threads=2, resume=True, progress=False)
    assert res["resumed_from"] == 20 and res["steps"] == 24 and res["data_cached"]  # no new replies generated


def test_sampled_softmax_rows_hold_every_label():
    support, labels = torch.tensor([5, 9, 20]), torch.tensor([[9, 20, -100], [5, 5, 9]])
    rows, idx = _vocab_rows(support, labels, 4, 30, torch.Generator().manual_seed(0))
    assert torch.equal(rows, torch.unique(rows)) and set(support.tolist()) <= set(rows.tolist())
    assert len(rows) > len(support)  # random negatives beside the data's tokens
    assert torch.equal(torch.where(idx >= 0, rows[idx.clamp_min(0)], idx), labels)  # same token, -100 kept
    assert _vocab_rows(support, labels, 0, 30, None) == (None, labels)  # 0 = the full vocabulary


def test_full_softmax_training_lowers_the_loss(tmp_path):  # the fixture trains with the default sampled softmax
    res = train_drafter("smollm2", tmp_path / "d.gguf", TrainConfig(steps=20, negatives=0, **TINY), threads=2,
                        progress=False)
    assert res["final_loss"] < res["first_loss"], res


def test_cli_refuses_bad_settings(tmp_path):
    res = subprocess.run([sys.executable, "-m", "bolt_ros.cli", "train-drafter", "--target", "smollm2", "--out",
                          str(tmp_path / "d.gguf"), "--steps", "0"], capture_output=True, text=True)
    assert res.returncode != 0 and "steps" in (res.stderr + res.stdout)
    json.dumps(TINY)


def test_a_fine_tune_starts_from_the_drafter_it_is_given(trained, tmp_path):
    # --init copies the drafter's weights: its first loss on the same data is the trained one's, far below a fresh
    # start's (res["first_loss"] of the fixture, ~random), and its draft vocabulary is kept beside the new labels
    out, res = trained
    data = tmp_path / "ft.data.pt"
    data.write_bytes(out.with_suffix(".data.pt").read_bytes())  # the same replies (no new generation)
    ft = train_drafter("smollm2", tmp_path / "ft.gguf", TrainConfig(steps=2, init=str(out), **TINY), threads=2,
                       progress=False)
    assert ft["data_cached"] and ft["first_loss"] < 0.8 * res["first_loss"], (ft, res)
    engine = Engine.load("smollm2", draft=tmp_path / "ft.gguf", n_ctx=2048)
    assert set(Engine.load("smollm2", draft=out, n_ctx=2048).draft.model.cfg.draft_vocab) <= set(
        engine.draft.model.cfg.draft_vocab)


def test_words_turns_are_rendered_as_the_assistant_renders_a_talk_turn():
    from bolt_ros.assistant.conversation import MEMORY_HEADER
    from bolt_ros.train.prompts import (
        HELD_OUT_CHAT,
        WordsTurn,
        assistant_messages,
        chat_turns,
        script_talk_turns,
        talk_turns,
        words_messages,
    )

    system = assistant_messages("hi")[0][0]
    plain = words_messages("How are you?")
    assert plain == [system, {"role": "user", "content": "How are you?"}]  # no tools are passed: none are shown
    msgs = words_messages(WordsTurn("And you?", (("Hello!", ""), ("Dance!", "you played your dance animation"))),
                          reply_for={"Hello!": "Hi, I'm Bolt."}.get)
    assert msgs[1]["role"] == "system" and msgs[1]["content"].startswith(MEMORY_HEADER)
    assert '"Hi, I\'m Bolt."' in msgs[1]["content"] and "you played your dance animation" in msgs[1]["content"]
    scripted = script_talk_turns()
    assert len(scripted) > 100 and any(t.caption for t in scripted) and any(t.earlier for t in scripted)
    chat = chat_turns(1500)
    assert len({t.say for t in chat}) == 1500 and any(t.earlier for t in chat)  # distinct; some after earlier turns
    trained = {t.say.lower() for t in talk_turns(300) + scripted + chat}
    assert len(HELD_OUT_CHAT) >= 8 and not {t.say.lower() for t in HELD_OUT_CHAT} & trained
    # negative control: the filter is what keeps a held-out utterance out of a frame's output
    from bolt_ros.train.chat_prompts import chat_utterances
    assert "Are cats smart?" in chat_utterances(2000)
    assert "Are cats smart?" not in chat_utterances(2000, held={"are cats smart?"})
