"""End of speech -> first robot audio, per stage, through the whole graph: spoken requests from WAV files (two very
different voices: Piper's en_US-joe-medium and espeak-ng) go in on audio/in in real time; the speech recognizer, the
assistant on its configured backend (the default model unless --backend/--model say otherwise), the simulated robot
and the speech synthesizer run in one process as bringup runs them. Each turn's AudioTurnStats gives the stages.

    python bench/bench_voice.py [--n 20] [--out docs/bench_voice] [--backend scripted]

Prints p50/p90 per stage, for the turns that moved the robot (a tool call), the turns that talked, and all, and
writes OUT.json and OUT.png (a timeline per turn). Besides the synthesizer's stages: the first motion (the first
joint_states that moved after the end of speech) and the first response, the first audio or the first motion,
whichever came first (issue 33). Goal (issue 26): end of speech to first audio p50 <= 1.0 s, p90 <= 1.5 s on 2
CPU cores.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
from bolt_ros.msg import AssistantEvent, AudioChunk, AudioEvent, AudioTurnStats
from graph_harness import Graph, product_config
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from bolt_ros.nodes.speech_common import chunk_msg
from bolt_ros.nodes.speech_recognizer import SpeechRecognizer
from bolt_ros.nodes.speech_synthesizer import SpeechSynthesizer
from bolt_ros.voice.audio import MODEL_RATE, Pcm, resample, to_float, to_int16, write_wav
from bolt_ros.voice.config import RecognizerConfig, SynthesizerConfig, VadConfig
from bolt_ros.voice.tts import EspeakTts, PiperTts

REQUESTS = ["Look to your left.", "What is the capital of France?", "Please nod.", "Can you dance for me?",
            "Look up.", "What can you do?", "Turn your head to the right.", "Are you happy today?",
            "Show me how you feel.", "What is two plus two?", "Look down.", "Say hello to my friend."]
STAGES = ["end_of_turn_ms", "transcript_ms", "first_token_ms", "first_sentence_ms", "first_audio_ms"]
REPORTED = [*STAGES, "first_motion_ms", "first_response_ms"]
# --instant-moves: the requests that name a move get its call at once (the others words), as the intent classifier
# would decide them: what the voice and motion stages cost without the model
MOVES = [("left", "look_left"), ("right", "look_right"), ("up", "look_up"), ("down", "look_down"), ("nod", "nod"),
         ("dance", "dance"), ("feel", "happy")]
BLOCK = 512                     # 32 ms mic blocks


def make_wavs(out: Path, n: int) -> list[tuple[str, str, Path]]:
    voices = {"piper": PiperTts(), "espeak": EspeakTts()}
    items = []
    for i in range(n):
        text, who = REQUESTS[i % len(REQUESTS)], ("piper", "espeak")[i % 2]
        pcm = voices[who].synthesize(text)
        x = resample(to_float(pcm), pcm.rate)
        path = out / f"{i:02d}_{who}.wav"
        write_wav(path, Pcm(to_int16(0.8 * x / max(1e-6, np.abs(x).max())), MODEL_RATE))
        items.append((text, who, path))
    return items


class Mic:
    """A microphone in real time on audio/in: silence, or the queued WAV."""

    def __init__(self, node):
        self.pub = node.create_publisher(AudioChunk, "audio/in", 200)
        self.queue: list[np.ndarray] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def say(self, samples: np.ndarray) -> None:
        with self.lock:
            self.queue.append(samples)

    def _run(self) -> None:
        t, pending = time.time(), np.zeros(0, np.int16)
        while not self.stop.is_set():
            if not len(pending):
                with self.lock:
                    pending = self.queue.pop(0) if self.queue else np.zeros(BLOCK, np.int16)
            block, pending = pending[:BLOCK], pending[BLOCK:]
            block = np.pad(block, (0, BLOCK - len(block)))
            if (wait := t + BLOCK / MODEL_RATE - time.time()) > 0:
                time.sleep(wait)
            self.pub.publish(chunk_msg(block, MODEL_RATE, t))
            t += BLOCK / MODEL_RATE


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else float("nan")


class Motion:
    """When the robot starts to move (system time, from joint_states stamps): each still -> moving change."""

    def __init__(self, node):
        self.starts: list[float] = []
        self._last: tuple | None = None
        self._moving = False
        node.create_subscription(JointState, "joint_states", self._on_joints, 100)

    def _on_joints(self, m: JointState) -> None:
        pos = tuple(round(p, 4) for p in m.position)   # 0.1 mrad: below it, the robot is still
        moving = self._last is not None and pos != self._last
        if moving and not self._moving:
            self.starts.append(m.header.stamp.sec + 1e-9 * m.header.stamp.nanosec)
        self._last, self._moving = pos, moving

    def first_after(self, t: float, since: int) -> float | None:
        """ms from t to the first start among starts[since:] at or after t; None without one."""
        return next(((x - t) * 1e3 for x in self.starts[since:] if x >= t), None)


def summarize(rows: list[dict]) -> dict:
    """{moves, talk, all: {stage: {p50, p90, n}}} over the turns where the stage happened (>= 0)."""
    groups = {"moves": [r for r in rows if r["tools"]], "talk": [r for r in rows if not r["tools"]], "all": rows}
    out = {}
    for g, rs in groups.items():
        out[g] = {}
        for k in REPORTED:
            xs = [r[k] for r in rs if r.get(k) is not None and r[k] >= 0]
            out[g][k] = {"p50": pct(xs, 50), "p90": pct(xs, 90), "n": len(xs)}
    return out


def first_response(row: dict) -> float | None:
    """The first audio or the first motion, whichever came first (ms after the end of speech)."""
    xs = [row[k] for k in ("first_audio_ms", "first_motion_ms") if row.get(k) is not None and row[k] >= 0]
    return min(xs) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--out", default="docs/bench_voice")
    ap.add_argument("--backend", default="", help="override backend.kind (default: config/assistant.yaml's)")
    ap.add_argument("--model", default="", help="override backend.model_path")
    ap.add_argument("--llama-server", action="store_true",
                    help="the default chat model served by llama.cpp's llama-server (2 threads) behind the openai "
                         "backend, instead of the embedded engine")
    ap.add_argument("--instant-llm", action="store_true",
                    help="a scripted backend that answers at once (what the voice stages cost without the model)")
    ap.add_argument("--instant-moves", action="store_true",
                    help="as --instant-llm, but a request that names a move gets that move's call (MOVES)")
    ap.add_argument("--turn-timeout", type=float, default=30.0)
    ap.add_argument("--issue33-off", action="store_true",
                    help="issue 33's latency changes off, the same code otherwise (the before of a before/after in one "
                         "hour): whole sentences to TTS, no speculative start, the end of turn after 400 ms of silence,"
                         " no kept audio of short lines")
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    wav_dir = out.parent / (out.name + "_wavs")
    wav_dir.mkdir(exist_ok=True)
    items = make_wavs(wav_dir, args.n)
    load_before = os.getloadavg()[0]
    updates = {k: v for k, v in (("backend.kind", args.backend), ("backend.model_path", args.model)) if v}
    server = None
    if args.llama_server:
        from bolt_ros.devtools.llamacpp import LlamaServer
        from bolt_ros.engine.default_models import resolve_model
        server = LlamaServer(resolve_model(args.model or "default-chat"), threads=2, extra=["--jinja"]).__enter__()
        updates = {"backend.kind": "openai", "backend.base_url": server.url + "/v1"}
    if args.instant_llm or args.instant_moves:
        moves = [{"match": w, "reply": [{"tool_call": {"name": tool, "arguments": {}}}]}
                 for w, tool in (MOVES if args.instant_moves else [])]
        updates = {"backend.kind": "scripted",
                   "backend.script": json.dumps([*moves, {"match": ".", "reply": [
                       {"text": "Sure, I can do that for you. "}]}])}
    rec_cfg, synth_cfg = RecognizerConfig(), SynthesizerConfig()
    if args.issue33_off:
        synth_cfg = SynthesizerConfig(keep_lines=0)
        updates = {**updates, "first_clause_words": 0, "speculative_start": False}
        rec_cfg = RecognizerConfig(vad=VadConfig(end_of_turn_ms=400, unfinished_end_ms=0))
    graph = Graph(product_config(**updates), domain_id=random.randint(1, 200))
    rec = SpeechRecognizer(rec_cfg, context=graph.context)
    synth = SpeechSynthesizer(synth_cfg, context=graph.context)
    for n in (rec, synth):
        graph.executor.add_node(n)
    stats: list[AudioTurnStats] = []
    transcripts: list[str] = []
    tools: list[str] = []
    playing = threading.Event()
    node = graph.probe
    node.create_subscription(AudioTurnStats, "speech/turn_stats", stats.append, 10)
    node.create_subscription(String, "speech/transcript", lambda m: transcripts.append(m.data), 10)
    node.create_subscription(AssistantEvent, "assistant/events",
                             lambda m: tools.append(m.tool_call.name) if m.type == AssistantEvent.TOOL_CALL else None,
                             100)
    node.create_subscription(AudioEvent, "speech/events", lambda m: (
        playing.set() if m.type == AudioEvent.PLAYBACK_START else
        playing.clear() if m.type in (AudioEvent.PLAYBACK_END, AudioEvent.PLAYBACK_STOPPED) else None), 100)
    mic = Mic(node)
    motion = Motion(node)
    graph.wait_connected()
    # the first turn pays one-time costs (the tool grammar, native kernels, caches: ~25 s on 2 cores): not measured
    graph.idle.clear()
    graph.say("Hello!")
    graph.idle.wait(timeout=180)
    while not (synth._play.empty() and synth._say.empty() and not playing.is_set()):
        time.sleep(0.1)
    rows = []
    try:
        for i, (text, who, path) in enumerate(items):
            graph.idle.clear()
            n_stats, n_tools, n_motion = len(stats), len(tools), len(motion.starts)
            from bolt_ros.voice.audio import read_wav
            mic.say(read_wav(path).samples)
            deadline = time.time() + args.turn_timeout
            while len(stats) == n_stats and time.time() < deadline:
                time.sleep(0.05)
            # the turn ends when the assistant is idle and nothing has played for a second (the person waits for the
            # robot): between a reply's first clause and the rest nothing plays for a moment, and a request sent
            # there went in over the robot's voice (a barge-in; one was taken for echo and never heard)
            quiet_since = None
            while time.time() < deadline:
                quiet = (graph.idle.is_set() and not playing.is_set() and synth._play.empty()
                         and synth._say.empty())
                quiet_since = (quiet_since or time.time()) if quiet else None
                if quiet_since is not None and time.time() - quiet_since >= 1.0:
                    break
                time.sleep(0.05)
            s = stats[n_stats] if len(stats) > n_stats else None
            row = {"i": i, "voice": who, "said": text, "heard": s.transcript if s else "",
                   "tools": tools[n_tools:], **{k: (getattr(s, k) if s else None) for k in STAGES}}
            eos = s.end_of_speech.sec + 1e-9 * s.end_of_speech.nanosec if s else None
            row["first_motion_ms"] = motion.first_after(eos, n_motion) if eos else None
            row["first_response_ms"] = first_response(row)
            rows.append(row)
            print(f"{i:2d} {who:6s} {text!r:36s} -> {row['heard']!r:36s} " + " ".join(
                f"{k[:-3]}={row[k]:.0f}" if row[k] is not None else f"{k[:-3]}=-" for k in REPORTED), flush=True)
    finally:
        # the speculative start (issue 33): speculative transcripts, and how many were the final words (hits)
        spec = {"assistant": dict(getattr(getattr(graph.assistant, "primer", None), "counts", {})),
                "recognizer": {k: v for k, v in rec.counts.items() if k in ("speculative", "unfinished",
                                                                             "transcripts", "empty")}}
        mic.stop.set()
        for n in (rec, synth):
            n.close()
        graph.close()
        if server is not None:
            server.__exit__()
    done = [r for r in rows if r["first_audio_ms"] is not None and r["first_audio_ms"] >= 0]
    by_kind = summarize(rows)
    summary = {k: {"p50": v["p50"], "p90": v["p90"]} for k, v in summarize(done)["all"].items() if k in STAGES}
    machine = _cpu()
    result = {"machine": machine, "cores": os.cpu_count(), "python": platform.python_version(),
              "backend": {k: v for k, v in updates.items() if k != "backend.base_url"} or "config/assistant.yaml",
              "issue33": "off" if args.issue33_off else "on",
              "llm": "llama-server" if server else "instant moves (scripted)" if args.instant_moves
              else "instant (scripted)" if args.instant_llm else "embedded",
              "load_avg_1min": [load_before, os.getloadavg()[0]],   # a shared machine's other work shows here
              "turns": len(rows), "with_audio": len(done), "summary_ms": summary, "by_kind_ms": by_kind,
              "speculative": spec,
              "rows": rows}
    Path(f"{out}.json").write_text(json.dumps(result, indent=1))
    print(f"\n{machine}, {os.cpu_count()} cores, load {load_before:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{len(done)}/{len(rows)} turns reached first audio")
    for k in STAGES:
        print(f"  {k:18s} p50 {summary[k]['p50']:7.0f}  p90 {summary[k]['p90']:7.0f}")
    print("per kind, over the turns where the stage happened (n): p50 / p90 ms after the end of speech")
    print(f"  {'stage':18s} " + "  ".join(f"{g:>20s}" for g in by_kind))
    for k in REPORTED:
        print(f"  {k:18s} " + "  ".join(f"{v[k]['p50']:7.0f} / {v[k]['p90']:5.0f} ({v[k]['n']:2d})"
                                        for v in by_kind.values()))
    a = spec["assistant"]
    if a.get("hits", 0) + a.get("misses", 0):
        print(f"speculative start: {a['speculative']} begun, {a['hits']} kept (the final words were the same), "
              f"{a['misses']} dropped: hit rate {a['hits'] / (a['hits'] + a['misses']):.0%}; "
              f"{a.get('stale', 0)} came after their turn (left alone); the recognizer "
              f"published {spec['recognizer'].get('speculative', 0)}, {spec['recognizer'].get('unfinished', 0)} "
              "read unfinished")
    _plot(done, f"{out}.png", machine)
    return 0


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name"))
    except (OSError, StopIteration):
        return platform.processor()


def _plot(rows: list[dict], path: str, machine: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(rows) + 1.5))
    colors = dict(zip(STAGES, ["#999999", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]))
    for y, r in enumerate(rows):
        prev = 0.0
        for k in STAGES:
            if r[k] is not None and r[k] >= 0:
                ax.barh(y, max(0.0, r[k] - prev), left=prev, color=colors[k], label=k if y == 0 else None)
                prev = max(prev, r[k])
        if r.get("first_motion_ms") is not None:  # a tool's motion began (issue 33: the first response)
            ax.plot(r["first_motion_ms"], y, "k^", ms=5, label="first motion" if "first motion" not in
                    ax.get_legend_handles_labels()[1] else None)
    ax.set_yticks(range(len(rows)), [f"{r['voice']}: {r['said']}" for r in rows], fontsize=7)
    ax.axvline(1000, color="k", ls="--", lw=0.8)
    ax.set_xlabel("ms after the end of the person's speech")
    ax.set_title(f"bench_voice: end of speech -> first audio ({machine})", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
