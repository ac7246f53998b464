"""Speech to text: faster-whisper (CTranslate2, int8 on CPU) with tiny.en from its pinned wheel.

Whisper invents text for noise ("Thank you.", "you"), so each segment must pass the model's own doubt measures
(no-speech probability, mean log-probability, and whisper's compression-ratio test for loops) before it becomes a
transcript; silence and noise then give "".
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

    def transcribe(self, audio: np.ndarray, prompt: bool = True) -> str:
        """16 kHz mono float32 -> the words, or "" when there are none the model believes. prompt=False: without
        the vocabulary prompt (a barge-in's turn, asr.vocabulary_on_barge_in)."""
        if audio.ndim != 1 or len(audio) < MIN_SECONDS * MODEL_RATE:
            return ""
        prompt_text = self.cfg.vocabulary if prompt else ""
        kept, unsure = self._decode(audio, self.cfg.beam_size, prompt_text)
        if not kept and unsure and self.cfg.retry_beam_size > self.cfg.beam_size:
            # Greedy decoding goes astray on speech over an echo (a barge-in: "Stop, please." came out as
            # "I'm gonna please" and was dropped as unsure); a beam finds the likelier reading. Only unsure passes
            # pay for it, so the usual turn keeps its greedy latency.
            kept, _ = self._decode(audio, self.cfg.retry_beam_size, prompt_text)
        text = clean_text(" ".join(kept))
        return text if any(c.isalnum() for c in text) else ""

    def _decode(self, audio: np.ndarray, beam_size: int, prompt: str) -> tuple[list[str], bool]:
        """The segments the model believes, and whether any were dropped only for being unsure (not silence)."""
        with self._lock:
            segments = list(self.model.transcribe(
                audio.astype(np.float32, copy=False), language=self.cfg.language, beam_size=beam_size,
                vad_filter=False, condition_on_previous_text=False, without_timestamps=True,
                initial_prompt=prompt or None,
                temperature=0.0)[0])   # no temperature fallback re-decodes: a bounded time
        return believed(segments, self.cfg)


def believed(segments, cfg: AsrConfig) -> tuple[list[str], bool]:
    """The texts of the segments whisper's own doubt measures let through, and whether any were dropped for doubt
    rather than for silence (a retry with a beam may read them)."""
    speech = [s for s in segments if s.no_speech_prob < cfg.no_speech_threshold]
    # a loop ("beep beep beep ...", "and I'm going to go to the left, and ...") is invented, not heard
    kept = [s.text for s in speech
            if s.avg_logprob >= cfg.min_avg_logprob and s.compression_ratio <= cfg.max_compression_ratio]
    return kept, len(kept) < len(speech)
