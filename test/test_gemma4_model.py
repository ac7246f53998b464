"""Gemma 4 architecture against the reference: random tiny `Gemma4ForCausalLM` models from transformers, written to
GGUF by our test-model writer (f32), run by our engine, must give transformers' fp32 logits for a 64-token prompt and
for 16 greedy decode steps with the KV cache (sliding windows smaller than the prompt, ring wrap-around included).

The same file is loaded by transformers' own GGUF loader to prove the tensor layout matches the ecosystem's names.
That loader reads only a few gemma4 hyper-parameters from GGUF metadata (no layer types, head_dim_swa, shared-KV
count, PLE width, RoPE or softcap), so it is given the true config; and it maps the HF buffer `layer_scalar` to
`blk.N.layer_output_scale` without the `.weight` suffix that llama.cpp's files (and ours) use, so it leaves the layer
scalars at their initial 1.0: the test checks that every other tensor arrives bit for bit and restores the scalars.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch
from transformers import Gemma4ForCausalLM, Gemma4TextConfig
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from bolt_ros.devtools.testmodel import write_model
from bolt_ros.engine.gguf.reader import GGUFFile
from bolt_ros.engine.model.config import config_from_gguf
from bolt_ros.engine.model.transformer import Transformer
from bolt_ros.engine.model.weights import WeightStore

PROMPT, DECODE, TOL = 64, 16, 1e-4


@dataclass(frozen=True)
class Case:
    """A tiny Gemma 4: E4B's 256/512 head dims scaled down, its layer mix, sharing and PLE in miniature."""

    name: str
    layer_types: tuple[str, ...]  # "s" sliding / "f" full
    n_head: int = 4
    n_head_kv: int = 2
    head_dim_swa: int = 32
    head_dim: int = 64
    window: int = 8
    shared: int = 2
    ple: int = 16
    softcap: float | None = 10.0
    partial_rotary: float = 0.25
    max_step: int = 64  # engine step size; < PROMPT means chunked prefill
    seed: int = 0
    hidden: int = 64
    vocab: int = 512
    extra: dict = field(default_factory=dict)

    @property
    def swa(self) -> list[bool]:
        return [t == "s" for t in self.layer_types]


CASES = [
    # E4B's structure in miniature: the last KV owner is a full layer, the last two layers read layer 2's (sliding)
    # and layer 3's (full) KV
    Case("e4b_like", tuple("sssfsf"), seed=1),
    # one KV head (MQA), full head dim 4x the sliding one, wider partial rotary, chunked prefill through the ring
    Case("mqa_chunked", tuple("sfssfssf"), n_head_kv=1, head_dim_swa=16, shared=3, ple=8, softcap=30.0,
         partial_rotary=0.5, window=16, max_step=16, seed=2),
    # no PLE, no sharing, no softcap, no GQA: the optional parts switched off, window just under the prompt
    Case("plain", tuple("ssf"), n_head_kv=4, shared=0, ple=0, softcap=None, window=48, max_step=24, seed=3),
]


def hf_config(c: Case) -> Gemma4TextConfig:
    types = ["sliding_attention" if s else "full_attention" for s in c.swa]
    return Gemma4TextConfig(
        vocab_size=c.vocab, hidden_size=c.hidden, intermediate_size=2 * c.hidden, num_hidden_layers=len(types),
        num_attention_heads=c.n_head, num_key_value_heads=c.n_head_kv, head_dim=c.head_dim_swa,
        global_head_dim=c.head_dim, layer_types=types, sliding_window=c.window, final_logit_softcapping=c.softcap,
        vocab_size_per_layer_input=c.vocab, hidden_size_per_layer_input=c.ple, num_kv_shared_layers=c.shared,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": c.partial_rotary,
                               "rope_theta": 1_000_000.0}},
        attn_implementation="eager")


