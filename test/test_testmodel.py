"""The GGUF writer (engine/gguf/writer.py, layout.py) and the test models written with it (devtools/testmodel.py):
files read back by gguf-py and GGUFFile, exact (f32) or within quantization error, with llama.cpp's names, the real
tokenizers, the Q4_K_M type mix, HF-name conversion and dflash drafter keys."""
import argparse
import math

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf import quants as gguf_quants

from bolt_ros.devtools import testmodel as tm
from bolt_ros.engine.default_models import resolve_model
from bolt_ros.engine.gguf import layout
from bolt_ros.engine.gguf import writer as gw
from bolt_ros.engine.gguf.reader import GGUFFile, torch_shape


def dequant(gf: GGUFFile, name: str) -> np.ndarray:
    info = gf.tensors[name]
    return gguf_quants.dequantize(np.array(gf.raw(name)), QT(info.ggml_type)).reshape(torch_shape(info))


def small_model(arch: str, seed: int = 7):
    """The tiny preset with a 512-token vocabulary (layout tests write tokenizer="none", which allows any size)."""
    spec = tm.preset_spec(arch, "tiny").model_copy(update={"vocab_size": 512})
    state = {k: s.full() for k, s in tm._random_sources(spec, seed).items()}
    return spec.model_dump(exclude={"arch"}), state


@pytest.fixture(scope="module")
def tiny_states():
    return {a: small_model(a) for a in ("gemma3", "gemma4", "llama")}


@pytest.fixture(scope="module")
def gemma3_file(tmp_path_factory):
    """A tiny gemma3 with the real Gemma vocabulary (a target for drafter tests too)."""
    path = tmp_path_factory.mktemp("g3") / "gemma3.gguf"
    tm.write_random_model(path, "gemma3", "tiny", seed=1, quant="q8_0")
    return path


# --- layout: gguf-py and GGUFFile read exactly what was written ---------------------------------------------------


@pytest.mark.parametrize("arch", ["gemma3", "gemma4", "llama"])
def test_f32_roundtrip_is_exact(tmp_path, tiny_states, arch):
    hparams, state = tiny_states[arch]
    path = tm.write_model(tmp_path / "m.gguf", arch, hparams, state, "f32", tokenizer="none")
    reader = GGUFReader(path)
    plan = layout.tensor_plan(layout.ModelSpec(arch=arch, **hparams))
    assert [t.name for t in reader.tensors] == [t.name for t in plan]
    with GGUFFile(path) as gf:
        assert gf.arch() == arch
        for t in reader.tensors:
            want = state[t.name]
            assert tuple(int(d) for d in t.shape) == tuple(reversed(want.shape)), t.name  # ggml order
            np.testing.assert_array_equal(np.asarray(t.data).reshape(want.shape), want, err_msg=t.name)
            np.testing.assert_array_equal(gf.raw(t.name).view(np.float32).reshape(want.shape), want)
        assert gf.metadata[f"{arch}.block_count"] == hparams["n_layer"]
        assert gf.metadata[f"{arch}.embedding_length"] == hparams["n_embd"]


def test_gemma4_layout(tiny_states, tmp_path):
    hparams, state = tiny_states["gemma4"]
    path = tm.write_model(tmp_path / "g4.gguf", "gemma4", hparams, state, "f32", tokenizer="none")
    with GGUFFile(path) as gf:
        md = gf.metadata
        assert list(md["gemma4.attention.sliding_window_pattern"]) == [True, True, True, False, True, False]
        assert md["gemma4.attention.shared_kv_layers"] == 2
        assert md["gemma4.attention.key_length"] == 64 and md["gemma4.attention.key_length_swa"] == 32
        assert md["gemma4.embedding_length_per_layer_input"] == 16
        assert md["gemma4.final_logit_softcapping"] == 30.0
        names = set(gf.tensors)
        # the last two layers share KV: no k/v projections or k norms of their own
        for il in range(6):
            assert (f"blk.{il}.attn_k.weight" in names) == (il < 4)
            assert (f"blk.{il}.attn_k_norm.weight" in names) == (il < 4)
        assert torch_shape(gf.tensors["blk.3.attn_q.weight"]) == (2 * 64, 64)  # full layer: head dim 64
        assert torch_shape(gf.tensors["blk.1.attn_q.weight"]) == (2 * 32, 64)  # sliding layer: head dim 32
        assert torch_shape(gf.tensors["per_layer_token_embd.weight"]) == (512, 6 * 16)
        freqs = gf.raw("rope_freqs.weight").view(np.float32)
        np.testing.assert_array_equal(freqs, np.array([1.0] * 8 + [1e30] * 24, np.float32))  # 8 of 32 pairs rotate
        assert "output.weight" not in names  # tied


