"""Barge-in in a room with noise (issue 36): does the robot interrupt itself, how fast does a person stop it, and
what does the ASR make of what they said. The recognizer's own parts run offline, frame by frame, as its audio
thread runs them (silero VAD, the echo gate, the turn segmenter: bench/voice_room.py's `replay`); the robot's
playback stops `--react-ms` after a barge-in, as the synthesizer stops at its next 20 ms block.

    python bench/bench_barge_in_asr.py [--quiet-minutes 5] [--per-cell 12] [--renderings 1] [--gate new|old]
                                       [--out FILE]

1. Nobody speaking: the robot's long replies (Piper, three sentences each) for `--quiet-minutes` of its voice, over
   room noise (pink + eight-talker babble, -45, -40 and -35 dBFS in turn) through a room with a 0.3 s reverberant
   tail, echo 120 ms late and 10 dB down: false barge-ins per minute of robot speech, and the transcripts any turn
   gave (as the recognizer makes them). Piper renders a sentence differently each time (its noise), and the gate
   must hold for every rendering: each run of four replies is a new rendering and a new stretch of noise.
2. Interruptions: a person (espeak-ng, two voices) says one of four phrases over a reply, +6, +8 or +10 dB over the
   robot's echo (each voice's level while it speaks), in the dry room and with the 0.3 s tail, noise at -41 dBFS,
   `--renderings` times over (a new rendering of the robot's sentences and new noise each time): detected, person's
   onset -> barge-in decided, -> robot silent (+ react), and the key word heard: by whisper on the turn as the
   recognizer now transcribes it (the robot's voice taken out, no prompt, the known-phrase check: "node"), and, to
   say which part does what, on the echo-suppressed turn with the vocabulary prompt and without it, on the raw
   turn without it, and on the person's words alone (no robot, no room).

`--gate old` runs the gate as it was before issue 36 (no room level, margin 6 dB): the "before" numbers.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
from voice_room import BABBLE_TEXTS, REPLY_TEXTS, Room, active_db, replay, room_noise, voice_clip

from bolt_ros.voice.asr import Transcriber
from bolt_ros.voice.audio import MODEL_RATE
from bolt_ros.voice.config import AsrConfig, EchoConfig, RecognizerConfig
from bolt_ros.voice.tts import EspeakTts, PiperTts
from bolt_ros.voice.vad import SileroVad
from bolt_ros.voice.words import words

# what each row transcribes: (the turn's audio, prompt, known-phrase check); "alone": the person's clip itself
READINGS = {"node": ("suppressed", False, True), "prompt": ("suppressed", True, False),
            "no_prompt": ("suppressed", False, False), "raw": ("raw", False, False), "alone": ("alone", False, False)}

PHRASES = {"Stop, please.": "stop", "Wait, look at me.": "wait", "No, turn left.": "left",
           "Hold on a second.": "hold"}
PERSONS = {"espeak en-us": "en-us", "espeak en-us+f3": "en-us+f3"}
LEAD_S, SENTENCE_GAP_S, REPLY_GAP_S = 2.0, 0.2, 1.5
QUIET_LEVELS = (-45.0, -40.0, -35.0)
OLD_ECHO = {"noise_window_s": 0.0, "vad_hangover_ms": 0, "margin_db": 6.0}


def timeline(sentences: list[np.ndarray], t0: float) -> tuple[list[tuple[float, np.ndarray]], float]:
    """A reply's sentences as the synthesizer plays them: (start, audio) from t0, and the end."""
    out, t = [], t0
    for x in sentences:
        out.append((t, x))
        t += len(x) / MODEL_RATE + SENTENCE_GAP_S
    return out, t


def prompt_words(text: str, phrase: str, vocabulary: str) -> list[str]:
    """Words of the vocabulary prompt in a transcript that the person did not say."""
    said = set(words(phrase))
    return [w for w in words(text) if w in set(words(vocabulary)) - said - {"your", "up", "look"}]


