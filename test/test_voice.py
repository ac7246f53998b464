"""The voice package without ROS, on the real models: Piper and espeak-ng speak, faster-whisper hears it back,
silero + the turn segmenter find onsets, pauses and ends of turns, the echo gate keeps the robot's own voice from
counting as speech (and lets a person speaking over it through), and garbage audio gives no words."""
from __future__ import annotations

import numpy as np
import pytest

from bolt_ros.voice.audio import MODEL_RATE, AudioError, Pcm, check_format, read_wav, resample, to_float, write_wav
from bolt_ros.voice.config import AsrConfig, EchoConfig, VadConfig
from bolt_ros.voice.echo import EchoGate
from bolt_ros.voice.vad import FRAME, FRAME_S, EndOfTurn, Onset, Pause, Resume, TurnSegmenter
from bolt_ros.voice.words import word_errors

pytest.importorskip("faster_whisper", reason="the voice stack: bash scripts/setup_voice.sh")


@pytest.fixture(scope="module")
def voices():
    from bolt_ros.voice.tts import EspeakTts, PiperTts
    return {"piper": PiperTts(), "espeak": EspeakTts()}


@pytest.fixture(scope="module")
def asr():
    from bolt_ros.voice.asr import Transcriber
    return Transcriber(AsrConfig())


@pytest.fixture(scope="module")
def vad():
    from bolt_ros.voice.vad import SileroVad
    return SileroVad()


def speech(voices, who: str, text: str) -> np.ndarray:
    """What `who` says, as the recognizer takes it (16 kHz mono float), without the voice's own leading and trailing
    silence (so the gaps a test puts between utterances are the gaps the segmenter sees)."""
    pcm = voices[who].synthesize(text)
    x = resample(to_float(pcm), pcm.rate)
    loud = np.flatnonzero(np.abs(x) > 0.02 * np.abs(x).max())
    return x[loud[0]:loud[-1] + 1]


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * MODEL_RATE), dtype=np.float32)


def run_segmenter(vad, audio: np.ndarray, cfg: VadConfig | None = None, gate: EchoGate | None = None, t0: float = 0.0):
    vad.reset()
    seg, events = TurnSegmenter(cfg or VadConfig()), []
    for i in range(0, len(audio) - FRAME + 1, FRAME):
        frame, t_end = audio[i:i + FRAME], t0 + (i + FRAME) / MODEL_RATE
        echo = gate.is_echo(frame, t_end) if gate else False
        events += [(t_end, e) for e in seg.push(frame, vad(frame), echo, t_end)]
    return events


@pytest.mark.parametrize("who", ["piper", "espeak"])
def test_what_the_robot_says_is_heard_back(voices, asr, who, max_word_errors=1):
    said = "Look to your left, please."
    heard = asr.transcribe(speech(voices, who, said))
    assert word_errors(said, heard) <= max_word_errors, heard
    # negative control: the measure tells other words apart
    assert word_errors("What is the capital of France?", heard) > max_word_errors


def test_a_turn_ends_after_the_configured_silence_and_a_short_pause_does_not_end_it(voices, vad):
    # the silence alone decides here (no words judged: wait_for_words off), at issue 26's 400 ms; the default 352
    # ms waits for the pause's words in the recognizer (test_turn_end.py)
    cfg = VadConfig(end_of_turn_ms=400)
    one, two = speech(voices, "piper", "Turn your head."), speech(voices, "piper", "And then nod.")
    # past the speculative pause, short of the end of turn: halfway between them. pause_ms + 50 (210 ms) failed once
    # in ~15 runs (no Pause): of a 210 ms gap silero counted 128-224 ms as silence over 20 of Piper's renderings
    # (each differs; its hangover after a word), 128 ms in one, under pause_ms. Halfway leaves 120 ms either side
    short_pause = (cfg.pause_ms + cfg.end_of_turn_ms) / 2 / 1000
    audio = np.concatenate([silence(0.5), one, silence(short_pause), two, silence(1.0)])
    events = run_segmenter(vad, audio, cfg)
    kinds = [type(e).__name__ for _, e in events]
    assert kinds.count("Onset") == 1 and kinds.count("EndOfTurn") == 1, kinds
    assert "Pause" in kinds and "Resume" in kinds  # the speculative ASR started and was called off
    end = next(e for _, e in events if isinstance(e, EndOfTurn))
    speech_end = (len(audio) - MODEL_RATE) / MODEL_RATE
    assert abs(end.t_end_of_speech - speech_end) < 0.2   # audio time: where the voice stops
    assert end.t_decision - end.t_end_of_speech >= cfg.end_of_turn_ms / 1000 - FRAME_S
    assert len(end.audio) / MODEL_RATE > len(one) / MODEL_RATE + len(two) / MODEL_RATE  # both parts in one turn
    # negative control: a long pause splits them into two turns
    audio = np.concatenate([silence(0.5), one, silence(1.0), two, silence(1.0)])
    assert sum(isinstance(e, EndOfTurn) for _, e in run_segmenter(vad, audio, cfg)) == 2


