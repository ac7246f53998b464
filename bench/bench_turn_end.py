"""End of turn: how often a person who pauses mid-sentence is cut off, and how soon a finished turn ends (issue 33).

    python bench/bench_turn_end.py [--n 40] [--pause 0.7] [--out docs/bench_turn_end.json]

Every distinct request of the conversation scripts (bench/conversation_scripts*.yaml) of five words or more is
spoken whole by Piper and by espeak-ng in turn; the person then pauses `--pause` s at the quietest point of the
sentence's middle (35-70 % of it: between words, with the sentence's own running intonation) and goes on. The
recognizer's own parts run offline over it frame by frame: silero, the turn segmenter, and at each pause the ASR
(tiny.en, the vocabulary prompt), whose words reach the segmenter as many frames later as the ASR took here (its
real time on this machine). Two settings over the same audio:

- before: the turn ends after 400 ms of silence (issue 26's setting);
- now: 352 ms once the pause's words read finished (bolt_ros/voice/turn_end.py), else up to 1.2 s; a turn the
  person goes on from within 1 s is taken back and joined to what follows (bolt_ros/voice/continuation.py);
- now, words at once: the same with the words there the moment the pause starts (a machine whose ASR is quick):
  here the words alone keep a turn open, not a slow ASR.

A turn is cut off when it ends at the mid-sentence pause and is not taken back: the sentence reaches the assistant
in pieces. Also the same sentences unpaused: the end-of-turn
decision after the end of speech (audio time, ASR included under `now`), and the ASR's own time.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import yaml
from voice_room import voice_clip

from bolt_ros.voice.asr import Transcriber
from bolt_ros.voice.audio import MODEL_RATE
from bolt_ros.voice.config import AsrConfig, VadConfig
from bolt_ros.voice.continuation import Continuation
from bolt_ros.voice.tts import EspeakTts, PiperTts
from bolt_ros.voice.turn_end import reads_unfinished
from bolt_ros.voice.vad import FRAME, FRAME_S, EndOfTurn, Onset, Pause, Resume, SileroVad, TurnSegmenter

# name: (segmenter settings, the pause's words reach it after the ASR's real time (True) or at once (False))
SETTINGS = {"before": (VadConfig(end_of_turn_ms=400, unfinished_end_ms=0, continue_ms=0), True),
            "now": (VadConfig(), True), "now, words at once": (VadConfig(), False)}


def requests(n: int) -> list[str]:
    seen = []
    for path in sorted(Path(__file__).parent.glob("conversation_scripts*.yaml")):
        for conv in yaml.safe_load(path.read_text())["conversations"]:
            for t in conv["turns"]:
                s = t.get("say")
                if s and len(s.split()) >= 5 and s not in seen:
                    seen.append(s)
    return seen[:n]


def quietest_middle(x: np.ndarray) -> int:
    """The sample at the quietest 50 ms of 35-70 % of the utterance (a gap between words)."""
    hop = 160
    e = np.array([np.sqrt(np.mean(x[i:i + hop] ** 2)) for i in range(0, len(x) - hop, hop)])
    lo, hi = int(len(e) * 0.35), int(len(e) * 0.7)
    return (lo + int(np.argmin(np.convolve(e[lo:hi], np.ones(5) / 5, "same")))) * hop


def run(vad, asr, audio: np.ndarray, cfg: VadConfig, asr_time: bool,
        heard: list[str] | None = None) -> tuple[list[EndOfTurn], list[float], list[EndOfTurn]]:
    """The recognizer's segmenting offline: the pause's ASR words arrive as many frames later as the ASR took
    (asr_time), or with the pause's frame; a turn that the person continues (continuation.py, no robot speech
    here) is taken back and its audio joined to the next. Returns the turns' ends, the ASR times and the ends that
    were taken back."""
    wait_for_words = cfg.unfinished_end_ms > 0
    vad.reset()
    seg, cont = TurnSegmenter(cfg), Continuation(cfg.continue_ms)
    seg.wait_for_words = wait_for_words
    ends, asr_s, due, taken_back = [], [], None, []      # due: (frame index, finished?) of the pending words
    for k, i in enumerate(range(0, len(audio) - FRAME + 1, FRAME)):
        if due is not None and k >= due[0]:
            seg.words_finished, due = due[1], None
        frame = audio[i:i + FRAME]
        for ev in seg.push(frame, vad(frame), False, (i + FRAME) / MODEL_RATE):
            if isinstance(ev, Onset) and cont.onset(ev.t_start, robot_spoke_since=False):
                taken_back.append(ends[-1])
            if isinstance(ev, Pause) and wait_for_words:
                t0 = time.perf_counter()
                text = asr.transcribe(cont.joined(ev.audio, ev.t_end - len(ev.audio) / MODEL_RATE))
                if heard is not None:
                    heard.append(text)
                asr_s.append(time.perf_counter() - t0)
                due = (k + 1 + (int(np.ceil(asr_s[-1] / FRAME_S)) if asr_time else 0), not reads_unfinished(text))
            elif isinstance(ev, Resume):
                due = None
            elif isinstance(ev, EndOfTurn):
                cont.ended(cont.joined(ev.audio, ev.t_decision - len(ev.audio) / MODEL_RATE), ev.t_decision)
                ends.append(ev)
                due = None
    return ends, asr_s, taken_back


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40, help="sentences (each in one of the two voices, alternating)")
    ap.add_argument("--pause", type=float, default=0.7, help="the mid-sentence pause, seconds")
    ap.add_argument("--out", default="docs/bench_turn_end.json")
    args = ap.parse_args()
    voices = [("piper", PiperTts()), ("espeak", EspeakTts())]
    vad, asr = SileroVad(), Transcriber(AsrConfig())
    lead, tail = np.zeros(int(0.4 * MODEL_RATE), np.float32), np.zeros(int(1.6 * MODEL_RATE), np.float32)
    rows, load = [], [os.getloadavg()[0]]
    for j, text in enumerate(requests(args.n)):
        who, tts = voices[j % 2]
        x = voice_clip(tts, text)
        cut = quietest_middle(x)
        paused = np.concatenate([lead, x[:cut], np.zeros(int(args.pause * MODEL_RATE), np.float32), x[cut:], tail])
        whole = np.concatenate([lead, x, tail])
        t_speech_end = (len(lead) + len(x)) / MODEL_RATE
        row = {"said": text, "voice": who, "cut_at": round(cut / len(x), 2)}
        for name, (cfg, asr_time) in SETTINGS.items():
            heard = []
            ends, _, taken_back = run(vad, asr, paused, cfg, asr_time, heard)
            row[f"{name}_words"] = heard
            t_resume = (len(lead) + cut) / MODEL_RATE + args.pause
            at_pause = [e for e in ends if e.t_decision < t_resume]
            row[f"{name}_ended_at_pause"] = bool(at_pause)
            row[f"{name}_cut_off"] = any(all(e is not t for t in taken_back) for e in at_pause)
            ends, asr_s, _ = run(vad, asr, whole, cfg, asr_time)
            row[f"{name}_end_ms"] = round((ends[0].t_decision - t_speech_end) * 1e3) if ends else None
            if asr_s:
                row["asr_ms"] = round(asr_s[-1] * 1e3)
        rows.append(row)
        print(f"{who:6s} {text!r:56s} cut at {row['cut_at']:.2f}: " + "; ".join(
            f"{k} cut off {row[f'{k}_cut_off']!s:5s} end {row[f'{k}_end_ms']}" for k in SETTINGS)
            + f" ms (ASR {row.get('asr_ms')} ms)", flush=True)
    load.append(os.getloadavg()[0])
    out = {"pause_s": args.pause, "sentences": len(rows), "load_avg_1min": load}
    for name in SETTINGS:
        ends = [r[f"{name}_end_ms"] for r in rows if r[f"{name}_end_ms"] is not None]
        out[name] = {"cut_off": sum(r[f"{name}_cut_off"] for r in rows),
                     "ended_at_pause_then_taken_back": sum(r[f"{name}_ended_at_pause"] and not r[f"{name}_cut_off"]
                                                           for r in rows),
                     "end_of_turn_p50_ms": float(np.percentile(ends, 50)), "end_of_turn_p90_ms":
                     float(np.percentile(ends, 90))}
    out["asr_p50_ms"] = float(np.percentile([r["asr_ms"] for r in rows if "asr_ms" in r], 50))
    out["rows"] = rows
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