def quiet(args, cfg, vad, asr, piper, clips) -> dict:
    """Part 1: minutes of the robot's voice, nobody speaking."""
    spoken_s, barges, onsets, transcripts, texts, k = 0.0, 0, 0, 0, [], 0
    while spoken_s < args.quiet_minutes * 60:
        robot = [voice_clip(piper, t) for t in REPLY_TEXTS]      # a new rendering each run
        level = QUIET_LEVELS[k % len(QUIET_LEVELS)]
        room = Room(rt60=0.3, noise_dbfs=level, seed=k)
        order = np.random.default_rng(k).permutation(len(robot))
        utterances, t = [], LEAD_S
        for r in range(4):                                   # four replies of three sentences per run
            part, t = timeline([robot[i] for i in order[3 * r:3 * r + 3]], t)
            utterances += part
            t += REPLY_GAP_S
        noise = room_noise(int(t * MODEL_RATE) + MODEL_RATE, level, np.random.default_rng(100 + k), clips)
        heard = replay(vad, utterances, room, t, noise=noise, react_s=None, cfg=cfg)
        spoken_s += sum(len(x) for _, x in utterances) / MODEL_RATE
        barges += len(heard.barge_ins())
        onsets += len(heard.onsets)
        for turn in heard.turns:
            text = asr.transcribe(turn.suppressor.suppress(turn.audio, turn.t_start, *turn.path),
                                  prompt=not turn.over_voice, known_phrases=turn.over_voice)
            transcripts += bool(text)
            texts += [text] if text else []
        print(f"quiet run {k}: {level:.0f} dBFS, robot {spoken_s / 60:.1f} min so far: barge-ins "
              f"{len(heard.barge_ins())}, onsets {len(heard.onsets)}, turns {len(heard.turns)}", flush=True)
        k += 1
    return {"robot_speech_min": spoken_s / 60, "barge_ins": barges, "barge_ins_per_min": barges / (spoken_s / 60),
            "onsets": onsets, "transcripts": transcripts, "texts": texts}


def interruptions(args, cfg, vad, asr, piper, clips, persons) -> list[dict]:
    """Part 2: a person speaks over a reply, `--renderings` times over."""
    rows = []
    for rendering in range(args.renderings):
        robot = [voice_clip(piper, t) for t in REPLY_TEXTS]
        rows += interruptions_once(args, cfg, vad, asr, robot, clips, persons, rendering)
    return rows


def interruptions_once(args, cfg, vad, asr, robot, clips, persons, rendering: int) -> list[dict]:
    rows, i = [], 0
    for who, tts in persons.items():
        for rt60 in (0.0, 0.3):
            room = Room(rt60=rt60, noise_dbfs=-41.0)
            for j in range(args.per_cell):
                phrase = list(PHRASES)[j % len(PHRASES)]
                snr = (6.0, 8.0, 10.0)[j % 3]
                a, b = robot[(2 * j) % len(robot)], robot[(2 * j + 1) % len(robot)]
                utterances, _ = timeline([a, b], LEAD_S)
                echo_db = active_db(room.echo(np.concatenate([a, b]), len(a) + len(b)))
                person = voice_clip(tts, phrase)
                person *= 10 ** ((echo_db + snr - active_db(person)) / 20)
                # over either sentence, the path learned or not (1.0 .. 6.0 s into the reply)
                t_person = LEAD_S + 1.0 + 5.0 * ((j * 0.37 + i * 0.11) % 1.0)
                i += 1
                duration = t_person + len(person) / MODEL_RATE + 2.0
                noise = room_noise(int(duration * MODEL_RATE) + MODEL_RATE, -41.0,
                                   np.random.default_rng(500 + i + 1000 * rendering), clips)
                heard = replay(vad, utterances, room, duration, person=(t_person, person), noise=noise,
                               react_s=args.react_ms / 1000, cfg=cfg)
                hits = [o for o in heard.barge_ins() if o[0] >= t_person]
                row = {"rendering": rendering, "person": who, "rt60_s": rt60, "phrase": phrase, "snr_db": snr,
                       "t_person": t_person,
                       "false_before": len([o for o in heard.barge_ins() if o[0] < t_person]),
                       "onsets_before": [round(o[1], 3) for o in heard.onsets if o[0] < t_person],
                       "detected": bool(hits), "latency_ms": 1e3 * (hits[0][0] - t_person) if hits else None}
                turn = next((t for t in heard.turns if t.barge_in), None)
                audio = {"alone": person}
                if turn is not None:
                    audio |= {"raw": turn.audio,
                              "suppressed": turn.suppressor.suppress(turn.audio, turn.t_start, *turn.path)}
                for name, (source, prompt, known) in READINGS.items():
                    text = asr.transcribe(audio[source], prompt=prompt, known_phrases=known) if source in audio else ""
                    row[f"text_{name}"] = text
                    row[f"key_{name}"] = PHRASES[phrase] in words(text)
                    row[f"extra_{name}"] = prompt_words(text, phrase, asr.cfg.vocabulary)
                rows.append(row)
                latency = f"{row['latency_ms']:.0f} ms" if hits else "MISSED"
                print(f"{rendering} {who} RT60 {rt60} {phrase!r} +{snr:.0f} dB at {t_person:.2f} s: "
                      f"{latency}, node {row['text_node']!r}, no prompt {row['text_no_prompt']!r}, "
                      f"raw {row['text_raw']!r}", flush=True)
    return rows


