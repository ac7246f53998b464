"""Test models: gemma3, gemma4, llama and dflash drafters with random weights and real tokenizers, written as GGUF.

A dev tool (the runtime never imports it): the file format, the tensor layout and HF naming are the engine's GGUF
writer's (engine/gguf/writer.py and layout.py, which `bolt train-drafter` ships drafters with); this module adds what
only tests and benches want: presets, seeded random weights, and tokenizers copied from real models by name.

`random_model(arch, preset, seed)` gives (hparams, state dict) for the small presets, and `write_random_model` streams
any preset (E4B included) tensor by tensor: each tensor comes from its own seeded generator (seed, name), so a streamed
file equals `write_model(random_model(...))` bit for bit. `write_model` is the writer's with a tokenizer by name.

Tokenizers are copied from real models: `gemma` = Gemma 3 270M's 262144-token SentencePiece vocabulary (for gemma4,
Gemma 4's control tokens replace the `<unusedN>`/turn tokens at Gemma 4's ids, see `GEMMA4_TOKENS`); `smollm2` =
SmolLM2-135M-Instruct's GPT-2 BPE vocabulary with merges and chat template. Drafters copy their target's tokenizer.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
import zlib
from collections.abc import Iterator, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from bolt_ros.engine.gguf import writer
from bolt_ros.engine.gguf.layout import ARCHS, QUANTS, ModelSpec, Quant, TensorSpec, gemma4_rope_freqs, tensor_plan
from bolt_ros.engine.gguf.reader import GGUFFile
from bolt_ros.engine.gguf.writer import ArraySource, Source

# Gemma 4's control tokens at their ids in the Gemma 4 vocabulary. The Gemma 3 vocabulary has `<unusedN>` (id N+6)
# at 46..52, 98, 100, 101 and <start_of_turn>/<end_of_turn> at 105/106; a gemma4 test model gets these instead.
# Types follow llama.cpp's Gemma 4 converter: the tokens the chat parser must see as text are USER_DEFINED (4).
GEMMA4_TOKENS: dict[int, tuple[str, int]] = {
    46: ("<|tool>", 3), 47: ("<tool|>", 3), 48: ("<|tool_call>", 4), 49: ("<tool_call|>", 4),
    50: ("<|tool_response>", 4), 51: ("<tool_response|>", 4), 52: ('<|"|>', 4), 98: ("<|think|>", 3),
    100: ("<|channel>", 4), 101: ("<channel|>", 4), 105: ("<|turn>", 3), 106: ("<turn|>", 3),
}


# --- random weights -------------------------------------------------------------------------------------------------
class RandomSource(Source):
    """Seeded uniform values with a given mean and std; the stream does not depend on the chunk size."""

    def __init__(self, shape: tuple[int, ...], seed: int, name: str, mean: float, std: float):
        super().__init__(shape)
        self.seed_seq = np.random.SeedSequence([seed, zlib.crc32(name.encode())])
        self.mean, self.half = mean, std * math.sqrt(3.0)

    def chunks(self, max_elems: int) -> Iterator[np.ndarray]:
        rng = np.random.Generator(np.random.PCG64(self.seed_seq))
        step = max(1, max_elems // self.ne0)
        for r in range(0, self.rows, step):
            n = min(step, self.rows - r)
            u = rng.random((n, self.ne0), dtype=np.float32)  # [n, ne0] in [0, 1)
            u *= 2 * self.half
            u += self.mean - self.half
            yield u


def _random_source(t: TensorSpec, spec: ModelSpec, seed: int) -> Source:
    if t.kind == "rope_freqs":
        return ArraySource(gemma4_rope_freqs(spec))
    if t.kind == "norm":
        # gemma3 stores 1 + w; gemma4/llama/dflash weights sit around 1 too
        return RandomSource(t.shape, seed, t.name, 1.0, 0.1)
    if t.kind == "scale":
        return RandomSource(t.shape, seed, t.name, 0.75, 0.1)
    fan_in = t.shape[-1]
    std = 1.0 / math.sqrt(spec.n_embd) if t.kind == "embd" else 1.0 / math.sqrt(fan_in)
    return RandomSource(t.shape, seed, t.name, 0.0, std)


# --- tokenizers -----------------------------------------------------------------------------------------------------
@lru_cache(maxsize=4)
def _tokenizer_from(path: str) -> tuple[tuple[str, Any], ...]:
    with GGUFFile(path) as gf:
        return tuple((k, v) for k, v in gf.metadata.items() if k.startswith("tokenizer."))


@lru_cache(maxsize=4)
def tokenizer_metadata(name: str) -> tuple[tuple[str, Any, VT], ...]:
    """(key, value, type) of a named tokenizer: `gemma`, `gemma4` (Gemma 3 vocab + Gemma 4 tokens), `smollm2`."""
    from bolt_ros.engine.default_models import resolve_model

    if name not in ("gemma", "gemma4", "smollm2"):
        raise ValueError(f"unknown tokenizer {name!r} (gemma, gemma4, smollm2)")
    src = resolve_model("smollm2" if name == "smollm2" else "default")
    items = dict(_tokenizer_from(str(src)))
    if name == "gemma4":
        tokens = list(items["tokenizer.ggml.tokens"])
        types = items["tokenizer.ggml.token_type"].copy()
        for i, (text, ttype) in GEMMA4_TOKENS.items():
            tokens[i], types[i] = text, ttype
        items["tokenizer.ggml.tokens"], items["tokenizer.ggml.token_type"] = tokens, types
    return writer.tokenizer_items(items)


_DEFAULT_TOKENIZER = {"gemma3": "gemma", "gemma4": "gemma4", "llama": "smollm2"}


def _test_tokenizer(arch: str, tokenizer: str | None) -> tuple[tuple[str, Any, VT], ...]:
    if tokenizer == "none" or arch not in _DEFAULT_TOKENIZER:
        return ()  # layout-only; a dflash drafter gets its target's from the writer (an unknown arch, its error)
    return tokenizer_metadata(tokenizer or _DEFAULT_TOKENIZER[arch])


def write_model(path: str | Path, arch: str, hparams: Mapping[str, Any] | ModelSpec,
                state_dict: Mapping[str, Any], quant: Quant = "f32", tokenizer: str | None = None, *,
                target: str | Path | None = None, search: bool = True, name: str | None = None) -> Path:
    """`writer.write_model` with a test tokenizer by name; returns the path.

    `tokenizer`: `gemma`, `gemma4` or `smollm2` (default per arch: gemma3 -> gemma, gemma4 -> gemma4,
    llama -> smollm2), or `none` for a layout-only file with any vocab_size (fast gguf-py round trips; llama.cpp
    cannot run it); a dflash drafter copies the tokenizer of its `target` GGUF. The vocabulary size in hparams must
    match the tokenizer's.
    """
    return writer.write_model(path, arch, hparams, state_dict, quant, _test_tokenizer(arch, tokenizer), target=target,
                              search=search, name=name or f"bolt testmodel {arch}")


# --- presets --------------------------------------------------------------------------------------------------------
GEMMA_VOCAB, SMOLLM2_VOCAB = 262144, 49152


def preset_spec(arch: str, preset: str) -> ModelSpec:
    """Named hyper-parameter sets. `tiny` presets keep the real vocabularies (the tokenizer needs them): gemma ones
    are 64 wide (K-quant rows need multiples of 256, so their q4_k_m falls back to Q5_0/Q8_0 as llama.cpp does),
    llama tiny is 256 wide so its q4_k_m has real Q4_K/Q6_K tensors; gemma4 `e4b` has Gemma 4 E4B's exact shapes."""
    presets: dict[tuple[str, str], dict[str, Any]] = {
        ("gemma3", "tiny"): dict(n_layer=6, n_embd=64, n_head=2, n_head_kv=1, head_dim=32, n_ff=128,
                                 vocab_size=GEMMA_VOCAB, rope_base=1e6, sliding_window=16, context_length=2048),
        ("gemma4", "tiny"): dict(n_layer=6, n_embd=64, n_head=2, n_head_kv=1, head_dim=64, head_dim_swa=32,
                                 n_ff=128, vocab_size=GEMMA_VOCAB, rope_base=1e6, sliding_window=16,
                                 swa_layers=[True, True, True, False, True, False], shared_kv_layers=2, ple_dim=16,
                                 final_logit_softcap=30.0, context_length=2048),
        ("gemma4", "e4b"): dict(n_layer=42, n_embd=2560, n_head=8, n_head_kv=2, head_dim=512, head_dim_swa=256,
                                n_ff=10240, vocab_size=GEMMA_VOCAB, rope_base=1e6, sliding_window=512,
                                swa_layers=[il % 6 != 5 for il in range(42)], shared_kv_layers=18, ple_dim=256,
                                final_logit_softcap=30.0, context_length=131072),
        ("llama", "tiny"): dict(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                                vocab_size=SMOLLM2_VOCAB, rope_base=1e5, rms_eps=1e-5, context_length=2048),
    }
    if (arch, preset) not in presets:
        names = ", ".join(f"{a}/{p}" for a, p in presets)
        raise ValueError(f"no preset {preset!r} for {arch!r} (have {names}; dflash drafters take --target)")
    return ModelSpec(arch=arch, **presets[(arch, preset)])


