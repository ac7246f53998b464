"""One device through the whole engine: a generation (prefill, plain decode, DFlash decode, sampling at T > 0) on a
simulated accelerator (sim_device.py: CUDA's placement rules on every op, real values) touches no host tensor, and
gives the tokens the same engine gives on the CPU with the same weight form; leaving one tensor on the host fails.
Also: `device:=...` flows from the launch arguments to Engine.load, `auto` picking CUDA where torch sees one.
"""
from __future__ import annotations

import pytest
import torch
from sim_device import CrossDevice, SimTensor, sim_device

from bolt_ros.devtools.testmodel import write_random_model
from bolt_ros.engine.decode import dflash_model
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams

PROMPT = [2, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000]
# the drafter must run: a random target is never sure of its tokens, so the anchor gate would skip every probe
DRAFTING = {"anchor_min": 0.0}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("sim")
    # Gemma 4: sliding and full layers, proportional RoPE, per-layer inputs, KV sharing, softcap
    write_random_model(d / "t.gguf", "gemma4", "tiny", seed=11)
    write_random_model(d / "d.gguf", "dflash", target=d / "t.gguf", layers=2, seed=12)
    return d / "t.gguf", d / "d.gguf"


def _runs(engine: Engine) -> list[list[int]]:
    greedy = SamplingParams(max_tokens=12)
    sampled = SamplingParams(max_tokens=12, temperature=0.8, top_k=40, top_p=0.9, repetition_penalty=1.1, seed=7)
    return [engine.generate(PROMPT, p, use_draft=d).completion_ids
            for p in (greedy, sampled) for d in (False, True)]


def _host_tensors(engine: Engine, session) -> list[str]:
    """Names of engine tensors that are not on the device: weights, KV cache, draft cache, RoPE tables."""
    found = []
    for name, t in [*engine.model.named_buffers(), *engine.draft.model.named_buffers()]:
        if not isinstance(t, SimTensor):
            found.append(name)
    for m in (*engine.model.modules(), *engine.draft.model.modules()):
        table = getattr(m, "table", None)
        if table is not None and not isinstance(table, SimTensor):
            found.append(f"{type(m).__name__}.table")
    tensors = {"rope": [t for r in engine.model.ropes for t in (r.inv_freq, r.inv_freq32)],
               "kv": [t for lc in session.cache.layers if lc is not None for t in (lc.k, lc.v, lc.pos)],
               "draft kv": [*engine.draft.state(session).cache.k, *engine.draft.state(session).cache.v]}
    for what, ts in tensors.items():
        found += [what for t in ts if not isinstance(t, SimTensor)]
    return found


def test_a_whole_generation_stays_on_the_device(pair):
    target, draft = pair
    with sim_device() as dev:
        engine = Engine.load(target, draft=draft, n_ctx=256, device=dev, draft_options=DRAFTING)
        assert engine.model.device == dev
        session = engine.new_session()
        engine.generate(PROMPT, SamplingParams(max_tokens=4), session=session)
        assert _host_tensors(engine, session) == []
        on_device = _runs(engine)
    # the CPU engine with the same weight form (GGUF blocks, the device's "fast") picks the same tokens
    cpu = Engine.load(target, draft=draft, n_ctx=256, policy="gguf", draft_options=DRAFTING)
    assert on_device == _runs(cpu)
    assert on_device[0] == on_device[1] and on_device[2] == on_device[3]  # DFlash is lossless here too


def test_one_tensor_left_on_the_host_fails(pair, monkeypatch):
    """Negative control: the drafter's cache allocated on the host (as it was before it took a device)."""
    target, draft = pair
    monkeypatch.setattr(dflash_model.DFlashDraftModel, "new_cache", lambda self: dflash_model.DraftCache(self.cfg))
    with sim_device() as dev:
        engine = Engine.load(target, draft=draft, n_ctx=256, device=dev, draft_options=DRAFTING)
        assert engine.generate(PROMPT, SamplingParams(max_tokens=4), use_draft=False).completion_ids
        with pytest.raises(CrossDevice, match="host tensors"):
            engine.generate(PROMPT, SamplingParams(max_tokens=4))


def test_device_flows_from_the_launch_arguments_to_engine_load(pair, monkeypatch):
    from bolt_ros.assistant.backend_factory import make_backend
    from bolt_ros.assistant.config import from_ros_parameters
    from bolt_ros.graph import describe_graph, parse_arguments

    target, _ = pair
    seen = []
    real_load = Engine.load.__func__

    def load(cls, model, **kw):  # records the device, then loads for real on the CPU this machine has
        seen.append(kw["device"])
        return real_load(cls, model, **{**kw, "device": "cpu"})

    monkeypatch.setattr(Engine, "load", classmethod(load))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA machine, simulated
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for arg, want in (("cuda", "cuda"), ("auto", "cuda:0"), ("cuda:0", "cuda:0"), ("cpu", "cpu")):
        params = describe_graph(parse_arguments({"device": arg, "model_path": str(target), "backend": "embedded"}))
        cfg = from_ros_parameters(params[0].parameters)
        assert cfg.backend.device == arg
        make_backend(cfg.backend)
        assert seen[-1] == torch.device(want)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    make_backend(from_ros_parameters({**params[0].parameters, "backend.device": "auto"}).backend)
    assert seen[-1] == torch.device("cpu")
