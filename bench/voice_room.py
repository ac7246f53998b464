"""A room for the voice bench and tests (issue 36): what a robot's mic hears while its own speaker plays.

- Room noise as recorded rooms have it: pink noise (the hum and rumble of a room, -3 dB per octave) plus babble (eight
  talkers far off, from the project's own voices, each a different stretch of a few sentences), equal in power, at
  a set level (-45..-35 dBFS). Over digital silence the echo gate never failed; over noise silero scored the plain
  room as speech for ~3 frames after each echo ended, and the robot barged in on itself.
- The speaker -> mic path: a delay, the direct sound at `gain`, and for rt60 > 0 a diffuse tail decaying by 60 dB
  over rt60 (seeded noise), scaled so the whole response has the direct sound's energy at `gain`.
- `replay`: the recognizer's own parts (silero, the echo gate, the turn segmenter) frame by frame over such a mic,
  with the reference arriving in the synthesizer's 20 ms blocks as they play, and the playback cut `react_s` after a
  barge-in (the synthesizer stops at its next block).
- `LiveRoom`, and this file run as a program: the room in real time, as a robot's audio driver meets it: what the
  robot plays on `audio/out` comes back on `audio/in` through the path, over the noise (the voice node tests; and
  `python bench/voice_room.py` beside `make run ARGS="voice:=true audio:=topic"`: the robot in a noisy room).
"""
from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from bolt_ros.voice.audio import MODEL_RATE, Pcm, level_db, resample, to_float, to_int16
from bolt_ros.voice.config import RecognizerConfig
from bolt_ros.voice.echo import EchoGate
from bolt_ros.voice.echo_suppress import EchoSuppressor
from bolt_ros.voice.vad import FRAME, FRAME_S, EndOfTurn, Onset, TurnSegmenter

PLAYBACK_BLOCK = 320            # the synthesizer's 20 ms blocks at 16 kHz
BABBLE_TALKERS = 8
BABBLE_TEXTS = [
    "I think the meeting moved to Thursday afternoon.",
    "Could you pass me the red folder on the desk?",
    "We went to the lake last weekend and it rained the whole time.",
    "The printer on the second floor is out of paper again.",
    "She said the train would be about twenty minutes late.",
    "Do you want coffee or tea with your breakfast?",
]
# the robot's long replies: several sentences each, as the assistant speaks them
REPLY_TEXTS = [
    "Sure, I can tell you about the weather patterns in this region.",
    "Most of the rain falls in the autumn, when the winds come in from the sea.",
    "In the summer the days are long and warm, and the evenings are cool.",
    "Once upon a time a little robot lived in a quiet workshop by the sea.",
    "Every morning it looked out of the window and counted the boats in the harbour.",
    "One day a storm came, and all the boats hurried back before the waves grew tall.",
    "Watch me, this is my favourite dance of all, I learned it from a friend.",
    "First I nod my head, then I turn to the left and to the right, and then I wiggle my antennas.",
    "The capital of France is Paris, a city on the river Seine.",
    "It is known for its museums, its cafes and the tall iron tower built for a world fair.",
    "I can look up, look down, look left and right, and show you how I feel.",
    "If you ask me to dance, I will play my favourite animation for you.",
]


def voice_clip(tts, text: str) -> np.ndarray:
    """What `tts` says, at 16 kHz, without the voice's own leading and trailing silence."""
    pcm = tts.synthesize(text)
    x = resample(to_float(pcm), pcm.rate)
    loud = np.flatnonzero(np.abs(x) > 0.02 * np.abs(x).max())
    return x[loud[0]:loud[-1] + 1]


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)) + 1e-20))


