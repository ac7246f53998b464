"""DFlash speculative decoding: loading, reference cross-check, losslessness (greedy and sampled), acceptance.

Targets are tiny random models built in torch (HF Llama) or by the test-model writer; drafters are z-lab
`DFlashDraftModel`s (the `dflash` wheel) written to GGUF by our writer, so the reference and our engine run the same
weights. The "agreeing" pair is built by hand so that acceptance is predictable:
  * echo target: unit-norm tied embeddings and (nearly) silent layers, so its greedy next token is mostly the current
    token (the final RMSNorm + tied head pick the embedding row closest to the input row);
  * copy drafter: context injection off (encoder norm 0), q = 0 so every block query attends uniformly, V projects out
    the MASK direction and O amplifies, so every MASK slot carries the anchor's embedding: it proposes "repeat the
    anchor", i.e. what the echo target does.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dflash.model import DFlashDraftModel, dflash_generate
from gguf import GGUFReader, GGUFWriter
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config

from bolt_ros.devtools.testmodel import write_model, write_random_model
from bolt_ros.engine.decode.dflash import attach_drafter
from bolt_ros.engine.decode.generate import Engine, Session
from bolt_ros.engine.decode.sampling import Sampler, SamplingParams

V, H, MASK = 49152, 64, 3  # SmolLM2 vocabulary (the llama writer's tokenizer), tiny width
PROMPTS = [[1, 500, 600, 700, 800, 900], [1, 42, 4242, 17, 30000], [1, 7, 7, 7, 123, 9999, 31]]


# --- building the models ------------------------------------------------------------------------------------------
def _target(seed: int, echo: float | None = None) -> LlamaForCausalLM:
    """Random tiny Llama; echo=alpha scales every layer's output projections (0 = pure echo model)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                      tie_word_embeddings=True, max_position_embeddings=512)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / math.sqrt(p.shape[1]) * (8 if "embed" in name else 1))
        if echo is not None:
            e = m.model.embed_tokens.weight
            e.copy_(e / e.norm(dim=1, keepdim=True))
            m.model.norm.weight.fill_(1.0)
            for layer in m.model.layers:
                layer.self_attn.o_proj.weight.mul_(echo)
                layer.mlp.down_proj.weight.mul_(echo)
    return m


def _drafter(seed: int, target: LlamaForCausalLM, copy: bool = False, n_kv: int = 2) -> DFlashDraftModel:
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=n_kv, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_position_embeddings=512, num_target_layers=6,
                      dflash_config={"target_layer_ids": [1, 3], "block_size": 8, "mask_token_id": MASK})
    d = DFlashDraftModel(cfg).eval()
    with torch.no_grad():
        for _, p in d.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if p.ndim == 1 else torch.randn_like(p) / math.sqrt(p.shape[1]))
        if copy:
            assert n_kv == 4
            u = target.model.embed_tokens.weight[MASK]
            u = u / u.norm()
            d.hidden_norm.weight.zero_()  # injected context rows: K = V = 0
            d.norm.weight.fill_(1.0)
            for il, layer in enumerate(d.layers):
                layer.input_layernorm.weight.fill_(1.0)
                layer.self_attn.q_proj.weight.zero_()  # uniform attention over context + block
                layer.self_attn.v_proj.weight.copy_(torch.eye(H) - torch.outer(u, u))  # drop the MASK rows' values
                layer.self_attn.o_proj.weight.copy_(torch.eye(H) * (1000.0 if il == 0 else 0.0))
                layer.mlp.down_proj.weight.zero_()
    return d


def _write_pair(dirpath, name: str, target, drafter) -> tuple[str, str]:
    t, d = str(dirpath / f"{name}.gguf"), str(dirpath / f"{name}-draft.gguf")
    write_model(t, "llama", dict(n_layer=6, n_embd=H, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, vocab_size=V,
                                 rope_base=10000.0, rms_eps=1e-6, context_length=512), target.state_dict())
    n_kv = drafter.config.num_key_value_heads
    write_model(d, "dflash", dict(n_layer=2, n_embd=H, n_head=4, n_head_kv=n_kv, head_dim=16, n_ff=128, vocab_size=V,
                                  rope_base=10000.0, rms_eps=1e-6, target_layers=[1, 3], target_hidden=H,
                                  block_size=8, mask_token_id=MASK), drafter.state_dict(), target=t)
    return t, d


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dflash")
    rnd_t = _target(0)
    rnd_d = _drafter(1, rnd_t)
    echo_t = _target(2, echo=0.2)
    copy_d = _drafter(3, echo_t, copy=True, n_kv=4)
    return {"random": (rnd_t, rnd_d, *_write_pair(root, "random", rnd_t, rnd_d)),
            "agree": (echo_t, copy_d, *_write_pair(root, "agree", echo_t, copy_d)), "root": root}


