"""Speech to text: faster-whisper (CTranslate2, int8 on CPU) with tiny.en from its pinned wheel.

Whisper invents text for noise ("Thank you.", "you"), so each segment must pass the model's own doubt measures
(no-speech probability, mean log-probability, and whisper's compression-ratio test for loops) before it becomes a
transcript; silence and noise then give "".

A barge-in's turn is short and spoken over what is left of the robot's echo, and tiny.en misreads it most where it
matters: "Hold on a second." over the robot came out "Oh, not a second.", "Go on a second.", "But we'll not
understand again." or nothing (8 of 24 heard; bench/bench_barge_in_asr.py). People stop a robot with a few
phrases (`asr.barge_in_phrases`), so such a turn also gets a known-phrase check: whisper itself scores each phrase
on the audio (teacher-forced, its mean token log-probability), and the best phrase replaces the free reading when
whisper finds it likely on its own (`phrase_min_logprob`) and not much less likely than its free reading
(`phrase_max_drop`), and the free reading does not already start like it. Speech that is no such phrase keeps its
free reading: questions and requests over the robot scored the best phrase at most -2.43 (-2.85 for "Go on, I am
listening.") while the misread interruptions scored it -2.24 or better.
"""
from __future__ import annotations

import re
import threading

import numpy as np

from bolt_ros.voice.audio import MODEL_RATE
from bolt_ros.voice.config import AsrConfig
from bolt_ros.voice.words import words

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

    def transcribe(self, audio: np.ndarray, prompt: bool = True, known_phrases: bool = False) -> str:
        """16 kHz mono float32 -> the words, or "" when there are none the model believes. prompt=False: without
        the vocabulary prompt (a barge-in's turn, asr.vocabulary_on_barge_in). known_phrases: a barge-in's turn,
        checked against asr.barge_in_phrases (the module docstring)."""
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
        text = text if any(c.isalnum() for c in text) else ""
        if known_phrases and self.cfg.barge_in_phrases and len(audio) <= self.cfg.phrase_max_s * MODEL_RATE:
            return self.known_phrase(audio, text)
        return text

    def known_phrase(self, audio: np.ndarray, text: str) -> str:
        """`text` (whisper's free reading of `audio`, maybe "") or the barge-in phrase that whisper finds likely
        enough on the audio in its stead."""
        said = words(text)
        phrases = [p for p in self.cfg.barge_in_phrases if words(p) and words(p)[0] not in said]
        if not phrases:
            return text
        scores = self.phrase_scores(audio, [text, *phrases] if text else phrases)
        own = scores.pop(0) if text else None
        best = int(np.argmax(scores))
        if scores[best] >= self.cfg.phrase_min_logprob and (own is None
                                                            or scores[best] >= own - self.cfg.phrase_max_drop):
            return phrases[best]
        return text

    def phrase_scores(self, audio: np.ndarray, texts: list[str]) -> list[float]:
        """Each text's mean token log-probability under whisper on `audio`, teacher-forced (one encoder pass, the
        texts aligned as a batch: CTranslate2's align gives each token's probability)."""
        import ctranslate2
        from faster_whisper.audio import pad_or_trim
        from faster_whisper.tokenizer import Tokenizer
        tokenizer = Tokenizer(self.model.hf_tokenizer, self.model.model.is_multilingual, task="transcribe",
                              language=self.cfg.language)
        tokens = [tokenizer.encode(" " + t.strip()) for t in texts]
        with self._lock:
            features = self.model.feature_extractor(audio.astype(np.float32, copy=False))
            n = features.shape[-1]
            encoded = np.asarray(self.model.encode(pad_or_trim(features)))
            batch = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.repeat(encoded, len(tokens), 0)))
            results = self.model.model.align(batch, [*tokenizer.sot_sequence, tokenizer.no_timestamps], tokens,
                                             [n] * len(tokens))
        return [float(np.mean(np.log(np.maximum(r.text_token_probs, 1e-6)))) for r in results]

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