def test_the_speculative_transcript_is_the_final_one(voices, vad, asr):
    audio = np.concatenate([silence(0.3), speech(voices, "espeak", "Please dance for me."), silence(0.8)])
    events = [e for _, e in run_segmenter(vad, audio)]
    pause = next(e for e in events if isinstance(e, Pause))
    end = next(e for e in events if isinstance(e, EndOfTurn))
    assert not any(isinstance(e, Resume) for e in events)
    early, final = asr.transcribe(pause.audio), asr.transcribe(end.audio)
    assert final and word_errors(final, early) == 0, (early, final)


@pytest.mark.parametrize("kind", ["silence", "noise", "hum"])
def test_garbage_gives_no_words(vad, asr, kind):
    rng = np.random.default_rng(1)
    t = np.arange(3 * MODEL_RATE) / MODEL_RATE
    audio = {"silence": silence(3.0),
             "noise": (0.3 * rng.standard_normal(len(t))).astype(np.float32),
             "hum": (0.5 * np.sin(2 * np.pi * 50 * t)).astype(np.float32)}[kind]
    assert asr.transcribe(audio) == ""
    turns = [e for _, e in run_segmenter(vad, audio) if isinstance(e, EndOfTurn)]
    assert all(asr.transcribe(e.audio) == "" for e in turns)


def test_a_loop_or_an_unsure_segment_is_not_believed():
    from types import SimpleNamespace as Seg

    from bolt_ros.voice.asr import believed
    said = Seg(text="Look left.", no_speech_prob=0.1, avg_logprob=-0.3, compression_ratio=0.9)
    loop = Seg(text=" beep" * 60, no_speech_prob=0.1, avg_logprob=-0.2, compression_ratio=12.0)
    silent = Seg(text="you", no_speech_prob=0.9, avg_logprob=-0.2, compression_ratio=0.8)
    unsure = Seg(text="Tom, please.", no_speech_prob=0.1, avg_logprob=-1.4, compression_ratio=1.0)
    cfg = AsrConfig()
    assert believed([said, silent], cfg) == (["Look left."], False)    # silence is no doubt: no retry
    assert believed([said, loop], cfg) == (["Look left."], True)
    assert believed([unsure], cfg) == ([], True)
    # negative control: without the loop test the loop is a transcript
    assert believed([said, loop], AsrConfig(max_compression_ratio=100.0))[0] == ["Look left.", loop.text]


def test_clipped_speech_is_heard_or_ignored_but_never_breaks(voices, asr):
    clean = speech(voices, "piper", "Look up.")
    clipped = np.clip(clean * 20, -1, 1)      # 26 dB of overdrive: a square wave with a voice's rhythm
    heard = asr.transcribe(clipped)
    assert heard == "" or word_errors("Look up.", heard) <= 2


def test_bad_formats_are_refused_with_a_clear_error(tmp_path):
    for rate, channels, n, why in [(0, 1, 100, "sample rate"), (1_000_000, 1, 100, "sample rate"),
                                   (16000, 0, 100, "channels"), (16000, 2, 101, "split")]:
        with pytest.raises(AudioError, match=why):
            check_format(rate, channels, n)
    check_format(48000, 2, 960)   # a normal stereo block passes
    bad = tmp_path / "x.wav"
    bad.write_bytes(b"RIFF\x00\x00not a wave")
    with pytest.raises(AudioError, match="not a PCM WAV"):
        read_wav(bad)
    good = tmp_path / "ok.wav"
    write_wav(good, Pcm(np.arange(-100, 100, dtype=np.int16).reshape(-1, 2), 8000))
    back = read_wav(good)
    assert back.rate == 8000 and back.samples.shape == (100, 2) and back.samples[0, 1] == -99