def active_db(x: np.ndarray, below_peak_db: float = 30.0) -> float:
    """A voice's level while it speaks: the RMS over its 32 ms frames within 30 dB of its loudest (pauses and the
    tail's last whisper would otherwise lower it by how long they are)."""
    frames = x[:len(x) // FRAME * FRAME].reshape(-1, FRAME)
    levels = 10 * np.log10(np.mean(np.square(frames, dtype=np.float64), axis=1) + 1e-20)
    keep = frames[levels > levels.max() - below_peak_db]
    return level_db(keep.reshape(-1))


def pink_noise(n: int, rng: np.random.Generator) -> np.ndarray:
    """Unit-RMS noise with a 1/f power spectrum (white noise shaped in the frequency domain), above 20 Hz."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / MODEL_RATE)
    spec *= 1 / np.sqrt(np.maximum(f, 20.0))
    x = np.fft.irfft(spec, n)
    return (x / rms(x)).astype(np.float32)


def babble(clips: list[np.ndarray], n: int, rng: np.random.Generator, talkers: int = BABBLE_TALKERS) -> np.ndarray:
    """Unit-RMS babble: `talkers` voices at once, each the clips in its own order and from its own point, at levels
    within 6 dB of each other."""
    out = np.zeros(n, np.float64)
    for _ in range(talkers):
        stream = np.concatenate([np.concatenate([clips[i], np.zeros(int(rng.uniform(0.1, 0.5) * MODEL_RATE))])
                                 for i in rng.permutation(len(clips))])
        reps = np.tile(stream, n // len(stream) + 2)
        start = int(rng.integers(len(stream)))
        out += 10 ** (rng.uniform(-6, 0) / 20) * reps[start:start + n] / rms(stream)
    return (out / rms(out)).astype(np.float32)


def room_noise(n: int, dbfs: float, rng: np.random.Generator, clips: list[np.ndarray]) -> np.ndarray:
    """Pink noise and babble of equal power, together at `dbfs` RMS."""
    x = (pink_noise(n, rng) + babble(clips, n, rng)) / np.sqrt(2)
    return (x * 10 ** (dbfs / 20) / rms(x)).astype(np.float32)


@dataclass(frozen=True)
class Room:
    delay_s: float = 0.12       # the robot: its audio/out back in the mic 120 ms later ...
    gain: float = 10 ** (-10 / 20)   # ... and 10 dB down
    rt60: float = 0.0           # a reverberant tail decaying by 60 dB over this long (0: dry)
    noise_dbfs: float | None = -41.0   # room noise level (None: digital silence)
    seed: int = 0

    def response(self) -> np.ndarray:
        """The path after its delay: the direct sound and the diffuse tail, with the energy of a `gain` copy."""
        if self.rt60 <= 0:
            return np.array([self.gain], np.float32)
        t = np.arange(int(self.rt60 * MODEL_RATE)) / MODEL_RATE
        h = np.random.default_rng(self.seed).standard_normal(len(t)) * 10 ** (-3 * t / self.rt60)
        h[0] = 0.0
        h *= 0.7 / np.sqrt((h ** 2).sum())
        h[0] = 0.7
        return (h * self.gain / np.sqrt((h ** 2).sum())).astype(np.float32)

    def echo(self, played: np.ndarray, n: int) -> np.ndarray:
        """The played timeline as the mic hears it, n samples long."""
        y = fft_convolve(played, self.response())
        d = int(self.delay_s * MODEL_RATE)
        out = np.zeros(n, np.float32)
        m = max(0, min(n - d, len(y)))
        out[d:d + m] = y[:m]
        return out


def fft_convolve(x: np.ndarray, h: np.ndarray) -> np.ndarray:
    if len(h) == 1:
        return (x * h[0]).astype(np.float32)
    n = len(x) + len(h) - 1
    size = 1 << (n - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(x, size) * np.fft.rfft(h, size), size)[:n].astype(np.float32)


@dataclass
class Turn:
    audio: np.ndarray
    t_start: float              # time of its first sample
    path: tuple                 # the gate's learned (lag, return loss) when it ended
    barge_in: bool              # its onset came while the robot spoke
    over_voice: bool            # ... while its voice could still reach the mic: the recognizer's barge-in ASR
    suppressor: EchoSuppressor


@dataclass
class Heard:
    onsets: list[tuple[float, float, bool]] = field(default_factory=list)   # (decided at, speech start, barge-in)
    turns: list[Turn] = field(default_factory=list)
    cut_at: float | None = None          # when the playback stopped for a barge-in

    def barge_ins(self) -> list[tuple[float, float, bool]]:
        return [o for o in self.onsets if o[2]]


def replay(vad, utterances: list[tuple[float, np.ndarray]], room: Room, duration_s: float, *,
           person: tuple[float, np.ndarray] | None = None, noise: np.ndarray | None = None,
           react_s: float | None = 0.02, cfg: RecognizerConfig | None = None, gate: EchoGate | None = None) -> Heard:
    """The recognizer's audio thread over `duration_s` of a room: the robot plays `utterances` ((start time, 16 kHz
    audio), in order), a person may speak (start time, audio at the mic), `noise` (the room, at least as long) is
    under everything. With react_s not None the first barge-in stops the playback react_s later. `gate`: another
    echo gate than cfg's (a test's negative control)."""
    cfg = cfg or RecognizerConfig()
    vad.reset()
    gate, seg, sup = gate or EchoGate(cfg.echo), TurnSegmenter(cfg.vad), EchoSuppressor(cfg.echo)
    n = int(duration_s * MODEL_RATE)
    blocks = []                                   # (start sample, block) in play order
    for t, x in utterances:
        i = int(t * MODEL_RATE)
        blocks += [(i + j, x[j:j + PLAYBACK_BLOCK]) for j in range(0, len(x), PLAYBACK_BLOCK) if i + j < n]
    other = np.zeros(n, np.float32) if noise is None else noise[:n].astype(np.float32, copy=True)
    if person is not None:
        i = int(person[0] * MODEL_RATE)
        x = person[1][:max(0, n - i)]
        other[i:i + len(x)] += x
    mic = room.echo(_timeline(blocks, n), n) + other
    heard, next_block, barge = Heard(), 0, False
    for k in range(n // FRAME):
        t_end = (k + 1) * FRAME_S
        while next_block < len(blocks) and blocks[next_block][0] < t_end * MODEL_RATE:   # played by now
            i, block = blocks[next_block]
            gate.add_reference(block, i / MODEL_RATE)
            sup.add_reference(block, i / MODEL_RATE)
            next_block += 1
        frame = mic[k * FRAME:(k + 1) * FRAME]
        prob = vad(frame)
        for ev in seg.push(frame, prob, gate.is_echo(frame, t_end, prob, seg.in_speech), t_end):
            if isinstance(ev, Onset):
                barge = cfg.barge_in and gate.robot_speaking(ev.t_start)
                over_voice = barge and gate.voice_reaches(ev.t_start)   # as the recognizer decides it
                heard.onsets.append((t_end, ev.t_start, barge))
                if barge and react_s is not None and heard.cut_at is None:
                    # the synthesizer drops every block it has not started by then
                    heard.cut_at = t_end + react_s
                    blocks = [b for b in blocks if b[0] < heard.cut_at * MODEL_RATE]
                    mic[(k + 1) * FRAME:] = (room.echo(_timeline(blocks, n), n) + other)[(k + 1) * FRAME:]
            elif isinstance(ev, EndOfTurn):
                heard.turns.append(Turn(ev.audio, ev.t_decision - len(ev.audio) / MODEL_RATE, gate.path(), barge,
                                        over_voice, sup))
    return heard


def _timeline(blocks: list[tuple[int, np.ndarray]], n: int) -> np.ndarray:
    played = np.zeros(n, np.float32)
    for i, x in blocks:
        x = x[:max(0, n - i)]
        played[i:i + len(x)] = x
    return played


class LiveRoom:
    """The room in real time on a node: the audio/out blocks come back on audio/in through `room`'s path (placed by
    their play-time stamps), over `noise` (from now on), in 32 ms blocks stamped with their capture time and sent
    30 ms later (a driver's capture latency); `say` mixes a person's voice in."""

    def __init__(self, node, room: Room, noise: np.ndarray | None = None, seconds: float = 120.0,
                 playback: str = "audio/out", audio_in: str = "audio/in"):
        from bolt_ros.msg import AudioChunk
        self.h, self.delay_s = room.response(), room.delay_s
        self.t0 = time.time()
        self.buf = np.zeros(int(seconds * MODEL_RATE), np.float32)    # the room's sound from t0 on
        if noise is not None:
            self.buf[:len(noise)] += noise[:len(self.buf)]
        self._played: list = []
        node.create_subscription(AudioChunk, playback, self._played.append, 500)
        self.mic = node.create_publisher(AudioChunk, audio_in, 200)
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def add(self, x: np.ndarray, t: float) -> None:
        i = int((t - self.t0) * MODEL_RATE)
        n = min(len(x), len(self.buf) - i)
        if i >= 0 and n > 0:
            self.buf[i:i + n] += x[:n]

    def say(self, x: np.ndarray, in_s: float = 0.1) -> float:
        """A person's voice (16 kHz, as loud as it reaches the mic) from in_s from now; its start time."""
        t = time.time() + in_s
        self.add(x, t)
        return t

    def _run(self) -> None:
        from bolt_ros.nodes.speech_common import chunk_msg, from_stamp
        block, t, seen = 512, self.t0, 0
        while not self.stop.is_set() and t + block / MODEL_RATE < self.t0 + len(self.buf) / MODEL_RATE:
            for m in self._played[seen:]:                                  # the echo of what was played
                x = resample(to_float(Pcm(np.frombuffer(m.data, dtype=np.int16), m.sample_rate)), m.sample_rate)
                self.add(fft_convolve(x, self.h), from_stamp(m.header.stamp) + self.delay_s)
            seen = len(self._played)
            if (wait := t + block / MODEL_RATE + 0.03 - time.time()) > 0:
                time.sleep(wait)
            i = int((t - self.t0) * MODEL_RATE)
            self.mic.publish(chunk_msg(to_int16(self.buf[i:i + block]), MODEL_RATE, t))
            t += block / MODEL_RATE


def main() -> None:
    """The robot's audio driver in a noisy room, for `make run ARGS="voice:=true audio:=topic"`: counts the
    barge-ins and transcripts while it runs. Nobody speaks in this room, unless `--say T TEXT` (a person, espeak-ng,
    `--say-db` over the room, says TEXT T seconds in: a spoken request; repeatable). Per request it prints what was
    heard and how much audio the robot played until the next one."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--noise-dbfs", type=float, default=-41.0)
    ap.add_argument("--rt60", type=float, default=0.3)
    ap.add_argument("--say", nargs=2, action="append", default=[], metavar=("T", "TEXT"))
    ap.add_argument("--say-db", type=float, default=20.0, help="the person's level over the room's")
    args = ap.parse_args()
    import rclpy
    from bolt_ros.msg import AudioChunk
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from std_msgs.msg import String

    from bolt_ros.nodes.common import spin_once
    from bolt_ros.voice.tts import EspeakTts, PiperTts
    piper, espeak = PiperTts(), EspeakTts()
    clips = [voice_clip(piper if i % 2 == 0 else espeak, t) for i, t in enumerate(BABBLE_TEXTS)]
    noise = room_noise(int(args.seconds * MODEL_RATE), args.noise_dbfs, np.random.default_rng(0), clips)
    requests = sorted((float(t), text) for t, text in args.say)
    for t, text in requests:
        x = voice_clip(espeak, text)
        x *= 10 ** ((args.noise_dbfs + args.say_db - active_db(x)) / 20)
        i = int(t * MODEL_RATE)
        noise[i:i + len(x)] += x[:max(0, len(noise) - i)]
    rclpy.init()
    node = Node("noisy_room")
    barge_ins, transcripts, played = [], [], []
    node.create_subscription(String, "speech/barge_in", lambda m: barge_ins.append(time.time()), 10)
    node.create_subscription(String, "speech/transcript", lambda m: transcripts.append((time.time(), m.data)), 10)
    node.create_subscription(AudioChunk, "audio/out",
                             lambda m: played.append((time.time(), len(m.data) / m.sample_rate)), 500)
    room = LiveRoom(node, Room(rt60=args.rt60, noise_dbfs=args.noise_dbfs), noise, args.seconds)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    print(f"noisy room: pink + babble at {args.noise_dbfs:.0f} dBFS, RT60 {args.rt60} s, echo 120 ms / -10 dB, "
          f"for {args.seconds:.0f} s", flush=True)
    try:
        while time.time() < room.t0 + args.seconds:
            spin_once(executor, 0.1)
    except KeyboardInterrupt:
        pass
    room.stop.set()
    t0 = room.t0
    for n, (t, text) in enumerate(requests):
        until = requests[n + 1][0] if n + 1 < len(requests) else args.seconds
        heard = [x for s, x in transcripts if t <= s - t0 < until]
        robot = sum(d for s, d in played if t <= s - t0 < until)
        cut = [round(s - t0, 1) for s in barge_ins if t <= s - t0 < until]
        print(f"request {n + 1} at {t:.0f} s, said {text!r}: heard {heard}, the robot then played {robot:.1f} s of "
              f"audio, barge-ins at {cut} s", flush=True)
    print(f"the robot played {sum(d for _, d in played):.1f} s of audio; barge-ins {len(barge_ins)}; transcripts "
          f"{[x for _, x in transcripts]}", flush=True)
    node.destroy_node()
    rclpy.try_shutdown()


if __name__ == "__main__":
    main()
