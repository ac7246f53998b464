"""What the ASR makes of a barge-in, with and without echo suppression: the robot says a long sentence (Piper), the
mic hears it through a room, and a person (espeak-ng) speaks over it at one of many offsets. The recognizer's own
parts run offline, frame by frame, as its audio thread runs them: silero VAD, the echo gate, the turn segmenter; the
robot's playback stops `--react-ms` after the segmenter's onset (the barge-in), as the synthesizer stops it. The
turn's audio then goes to tiny.en as it is, and with the robot's voice taken out (`EchoSuppressor`).

    python bench/bench_barge_in_asr.py [--rooms 0 0.4] [--out docs/bench_barge_in_asr.json]

Rooms: RT60 0 is the voice test's room (a copy of the played audio, 120 ms late, at 0.35); RT60 > 0 adds a diffuse
tail decaying by 60 dB over RT60 s (seeded noise), scaled to the same echo energy. Counts, per room and phrase, the
turns whose transcript holds the phrase's key word, and the turns that came out empty.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from bolt_ros.voice.asr import Transcriber
from bolt_ros.voice.audio import MODEL_RATE, resample, to_float
from bolt_ros.voice.config import AsrConfig, RecognizerConfig
from bolt_ros.voice.echo import EchoGate
from bolt_ros.voice.echo_suppress import EchoSuppressor
from bolt_ros.voice.tts import EspeakTts, PiperTts
from bolt_ros.voice.vad import FRAME, FRAME_S, EndOfTurn, Onset, SileroVad, TurnSegmenter

ROBOT = "Watch me, this is my favourite dance of all, I learned it from a friend."
PHRASES = {"Stop, please.": "stop", "Wait, look at me.": "wait", "No, turn left.": "left"}
DELAY_S, GAIN = 0.12, 0.35         # the voice test's room
PLAYBACK_BLOCK = 320               # the synthesizer's 20 ms blocks, as the reference arrives


def voice(tts, text: str) -> np.ndarray:
    pcm = tts.synthesize(text)
    x = resample(to_float(pcm), pcm.rate)
    loud = np.flatnonzero(np.abs(x) > 0.02 * np.abs(x).max())
    return x[loud[0]:loud[-1] + 1]


def room_response(rt60: float, seed: int = 0) -> np.ndarray:
    """The speaker -> mic path after its DELAY_S: the direct sound, and for rt60 > 0 a diffuse decaying tail, with
    the energy of a GAIN copy."""
    if rt60 <= 0:
        return np.array([GAIN], np.float32)
    t = np.arange(int(rt60 * MODEL_RATE)) / MODEL_RATE
    h = np.random.default_rng(seed).standard_normal(len(t)) * 10 ** (-3 * t / rt60)
    h[0] = 0.0
    h *= 0.7 / np.sqrt((h ** 2).sum())
    h[0] = 0.7
    return (h * GAIN / np.sqrt((h ** 2).sum())).astype(np.float32)


def barge_in_turn(vad, robot, person, t_person: float, h, react_s: float):
    """One barge-in replayed frame by frame: (the turn's audio, its start time, the gate's learned path, the
    suppressor holding what was played), or None when no turn ended."""
    cfg = RecognizerConfig()
    vad.reset()
    gate, seg, sup = EchoGate(cfg.echo), TurnSegmenter(cfg.vad), EchoSuppressor(cfg.echo)
    echo = np.convolve(robot, h).astype(np.float32)
    cut, played = len(robot), 0
    n_frames = int((t_person + len(person) / MODEL_RATE + 1.5) / FRAME_S)
    d, p0 = int(DELAY_S * MODEL_RATE), int(t_person * MODEL_RATE)
    for k in range(n_frames):
        t_end = (k + 1) * FRAME_S
        while played < cut and played < t_end * MODEL_RATE:     # the reference, as its blocks are played
            block = robot[played:min(played + PLAYBACK_BLOCK, cut)]
            gate.add_reference(block, played / MODEL_RATE)
            sup.add_reference(block, played / MODEL_RATE)
            played += len(block)
        i = np.arange(k * FRAME, (k + 1) * FRAME)
        frame = np.zeros(FRAME, np.float32)
        ok = (i - d >= 0) & (i - d < len(echo))
        frame[ok] = echo[i[ok] - d]
        ok = (i - p0 >= 0) & (i - p0 < len(person))
        frame[ok] += person[i[ok] - p0]
        for ev in seg.push(frame, vad(frame), gate.is_echo(frame, t_end), t_end):
            if isinstance(ev, Onset) and cut == len(robot):     # the barge-in: playback stops
                cut = min(len(robot), int((t_end + react_s) * MODEL_RATE))
                stopped = robot.copy()
                stopped[cut:] = 0.0
                echo = np.convolve(stopped, h).astype(np.float32)
            if isinstance(ev, EndOfTurn):
                return ev.audio, ev.t_decision - len(ev.audio) / MODEL_RATE, gate.path(), sup
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rooms", type=float, nargs="+", default=[0.0, 0.4], help="RT60s in seconds")
    ap.add_argument("--offsets", type=float, nargs=3, default=[1.0, 4.0, 0.1], help="person starts: from to step")
    ap.add_argument("--react-ms", type=float, default=20.0)
    ap.add_argument("--out", default="docs/bench_barge_in_asr.json")
    args = ap.parse_args()
    tts = {"piper": PiperTts(), "espeak": EspeakTts()}
    robot = voice(tts["piper"], ROBOT)
    asr, vad = Transcriber(AsrConfig()), SileroVad()
    offsets = np.arange(args.offsets[0], args.offsets[1] + 1e-9, args.offsets[2])
    rows = []
    for rt60 in args.rooms:
        h = room_response(rt60)
        for phrase, key in PHRASES.items():
            person = voice(tts["espeak"], phrase)
            person = 0.9 * person / np.abs(person).max()     # as loud at the mic as the robot is played
            counts = {"raw": [0, 0, []], "suppressed": [0, 0, []]}
            for tp in offsets:
                turn = barge_in_turn(vad, robot, person, float(tp), h, args.react_ms / 1000)
                if turn is None:
                    continue
                audio, t0, path, sup = turn
                tic = time.perf_counter()
                cleaned = sup.suppress(audio, t0, *path)
                t_sup = time.perf_counter() - tic
                for name, x in (("raw", audio), ("suppressed", cleaned)):
                    text = asr.transcribe(x)
                    c = counts[name]
                    c[0] += key in text.lower()
                    c[1] += not text
                    c[2].append(text)
                print(f"RT60 {rt60:.1f} {phrase!r} at {tp:.1f} s: raw {counts['raw'][2][-1]!r}, suppressed "
                      f"{counts['suppressed'][2][-1]!r} ({1e3 * t_sup:.1f} ms)", flush=True)
            n = len(counts["raw"][2])
            rows.append({"rt60_s": rt60, "phrase": phrase, "key": key, "turns": n,
                         **{f"{k}_{m}": v[i] for k, v in counts.items() for i, m in ((0, "key_heard"), (1, "empty"))},
                         "transcripts": {k: v[2] for k, v in counts.items()}})
    print("\n| RT60 | phrase | turns | key word heard, raw | suppressed | empty, raw | suppressed |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rt60_s']:.1f} s | {r['phrase']} | {r['turns']} | {r['raw_key_heard']} | "
              f"{r['suppressed_key_heard']} | {r['raw_empty']} | {r['suppressed_empty']} |")
    Path(args.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(),
                                          "react_ms": args.react_ms, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
