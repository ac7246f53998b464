"""Voice activity: silero's speech probability per 32 ms frame, and the turn segmenter on top of it.

The segmenter is a small state machine over frames, in the order a conversation needs its decisions:
onset (after `min_speech_ms` of speech: a barge-in may follow), pause (the ASR may start speculatively while the
person might still go on), resume (the speculative transcript is stale), end of turn (after `end_of_turn_ms` of
silence; with `unfinished_end_ms`, and `wait_for_words` set by the recognizer, only once the pause's speculative
words are in and read finished (`words_finished`, turn_end.py), else after `unfinished_end_ms`). silero's own
VADIterator gives start/end only, with no speculative pause and no echo veto, so the decisions live here and the
model is only asked for probabilities.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from bolt_ros.voice.audio import MODEL_RATE
from bolt_ros.voice.config import VadConfig

FRAME = 512                       # silero's window at 16 kHz
FRAME_S = FRAME / MODEL_RATE      # 32 ms
HANGOVER = 0.15                   # in speech, frames down to threshold - this still count (silero's neg_threshold)


class SileroVad:
    """silero-vad's ONNX model (from its wheel) on onnxruntime, one thread: a probability per 512-sample frame."""

    def __init__(self) -> None:
        from silero_vad import load_silero_vad
        self._model = load_silero_vad(onnx=True)
        import torch
        self._torch = torch

    def __call__(self, frame: np.ndarray) -> float:
        if len(frame) != FRAME:
            raise ValueError(f"silero takes {FRAME}-sample frames at {MODEL_RATE} Hz, got {len(frame)}")
        return float(self._model(self._torch.from_numpy(np.ascontiguousarray(frame, dtype=np.float32)), MODEL_RATE))

    def reset(self) -> None:
        self._model.reset_states()


@dataclass
class Onset:
    t_start: float            # time of the first voiced frame


@dataclass
class Pause:
    audio: np.ndarray         # the turn so far (with pre-roll), 16 kHz float32
    t_end: float              # end of its last frame


@dataclass
class Resume:
    pass


@dataclass
class EndOfTurn:
    audio: np.ndarray
    t_end_of_speech: float    # end of the last voiced frame
    t_decision: float         # end of the frame that decided it
    forced: bool = False      # cut at max_utterance_s, not by silence


Event = Onset | Pause | Resume | EndOfTurn


class TurnSegmenter:
    """Feed (frame, its speech probability, whether the echo gate vetoes it, time of its end); get events."""

    def __init__(self, cfg: VadConfig):
        self.cfg = cfg
        self._pre: deque[np.ndarray] = deque(maxlen=max(1, round(cfg.pre_roll_ms / 1000 / FRAME_S)))
        self._frames: list[np.ndarray] = []
        self.in_speech = False
        self._run = 0              # consecutive voiced frames before an onset
        self._silence = 0.0        # seconds of silence in speech
        self._paused = False
        self._t_voiced = 0.0
        # the recognizer judges the words of the current pause (its speculative ASR): None until they are in, then
        # whether they read finished; with wait_for_words a turn ends early only on finished words (issue 33)
        self.wait_for_words = False
        self.words_finished: bool | None = None

    def push(self, frame: np.ndarray, prob: float, echo: bool, t_end: float) -> list[Event]:
        cfg = self.cfg
        if not self.in_speech:
            voiced = prob >= cfg.threshold and not echo
            self._pre.append(frame)
            self._run = self._run + 1 if voiced else 0
            if self._run * FRAME_S * 1000 < max(cfg.min_speech_ms, 1):
                return []
            self.in_speech, self._silence, self._paused, self._t_voiced = True, 0.0, False, t_end
            self._frames, self._t_last = list(self._pre), t_end
            self._pre.clear()
            return [Onset(t_end - self._run * FRAME_S)]
        voiced = prob >= cfg.threshold - HANGOVER and not echo
        self._frames.append(frame)
        self._t_last = t_end
        events: list[Event] = []
        if voiced:
            self._silence, self._t_voiced = 0.0, t_end
            if self._paused:
                self._paused, self.words_finished = False, None
                events.append(Resume())
        else:
            self._silence += FRAME_S
            if not self._paused and self._silence * 1000 >= cfg.pause_ms:
                self._paused, self.words_finished = True, None
                events.append(Pause(self._audio(), t_end))
        if self._silence * 1000 >= cfg.end_of_turn_ms and self._words_allow():
            events.append(self._end(t_end, forced=False))
        elif len(self._frames) * FRAME_S >= cfg.max_utterance_s:
            events.append(self._end(t_end, forced=True))
        return events

    def poll(self, idle: bool = False) -> list[Event]:
        """Between frames: the turn's end when its words came in finished after end_of_turn_ms of silence (the ASR
        thread's verdict need not wait for the next frame), or, `idle` (no audio comes: a WAV ended, a driver
        stopped), after end_of_turn_ms of silence whatever its words."""
        if self.in_speech and self._silence * 1000 >= self.cfg.end_of_turn_ms and (idle or self._words_allow()):
            return [self._end(self._t_last, forced=False)]
        return []

    def _words_allow(self) -> bool:
        """After end_of_turn_ms of silence: whether the turn may end now (module doc)."""
        cfg = self.cfg
        if not self.wait_for_words or cfg.unfinished_end_ms <= cfg.end_of_turn_ms:
            return True
        return bool(self.words_finished) or self._silence * 1000 >= cfg.unfinished_end_ms

    def _audio(self) -> np.ndarray:
        return np.concatenate(self._frames)

    def _end(self, t_end: float, forced: bool) -> EndOfTurn:
        ev = EndOfTurn(self._audio(), self._t_voiced, t_end, forced)
        self.in_speech, self._run, self._frames = False, 0, []
        return ev


class Framer:
    """Cuts a 16 kHz stream of any block size into FRAME-sample frames, each with the time its last sample ends."""

    def __init__(self) -> None:
        self._buf = np.zeros(0, dtype=np.float32)
        self._t0 = 0.0              # time of the first buffered sample

    def push(self, x: np.ndarray, t_start: float) -> list[tuple[np.ndarray, float]]:
        if not len(self._buf):
            self._t0 = t_start
        self._buf = np.concatenate([self._buf, x.astype(np.float32, copy=False)])
        out = []
        while len(self._buf) >= FRAME:
            frame, self._buf = self._buf[:FRAME], self._buf[FRAME:]
            self._t0 += FRAME_S
            out.append((frame, self._t0))
        return out