def test_streaming_equals_state_dict_write(tmp_path, tiny_states, monkeypatch):
    hparams, state = tiny_states["gemma4"]
    a = tm.write_model(tmp_path / "a.gguf", "gemma4", hparams, state, "f32", tokenizer="none", name="n")
    monkeypatch.setattr(gw._Deferred, "CHUNK", 1000)  # many small chunks: the random stream must not depend on them
    spec = layout.ModelSpec(arch="gemma4", **hparams)
    gw.write_sources(tmp_path / "b.gguf", spec, tm._random_sources(spec, 7), "f32", (), search=False, name="n")
    assert a.read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_random_model_equals_streamed_preset(tmp_path):
    hparams, state = tm.random_model("llama", "tiny", seed=4)
    a = tm.write_model(tmp_path / "a.gguf", "llama", hparams, state, "q8_0", name="bolt testmodel llama tiny seed 4")
    b = tm.write_random_model(tmp_path / "b.gguf", "llama", "tiny", seed=4, quant="q8_0")
    assert a.read_bytes() == b.read_bytes()


def test_seed_changes_weights():
    _, s1 = small_model("llama", seed=1)
    _, s2 = small_model("llama", seed=2)
    assert not np.array_equal(s1["blk.0.attn_q.weight"], s2["blk.0.attn_q.weight"])


# --- quantized files ----------------------------------------------------------------------------------------------


def test_q4_k_m_mix_and_error(tmp_path, tiny_states):
    hparams, state = tiny_states["llama"]  # 256 wide: real K-quants
    path = tm.write_model(tmp_path / "q.gguf", "llama", hparams, state, "q4_k_m", tokenizer="none", search=False)
    with GGUFFile(path) as gf:
        types = {n: QT(i.ggml_type) for n, i in gf.tensors.items()}
        assert types["token_embd.weight"] == QT.Q6_K  # tied embedding = output head
        assert types["blk.0.attn_q.weight"] == QT.Q4_K
        # llama.cpp's use_more_bits(i, 4): layers 2 and 3 get Q6_K attn_v / ffn_down
        assert [types[f"blk.{i}.attn_v.weight"] for i in range(4)] == [QT.Q4_K, QT.Q4_K, QT.Q6_K, QT.Q6_K]
        assert [types[f"blk.{i}.ffn_down.weight"] for i in range(4)] == [QT.Q4_K, QT.Q4_K, QT.Q6_K, QT.Q6_K]
        assert types["blk.0.attn_norm.weight"] == QT.F32
        assert gf.metadata["general.file_type"] == 15
        for name, qt in types.items():
            x, y = state[name], dequant(gf, name)
            err = np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2))
            limit = {QT.F32: 0.0, QT.Q6_K: 0.025, QT.Q4_K: 0.1}[qt]
            assert err <= limit, (name, qt.name, err)


def test_q8_0_and_f16(tmp_path, tiny_states):
    hparams, state = tiny_states["gemma3"]
    for quant, qt, tol in (("q8_0", QT.Q8_0, 0.01), ("f16", QT.F16, 1e-3)):
        path = tm.write_model(tmp_path / f"{quant}.gguf", "gemma3", hparams, state, quant, tokenizer="none")
        with GGUFFile(path) as gf:
            assert QT(gf.tensors["blk.0.ffn_up.weight"].ggml_type) == qt
            assert QT(gf.tensors["blk.0.attn_q_norm.weight"].ggml_type) == QT.F32
            y = dequant(gf, "blk.0.ffn_up.weight")
            x = state["blk.0.ffn_up.weight"]
            assert np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)) < tol


def test_small_rows_fall_back_like_llama_cpp(tiny_states):
    hparams, _ = tiny_states["gemma3"]  # 64 wide: no 256-blocks, so Q4_K -> Q5_0 and Q6_K -> Q8_0
    spec = layout.ModelSpec(arch="gemma3", **hparams)
    plan = {t.name: t for t in layout.tensor_plan(spec)}
    assert layout.tensor_type(plan["blk.0.attn_q.weight"], spec, "q4_k_m") == QT.Q5_0
    assert layout.tensor_type(plan["token_embd.weight"], spec, "q4_k_m") == QT.Q8_0


