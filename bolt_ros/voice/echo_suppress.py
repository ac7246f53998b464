"""The robot's own voice taken out of what the ASR hears: spectral echo suppression over a turn's audio.

The echo gate (echo.py) decides *whether* a frame is the person; it does not clean the audio. A barge-in's turn
still holds the robot's voice under the person's first word (the gate needs ~100 ms of speech to believe an onset,
the playback stops after that, and the room adds its delay), and whisper tiny.en then reads "Stop, please." as "Tom,
please.", "from the top, please." or nothing at all (the key word in 12 of 31 offsets of
bench/bench_barge_in_asr.py's replay of the voice test's room; 30 of 31 with this). Here the played audio is the
reference: aligned by the gate's learned delay, its short-time spectrum, scaled by the learned return loss, is what
the echo can hold in each time-frequency cell, and that much magnitude is taken from the mic's spectrum (the mic's
phase is kept). Not an adaptive filter: like the gate it needs no impulse response, and over-estimating the echo (a
cell's loudest reference within the delay's uncertainty and the room's tail) only costs the person some energy in
cells the robot filled anyway. Audio with no reference under it is returned as it came, bit for bit.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from bolt_ros.voice.audio import MODEL_RATE
from bolt_ros.voice.config import EchoConfig
from bolt_ros.voice.vad import FRAME_S

N_FFT = 512                 # 32 ms windows ...
HOP = 128                   # ... every 8 ms (75 % overlap: Hann windows sum to a constant)
OVER_SUBTRACT = 1.5         # the echo estimate is a level, not a waveform: take a bit more than it
FLOOR = 0.1                 # a cell keeps at least -20 dB of itself: no holes whisper would read as silence


class EchoSuppressor:
    def __init__(self, cfg: EchoConfig, keep_s: float = 30.0):
        self.cfg = cfg
        self._lock = threading.Lock()   # the reference arrives on the executor, turns end on the audio thread
        self._chunks: deque[tuple[float, np.ndarray]] = deque()    # (time of the first sample, 16 kHz float)
        self._keep_s = keep_s

    def add_reference(self, x: np.ndarray, t_start: float) -> None:
        """Played audio at 16 kHz whose first sample left the speaker at t_start."""
        with self._lock:
            self._chunks.append((t_start, x.astype(np.float32, copy=True)))
            while self._chunks and self._chunks[0][0] < t_start - self._keep_s:
                self._chunks.popleft()

    def reference(self, t_start: float, n: int, delay_s: float) -> np.ndarray:
        """The played audio as it would reach the mic `delay_s` late, over the n samples from t_start."""
        out = np.zeros(n, np.float32)
        with self._lock:
            chunks = list(self._chunks)
        for t, x in chunks:
            i = round((t + delay_s - t_start) * MODEL_RATE)
            a, b = max(i, 0), min(i + len(x), n)
            if a < b:
                out[a:b] = x[a - i:b - i]
        return out

    def suppress(self, audio: np.ndarray, t_start: float, lag_frames: int | None, erl_db: float) -> np.ndarray:
        """The mic audio (16 kHz float) from t_start with the robot's voice taken out; the gate's learned delay
        (in its 32 ms frames) and return loss, or None for its conservative prior."""
        cfg = self.cfg
        if lag_frames is None:      # not learned yet: any delay up to the most the room may take
            delay, spread, erl_db = 0.0, cfg.max_delay_ms / 1000, cfg.return_loss_db
        else:                       # the gate's delay is whole frames and its estimate may be one off, as its own
            delay, spread = max(0.0, (lag_frames - 1) * FRAME_S), 2 * FRAME_S   # echo model allows
        ref = self.reference(t_start, len(audio), delay)
        if not ref.any():
            return audio
        mic_spec = _stft(audio)                        # [frames, bins] complex
        ref_mag = np.abs(_stft(ref))
        echo = _spread(ref_mag, round(spread * MODEL_RATE / HOP), round(cfg.tail_ms / 1000 * MODEL_RATE / HOP))
        echo *= 10 ** (-erl_db / 20) * OVER_SUBTRACT
        mag = np.abs(mic_spec)
        gain = np.maximum(FLOOR, 1.0 - echo / np.maximum(mag, 1e-9))
        return _istft(mic_spec * gain, len(audio)).astype(np.float32)


def _spread(mag: np.ndarray, late: int, tail: int) -> np.ndarray:
    """Each cell's loudest reference over the `late` hops before it (the delay's uncertainty), and the room's tail
    after that decaying by 60 dB over `tail` hops (tail_ms taken as the RT60)."""
    out = mag.copy()
    decay = 10 ** (-60 / 20 / max(tail, 1))
    for j in range(1, min(late + tail, len(mag) - 1) + 1):
        out[j:] = np.maximum(out[j:], mag[:-j] * decay ** max(0, j - late))
    return out


_WINDOW = np.hanning(N_FFT + 1)[:N_FFT].astype(np.float32)   # periodic Hann: overlap-adds to 1.5 at hop N/4


def _stft(x: np.ndarray) -> np.ndarray:
    """[len] -> [frames, N_FFT/2+1], frames every HOP samples over x padded by N_FFT on both sides."""
    pad = np.pad(x.astype(np.float32, copy=False), (N_FFT, N_FFT + HOP))
    n = (len(pad) - N_FFT) // HOP + 1
    idx = np.arange(N_FFT)[None, :] + HOP * np.arange(n)[:, None]
    return np.fft.rfft(pad[idx] * _WINDOW, axis=1)


def _istft(spec: np.ndarray, length: int) -> np.ndarray:
    """The inverse of _stft (windowed overlap-add), cut back to `length` samples."""
    frames = np.fft.irfft(spec, n=N_FFT, axis=1) * _WINDOW
    out = np.zeros(HOP * (len(frames) - 1) + N_FFT)
    norm = np.zeros_like(out)
    for k, f in enumerate(frames):
        out[k * HOP:k * HOP + N_FFT] += f
        norm[k * HOP:k * HOP + N_FFT] += _WINDOW ** 2
    return (out / np.maximum(norm, 1e-6))[N_FFT:N_FFT + length]