def writer_hparams(c: Case) -> dict:
    return dict(n_layer=len(c.swa), n_embd=c.hidden, n_head=c.n_head, n_head_kv=c.n_head_kv, head_dim=c.head_dim,
                head_dim_swa=c.head_dim_swa, n_ff=2 * c.hidden, vocab_size=c.vocab, rope_base=1e6,
                rope_base_swa=1e4, sliding_window=c.window, swa_layers=c.swa, shared_kv_layers=c.shared,
                ple_dim=c.ple, rope_partial_full=c.partial_rotary, final_logit_softcap=c.softcap)


def randomize(model: Gemma4ForCausalLM, seed: int) -> None:
    """Weights far from HF's init (norms 1, layer_scalar 1 would hide convention bugs), yet well conditioned: q/k
    norm gains below 1 keep the scale-1.0 attention logits moderate, so fp32 rounding stays ~1e-6 of the logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.state_dict().items():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.copy_(0.2 + 0.3 * torch.rand(p.shape, generator=g))
            elif name.endswith(("norm.weight", "layer_scalar")):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif "embed" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """These matrices are tiny: extra threads only add synchronisation (10x slower on a busy 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.name)
def pair(request, tmp_path_factory, one_thread):
    """(case, transformers model, GGUF path, our model) for one case."""
    c: Case = request.param
    torch.manual_seed(c.seed)
    hf = Gemma4ForCausalLM(hf_config(c)).eval()
    randomize(hf, c.seed)
    path = tmp_path_factory.mktemp(c.name) / "model.gguf"
    write_model(path, "gemma4", writer_hparams(c), hf.state_dict(), quant="f32", tokenizer="none")
    gf = GGUFFile(path)
    ours = Transformer(config_from_gguf(gf), WeightStore(gf, "exact"))
    yield c, hf, path, ours
    gf.close()


def prompt(c: Case) -> torch.Tensor:
    return torch.randint(0, c.vocab, (PROMPT,), generator=torch.Generator().manual_seed(100 + c.seed))


def run_ours(model: Transformer, c: Case, ids: torch.Tensor, logits: str = "all"):
    """Prefill in steps of c.max_step, then greedy decode; returns (prefill logits, decode logits).

    logits="last" prefills as the Engine does: no logits for the early chunks, the last row's for the final one (the
    KV-shared layers then skip the rows nobody reads)."""
    cache = model.new_cache(PROMPT + DECODE + 8, max_step=c.max_step)
    pre = []
    for i in range(0, PROMPT, c.max_step):
        last = i + c.max_step >= PROMPT
        out = model(ids[i:i + c.max_step], cache, logits=logits if last or logits == "all" else None).logits
        pre += [] if out is None else [out]
    pre = torch.cat(pre)
    steps, nxt = [], int(pre[-1].argmax())
    for _ in range(DECODE):
        step = model(torch.tensor([nxt]), cache).logits[-1]
        steps.append(step)
        nxt = int(step.argmax())
    return pre, torch.stack(steps)


def run_hf(model: Gemma4ForCausalLM, ids: torch.Tensor):
    with torch.no_grad():
        out = model(ids[None], use_cache=True)
        cache, pre = out.cache, out.logits[0]
        steps, nxt = [], int(pre[-1].argmax())
        for _ in range(DECODE):
            out = model(torch.tensor([[nxt]]), cache=cache, use_cache=True)
            cache = out.cache
            steps.append(out.logits[0, -1])
            nxt = int(steps[-1].argmax())
    return pre, torch.stack(steps)


def test_config_read_from_gguf(pair):
    c, hf, _, ours = pair
    cfg, hcfg = ours.cfg, hf.config
    assert cfg.swa == c.swa
    assert cfg.head_dim == [c.head_dim_swa if s else c.head_dim for s in c.swa]
    # the producer of each layer type is its last KV-owning layer, as in HF's kv_sharing_modes
    modes = hcfg.kv_sharing_modes
    for il, src in enumerate(cfg.kv_source):
        if modes[il] == "reuse":
            assert src != il and modes[src] == "store" and c.swa[src] == c.swa[il]
        else:
            assert src == il
    assert cfg.ple_dim == c.ple and cfg.final_softcap == c.softcap and cfg.attn_scale == 1.0