def table(quiet_res: dict, rows: list[dict], react_ms: float) -> str:
    q = quiet_res
    out = ["| nobody speaking | robot speech | barge-ins | per minute | onsets | transcripts |",
           "|---|---|---|---|---|---|",
           f"| 0.3 s tail, -45/-40/-35 dBFS | {q['robot_speech_min']:.1f} min | {q['barge_ins']} | "
           f"{q['barge_ins_per_min']:.2f} | {q['onsets']} | {q['transcripts']} |", "",
           "| person | room | n | detected | onset -> silent p50 / p90 (ms) | key word: node | suppressed, prompt | "
           "suppressed | raw | said alone | prompt words not said, prompt / node | false barge-ins before |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    cells = [*sorted({(r["person"], r["rt60_s"]) for r in rows}), ("all", None)]
    for who, rt60 in cells:
        rs = [r for r in rows if who == "all" or (r["person"], r["rt60_s"]) == (who, rt60)]
        lat = np.array([r["latency_ms"] + react_ms for r in rs if r["detected"]])
        p = (f"{np.percentile(lat, 50):.0f} / {np.percentile(lat, 90):.0f}" if len(lat) else "-")
        out.append(f"| {who} | {'all' if rt60 is None else ('dry' if rt60 == 0 else f'RT60 {rt60} s')} | {len(rs)} | "
                   f"{sum(r['detected'] for r in rs)} | {p} | "
                   + " | ".join(str(sum(r[f"key_{k}"] for r in rs)) for k in ("node", "prompt", "no_prompt", "raw",
                                                                          "alone"))
                   + f" | {sum(bool(r['extra_prompt']) for r in rs)} / {sum(bool(r['extra_node']) for r in rs)} | "
                   f"{sum(r['false_before'] for r in rs)} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quiet-minutes", type=float, default=5.0, help="minutes of robot speech with nobody speaking")
    ap.add_argument("--per-cell", type=int, default=12, help="interruptions per person voice and room")
    ap.add_argument("--renderings", type=int, default=1, help="part 2 this many times, the robot rendered anew")
    ap.add_argument("--react-ms", type=float, default=20.0, help="barge-in -> playback stopped (one 20 ms block)")
    ap.add_argument("--gate", choices=["new", "old"], default="new")
    ap.add_argument("--echo", nargs="*", default=[], metavar="KEY=VALUE", help="echo config overrides")
    ap.add_argument("--out", default="docs/bench_barge_in_asr.json")
    args = ap.parse_args()
    overrides = dict(kv.split("=", 1) for kv in args.echo)
    cfg = RecognizerConfig(echo=EchoConfig(**(OLD_ECHO if args.gate == "old" else {}), **overrides))
    piper = PiperTts()
    espeak = EspeakTts()
    clips = [voice_clip(piper if i % 2 == 0 else espeak, t) for i, t in enumerate(BABBLE_TEXTS)]
    persons = {who: EspeakTts(v) for who, v in PERSONS.items()}
    asr, vad = Transcriber(AsrConfig()), SileroVad()
    tic = time.perf_counter()
    q = quiet(args, cfg, vad, asr, piper, clips) if args.quiet_minutes > 0 else {
        "robot_speech_min": 0.0, "barge_ins": 0, "barge_ins_per_min": 0.0, "onsets": 0, "transcripts": 0, "texts": []}
    rows = interruptions(args, cfg, vad, asr, piper, clips, persons) if args.per_cell > 0 else []
    print(f"\ngate {args.gate} {overrides}, {time.perf_counter() - tic:.0f} s\n")
    print(table(q, rows, args.react_ms))
    Path(args.out).write_text(json.dumps({"machine": platform.processor() or platform.machine(), "gate": args.gate,
                                          "echo": cfg.echo.model_dump(), "react_ms": args.react_ms, "quiet": q,
                                          "interruptions": rows}, indent=1))


if __name__ == "__main__":
    main()
