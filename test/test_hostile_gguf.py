"""Hostile model files: every malformed file is a GGUFError naming the file and the key or tensor, before anything big
is allocated; the fuzz bench's mutations (bench/fuzz_mutate.py) give no crash, hang or OOM; unmutated files load and
generate (negative control)."""
from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path

import pytest

from bolt_ros.devtools.testmodel import write_random_model
from bolt_ros.engine.decode.dflash_model import draft_config_from_gguf
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.engine.gguf import validate
from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile
from bolt_ros.engine.model.config import config_from_gguf

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
fm = importlib.import_module("fuzz_mutate")
fuzz_corpus = importlib.import_module("fuzz_corpus")
fuzz_load = importlib.import_module("fuzz_load")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The fuzz corpora (tiny gemma4/gemma3/llama/dflash from the writer, SmolLM2's header rewritten small)."""
    workdir = tmp_path_factory.mktemp("fuzz")
    fuzz_corpus.build(workdir)
    return workdir


@pytest.fixture(scope="module")
def raws(corpus) -> dict:
    return fuzz_corpus.load_raws(corpus)


def variant(raws, corpus: str, tmp_path: Path, edit, name: str = "hostile.gguf") -> Path:
    raw = raws[corpus].copy()
    edit(raw)
    path = tmp_path / name
    path.write_bytes(fm.serialize(raw))
    return path


def load(path: Path, corpus: str, workdir: Path) -> Engine:
    if corpus == "dflash":
        return Engine.load(workdir / "gemma4.gguf", n_ctx=64, draft=path)
    return Engine.load(path, n_ctx=64)


# --- edits ---------------------------------------------------------------------------------------------------------
def drop(key):
    return lambda r: r.kvs.remove(r.get(key))


def u32(key, v, vtype=fm.U32):
    return lambda r: r.set(key, vtype, fm.enc_scalar(vtype, v))


def string(key, v):
    return lambda r: r.set(key, fm.STRING, fm.enc_str(v))


def array(key, etype, items):
    return lambda r: r.set(key, fm.ARRAY, fm.enc_array(etype, items))


def tensor(name, *, dims=None, ggml_type=None, fill=None):
    def edit(r):
        t = r.tensor(name)
        if dims is not None:
            t.dims = list(dims)
        if ggml_type is not None:
            t.ggml_type = ggml_type
        if dims is not None or ggml_type is not None:  # keep the file consistent: only the config check may object
            t.data = b"\0" * fm.tensor_nbytes(t.ggml_type, t.dims)
        if fill is not None:
            t.data = fill * len(t.data)
    return edit


def drop_tensor(name):
    return lambda r: r.tensors.remove(r.tensor(name))


def tokens(texts):
    def edit(r):
        kv = r.get("tokenizer.ggml.tokens")
        _, count, _ = fm.array_items(kv)
        r.set("tokenizer.ggml.tokens", fm.ARRAY, fm.enc_array(fm.STRING, texts + [f"t{i}" for i in range(
            len(texts), count)]))
    return edit


G4 = "gemma4."
CASES = [  # (corpus, edit, what the message must name)
    # the cases of the brief: today a RuntimeError in model.py, a TypeError, a 4 TB allocation
    ("gemma4", drop(G4 + "attention.head_count_kv"), r"tensor 'blk\.0\.attn_k\.weight'.*head_count_kv"),
    ("gemma4", drop(G4 + "attention.sliding_window"), r"missing metadata key 'gemma4\.attention\.sliding_window'"),
    ("gemma4", u32(G4 + "rope.dimension_count_swa", 1 << 40, fm.U64), r"'gemma4\.rope\.dimension_count_swa'"),
    ("gemma4", u32(G4 + "rope.dimension_count_swa", 64), r"gemma4\.rope\.dimension_count_swa = 64 .*head dim 32"),
    # wrong types
    ("gemma4", string(G4 + "embedding_length", "64"), r"'gemma4\.embedding_length' = '64': .*valid integer"),
    ("gemma4", u32(G4 + "attention.head_count", 2.0, fm.F32), r"'gemma4\.attention\.head_count'"),
    ("gemma4", u32(G4 + "block_count", 1, fm.BOOL), r"'gemma4\.block_count'"),
    ("gemma3", array("gemma3.context_length", fm.U32, [2048]), r"'gemma3\.context_length'"),
    ("gemma4", u32(G4 + "attention.layer_norm_rms_epsilon", float("nan"), fm.F32), r"rms_epsilon' = nan"),
    ("gemma3", string("gemma3.rope.freq_base", "1e6"), r"'gemma3\.rope\.freq_base'"),
    # negative, zero, huge
    ("gemma4", u32(G4 + "block_count", -1, fm.I32), r"'gemma4\.block_count' = -1"),
    ("gemma4", u32(G4 + "block_count", 2**32 - 1), r"'gemma4\.block_count' = 4294967295"),
    ("gemma4", u32(G4 + "embedding_length", 2**31), r"'gemma4\.embedding_length'"),
    ("gemma4", u32(G4 + "attention.head_count_kv", 0), r"'gemma4\.attention\.head_count_kv' = 0"),
    ("gemma4", u32(G4 + "attention.head_count", 65535), r"'gemma4\.attention\.head_count' = 65535"),
    ("gemma4", u32(G4 + "feed_forward_length", 0), r"'gemma4\.feed_forward_length' = 0"),
    ("gemma4", u32(G4 + "context_length", 0), r"'gemma4\.context_length' = 0"),
    ("gemma4", u32(G4 + "vocab_size", 2**31), r"'gemma4\.vocab_size'"),
    ("gemma4", u32(G4 + "attention.shared_kv_layers", 6), r"gemma4\.attention\.shared_kv_layers = 6"),
    ("llama", u32("llama.rope.dimension_count", 65), r"llama\.rope\.dimension_count = 65"),
    # wrong-length per-layer arrays, dropped required keys
    ("gemma4", array(G4 + "attention.sliding_window_pattern", fm.BOOL, [1, 1, 0, 1, 1]), r"has 5 entries for 6"),
    ("gemma4", array(G4 + "attention.head_count_kv", fm.U32, [1] * 7), r"head_count_kv' has 7 entries for 6"),
    ("gemma4", array(G4 + "attention.sliding_window_pattern", fm.U32, [1, 1, 0, 1, 1, 0]), r"valid boolean"),
    ("gemma4", u32(G4 + "block_count", 7), r"sliding_window_pattern' has 6 entries for 7 layers"),
    ("gemma4", drop(G4 + "block_count"), r"missing metadata key 'gemma4\.block_count'"),
    ("gemma4", drop(G4 + "attention.sliding_window_pattern"), r"missing metadata key .*sliding_window_pattern'"),
    ("llama", drop("llama.feed_forward_length"), r"missing metadata key 'llama\.feed_forward_length'"),
    ("llama", u32("llama.block_count", 5), r"missing tensor 'blk\.4\.attn_norm\.weight'"),
    # tensors: shapes, presence, types, values
    ("gemma4", tensor("blk.0.attn_norm.weight", dims=[32]), r"'blk\.0\.attn_norm\.weight' has shape \[32\]"),
    ("gemma4", tensor("blk.2.attn_q_norm.weight", dims=[64, 1]), r"'blk\.2\.attn_q_norm\.weight' has shape \[1, 64\]"),
    ("gemma4", drop_tensor("blk.3.ffn_up.weight"), r"missing tensor 'blk\.3\.ffn_up\.weight'"),
    ("gemma4", drop_tensor("per_layer_model_proj.weight"), r"missing tensor 'per_layer_model_proj\.weight'"),
    ("gemma4", tensor("token_embd.weight", dims=[64 * 512]), r"'token_embd\.weight' has shape"),
    ("gemma4", tensor("blk.1.attn_q.weight", ggml_type=9), r"'blk\.1\.attn_q\.weight' has type Q8_1"),
    ("gemma4", tensor("blk.1.attn_q.weight", fill=b"\xff"), r"'blk\.1\.attn_q\.weight' has non-finite"),
    ("gemma3", tensor("blk.0.ffn_norm.weight", fill=b"\xff"), r"'blk\.0\.ffn_norm\.weight' has non-finite"),
    ("gemma4", tensor("rope_freqs.weight", dims=[4]), r"'rope_freqs\.weight' has 4 factors"),
    ("gemma4", tensor("blk.0.layer_output_scale.weight", dims=[3]), r"layer_output_scale\.weight' has shape \[3\]"),
    # tokenizer and chat template
    ("gemma4", array("tokenizer.ggml.tokens", fm.U32, [1, 2]), r"'tokenizer\.ggml\.tokens' .*array of strings"),
    ("gemma4", drop("tokenizer.ggml.tokens"), r"missing metadata key 'tokenizer\.ggml\.tokens'"),
    ("gemma4", u32("tokenizer.ggml.bos_token_id", 9999), r"'tokenizer\.ggml\.bos_token_id' = 9999 is outside"),
    ("gemma4", string("tokenizer.ggml.bos_token_id", "2"), r"'tokenizer\.ggml\.bos_token_id' = '2'"),
    ("gemma4", array("tokenizer.ggml.add_bos_token", fm.BOOL, [1, 0]), r"'tokenizer\.ggml\.add_bos_token'"),
    ("gemma4", array("tokenizer.ggml.scores", fm.F32, [0.0] * 100), r"'tokenizer\.ggml\.scores' has 100 entries"),
    ("gemma4", tokens(["<pad>", "<pad>"]), r"'tokenizer\.ggml\.tokens' has '<pad>' twice \(ids 0 and 1\)"),
    ("gemma4", tokens(["a", b"\xff\xfe".decode("utf-8", "surrogateescape")]), r"tokens'\[1\] .* not valid UTF-8"),
    ("gemma4", string("tokenizer.ggml.model", "bert"), r"'tokenizer\.ggml\.model' is 'bert'"),
    ("llama", string("tokenizer.ggml.pre", "nope"), r"'tokenizer\.ggml\.pre' = 'nope'"),
    ("llama", array("tokenizer.ggml.merges", fm.STRING, ["a b", "ab"]), r"'tokenizer\.ggml\.merges'\[1\] = 'ab'"),
    ("llama", drop("tokenizer.chat_template"), r"missing metadata key 'tokenizer\.chat_template'"),
    ("llama", string("tokenizer.chat_template", "{% for x in %}"), r"'tokenizer\.chat_template' does not compile"),
    # the real SmolLM2 header, rewritten small
    ("smollm2-small", u32("llama.attention.head_count_kv", 2), r"'blk\.0\.attn_k\.weight'.*head_count_kv 2"),
    ("smollm2-small", u32("llama.attention.head_count_kv", 3), r"head_count = 2 is not a multiple of .*_kv = 3"),
    ("smollm2-small", drop_tensor("output_norm.weight"), r"missing tensor 'output_norm\.weight'"),
    ("smollm2-small", u32("llama.attention.head_count", 3), r"llama\.rope\.dimension_count = 32 .*head dim 21"),
    # DFlash drafters (loaded against the gemma4 corpus)
    ("dflash", drop("dflash.target_layers"), r"missing metadata key 'dflash\.target_layers'"),
    ("dflash", array("dflash.target_layers", fm.U32, []), r"'dflash\.target_layers' = \[\]"),
    ("dflash", array("dflash.target_layers", fm.U32, [1, 99]), r"reads target layers \[99\]"),
    ("dflash", u32("dflash.block_size", 1), r"'dflash\.block_size' = 1"),
    ("dflash", u32("dflash.block_size", 2**32 - 1), r"'dflash\.block_size' = 4294967295"),
    ("dflash", u32("dflash.attention.head_count_kv", 3), r"dflash\.attention\.head_count_kv"),
    ("dflash", u32("dflash.rope.dimension_count", 1 << 40, fm.U64), r"'dflash\.rope\.dimension_count'"),
    ("dflash", string("tokenizer.ggml.mask_token_id", "4"), r"'tokenizer\.ggml\.mask_token_id' = '4'"),
    ("dflash", drop("tokenizer.ggml.mask_token_id"), r"missing metadata key 'tokenizer\.ggml\.mask_token_id'"),
    ("dflash", u32("dflash.target_hidden_size", 32), r"drafter hostile\.gguf expects target hidden size 32"),
    ("dflash", array("dflash.target_layers", fm.U32, [1]), r"fc\.weight' has shape \[64, 128\], expected \[64, 64\]"),
    ("dflash", tensor("blk.0.attn_k_norm.weight", dims=[8]), r"'blk\.0\.attn_k_norm\.weight' has shape \[8\]"),
    ("dflash", drop_tensor("enc.output_norm.weight"), r"no encoder norm"),
    ("dflash", u32("dflash.attention.sliding_window", 8), None),  # harmless: loads (ring-less sliding window)
]


@pytest.mark.parametrize("corpus_name, edit, match", CASES,
                         ids=[f"{c}-{i}" for i, (c, _, _) in enumerate(CASES)])
def test_hostile_file_is_a_named_gguf_error(raws, corpus, tmp_path, corpus_name, edit, match):
    path = variant(raws, corpus_name, tmp_path, edit)
    t0 = time.perf_counter()
    if match is None:
        engine = load(path, corpus_name, corpus)
        assert engine.generate(engine.tok.encode("Hi", add_bos=True) or [0], SamplingParams(max_tokens=3))
        return
    with pytest.raises(GGUFError, match=match) as e:
        load(path, corpus_name, corpus)
    assert path.name in str(e.value)  # the message names the file
    assert time.perf_counter() - t0 < 10


def test_a_file_without_any_tokenizer_is_refused_by_name(tmp_path):
    """Layout-only files (no tokenizer keys at all) pass the reader's checks but cannot make an Engine."""
    path = write_random_model(tmp_path / "layout-only.gguf", "gemma3", "tiny", seed=1, tokenizer="none")
    with pytest.raises(GGUFError, match=r"layout-only\.gguf: tokenizer\.ggml\.tokens is missing"):
        Engine.load(path, n_ctx=64)


def test_weights_that_overflow_are_refused_not_babbled(tmp_path):
    """Finite weights whose products overflow fp32 (3e38 in an MLP) give non-finite logits: a named error at the
    first prefill, not tokens picked from NaNs. Negative control: the same file unedited generates."""
    import numpy as np

    path = write_random_model(tmp_path / "overflow.gguf", "gemma3", "tiny", seed=2, quant="f32")
    assert Engine.load(path, n_ctx=64).generate([2, 100, 200], SamplingParams(max_tokens=2)).completion_ids
    with GGUFFile(path) as gf:
        info = gf.info("blk.0.ffn_down.weight")
    np.memmap(path, dtype=np.float32, mode="r+", offset=info.offset, shape=(info.nbytes // 4,))[:] = 3e38
    engine = Engine.load(path, n_ctx=64)
    with pytest.raises(GGUFError, match=r"overflow\.gguf: the model's logits are not finite"):
        engine.generate([2, 100, 200], SamplingParams(max_tokens=2))


def test_refused_before_any_weight_is_built(raws, corpus, tmp_path):
    """Config and tensor checks live in config_from_gguf / draft_config_from_gguf: nothing is allocated yet."""
    for name, edit, cfg_of in (
            ("gemma4", u32(G4 + "rope.dimension_count_swa", 1 << 40, fm.U64), config_from_gguf),
            ("gemma4", tensor("blk.0.attn_norm.weight", dims=[32]), config_from_gguf),
            ("dflash", tensor("blk.0.ffn_down.weight", dims=[64, 64]), draft_config_from_gguf)):
        with GGUFFile(variant(raws, name, tmp_path, edit)) as gf, pytest.raises(GGUFError):
            cfg_of(gf)


def test_kv_cache_is_sized_by_the_callers_n_ctx(raws, corpus, tmp_path):
    """A file claiming a 2^32-token context gets a KV cache for the caller's n_ctx, not its own."""
    path = variant(raws, "gemma4", tmp_path, u32(G4 + "context_length", 2**32, fm.U64))
    engine = Engine.load(path, n_ctx=64)
    assert engine.n_ctx == 64 and engine.cfg.n_ctx_train == 2**32
    assert engine.new_session().cache.nbytes <= engine.cfg.kv_bytes(64, dtype_bytes=4, max_step=512)


def test_per_token_kv_bound(raws, corpus, tmp_path, monkeypatch):
    """Per-token costs no single key bounds (layers x KV heads x head dim) are bounded as a product."""
    monkeypatch.setattr(validate, "MAX_KV_BYTES_PER_TOKEN", 1024)
    with GGUFFile(corpus / "gemma4.gguf") as gf, pytest.raises(GGUFError, match="bytes per token"):
        config_from_gguf(gf)


def test_controls_load_and_generate(corpus):
    """Negative control: every unmutated corpus file loads and generates (the header-only one is refused)."""
    for name in fuzz_corpus.WEIGHTS:
        path = corpus / f"{name}.gguf"
        if name == "smollm2-header":
            with pytest.raises(GGUFError, match=r"smollm2-header\.gguf: (truncated|tensor .* overlaps)"):
                Engine.load(path, n_ctx=64)
            continue
        engine = load(path, name, corpus)
        res = engine.generate(engine.tok.encode("Hello world", add_bos=True), SamplingParams(max_tokens=3))
        assert len(res.completion_ids) >= 1, name


def test_fuzz_cases(corpus, tmp_path):
    """A few hundred seeded cases of the bench's own mutations, through its runner and one worker process (memory
    and time limited): each one refused with a named GGUFError or loaded and generated."""
    out = tmp_path / "fuzz.json"
    rc = fuzz_load.main(["--cases", "300", "--seed", "7", "--workers", "1", "--workdir", str(corpus),
                         "--timeout", "30", "--json", str(out), "--no-progress"])
    summary = json.loads(out.read_text())
    assert summary["failures"] == [] and rc == 0, summary["failures"][:5]
    counts = summary["counts"]
    assert counts["refused"] + counts["ok"] == 300 and counts["refused"] > 150 and counts["ok"] > 20, counts
    assert set(summary["controls"].values()) == {"ok", "refused"}  # the header-only corpus is refused