def test_e4b_plan_has_exact_shapes_and_mix():
    spec = tm.preset_spec("gemma4", "e4b")
    plan = {t.name: t for t in layout.tensor_plan(spec)}
    assert plan["token_embd.weight"].shape == (262144, 2560)
    assert plan["per_layer_token_embd.weight"].shape == (262144, 42 * 256)
    assert plan["per_layer_model_proj.weight"].shape == (42 * 256, 2560)
    assert plan["blk.5.attn_q.weight"].shape == (8 * 512, 2560)  # full layer
    assert plan["blk.4.attn_k.weight"].shape == (2 * 256, 2560)  # sliding layer
    assert "blk.23.attn_k.weight" in plan and "blk.24.attn_k.weight" not in plan  # 18 shared-KV layers
    assert plan["blk.41.ffn_down.weight"].shape == (2560, 10240)
    assert [il for il in range(42) if not spec.swa_layers[il]] == [5, 11, 17, 23, 29, 35, 41]
    n_params = sum(math.prod(t.shape) for t in plan.values())
    assert 7.3e9 < n_params < 7.6e9  # "8B total" counts the vision/audio towers too
    types = {n: layout.tensor_type(t, spec, "q4_k_m") for n, t in plan.items()}
    assert types["per_layer_token_embd.weight"] == QT.Q6_K and types["token_embd.weight"] == QT.Q6_K
    assert types["per_layer_model_proj.weight"] == QT.F16
    assert types["blk.10.ffn_gate.weight"] == QT.Q4_K and types["blk.0.ffn_down.weight"] == QT.Q6_K
    assert types["blk.0.layer_output_scale.weight"] == QT.F32
    size = sum(layout.tensor_nbytes(types[n], t.shape) for n, t in plan.items())
    assert 4.5e9 < size < 6.5e9  # the published Q4_K_M file is 6.18 GB (its PLE/embedding types may differ)


# --- tokenizers ---------------------------------------------------------------------------------------------------


def test_gemma_tokenizer_is_copied(gemma3_file):
    with GGUFFile(resolve_model("default")) as real, GGUFFile(gemma3_file) as gf:
        for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.model", "tokenizer.ggml.bos_token_id",
                    "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix"):
            assert gf.metadata[key] == real.metadata[key], key
        np.testing.assert_array_equal(gf.metadata["tokenizer.ggml.scores"], real.metadata["tokenizer.ggml.scores"])
        np.testing.assert_array_equal(gf.metadata["tokenizer.ggml.token_type"],
                                      real.metadata["tokenizer.ggml.token_type"])
        assert gf.metadata["gemma3.vocab_size"] == 262144
        assert torch_shape(gf.tensors["token_embd.weight"]) == (262144, 64)


def test_gemma4_file_tokens(tmp_path):
    path = tm.write_random_model(tmp_path / "g4.gguf", "gemma4", "tiny", seed=3, quant="q8_0")
    with GGUFFile(path) as gf:
        toks, types = gf.metadata["tokenizer.ggml.tokens"], gf.metadata["tokenizer.ggml.token_type"]
        assert len(toks) == 262144
        assert (toks[105], toks[106], toks[48], toks[52]) == ("<|turn>", "<turn|>", "<|tool_call>", '<|"|>')
        assert types[48] == 4 and types[105] == 3  # USER_DEFINED renders as text; CONTROL does not
        assert toks[4] == "<mask>" and toks[1] == "<eos>" and toks[47 + 6] == "<unused47>"
    with GGUFFile(resolve_model("default")) as real:
        assert real.metadata["tokenizer.ggml.tokens"][105] == "<start_of_turn>"  # what gemma4 files replace


def test_smollm2_tokenizer_for_llama():
    meta = {k: v for k, v, _ in tm.tokenizer_metadata("smollm2")}
    assert meta["tokenizer.ggml.model"] == "gpt2"
    assert meta["tokenizer.ggml.tokens"].count == 49152
    assert meta["tokenizer.ggml.merges"].count > 40000
    assert "im_start" in meta["tokenizer.chat_template"]


def test_string_packing_matches_gguf_writer(tmp_path):
    strings = ["", "a", "bé", "\U0001f600", "<x>"]
    w = gguf.GGUFWriter(None, "llama")
    assert gw._pack_strings(strings).payload == w._pack_val(strings, gguf.GGUFValueType.ARRAY, False)[12:]