@pytest.fixture(scope="module")
def engines(models):
    # the fixed policy: every step drafts a whole block, as the z-lab reference does
    fixed = {"adaptive": False, "p_min": 0.0}
    return {k: Engine.load(models[k][2], draft=models[k][3], n_ctx=512, draft_options=fixed)
            for k in ("random", "agree")}


def _run(engine: Engine, prompt: list[int], n_steps: int, params: SamplingParams | None = None, session=None):
    """Drive the drafter's Decoder directly: (committed tokens, per-step log, stats)."""
    session = session or engine.new_session()
    dec = engine.draft.decoder(engine, session, Sampler(params or SamplingParams()))
    dec.prefill(prompt)
    recent, out = list(prompt), []
    for _ in range(n_steps):
        new = dec.step(recent)
        recent += new
        out += new
    return out, dec.log, dec.stats()


# --- cross-check with the z-lab reference -------------------------------------------------------------------------
def _reference(target, drafter, prompt: list[int], max_new: int):
    """dflash_generate with the drafted block of every step recorded (its greedy argmax over slots 1..B-1)."""
    blocks: list[list[int]] = []
    orig = drafter.compute_logits

    def record(hidden, head):
        logits = orig(hidden, head)
        blocks.append(logits.argmax(-1)[0].tolist())
        return logits

    drafter.compute_logits = record
    try:
        out = dflash_generate(drafter, target, torch.tensor([prompt]), max_new, None)
    finally:
        drafter.compute_logits = orig
    return out[0, len(prompt):].tolist(), blocks


def _accepted(blocks: list[list[int]], output: list[int]) -> list[int]:
    """Accepted drafts per step, replayed from the output: leading drafts equal to the committed tokens."""
    pos, acc = 0, []  # output[pos] is the anchor of the current step
    for drafts in blocks:
        a = 0
        while a < len(drafts) and pos + 1 + a < len(output) and drafts[a] == output[pos + 1 + a]:
            a += 1
        acc.append(a)
        pos += a + 1
    return acc


@pytest.mark.parametrize("kind", ["random", "agree"])
def test_matches_reference_step_by_step(models, engines, kind):
    target, drafter = models[kind][:2]
    engine = engines[kind]
    for prompt in PROMPTS[:2]:
        ref_out, ref_blocks = _reference(target, drafter, prompt, 48)
        ours, log, _ = _run(engine, prompt, 12)
        n = min(len(ours), len(ref_out))
        assert n >= 12
        assert ours[:n] == ref_out[:n]
        full = [b for b in ref_blocks if len(b) == 7][: len(log)]  # the reference shrinks the last blocks
        assert [d for d, _ in log][: len(full)] == full
        assert [a for _, a in log][: len(full)] == _accepted(full, ref_out)[: len(full)]
    if kind == "agree":  # the cross-check covers accepting and rejecting steps
        accepted = [a for _, a in log]
        assert max(accepted) > 0 and min(accepted) < 7


# --- losslessness -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["random", "agree"])
def test_greedy_equals_plain(engines, kind):
    engine = engines[kind]
    for prompt in PROMPTS[1:]:
        plain = engine.generate(prompt, SamplingParams(max_tokens=32), use_draft=False)
        spec = engine.generate(prompt, SamplingParams(max_tokens=32))
        assert len(plain.completion_ids) == 32 and spec.completion_ids == plain.completion_ids
        assert plain.spec is None and spec.spec["target_passes"] <= 32