def dflash_spec(target: GGUFFile, n_layers: int = 5, *, block_size: int = 8, mask_token_id: int = 4,
                target_layers: list[int] | None = None, embedding_scale: float | str | None = "auto") -> ModelSpec:
    """A drafter for `target`: hidden = the target's hidden size, Qwen3-style layers, z-lab's default layer choice.

    embedding_scale "auto" follows llama.cpp's current converter: sqrt(hidden) for Gemma targets (their embedding
    module scales), none otherwise.
    """
    arch = target.arch()
    H = int(target.require(f"{arch}.embedding_length"))
    L = int(target.require(f"{arch}.block_count"))
    if target_layers is None:
        target_layers = [L // 2] if n_layers == 1 else [
            round(1 + i * (L - 4) / (n_layers - 1)) for i in range(n_layers)]
    if embedding_scale == "auto":
        embedding_scale = math.sqrt(H) if arch.startswith("gemma") else None
    head_dim, n_head = (128, 32) if H >= 1024 else (16, 4)
    tokens = target.get("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if tokens is not None else int(target.require(f"{arch}.vocab_size"))
    return ModelSpec(arch="dflash", n_layer=n_layers, n_embd=H, n_head=n_head, n_head_kv=max(1, n_head // 4),
                     head_dim=head_dim, n_ff=2 * H, vocab_size=n_vocab, rms_eps=1e-6,
                     rope_base=float(target.get(f"{arch}.rope.freq_base", 10000.0)),
                     context_length=int(target.get(f"{arch}.context_length", 8192)),
                     target_layers=target_layers, target_hidden=H, block_size=block_size,
                     mask_token_id=mask_token_id, embedding_scale=embedding_scale)


def _random_sources(spec: ModelSpec, seed: int) -> dict[str, Source]:
    return {t.name: _random_source(t, spec, seed) for t in tensor_plan(spec)}


def random_model(arch: str, preset: str = "tiny", seed: int = 0, *,
                 target: str | Path | None = None, layers: int = 5) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(hparams, state dict with GGUF names, float32 numpy) of a random model; for dflash pass `target`."""
    spec = _spec_for(arch, preset, target, layers)
    n = sum(math.prod(t.shape) for t in tensor_plan(spec))
    if n > 1 << 29:
        raise ValueError(f"{arch}/{preset} has {n / 1e9:.1f}B parameters: stream it with write_random_model")
    state = {k: s.full() for k, s in _random_sources(spec, seed).items()}
    return spec.model_dump(exclude={"arch"}), state


def _spec_for(arch: str, preset: str, target: str | Path | None, layers: int) -> ModelSpec:
    if arch == "dflash":
        if target is None:
            raise ValueError("dflash needs --target T.gguf")
        with GGUFFile(target) as tf:
            return dflash_spec(tf, layers)
    return preset_spec(arch, preset)


def write_random_model(path: str | Path, arch: str, preset: str = "tiny", seed: int = 0, quant: Quant = "f32", *,
                       target: str | Path | None = None, layers: int = 5, tokenizer: str | None = None,
                       search: bool = False) -> Path:
    """Stream a random model to GGUF, one seeded tensor at a time (any size; E4B needs ~1 GB of RAM at most).

    `search=False` (default) skips the K-quant scale search: random weights gain nothing from it and E4B-sized
    tensors would take minutes more.
    """
    spec = _spec_for(arch, preset, target, layers)
    tok = writer.tokenizer_of(target) if arch == "dflash" else _test_tokenizer(arch, tokenizer)
    writer.write_sources(path, spec, _random_sources(spec, seed), quant, tok, search=search,
                         name=f"bolt testmodel {arch} {preset if arch != 'dflash' else 'drafter'} seed {seed}")
    return Path(path)


# --- CLI ------------------------------------------------------------------------------------------------------------
def add_testmodel_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("testmodel", help="write a random test model as GGUF (llama.cpp layout)")
    p.add_argument("--arch", required=True, choices=ARCHS)
    p.add_argument("--preset", default="tiny", help="tiny (gemma3/gemma4/llama) or e4b (gemma4)")
    p.add_argument("--quant", default="f32", choices=QUANTS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="output .gguf path")
    p.add_argument("--target", help="dflash: the target model GGUF")
    p.add_argument("--layers", type=int, default=5, help="dflash: number of drafter layers")
    p.add_argument("--search", action="store_true", help="K-quants: llama.cpp's full scale search (slower)")
    p.set_defaults(func=run_testmodel)
    return p


def run_testmodel(args: argparse.Namespace) -> int:
    from bolt_ros.engine.default_models import resolve_model

    target = str(resolve_model(args.target)) if args.target else None
    if args.layers < 1:
        raise ValueError("--layers must be >= 1")
    t0 = time.perf_counter()
    path = write_random_model(args.out, args.arch, args.preset, args.seed, args.quant, target=target,
                              layers=args.layers, search=args.search)
    size = path.stat().st_size
    print(f"wrote {path} ({size / 1e6:.1f} MB) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":  # python -m bolt_ros.devtools.testmodel --arch gemma3 --out x.gguf
    parser = argparse.ArgumentParser(prog="testmodel")
    sub = parser.add_subparsers()
    add_testmodel_parser(sub)
    ns = parser.parse_args(["testmodel", *sys.argv[1:]])
    sys.exit(ns.func(ns))