# --- HF names -------------------------------------------------------------------------------------------------------


def _gguf_to_hf(arch: str) -> dict[str, str]:
    inv = {}
    layer = {**gw._LAYER_HF, **(gw._LAYER_HF_GEMMA if arch.startswith("gemma") else gw._LAYER_HF_LLAMA)}
    for hf, g in layer.items():
        inv[g] = hf
    return inv


def to_hf(arch: str, hparams: dict, state: dict) -> dict[str, np.ndarray]:
    """GGUF-convention state dict -> HF names and conventions (the inverse of the writer's transforms)."""
    glob = {g: hf for hf, g in gw._GLOBAL_HF.items() if hf.startswith(("model.", "lm_head"))}
    layer = _gguf_to_hf(arch)
    out = {}
    for name, arr in state.items():
        if name == "rope_freqs.weight":
            continue
        if name.startswith("blk."):
            _, il, rest = name.split(".", 2)
            hf = f"model.layers.{il}.{layer[rest]}"
        else:
            hf = glob[name]
        if arch == "gemma3" and name.endswith("norm.weight"):
            arr = arr - 1.0
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            n = hparams["n_head"] if "attn_q" in name else hparams["n_head_kv"]
            arr = arr.reshape(n, arr.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(arr.shape)
        out[hf] = arr
    return out


@pytest.mark.parametrize("arch", ["gemma3", "gemma4", "llama"])
def test_hf_names_convert_to_the_same_file(tmp_path, tiny_states, arch):
    hparams, state = tiny_states[arch]
    hf = to_hf(arch, hparams, state)
    # the names agree with gguf-py's own HF -> GGUF map (what transformers' GGUF loader uses)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], hparams["n_layer"])
    for hf_name in hf:
        base = hf_name.rpartition(".")[0] if hf_name.endswith(".weight") else hf_name
        mapped = name_map.get_name(base)
        assert mapped is not None and gw.hf_to_gguf_name(arch, hf_name).startswith(mapped), hf_name
    a = tm.write_model(tmp_path / "gguf.gguf", arch, hparams, state, "f32", tokenizer="none")
    hf["lm_head.weight"] = hf["model.embed_tokens.weight"]  # HF state dicts carry the tied head too
    b = tm.write_model(tmp_path / "hf.gguf", arch, hparams, hf, "f32", tokenizer="none")
    assert a.read_bytes() == b.read_bytes()


def test_llama_permute_interleaves_rotate_half_pairs():
    # HF rotate-half pairs row i with row i + d/2 in each head; ggml's interleaved RoPE pairs rows 2i and 2i+1
    n_head, d = 2, 8
    w = np.arange(n_head * d, dtype=np.float32)[:, None].repeat(3, 1)
    p = gw._llama_permute(w, n_head)
    for h in range(n_head):
        for i in range(d // 2):
            assert p[h * d + 2 * i, 0] == h * d + i
            assert p[h * d + 2 * i + 1, 0] == h * d + i + d // 2


# --- dflash ---------------------------------------------------------------------------------------------------------


def test_dflash_drafter_keys_and_tensors(tmp_path, gemma3_file):
    path = tm.write_random_model(tmp_path / "d.gguf", "dflash", seed=5, quant="f32", target=gemma3_file, layers=5)
    with GGUFFile(path) as gf, GGUFFile(gemma3_file) as target:
        md = gf.metadata
        assert gf.arch() == "dflash"
        ids = md["dflash.target_layers"]
        assert ids.dtype == np.uint32
        # z-lab's default for a 6-layer target and 5 draft layers: round(1 + i * 2 / 4) -> [1, 2, 2, 2, 3], +1 in GGUF
        assert list(ids) == [2, 3, 3, 3, 4]
        assert md["dflash.block_size"] == 8 and md["tokenizer.ggml.mask_token_id"] == 4
        assert md["dflash.target_hidden_size"] == 64 and md["dflash.embedding_length"] == 64
        assert md["dflash.block_count"] == 5
        assert md["dflash.embedding_scale"] == pytest.approx(8.0)  # sqrt(hidden) for a Gemma target
        assert md["tokenizer.ggml.tokens"] == target.metadata["tokenizer.ggml.tokens"]
        assert torch_shape(gf.tensors["fc.weight"]) == (64, 5 * 64)
        for name in ("enc.output_norm.weight", "output_norm.weight", "blk.4.attn_q_norm.weight",
                     "blk.4.attn_k_norm.weight", "blk.4.ffn_norm.weight", "blk.4.ffn_down.weight"):
            assert name in gf.tensors, name
        assert "token_embd.weight" not in gf.tensors and "output.weight" not in gf.tensors  # borrowed from target


def test_dflash_from_zlab_state_dict(tmp_path, gemma3_file):
    hparams, state = tm.random_model("dflash", target=gemma3_file, layers=2, seed=9)
    a = tm.write_model(tmp_path / "a.gguf", "dflash", hparams, state, target=gemma3_file)
    zlab = {}
    for name, arr in state.items():
        if name.startswith("blk."):
            _, il, rest = name.split(".", 2)
            zlab[f"layers.{il}.{_gguf_to_hf('dflash')[rest]}"] = arr
        else:
            zlab[{"fc.weight": "fc.weight", "enc.output_norm.weight": "hidden_norm.weight",
                  "output_norm.weight": "norm.weight"}[name]] = arr
    b = tm.write_model(tmp_path / "b.gguf", "dflash", hparams, zlab, target=gemma3_file)
    assert a.read_bytes() == b.read_bytes()


# --- errors -------------------------------------------------------------------------------------------------------


def test_bad_inputs_are_rejected(tmp_path, tiny_states):
    hparams, state = tiny_states["llama"]
    out = tmp_path / "x.gguf"
    with pytest.raises(ValueError, match=r"missing \['blk.0.attn_q.weight'\]"):
        tm.write_model(out, "llama", hparams, {k: v for k, v in state.items() if k != "blk.0.attn_q.weight"},
                       tokenizer="none")
    with pytest.raises(ValueError, match=r"unexpected \['blk.9.attn_q.weight'\]"):
        tm.write_model(out, "llama", hparams, {**state, "blk.9.attn_q.weight": state["blk.0.attn_q.weight"]},
                       tokenizer="none")
    with pytest.raises(ValueError, match="shape"):
        tm.write_model(out, "llama", hparams, {**state, "blk.0.attn_q.weight": np.zeros((3, 3), np.float32)},
                       tokenizer="none")
    with pytest.raises(ValueError, match="does not match the 49152-token tokenizer"):
        tm.write_model(out, "llama", {**hparams, "vocab_size": 1000}, state)
    with pytest.raises(ValueError, match="no GGUF name for HF tensor"):
        tm.write_model(out, "llama", hparams, {"model.weird.weight": np.zeros(3)}, tokenizer="none")
    with pytest.raises(ValueError, match="unknown quant"):
        tm.write_model(out, "llama", hparams, state, "q3", tokenizer="none")
    with pytest.raises(ValueError, match="no preset"):
        tm.preset_spec("llama", "e4b")
    with pytest.raises(ValueError, match="needs --target"):
        tm.random_model("dflash")
    with pytest.raises(ValueError, match="multiple of n_head_kv"):
        layout.ModelSpec(**{**hparams, "arch": "llama", "n_head_kv": 3})
    with pytest.raises(ValueError, match="fixed pattern"):
        layout.ModelSpec(**{**tiny_states["gemma3"][0], "arch": "gemma3", "swa_layers": [True] * 6})
    with pytest.raises(ValueError, match="last KV-owning layer"):  # the old tiny layout, which llama.cpp refuses
        layout.ModelSpec(**{**tiny_states["gemma4"][0], "arch": "gemma4",
                        "swa_layers": [True, True, False, True, True, False]})
    with pytest.raises(ValueError, match="write_random_model"):
        tm.random_model("gemma4", "e4b")


def test_cli(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="bolt")
    tm.add_testmodel_parser(parser.add_subparsers())
    out = tmp_path / "cli.gguf"
    args = parser.parse_args(["testmodel", "--arch", "llama", "--quant", "q4_k_m", "--seed", "3", "--out", str(out)])
    assert args.func(args) == 0
    assert "wrote" in capsys.readouterr().err
    with GGUFFile(out) as gf:
        assert gf.metadata["general.name"] == "bolt testmodel llama tiny seed 3"
        assert QT(gf.tensors["blk.0.attn_q.weight"].ggml_type) == QT.Q4_K
        assert gf.metadata["tokenizer.ggml.model"] == "gpt2"
    with pytest.raises(SystemExit):
        parser.parse_args(["testmodel", "--arch", "mamba", "--out", str(out)])
