"""The base files of the hostile-file fuzz (fuzz_load.py), built once into a work directory.

  gemma4, gemma3, llama  tiny test models from our writer (bolt_ros/devtools/testmodel.py; q8_0, f16, q4_k_m)
  dflash                 a 2-layer DFlash drafter from the writer for the gemma4 model (loaded against it)
  smollm2-small          the real SmolLM2-135M header (its tokenizer, template, general.* keys, tensor names and
                         types) rewritten with 2 layers of width 64 and small random weights of the real types
  smollm2-header         the real SmolLM2 header with its tensor data cut off (reader-level fuzz only)

Why the vocabularies are cut to VOCAB tokens: the writer's tokenizers are the real 262144/49152-token ones, and
building those costs ~1 s per load; the first VOCAB tokens keep every special id the presets use, so a case costs
~0.1 s and 10,000 cases fit in minutes on 2 cores. The embedding rows (and the PLE table's) are cut to match.
"""
from __future__ import annotations

import struct
from pathlib import Path

import fuzz_mutate as fm
import numpy as np

VOCAB = 512
MERGES = 256
WEIGHTS = {"gemma4": 22, "gemma3": 14, "llama": 18, "dflash": 16, "smollm2-small": 20, "smollm2-header": 10}
STAMP = "fuzz-corpus-v1"  # bump when a corpus changes, so cached work directories are rebuilt


def shrink_vocab(raw: fm.Raw, n: int = VOCAB) -> None:
    """Cut the tokenizer arrays, the vocab_size key and the vocab-sized tensors to n tokens."""
    for kv in raw.kvs:
        if kv.key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
            fm.slice_array(kv, n)
        elif kv.key == "tokenizer.ggml.merges":
            fm.slice_array(kv, MERGES)
        elif kv.key.endswith(".vocab_size"):
            kv.payload = fm.enc_scalar(kv.vtype, n)
    for t in raw.tensors:
        if t.name in ("token_embd.weight", "output.weight", "per_layer_token_embd.weight"):
            row = len(t.data) // t.dims[1]
            t.dims[1], t.data = n, t.data[:n * row]


def _random_tensor(ggml_type: int, dims: list[int], seed: int, norm: bool) -> bytes:
    from bolt_ros.engine.gguf.quants import random_raw

    rng = np.random.default_rng(seed)
    if norm or ggml_type == 0:  # F32 (norms: near 1; matrices: small), finite by construction
        n = int(np.prod(dims))
        return (rng.normal(1.0 if norm else 0.0, 0.1, n)).astype(np.float32).tobytes()
    return random_raw(ggml_type, (int(np.prod(dims[1:])), dims[0]), seed=seed, max_scale=0.02).tobytes()


def smollm2_small(real: fm.Raw, layers: int = 2) -> fm.Raw:
    """The real header with llama hyper-parameters scaled down and weights of the real types for the new shapes."""
    E, FF, H, KV, HD = 64, 128, 2, 1, 32
    width = {576: E, 1536: FF, 192: KV * HD}  # SmolLM2: 576 = 9 heads x 64, KV 3 x 64, FFN 1536
    raw = fm.Raw(real.version, [fm.KV(kv.key, kv.vtype, kv.payload) for kv in real.kvs], [])
    for key, value in (("block_count", layers), ("embedding_length", E), ("feed_forward_length", FF),
                       ("attention.head_count", H), ("attention.head_count_kv", KV), ("rope.dimension_count", HD)):
        raw.set(f"llama.{key}", fm.U32, fm.enc_scalar(fm.U32, value))
    for i, t in enumerate(real.tensors):
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        dims = [width.get(d, d) for d in t.dims]
        raw.tensors.append(fm.Tensor(t.name, dims, t.ggml_type,
                                     _random_tensor(t.ggml_type, dims, i, t.name.endswith("norm.weight"))))
    return raw


def _smollm2_file() -> Path:
    from bolt_ros.engine.default_models import resolve_model

    return resolve_model("smollm2")


def _real_header() -> fm.Raw:
    """The real SmolLM2 file's metadata and tensor table (its 98 MB of data are not read)."""
    path = _smollm2_file()
    with open(path, "rb") as f:
        head = f.read(8 << 20)  # the header ends within the first ~1.3 MB
    n_tensors = struct.unpack_from("<Q", head, 8)[0]
    # parse() slices each tensor's data from the buffer: past its end that is just empty bytes
    raw = fm.parse(head)
    assert len(raw.tensors) == n_tensors
    for t in raw.tensors:
        t.data = b""
    return raw


def build(workdir: Path) -> None:
    """Write the corpora into workdir (skipped when they are there from this STAMP)."""
    stamp = workdir / "corpus.stamp"
    if stamp.exists() and stamp.read_text() == STAMP:
        return
    from bolt_ros.devtools.testmodel import write_random_model

    workdir.mkdir(parents=True, exist_ok=True)
    full = workdir / "full"
    full.mkdir(exist_ok=True)
    for arch, quant in (("gemma4", "q8_0"), ("gemma3", "f16"), ("llama", "q4_k_m")):
        src = write_random_model(full / f"{arch}.gguf", arch, "tiny", seed=1, quant=quant)
        _save(workdir / f"{arch}.gguf", fm.parse(src.read_bytes()), shrink=True)
    drafter = write_random_model(full / "dflash.gguf", "dflash", target=full / "gemma4.gguf", layers=2, seed=2)
    _save(workdir / "dflash.gguf", fm.parse(drafter.read_bytes()), shrink=True)
    real = _real_header()
    _save(workdir / "smollm2-header.gguf", real)
    _save(workdir / "smollm2-small.gguf", smollm2_small(real))
    for f in full.iterdir():
        f.unlink()
    full.rmdir()
    stamp.write_text(STAMP)


def _save(path: Path, raw: fm.Raw, shrink: bool = False) -> None:
    if shrink:
        shrink_vocab(raw)
    path.write_bytes(fm.serialize(raw))


def load_raws(workdir: Path) -> dict[str, fm.Raw]:
    raws = {}
    for name in WEIGHTS:
        data = (workdir / f"{name}.gguf").read_bytes()
        raw = fm.parse(data)
        if name == "smollm2-header":  # its tensors have no data: parse() cannot tell, so drop what it read
            for t in raw.tensors:
                t.data = b""
        raws[name] = raw
    return raws
