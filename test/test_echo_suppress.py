"""Echo suppression on the real voices: the robot's Piper voice, heard back through a room, mostly leaves the audio the
ASR gets; a person (espeak-ng) speaking over it comes out closer to what they said; audio with no played sound under
it is not touched. What whisper then makes of a barge-in is measured by bench/bench_barge_in_asr.py, and end to end
by test_voice_nodes.py's barge-in."""
from __future__ import annotations

import numpy as np
import pytest
from test_voice import speech, voices  # noqa: F401  (voices: the module's fixture)

from bolt_ros.voice.audio import MODEL_RATE
from bolt_ros.voice.config import EchoConfig
from bolt_ros.voice.echo_suppress import EchoSuppressor

ROBOT = "Watch me, this is my favourite dance of all, I learned it from a friend."
DELAY_S = 0.12


def db(x: np.ndarray) -> float:
    return 10 * np.log10(np.mean(np.square(x, dtype=np.float64)) + 1e-20)


def through_room(x: np.ndarray, rt60: float, gain: float = 0.35) -> np.ndarray:
    """x as the mic hears it DELAY_S after it was played: at `gain`, plus (rt60 > 0) a seeded diffuse tail with a
    quarter of the direct sound's energy, decaying by 60 dB over rt60."""
    h = np.zeros(max(1, int(rt60 * MODEL_RATE)))
    if rt60 > 0:
        t = np.arange(len(h)) / MODEL_RATE
        h = np.random.default_rng(1).standard_normal(len(h)) * 10 ** (-3 * t / rt60)
        h *= 0.5 / np.sqrt(np.sum(h ** 2))
    h[0] = 1.0
    y = np.convolve(x, gain * h)[:len(x)]
    return np.concatenate([np.zeros(int(DELAY_S * MODEL_RATE)), y])[:len(x)].astype(np.float32)


def played(robot: np.ndarray) -> EchoSuppressor:
    """A suppressor that saw `robot` played from t=0 in the synthesizer's 20 ms blocks."""
    sup = EchoSuppressor(EchoConfig())
    for i in range(0, len(robot), 320):
        sup.add_reference(robot[i:i + 320], i / MODEL_RATE)
    return sup


@pytest.fixture(scope="module")
def robot(voices):  # noqa: F811
    return speech(voices, "piper", ROBOT)


def test_audio_with_no_played_sound_under_it_is_returned_untouched(robot):
    person = np.random.default_rng(0).standard_normal(MODEL_RATE).astype(np.float32) * 0.1
    assert EchoSuppressor(EchoConfig()).suppress(person, 0.0, 4, 9.0) is person           # nothing ever played
    sup = played(robot)
    after = len(robot) / MODEL_RATE + 1.0                                               # a turn after the robot
    assert sup.suppress(person, after, 4, 9.0) is person
    assert sup.suppress(person, after, None, 0.0) is person   # the prior's longer reach still ends before it


# The learned path (4 frames = 128 ms for the 120 ms delay; a return loss of 9 dB against 20 log10(0.35) = -9.1 dB)
# and the gate's conservative prior (any delay up to 300 ms, 10 dB). An echo cell the estimate covers keeps FLOOR
# (-20 dB) of itself; 10 dB asks that most of the echo's energy sits in covered cells, in a dry room and with a tail
# longer than tail_ms (0.4 s RT60 against 250 ms).
@pytest.mark.parametrize("rt60", [0.0, 0.4])
@pytest.mark.parametrize("lag,erl", [(4, 9.0), (None, 0.0)], ids=["learned", "prior"])
def test_the_robots_own_voice_mostly_leaves_the_audio(robot, rt60, lag, erl):
    mic = through_room(robot, rt60)
    out = played(robot).suppress(mic, 0.0, lag, erl)
    assert out.shape == mic.shape and out.dtype == np.float32
    assert db(out) < db(mic) - 10, (db(mic), db(out))


@pytest.mark.parametrize("rt60", [0.0, 0.4])
def test_a_person_over_the_robot_comes_out_closer_to_what_they_said(voices, robot, rt60):  # noqa: F811
    person = speech(voices, "espeak", "Stop, please.")
    person = 0.9 * person / np.abs(person).max()
    start = int(1.5 * MODEL_RATE)                  # over the middle of the robot's sentence
    said = np.zeros(len(robot), np.float32)
    said[start:start + len(person)] = person[:len(robot) - start]
    mic = through_room(robot, rt60) + said
    out = played(robot).suppress(mic, 0.0, 4, 9.0)
    # signal to everything-else ratio of the person's words, before and after: the echo was the larger error
    snr_in, snr_out = db(said) - db(mic - said), db(said) - db(out - said)
    assert snr_out > snr_in + 3, (snr_in, snr_out)
    # negative control: the same mixture with the reference of a different, silent playback is not changed
    assert played(np.zeros_like(robot)).suppress(mic, 0.0, 4, 9.0) is mic
