"""Numerical fidelity against llama.cpp on the real models (fixtures from bench/make_fidelity_fixtures.py).

Teacher-forced on llama.cpp's own greedy continuation: our top-1 must agree with llama.cpp's chosen token and our
log-probability of that token must be close to llama.cpp's. (llama.cpp quantizes activations and flips near-ties,
so exact greedy strings are not the bar: platform-notes.md.)
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bolt_ros.engine.decode.generate import Engine

FIXTURES = Path(__file__).parent / "fixtures"


def score(engine: Engine, fixture: str) -> dict:
    data = json.loads((FIXTURES / fixture).read_text())
    agree = total = 0
    diffs, top5_overlap = [], []
    for case in data["cases"]:
        prompt, cont = case["prompt_ids"], case["completion_ids"]
        session = engine.new_session()
        logits = engine.forward(session, prompt + cont, logits="all")[len(prompt) - 1: -1]  # [C, vocab]
        lp = torch.log_softmax(logits.float(), dim=-1)
        ours_top1 = lp.argmax(-1).tolist()
        for i, tok in enumerate(cont):
            total += 1
            agree += ours_top1[i] == tok
            diffs.append(abs(float(lp[i, tok]) - case["logprobs"][i]))
            theirs = {t for t, _ in case["top5"][i]}
            top5_overlap.append(len(theirs & set(lp[i].topk(5).indices.tolist())) / 5)
    return {"prompts": len(data["cases"]), "tokens": total, "top1_agreement": agree / total,
            "mean_abs_logprob_diff": sum(diffs) / len(diffs), "top5_overlap": sum(top5_overlap) / len(top5_overlap)}


@pytest.mark.parametrize(("model", "fixture"), [("default", "fidelity_gemma3.json"),
                                                ("smollm2", "fidelity_smollm2.json")])
def test_teacher_forced_agreement_with_llama_cpp(model, fixture):
    engine = Engine.load(model, n_ctx=512)
    s = score(engine, fixture)
    print(f"\n{model}: {s}")
    assert s["prompts"] >= 20 and s["tokens"] >= 20 * 64
    # Measured: Gemma 3 270M 97.6 % / 0.028 nat, SmolLM2 97.5 % / 0.034 nat (the fp32 "exact" policy, and our decode
    # path token by token, give the same). HF transformers on the same GGUF agrees with llama.cpp exactly as well as
    # we do (Gemma 97.6 % / 0.028 nat; we equal transformers: test below), and llama.cpp agrees with its own greedy
    # decode on 98.0 % of the Gemma positions when it evaluates them batched (bench/llamacpp_self_agreement.py).
    # llama.cpp's own settings do not move it: fixtures made with flash attention off, an f32 KV cache or weight
    # repacking off score 97.3-97.9 % (make_fidelity_fixtures.py --server-args); emulating its Q8 activations or f16
    # KV cache in our engine scores 96.9-97.6 %. Guard against regressions.
    assert s["top1_agreement"] >= 0.965, s
    assert s["mean_abs_logprob_diff"] <= 0.05, s
    assert s["top5_overlap"] >= 0.9, s  # ranks far below the top come from the 4-bit head (linear.HEAD_MARGIN)


@pytest.mark.parametrize(("model", "fixture"), [("default", "fidelity_gemma3.json"),
                                                ("smollm2", "fidelity_smollm2.json")])
def test_exact_policy_equals_transformers_on_the_real_models(model, fixture):
    """The second numerical reference: transformers' own GGUF loader (it dequantizes to fp32) on the same file.
    Our exact policy must give its log-probabilities, teacher-forced on llama.cpp's continuations."""
    import gc
    import os

    from transformers import AutoModelForCausalLM

    from bolt_ros.engine.default_models import resolve_model

    path = resolve_model(model)
    cases = json.loads((FIXTURES / fixture).read_text())["cases"][:3]
    ref = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                               dtype=torch.float32).eval()

    def picked(logits: torch.Tensor, case: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities of the continuation tokens, argmax ids) over the continuation rows."""
        k = len(case["prompt_ids"]) - 1
        lp = torch.log_softmax(logits[k: k + len(case["completion_ids"])].float(), -1)
        return lp.gather(1, torch.tensor(case["completion_ids"])[:, None])[:, 0], lp.argmax(-1)

    with torch.no_grad():
        theirs = [picked(ref(torch.tensor([c["prompt_ids"] + c["completion_ids"]])).logits[0], c) for c in cases]
    del ref  # one fp32 model in memory at a time (CI machines are small)
    gc.collect()
    engine = Engine.load(model, n_ctx=512, policy="exact")
    worst = 0.0
    for case, (lp_ref, top_ref) in zip(cases, theirs):
        lp, top = picked(engine.forward(engine.new_session(), case["prompt_ids"] + case["completion_ids"],
                                        logits="all"), case)
        worst = max(worst, float((lp - lp_ref).abs().max()))
        assert torch.equal(top, top_ref)
    # measured: max 3e-5 nat (Gemma 3), 1e-5 (SmolLM2); mean ~1.5e-6
    assert worst < 1e-3, worst
