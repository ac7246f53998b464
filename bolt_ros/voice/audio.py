"""PCM audio as the voice package passes it around: int16 samples with their rate, checked on the way in.

Everything downstream (VAD, ASR, echo gate) works on mono float32 at 16 kHz; `to_model_rate` gets any input there
with soxr (a proper band-limited resampler: linear interpolation would alias a 48 kHz mic into the speech band).
"""
from __future__ import annotations

import io
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MODEL_RATE = 16000                 # what silero and whisper take
MIN_RATE, MAX_RATE = 8000, 192000  # outside this a "rate" is a bug upstream, not audio
MAX_CHANNELS = 8


class AudioError(ValueError):
    """Audio that cannot be used as it is: the message says what is wrong with it."""


@dataclass(frozen=True)
class Pcm:
    samples: np.ndarray   # int16, shape (frames,) mono or (frames, channels)
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.rate


def check_format(rate: int, channels: int, n_values: int) -> None:
    """Raise AudioError for a block no microphone produces (the caller drops it and goes on)."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioError(f"sample rate {rate} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")
    if not 1 <= channels <= MAX_CHANNELS:
        raise AudioError(f"{channels} channels (expected 1..{MAX_CHANNELS})")
    if n_values % channels:
        raise AudioError(f"{n_values} samples do not split into {channels} channels")


def to_mono_float(data: np.ndarray, channels: int) -> np.ndarray:
    """Interleaved int16 -> mono float32 in [-1, 1] (channels averaged)."""
    x = np.asarray(data, dtype=np.int16).astype(np.float32) / 32768.0
    return x.reshape(-1, channels).mean(axis=1) if channels > 1 else x


def to_float(pcm: Pcm) -> np.ndarray:
    """Pcm (mono or frames x channels) -> mono float32 in [-1, 1] at the same rate."""
    s = pcm.samples
    return to_mono_float(s.reshape(-1), s.shape[1] if s.ndim == 2 else 1)


def to_int16(x: np.ndarray) -> np.ndarray:
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16)


class Resampler:
    """Streaming resampler to MODEL_RATE for one source (soxr keeps filter state across blocks)."""

    def __init__(self, in_rate: int, out_rate: int = MODEL_RATE):
        import soxr
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self._stream is None:
            return x.astype(np.float32, copy=False)
        return self._stream.resample_chunk(x.astype(np.float32, copy=False))


def resample(x: np.ndarray, in_rate: int, out_rate: int = MODEL_RATE) -> np.ndarray:
    """A whole signal at another rate (float32)."""
    if in_rate == out_rate:
        return x.astype(np.float32, copy=False)
    import soxr
    return soxr.resample(x.astype(np.float32, copy=False), in_rate, out_rate).astype(np.float32, copy=False)


def read_wav(path: str | Path | io.BytesIO) -> Pcm:
    """A 16-bit PCM WAV file; anything else is an AudioError naming the file."""
    try:
        with wave.open(str(path) if isinstance(path, Path) else path, "rb") as w:
            width, channels, rate, n = w.getsampwidth(), w.getnchannels(), w.getframerate(), w.getnframes()
            raw = w.readframes(n)
    except (wave.Error, EOFError) as e:
        raise AudioError(f"{path}: not a PCM WAV file ({e})") from e
    if width != 2:
        raise AudioError(f"{path}: {8 * width}-bit samples (expected 16-bit PCM)")
    check_format(rate, channels, len(raw) // 2)
    samples = np.frombuffer(raw, dtype="<i2").astype(np.int16)
    return Pcm(samples.reshape(-1, channels) if channels > 1 else samples, rate)


def write_wav(path: str | Path | io.BytesIO, pcm: Pcm) -> None:
    channels = pcm.samples.shape[1] if pcm.samples.ndim == 2 else 1
    with wave.open(str(path) if isinstance(path, Path) else path, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(pcm.rate)
        w.writeframes(pcm.samples.astype("<i2").tobytes())


def level_db(x: np.ndarray) -> float:
    """RMS level in dB full scale of a float block (-120 for digital silence)."""
    rms = float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if len(x) else 0.0
    return 20.0 * np.log10(max(rms, 1e-6))