def test_greedy_equals_plain_sliding_window_ring(tmp_path):
    """Gemma 3 target (window 16) on a small-step cache, so the sliding layers' ring wraps while drafts roll back."""
    t, d = tmp_path / "g3.gguf", tmp_path / "g3-draft.gguf"
    write_random_model(t, "gemma3", "tiny", seed=5)
    write_random_model(d, "dflash", target=t, layers=2, seed=6)
    # whole blocks every step: the random drafter's rejected drafts are rolled back on every step
    engine = Engine.load(t, draft=d, n_ctx=256, draft_options={"adaptive": False, "p_min": 0.0})
    prompt = [2, 1000, 2000, 3000, 4000, 5000, 6000, 7000]
    outs = []
    for use_draft in (False, True):
        session = Session(engine.model.new_cache(256, max_step=16))  # ring of 16 + 16 slots on sliding layers
        res = engine.generate(prompt, SamplingParams(max_tokens=40), session=session, use_draft=use_draft)
        outs.append(res.completion_ids)
    assert len(outs[0]) == 40 and outs[0] == outs[1] and res.spec["drafted"] > 0


def test_stop_inside_accepted_run_rolls_back(engines):
    """A stop token inside an accepted run: output ends before it and both caches keep exactly prompt + output."""
    engine = engines["agree"]
    prompt = PROMPTS[0]
    plain = engine.generate(prompt, SamplingParams(max_tokens=30), use_draft=False)
    stop = plain.completion_ids[10]
    first = plain.completion_ids.index(stop)
    session = engine.new_session()
    res = engine.generate(prompt, SamplingParams(max_tokens=30, stop_token_ids=[stop]), session=session)
    assert res.finish_reason == "eos" and res.completion_ids == plain.completion_ids[:first]
    assert session.tokens == prompt + res.completion_ids
    assert engine.draft.state(session).tokens == session.tokens
    # the next turn reuses that prefix in both caches and still decodes exactly
    again = engine.generate(prompt + res.completion_ids, SamplingParams(max_tokens=5), session=session)
    ref = engine.generate(prompt + res.completion_ids, SamplingParams(max_tokens=5), use_draft=False)
    assert session.last_prefill == 1 and again.completion_ids == ref.completion_ids


def test_verify_rows_match_single_token_rows(engines):
    """Numerics of verification: the T-row verify pass vs the same rows one token at a time (plain decoding)."""
    engine = engines["random"]
    ids = PROMPTS[0] + [11, 22, 33, 44, 55, 66, 77, 88]
    a, b = engine.new_session(), engine.new_session()
    engine.forward(a, ids[:6])
    engine.forward(b, ids[:6])
    batched = engine.forward(a, ids[6:], logits="all")  # [8, vocab]
    rows = torch.stack([engine.forward(b, [t]) for t in ids[6:]])
    assert torch.equal(batched.argmax(-1), rows.argmax(-1))
    rel = ((batched - rows).abs().max() / rows.abs().max()).item()
    # The fast path's int4 kernels round to bf16 and take a different micro-kernel for 1 row than for several, so
    # rows differ by bf16 ulps (measured 3e-3); the argmax (what greedy verification compares) must not.
    assert rel < 1e-2, f"batched vs single-token logits differ by {rel:.2e} (relative)"


# --- sampling is lossless -----------------------------------------------------------------------------------------
def _chi2_pvalue(counts: dict, probs: dict, n: int) -> float:
    """Pearson chi-square goodness of fit; cells with small expectation pooled into one."""
    big = [c for c in probs if probs[c] * n >= 5]
    obs = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    exp = [probs[c] * n for c in big] + [n * (1 - sum(probs[c] for c in big))]
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


class _WrongVerifier:
    """A biased verifier: accepts a draft whenever the target gives it any probability at all."""

    def __init__(self, dec):
        self.dec = dec

    def __call__(self, logits, drafts, recent):
        history, out = list(recent), []
        for i in range(len(drafts) + 1):
            p = self.dec.sampler.distribution(logits[i], history)
            if i < len(drafts) and p[drafts[i]] > 0:
                out.append(drafts[i])
                history.append(drafts[i])
                continue
            out.append(self.dec.sampler.draw(p))
            break
        return out


def _sampled_triples(engine, prompt, params, n_runs, wrong: bool) -> dict:
    counts: dict = {}
    session = engine.new_session()
    for seed in range(n_runs):
        p = params.model_copy(update={"seed": seed})
        dec = engine.draft.decoder(engine, session, Sampler(p))
        if wrong:
            dec.verify = _WrongVerifier(dec)
        dec.prefill(prompt)
        recent, out = list(prompt), []
        while len(out) < 3:
            new = dec.step(recent)
            recent += new
            out += new
        counts[tuple(out[:3])] = counts.get(tuple(out[:3]), 0) + 1
    return counts


