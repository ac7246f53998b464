"""Whisper's prompt (`asr.vocabulary`: the robot's name and moves) against none: word errors on what people say to
the robot, and words invented from noise.

Speech: every distinct sentence of the three conversation scripts (bench/conversation_scripts*.yaml), spoken by Piper
(en_US-joe-medium) and espeak-ng, with 0.25 s of silence before and 0.5 s after. Noise: white, pink, mains hum,
clicks and a tone at five levels and three lengths (75 clips, seeded), none of which holds a word.

    python bench/bench_asr_vocabulary.py [--out docs/bench_asr_vocabulary.json]
"""
from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import numpy as np
import yaml

from bolt_ros.voice.asr import Transcriber
from bolt_ros.voice.audio import MODEL_RATE, resample, to_float
from bolt_ros.voice.config import AsrConfig
from bolt_ros.voice.tts import EspeakTts, PiperTts
from bolt_ros.voice.words import word_errors, words

SCRIPTS = ["conversation_scripts", "conversation_scripts_heldout", "conversation_scripts_heldout2"]


def sentences(bench: Path) -> list[str]:
    out: list[str] = []
    for name in SCRIPTS:
        for conv in yaml.safe_load((bench / f"{name}.yaml").read_text())["conversations"]:
            out += [t["say"] for t in conv["turns"] if "say" in t and t["say"] not in out]
    return out


def noises(seed: int = 7) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    clips = []
    for level in (0.003, 0.01, 0.03, 0.1, 0.3):
        for seconds in (0.5, 1.0, 2.0):
            n = int(seconds * MODEL_RATE)
            t = np.arange(n) / MODEL_RATE
            spec = np.fft.rfft(rng.standard_normal(n))
            pink = np.fft.irfft(spec / np.sqrt(np.maximum(np.arange(len(spec)), 1)), n)
            clips += [("white", level * rng.standard_normal(n)), ("pink", level * pink / np.std(pink)),
                      ("hum", level * (np.sin(2 * np.pi * 50 * t) + 0.3 * np.sin(2 * np.pi * 150 * t))),
                      ("clicks", 10 * level * (rng.random(n) > 0.999)), ("tone", level * np.sin(2 * np.pi * 440 * t))]
    return [(k, x.astype(np.float32)) for k, x in clips]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/bench_asr_vocabulary.json")
    args = ap.parse_args()
    said = sentences(Path(__file__).parent)
    tts = {"piper": PiperTts(), "espeak": EspeakTts()}
    audio = []
    for text in said:
        for who, voice in tts.items():
            pcm = voice.synthesize(text)
            x = resample(to_float(pcm), pcm.rate)
            audio.append((who, text, np.concatenate([np.zeros(4000, np.float32), x, np.zeros(8000, np.float32)])))
    clips = noises()
    n_words = sum(len(words(t)) for _, t, _ in audio)
    report = {"machine": platform.processor() or platform.machine(), "sentences": len(said), "turns": len(audio),
              "words": n_words, "noise_clips": len(clips), "configs": {}}
    for name, cfg in (("no prompt", AsrConfig(vocabulary="")), ("vocabulary", AsrConfig())):
        asr = Transcriber(cfg)
        heard = [(who, text, asr.transcribe(x)) for who, text, x in audio]
        errors = [word_errors(text, h) for _, text, h in heard]
        invented = [(k, t) for k, t in ((k, asr.transcribe(x)) for k, x in clips) if t]
        report["configs"][name] = {
            "word_errors": sum(errors), "wer": sum(errors) / n_words,
            "exact": sum(e == 0 for e in errors),
            "by_voice": {w: sum(e for (v, _, _), e in zip(heard, errors) if v == w) for w in tts},
            "noise_with_words": invented, "transcripts": heard}
        print(f"{name:11s} word errors {sum(errors)}/{n_words} ({100 * sum(errors) / n_words:.1f} %), exact "
              f"{sum(e == 0 for e in errors)}/{len(audio)}, noise clips with words {len(invented)}/{len(clips)}",
              flush=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