def test_prefill_and_decode_match_transformers(pair):
    c, hf, _, ours = pair
    ids = prompt(c)
    ref_pre, ref_dec = run_hf(hf, ids)
    our_pre, our_dec = run_ours(ours, c, ids)
    assert our_pre.shape == ref_pre.shape
    assert rel_err(our_pre, ref_pre) < TOL, "prefill logits"
    for i in range(DECODE):
        assert rel_err(our_dec[i], ref_dec[i]) < TOL, f"decode step {i}"


def test_last_row_prefill_matches_transformers(pair):
    c, hf, _, ours = pair
    ids = prompt(c)
    ref_pre, ref_dec = run_hf(hf, ids)
    our_pre, our_dec = run_ours(ours, c, ids, logits="last")
    assert our_pre.shape == (1, c.vocab)
    assert rel_err(our_pre[0], ref_pre[-1]) < TOL
    assert rel_err(our_dec, ref_dec) < TOL


def test_window_matters(pair):
    """Guards the test itself: an engine that ignored the sliding window would not match by accident."""
    c, hf, _, _ = pair
    ids = prompt(c)
    wide = Gemma4ForCausalLM(hf_config(Case(**{**c.__dict__, "window": 4 * PROMPT}))).eval()
    wide.load_state_dict(hf.state_dict())
    with torch.no_grad():
        ref, other = (m(ids[None], logits_to_keep=1).logits[0, -1] for m in (hf, wide))
    assert rel_err(other, ref) > 100 * TOL


def test_transformers_gguf_loader_reads_our_layout(pair):
    c, hf, path, _ = pair
    model = Gemma4ForCausalLM(hf_config(c)).eval()  # fresh init: anything not loaded stays different
    parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    loaded = parsed["tensors"]
    ref = hf.state_dict()
    not_loaded = {k for k in ref if k not in loaded and k != "lm_head.weight"}  # lm_head is tied
    assert {k.rsplit(".", 1)[-1] for k in not_loaded} <= {"layer_scalar"}, sorted(not_loaded)
    for k, v in loaded.items():
        assert torch.equal(v, ref[k]), k
    # the layer scalars the loader skips are in our file under llama.cpp's name
    with GGUFFile(path) as gf:
        for k in not_loaded:
            il = int(k.split(".")[2])
            raw = gf.raw(f"blk.{il}.layer_output_scale.weight").view("<f4")
            loaded[k] = torch.tensor(raw.copy())
    model.load_state_dict(loaded, strict=False)
    model.tie_weights()
    ids = prompt(c)[:16]
    with torch.no_grad():
        assert torch.equal(model(ids[None]).logits, hf(ids[None]).logits)


def test_kv_cache_only_for_owners_and_windows(pair):
    c, _, _, ours = pair
    cfg = ours.cfg
    n_ctx, step = 256, 16
    cache = ours.new_cache(n_ctx, max_step=step)
    for il, lc in enumerate(cache.layers):
        if not cfg.owns_kv(il):
            assert lc is None  # shared layers own nothing
            continue
        want = c.window + step if c.swa[il] else n_ctx
        assert lc.n_slots == want and lc.k.shape == (cfg.n_head_kv[il], want, cfg.head_dim[il])
    assert cache.nbytes == cfg.kv_bytes(n_ctx, dtype_bytes=4, max_step=step)
    n_owned = len(c.swa) - c.shared
    full = sum(2 * n_ctx * cfg.n_head_kv[il] * cfg.head_dim[il] * 4 for il in range(len(c.swa)))
    assert cache.nbytes < full or (n_owned == len(c.swa) and not any(c.swa))
    # without a step margin the sliding layers count exactly their window
    swa_owned = [il for il in range(n_owned) if c.swa[il]]
    full_owned = [il for il in range(n_owned) if not c.swa[il]]
    expect = sum(2 * c.window * c.n_head_kv * c.head_dim_swa * 2 for _ in swa_owned) + sum(
        2 * n_ctx * c.n_head_kv * c.head_dim * 2 for _ in full_owned)
    assert cfg.kv_bytes(n_ctx) == expect