def _exact_triples(engine, prompt, params) -> dict:
    """P(t1, t2, t3) from plain target passes and the sampler's distribution()."""
    def dist(ids):
        s = engine.new_session()
        return Sampler(params).distribution(engine.forward(s, ids), ids)

    probs = {}
    p1 = dist(prompt)
    for t1 in p1.nonzero().flatten().tolist():
        p2 = dist([*prompt, t1])
        for t2 in p2.nonzero().flatten().tolist():
            p3 = dist([*prompt, t1, t2])
            for t3 in p3.nonzero().flatten().tolist():
                probs[(t1, t2, t3)] = float(p1[t1] * p2[t2] * p3[t3])
    return probs


def test_sampling_follows_target_distribution(engines):
    engine = engines["agree"]
    prompt = PROMPTS[1]
    params = SamplingParams(temperature=3.0, top_k=2, max_tokens=3)  # 8 cells, each expected >= 5 times
    probs = _exact_triples(engine, prompt, params)
    n = 80
    good = _sampled_triples(engine, prompt, params, n, wrong=False)
    bad = _sampled_triples(engine, prompt, params, n, wrong=True)
    assert _chi2_pvalue(good, probs, n) > 1e-3
    assert _chi2_pvalue(bad, probs, n) < 1e-6


# --- acceptance ---------------------------------------------------------------------------------------------------
def test_acceptance_agreeing_vs_random(engines):
    high = [engines["agree"].generate(p, SamplingParams(max_tokens=48)).spec for p in PROMPTS]
    low = [engines["random"].generate(p, SamplingParams(max_tokens=48)).spec for p in PROMPTS]
    assert np.mean([s["acceptance_rate"] for s in high]) > 0.6
    assert np.mean([s["tokens_per_pass"] for s in high]) > 4.0
    assert max(s["acceptance_rate"] for s in low) < 0.05 and max(s["tokens_per_pass"] for s in low) < 1.3
    for s in high + low:
        assert sum(s["accept_hist"]) == s["target_passes"] and len(s["accept_hist"]) == s["n_max"] + 1
        assert s["draft_s"] > 0 and s["verify_s"] > 0