def echo_path(played: np.ndarray, delay_s: float, gain: float, length: int) -> np.ndarray:
    """The room between speaker and mic: a delay, an attenuation, and a short reverb tail (three reflections)."""
    out = np.zeros(length, dtype=np.float32)
    for extra_s, g in ((0.0, 1.0), (0.011, 0.5), (0.023, 0.3), (0.041, 0.15)):
        d = int((delay_s + extra_s) * MODEL_RATE)
        n = min(len(played), length - d)
        if n > 0:
            out[d:d + n] += gain * g * played[:n]
    return out


# (speaker -> mic delay, direct-path gain): a laptop's own speaker close by, and a robot's speaker farther off with
# more buffering; with the reflections the echo is 7-11 dB below the played level
@pytest.mark.parametrize("delay_s,gain", [(0.04, 0.35), (0.15, 0.25)])
def test_the_robot_does_not_hear_itself_but_hears_a_person_over_it(voices, vad, delay_s, gain):
    robot = speech(voices, "piper", "I can turn my head, move my antennas and rotate my body. Watch this dance!")
    t0 = 100.0                                   # any clock: the gate compares times
    n = len(robot) + MODEL_RATE
    rng = np.random.default_rng(2)
    mic = echo_path(robot, delay_s, gain, n) + 0.003 * rng.standard_normal(n).astype(np.float32)

    def gate() -> EchoGate:
        g = EchoGate(EchoConfig())
        g.add_reference(robot, t0)               # what the synthesizer published as it played
        return g
    assert not any(isinstance(e, Onset) for _, e in run_segmenter(vad, mic, gate=gate(), t0=t0))
    # negative control: without the gate the robot's echo is taken for a person (a false barge-in)
    assert any(isinstance(e, Onset) for _, e in run_segmenter(vad, mic, t0=t0))
    # a person speaking over the robot, one second in, as loud at the mic as the robot's own voice is played
    person = speech(voices, "espeak", "Stop, stop!")
    person *= np.abs(robot).max() / np.abs(person).max()
    start = MODEL_RATE
    mixed = mic.copy()
    mixed[start:start + len(person)] += person
    g = gate()
    onsets = [e for _, e in run_segmenter(vad, mixed, gate=g, t0=t0) if isinstance(e, Onset)]
    assert onsets and abs(onsets[0].t_start - (t0 + 1.0)) < 0.3
    assert g.robot_speaking(onsets[0].t_start)    # so the recognizer calls it a barge-in
    assert g.voice_reaches(onsets[0].t_start)     # ... and its words get the barge-in's ASR


def test_a_reply_just_after_the_robot_s_last_word_is_not_taken_for_words_over_its_voice():
    """The robot's sentence ends in 0.3 s of played silence (as Piper's do): a person who starts 0.4 s after its
    last sounding frame still counts as a barge-in (the echo may linger) but not as speaking over its voice."""
    t0, rng = 50.0, np.random.default_rng(0)
    voice = 0.3 * rng.standard_normal(MODEL_RATE).astype(np.float32)      # 1 s of sound
    played = np.concatenate([voice, np.zeros(int(0.3 * MODEL_RATE), np.float32)])
    g = EchoGate(EchoConfig())                    # no learned path: the delay is max_delay_ms (300)
    g.add_reference(played, t0)
    t_voice_end = t0 + 1.0
    assert g.voice_reaches(t_voice_end - 0.5) and g.voice_reaches(t_voice_end + 0.25)
    assert not g.voice_reaches(t_voice_end + 0.4)
    assert g.robot_speaking(t_voice_end + 0.4)    # negative control: the old test, with the silence and the tail
    g2 = EchoGate(EchoConfig())
    g2.add_reference(np.zeros(MODEL_RATE, np.float32), t0)   # silence alone was never the robot's voice
    assert not g2.voice_reaches(t0 + 0.5) and g2.robot_speaking(t0 + 0.5)
