"""Speech to text: faster-whisper (CTranslate2, int8 on CPU) with tiny.en from its pinned wheel.

Whisper invents text for noise ("Thank you.", "you"), so each segment must pass the model's own doubt measures
(no-speech probability, mean log-probability) before it becomes a transcript; silence and noise then give "".
"""
from __future__ import annotations

import re
import threading

import numpy as np

from bolt_ros.voice.audio import MODEL_RATE
from bolt_ros.voice.config import AsrConfig

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MIN_SECONDS = 0.2   # shorter audio is a click, not words


def clean_text(text: str) -> str:
    """One line of plain text: no control characters, single spaces."""
    return " ".join(_CONTROL.sub(" ", text).split())


class Transcriber:
    def __init__(self, cfg: AsrConfig):
        from faster_whisper import WhisperModel

        from bolt_ros.voice.models import whisper_dir
        self.cfg = cfg
        self.model = WhisperModel(cfg.model_dir or str(whisper_dir()), device="cpu", compute_type=cfg.compute_type,
                                  cpu_threads=cfg.cpu_threads)
        self._lock = threading.Lock()   # one transcription at a time: the model's threads are the CPU budget

    def transcribe(self, audio: np.ndarray) -> str:
        """16 kHz mono float32 -> the words, or "" when there are none the model believes."""
        if audio.ndim != 1 or len(audio) < MIN_SECONDS * MODEL_RATE:
            return ""
        with self._lock:
            segments, _info = self.model.transcribe(
                audio.astype(np.float32, copy=False), language=self.cfg.language, beam_size=self.cfg.beam_size,
                vad_filter=False, condition_on_previous_text=False, without_timestamps=True,
                temperature=0.0)   # no fallback re-decodes: one pass, a bounded time
            kept = [s.text for s in segments
                    if s.no_speech_prob < self.cfg.no_speech_threshold and s.avg_logprob >= self.cfg.min_avg_logprob]
        text = clean_text(" ".join(kept))
        return text if any(c.isalnum() for c in text) else ""