# --- loading ------------------------------------------------------------------------------------------------------
def _copy_gguf(src, dst, *, rename=None, drop=(), set_kv=None):
    """Rewrite a GGUF with tensors renamed/dropped and metadata replaced (for layout variants)."""
    rename, set_kv = rename or {}, set_kv or {}
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        if f.name in set_kv:
            continue
        vt = f.types[0]
        sub = f.types[-1] if len(f.types) > 1 else None
        w.add_key_value(f.name, f.contents(), vt, sub_type=sub)
    for k, (v, vt, sub) in set_kv.items():
        w.add_key_value(k, v, vt, sub_type=sub)
    for t in r.tensors:
        if t.name in drop:
            continue
        w.add_tensor(rename.get(t.name, t.name), np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_layout_variants_and_options(models, engines, tmp_path):
    from gguf import GGUFValueType as VT
    engine = engines["agree"]
    draft = models["agree"][3]
    base, _, _ = _run(engine, PROMPTS[0], 6)
    old = tmp_path / "old-names.gguf"  # older converters: hidden_norm.weight
    _copy_gguf(draft, old, rename={"enc.output_norm.weight": "hidden_norm.weight"})
    attach_drafter(engine, old, adaptive=False, p_min=0.0)
    assert _run(engine, PROMPTS[0], 6)[0] == base
    attach_drafter(engine, draft, n_max=100)
    assert engine.draft.n_max == 7
    attach_drafter(engine, draft, n_max=3, adaptive=False, p_min=0.0)
    _, log, stats = _run(engine, PROMPTS[0], 6)
    assert stats["n_max"] == 3 and all(len(d) == 3 for d, _ in log)
    attach_drafter(engine, draft, embedding_scale="sqrt")
    assert engine.draft.model.embedding_scale == 8.0
    scaled = tmp_path / "scaled.gguf"
    _copy_gguf(draft, scaled, set_kv={"dflash.embedding_scale": (2.5, VT.FLOAT32, None)})
    assert attach_drafter(engine, scaled).model.embedding_scale == 2.5
    assert attach_drafter(engine, scaled, embedding_scale="none").model.embedding_scale == 1.0
    attach_drafter(engine, draft, adaptive=False, p_min=0.0)  # the module's engines stay on the fixed policy


def test_rejects_mismatched_drafters(models, tmp_path):
    t = models["random"][2]
    g3, g3d = tmp_path / "g3.gguf", tmp_path / "g3d.gguf"
    write_random_model(g3, "gemma3", "tiny", seed=1)
    write_random_model(g3d, "dflash", target=g3, layers=1, seed=2)
    with pytest.raises(ValueError, match="vocabulary"):
        Engine.load(t, draft=g3d, n_ctx=64)
    narrow = tmp_path / "narrow.gguf"  # fused features of a 32-wide target
    write_model(narrow, "dflash", dict(n_layer=1, n_embd=H, n_head=4, n_head_kv=2, head_dim=16, n_ff=128,
                                       vocab_size=V, target_layers=[1], target_hidden=32, block_size=4),
                _small_draft_state(32), target=t)
    with pytest.raises(ValueError, match="target hidden size 32"):
        Engine.load(t, draft=narrow, n_ctx=64)
    with pytest.raises(ValueError, match="dflash"):
        Engine.load(t, draft=t, n_ctx=64)
    no_layers = tmp_path / "no-layers.gguf"
    _copy_gguf(models["random"][3], no_layers, set_kv={"dflash.target_layers": ([9], 9, 4)})
    with pytest.raises(ValueError, match="reads target layers"):
        Engine.load(t, draft=no_layers, n_ctx=64)


def _small_draft_state(target_hidden: int) -> dict:
    g = torch.Generator().manual_seed(0)
    s = {"fc.weight": torch.randn(H, target_hidden, generator=g), "hidden_norm.weight": torch.ones(H),
         "norm.weight": torch.ones(H)}
    shapes = {"self_attn.q_proj.weight": (64, H), "self_attn.k_proj.weight": (32, H),
              "self_attn.v_proj.weight": (32, H),
              "self_attn.o_proj.weight": (H, 64), "self_attn.q_norm.weight": (16,), "self_attn.k_norm.weight": (16,),
              "input_layernorm.weight": (H,), "post_attention_layernorm.weight": (H,),
              "mlp.gate_proj.weight": (128, H), "mlp.up_proj.weight": (128, H), "mlp.down_proj.weight": (H, 128)}
    for k, shape in shapes.items():
        s[f"layers.0.{k}"] = torch.randn(*shape, generator=g)
    return s


# --- adaptive drafting ----------------------------------------------------------------------------------------------
def test_adaptive_policy_shrinks_backs_off_and_recovers():
    from bolt_ros.engine.decode.draft_policy import MAX_BACKOFF, AdaptiveDraft

    p = AdaptiveDraft(7)
    assert p.next_n() == 7
    p.update(7, 7, 6)  # one short: still whole blocks (the average moves, not the last count)
    assert p.next_n() == 7
    for _ in range(8):  # acceptance falls to 1 per step: the draft follows it down to 1 + MARGIN
        n = p.next_n()
        p.update(n, n, 1)
    assert p.next_n() == 3
    plain = 0
    for _ in range(300):  # a drafter that is never accepted: probes get rarer, up to one per MAX_BACKOFF steps
        n = p.next_n()
        plain += n == 0
        p.update(n, n, 0)
    assert plain > 250 and p.next_backoff == MAX_BACKOFF
    while (n := p.next_n()) == 0:
        pass
    assert n == 2  # a probe: the average has decayed to 0
    p.update(n, n, n)
    for _ in range(10):  # probes accepted again: drafting resumes and grows back to whole blocks
        n = p.next_n()
        p.update(n, n, n)
    assert p.next_n() == 7 and p.next_backoff == 1


def test_adaptive_drafting_is_lossless_and_cheap_with_a_useless_drafter(models):
    """Random drafter: the adaptive policy stops paying for drafts (few drafter passes), output equals plain."""
    engine = Engine.load(models["random"][2], draft=models["random"][3], n_ctx=512)
    assert engine.draft.options.adaptive
    for prompt in PROMPTS[:2]:
        plain = engine.generate(prompt, SamplingParams(max_tokens=48), use_draft=False)
        spec = engine.generate(prompt, SamplingParams(max_tokens=48))
        assert spec.completion_ids == plain.completion_ids
        assert spec.spec["drafter_passes"] <= 0.3 * spec.spec["target_passes"], spec.spec


def test_a_useless_drafter_pays_fewer_probes_on_the_next_reply_of_the_same_kind(models, monkeypatch):
    """The adaptive policy's backoff carries over to the next generation of the same kind (Drafter.carry): a drafter
    never accepted on the first reply starts the second in backoff, so short replies stop paying its probes; a
    grammar's generations keep their own. Negative control: the policy of an accepted drafter carries nothing.
    The policy also weighs measured step times; here they come from a fixed clock (a drafting pass twice a plain
    step), so a loaded machine's slow plain step cannot reset the backoff (it did, in one CI run of 1261 tests)."""
    from bolt_ros.engine.decode.draft_policy import AdaptiveDraft

    observe = AdaptiveDraft.observe
    monkeypatch.setattr(AdaptiveDraft, "observe", lambda self, asked, seconds, committed:
                        observe(self, asked, 0.002 if asked else 0.001, committed))

    engine = Engine.load(models["random"][2], draft=models["random"][3], n_ctx=512)
    params = SamplingParams(max_tokens=16)
    plain = engine.generate(PROMPTS[0], params, use_draft=False)
    first, second = (engine.generate(PROMPTS[0], params, session=engine.new_session()) for _ in range(2))
    assert first.completion_ids == second.completion_ids == plain.completion_ids
    assert engine.draft.carry[False] > 1 and True not in engine.draft.carry  # no grammar here: its kind only
    assert second.spec["drafter_passes"] < first.spec["drafter_passes"], (first.spec, second.spec)
    good = AdaptiveDraft(7)
    good.update(7, 7, 7)
    assert good.carry() == 0
    fresh = AdaptiveDraft(7)
    fresh.resume(good.carry())
    assert fresh.next_n() == 7  # nothing carried: a whole block at once


def test_adaptive_drafting_keeps_whole_blocks_with_an_agreeing_drafter(models, engines):
    fixed = engines["agree"].generate(PROMPTS[0], SamplingParams(max_tokens=48))
    # p_min off: this random echo model agrees with its drafter on the argmax, from a flat distribution
    # p_min 1e-9: every slot passes, through the gated path (the head's held form, HEAD_ROWS rows at a time)
    for p_min in (0.0, 1e-9):
        engine = Engine.load(models["agree"][2], draft=models["agree"][3], n_ctx=512,
                             draft_options={"p_min": p_min, "anchor_min": 0.0})
        adaptive = engine.generate(PROMPTS[0], SamplingParams(max_tokens=48))
        assert adaptive.completion_ids == fixed.completion_ids
        assert adaptive.spec["tokens_per_pass"] >= 0.8 * fixed.spec["tokens_per_pass"], (adaptive.spec, fixed.spec)


def test_adaptive_policy_probes_until_accepted_and_backs_off_when_the_drafter_is_unsure():
    from bolt_ros.engine.decode.draft_policy import CUT_BACKOFF, AdaptiveDraft

    p = AdaptiveDraft(7)
    assert p.probing  # nothing accepted yet: a draft starts with its first slot alone
    p.update(7, 7, 3)
    assert not p.probing and p.next_n() == 7
    q = AdaptiveDraft(7)
    q.update(7, 0, 0)  # the drafter was unsure of its first slot (p_min cut it to nothing)
    assert q.next_n() == 0 and q.probing  # plain steps at once, not after a second miss
    assert [q.next_n() for _ in range(2)] == [0, q.n] and CUT_BACKOFF == 2  # CUT_BACKOFF of them, then a probe
    q.update(7, 0, 0)
    assert [q.next_n() for _ in range(5)] == [0, 0, 0, 0, q.n]  # the backoff doubles


def test_an_unsure_drafter_costs_one_head_row(models, monkeypatch):
    """While probing, a draft whose first slot is below p_min never reaches the head's other rows."""
    engine = Engine.load(models["agree"][2], draft=models["agree"][3], n_ctx=512,
                         draft_options={"p_min": 0.999, "anchor_min": 0.0})  # a flat target: the anchor gate off
    head = engine.draft.model.output  # the target's own head, borrowed
    rows, probes = [], []
    forward, approximate = head.forward, head.approximate
    monkeypatch.setattr(head, "forward", lambda x: rows.append(x.reshape(-1, x.shape[-1]).shape[0]) or forward(x))
    monkeypatch.setattr(head, "approximate", lambda x: probes.append(x.shape[0]) or approximate(x))
    plain = engine.generate(PROMPTS[0], SamplingParams(max_tokens=12), use_draft=False)
    rows.clear()
    cut = engine.generate(PROMPTS[0], SamplingParams(max_tokens=12))
    assert cut.completion_ids == plain.completion_ids and cut.spec["drafted"] == 0
    assert probes and set(probes) == {1} and len(probes) == cut.spec["drafter_passes"]
    assert set(rows) == {1}, rows  # only the target's own rows: no drafter pass paid for the other slots


def test_while_probing_a_token_the_target_was_unsure_of_runs_no_drafter(models, monkeypatch):
    """anchor_min: after a token the target gave less than anchor_min (this random target's flat distribution gives
    no token 0.999), a probing step is a plain step and the drafter does not run at all; output unchanged."""
    passes = {}
    for q in (0.999, 0.0):  # 0: the negative control, the same run with the gate off
        engine = Engine.load(models["agree"][2], draft=models["agree"][3], n_ctx=512,
                             draft_options={"p_min": 0.999, "anchor_min": q})
        calls: list[int] = []
        passes[q] = calls
        draft_hidden = engine.draft.model.draft_hidden
        monkeypatch.setattr(engine.draft.model, "draft_hidden",
                            lambda t, c, calls=calls, f=draft_hidden: calls.append(len(t)) or f(t, c))
        plain = engine.generate(PROMPTS[0], SamplingParams(max_tokens=12), use_draft=False)
        gated = engine.generate(PROMPTS[0], SamplingParams(max_tokens=12))
        assert gated.completion_ids == plain.completion_ids and gated.spec["anchor_min"] == q
    assert passes[0.999] == [] and passes[0.0] and set(passes[0.0]) == {2}  # probes: [anchor, MASK] blocks


def test_p_min_ends_a_draft_at_the_first_unsure_slot(models, engines):
    """The same drafter's slots are below 0.999 confidence: every draft is cut to nothing, output unchanged."""
    fixed = engines["agree"].generate(PROMPTS[0], SamplingParams(max_tokens=24))
    engine = Engine.load(models["agree"][2], draft=models["agree"][3], n_ctx=512,
                         draft_options={"adaptive": False, "p_min": 0.999})
    cut = engine.generate(PROMPTS[0], SamplingParams(max_tokens=24))
    assert cut.completion_ids == fixed.completion_ids
    assert cut.spec["drafted"] == 0 and cut.spec["tokens_per_pass"] == 1.0
    assert cut.spec["drafter_passes"] == cut.spec["target_passes"]  # every step drafted, and every draft was cut


def test_the_same_prompt_again_gets_its_prefill_logits_back_as_plain_decoding_does(engines):
    """A DFlash session that holds the whole prompt (a repeated request, a redraw) takes the logits its prefill gave
    and runs nothing, as a plain session does. Re-running the prompt's last token as a step rounds another way on a
    quantized model: on held-out chat the same request twice gave DFlash and plain decoding different replies."""
    engine = engines["agree"]
    for use_draft in (True, False):
        s = engine.new_session()
        first = engine.generate(PROMPTS[0], SamplingParams(max_tokens=8), session=s, use_draft=use_draft)
        again = engine.generate(PROMPTS[0], SamplingParams(max_tokens=8), session=s, use_draft=use_draft)
        assert s.last_prefill == 0 and again.completion_ids == first.completion_ids, use_draft
    engine.generate(PROMPTS[0][:-1], SamplingParams(max_tokens=8), session=s)  # negative control: a shorter prompt
    engine.generate(PROMPTS[0], SamplingParams(max_tokens=8), session=s)  # ... then the whole one runs its end again
    assert s.last_prefill >= 1
