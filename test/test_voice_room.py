"""The echo gate in a room with noise (issue 36), on the real voices and silero, through the recognizer's own parts
(silero, the echo gate, the turn segmenter) frame by frame: bench/voice_room.py's room, pink noise and eight-talker
babble at -41 and -35 dBFS under the robot's echo (120 ms, -10 dB), with and without a 0.3 s reverberant tail.

The negative control is the gate before this issue: `test_long_replies_over_a_noisy_room_...` failed on commit
8349c5e (run with that commit's bolt_ros: the robot barged in on itself in every room here), and the test repeats
its rooms with the old gate's settings (no room level, 6 dB margin) and sees the false barge-ins.
What the bench measures (false barge-ins per minute over 5 minutes, latency, words heard) is in
bench/bench_barge_in_asr.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from test_voice import vad, voices  # noqa: F401  (the module's fixtures)

from bolt_ros.voice.audio import MODEL_RATE
from bolt_ros.voice.config import EchoConfig, RecognizerConfig
from bolt_ros.voice.echo import MIN_ROOM_FRAMES, EchoGate
from bolt_ros.voice.vad import FRAME, FRAME_S

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from voice_room import BABBLE_TEXTS, REPLY_TEXTS, Room, active_db, replay, room_noise, voice_clip

pytest.importorskip("faster_whisper", reason="the voice stack: bash scripts/setup_voice.sh")

LEAD_S = 2.0          # the mic hears the room before the robot's first word (the gate learns its level)
ROOM_KNOWN_S = MIN_ROOM_FRAMES * FRAME_S   # ... in its first second: babble before that may be an onset (not a
                                           # barge-in: the robot is silent), as a person would be
SENTENCE_GAP_S = 0.2  # the synthesizer plays a reply's sentences back to back, Piper's own pauses trimmed
REPLY_GAP_S = 1.5


def old_gate() -> RecognizerConfig:
    """The gate as it was before issue 36: no room level, a 6 dB margin over the echo."""
    return RecognizerConfig(echo=EchoConfig(noise_window_s=0.0, vad_hangover_ms=0, margin_db=6.0))


@pytest.fixture(scope="module")
def babble_clips(voices):  # noqa: F811
    return [voice_clip(voices["espeak" if i % 2 else "piper"], t) for i, t in enumerate(BABBLE_TEXTS)]


@pytest.fixture(scope="module")
def replies():
    """Three long replies of three sentences (~40 s of the robot's voice), timed as the synthesizer plays them.
    Rendered still (the same audio every run): Piper draws a new rendering each call, and in the CI pre-check of
    2026-12-04 one rendering in ~20 runs made the gate let 4 onsets through as barge-ins in the -35 dBFS room with the
    tail. That weakness is real and measured by bench/bench_barge_in_asr.py over many renderings; this test's verdict
    must not depend on the draw."""
    from bolt_ros.voice.tts import PiperTts
    piper = PiperTts(still=True)
    out, t = [], LEAD_S
    for r in range(3):
        for text in REPLY_TEXTS[3 * r:3 * r + 3]:
            x = voice_clip(piper, text)
            out.append((t, x))
            t += len(x) / MODEL_RATE + SENTENCE_GAP_S
        t += REPLY_GAP_S
    return out, t


# the room (-41 dBFS, and with a 0.3 s tail) and a louder one (-35 dBFS, the top of the done-when's range)
ROOMS = [Room(noise_dbfs=-41.0, rt60=0.0), Room(noise_dbfs=-41.0, rt60=0.3), Room(noise_dbfs=-35.0, rt60=0.3, seed=1)]


def test_long_replies_over_a_noisy_room_with_nobody_speaking_are_never_a_barge_in(vad, replies, babble_clips):  # noqa: F811
    utterances, end = replies
    old_barge_ins = {}
    for room in ROOMS:
        name = f"{room.noise_dbfs:.0f} dBFS, RT60 {room.rt60} s"
        noise = room_noise(int(end * MODEL_RATE) + MODEL_RATE, room.noise_dbfs, np.random.default_rng(room.seed),
                           babble_clips)
        heard = replay(vad, utterances, room, end, noise=noise, react_s=None)
        # nobody spoke: no barge-in, and once the gate knows the room no onset at all (so no turn, no transcript),
        # during the replies or between them
        assert not heard.barge_ins() and not [o for o in heard.onsets if o[1] >= ROOM_KNOWN_S], (name, heard.onsets)
        old_barge_ins[name] = len(replay(vad, utterances, room, end, noise=noise, react_s=None,
                                         cfg=old_gate()).barge_ins())
    # negative control: the same rooms through the old gate. Over all three, not in each: Piper renders the replies
    # differently every time, and in 2 of 8 renderings the old gate held in the -41 dBFS room with the tail; in each
    # of the 8 it barged in on itself in the other two rooms
    assert sum(old_barge_ins.values()) >= 1, old_barge_ins


@pytest.mark.parametrize("rt60", [0.0, 0.3])
def test_a_person_over_the_robot_in_that_room_still_barges_in(vad, voices, replies, babble_clips, rt60):  # noqa: F811
    room = Room(noise_dbfs=-41.0, rt60=rt60)
    utterances, _ = replies
    t_sentence, robot = utterances[1]
    person = voice_clip(voices["espeak"], "Stop, please.")
    # +8 dB over the robot's echo while each speaks, as in the room. Not +6 dB, the bench's quietest: there
    # the echo under "Stop" (Piper renders each sentence differently) hid the word in 3 of 12 renderings here and
    # the onset came with "please", 0.6 s late; at +8 dB 12 of 12 came within 0.13 s
    echo_db = active_db(room.echo(robot, len(robot) + MODEL_RATE))
    person *= 10 ** ((echo_db + 8.0 - active_db(person)) / 20)
    t_person = t_sentence + 1.5                   # inside the sentence, the gate's path learned
    end = t_person + len(person) / MODEL_RATE + 1.5
    noise = room_noise(int(end * MODEL_RATE) + MODEL_RATE, room.noise_dbfs, np.random.default_rng(3), babble_clips)
    heard = replay(vad, utterances, room, end, person=(t_person, person), noise=noise)
    onsets = [o for o in heard.onsets if o[1] >= ROOM_KNOWN_S]
    assert len(onsets) == 1 and onsets[0][2], heard.onsets    # one onset, and a barge-in
    # where the person starts, within a frame and silero's onset (the segmenter dates the onset at the first voiced
    # frame of its run: 0.2 s is six frames, the run's own 3 and the softest word start espeak-ng gives)
    assert abs(onsets[0][1] - t_person) < 0.2, (heard.onsets, t_person)
    assert len(heard.turns) == 1 and heard.turns[0].barge_in


class TurnBlindGate(EchoGate):
    """The gate without the segmenter's state or silero's probability: the room vetoes soft frames inside a turn."""

    def is_echo(self, frame, t_end, speech_prob=None, in_turn=False):
        return super().is_echo(frame, t_end)


def test_a_long_turn_in_the_noisy_room_stays_one_turn(vad, voices, babble_clips):  # noqa: F811
    # 11 s of speech, 8 dB over the room (a quiet talker a few metres off), the robot silent
    text = " ".join(REPLY_TEXTS[3:6])
    person = voice_clip(voices["espeak"], text)
    room = Room(noise_dbfs=-41.0)
    person *= 10 ** ((room.noise_dbfs + 8.0 - active_db(person)) / 20)
    end = LEAD_S + len(person) / MODEL_RATE + 1.5
    noise = room_noise(int(end * MODEL_RATE) + MODEL_RATE, room.noise_dbfs, np.random.default_rng(5), babble_clips)

    def turns(heard) -> list[float]:
        """The turns' lengths, from the person's start on (babble before the gate knows the room may be one)"""
        return [round(len(t.audio) / MODEL_RATE, 1) for t in heard.turns
                if t.t_start + len(t.audio) / MODEL_RATE > LEAD_S]
    said = turns(replay(vad, [], room, end, person=(LEAD_S, person), noise=noise))
    assert len(said) == 1 and said[0] >= len(person) / MODEL_RATE, said
    # negative control: a room level that vetoes frames inside the turn (its soft syllables and short pauses) cuts it
    blind = turns(replay(vad, [], room, end, person=(LEAD_S, person), noise=noise,
                         gate=TurnBlindGate(RecognizerConfig().echo)))
    assert len(blind) > 1, blind


def test_a_frame_let_through_before_its_playback_arrived_is_counted():
    """The live failure the offline replay cannot have: a busy executor hands the recognizer the playback after it
    judged the mic frames that hold its echo. The gate counts such frames (the node warns)."""
    rng = np.random.default_rng(0)
    loud = (0.1 * rng.standard_normal(FRAME)).astype(np.float32)    # -20 dBFS: possible speech
    played = (0.3 * rng.standard_normal(int(0.5 * MODEL_RATE))).astype(np.float32)

    def gate_after(reference_first: bool) -> EchoGate:
        gate = EchoGate(EchoConfig())
        if reference_first:
            gate.add_reference(played, 10.0)
        assert reference_first or not gate.is_echo(loud, 10.3)   # judged with no playback known: let through
        if not reference_first:
            gate.add_reference(played, 10.0)                      # ... then the playback under it arrives
        return gate
    assert gate_after(reference_first=False).late_frames == 1
    # negative control: the same playback on time leaves nothing to count (and the frame is judged against it)
    assert gate_after(reference_first=True).late_frames == 0


def test_the_robot_speaking_from_the_start_in_a_babbling_room_is_never_a_barge_in(vad, replies, babble_clips,  # noqa: F811
                                                                                   monkeypatch):
    """The robot's first reply starts as the recognizer starts (no second of the room alone, and over babble at -35
    dBFS silero takes many room frames for speech): the room's level is not known from frames with no playback until
    the first pause between replies. The low quantile of every frame heard stands in until then (echo.py)."""
    from bolt_ros.voice import echo
    utterances, end = replies
    start = [(t - LEAD_S + 0.1, x) for t, x in utterances]            # the first word 0.1 s in
    room = Room(noise_dbfs=-35.0, rt60=0.3, seed=2)
    end -= LEAD_S - 0.1
    noise = room_noise(int(end * MODEL_RATE) + MODEL_RATE, room.noise_dbfs, np.random.default_rng(7), babble_clips)
    heard = replay(vad, start, room, end, noise=noise, react_s=None)
    assert not heard.barge_ins() and not heard.onsets, heard.onsets
    # negative control: without the stand-in the gate knows no room during the first reply, and the frames after
    # each sentence's echo (the room, which silero still scores as speech) are barge-ins
    monkeypatch.setattr(echo, "ROUGH_FRAMES", 10 ** 9)
    assert replay(vad, start, room, end, noise=noise, react_s=None).barge_ins()
