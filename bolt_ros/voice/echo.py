"""The robot's own voice in its microphone: a gate that knows what was played and when.

Without an echo-cancelling board the mic hears the speaker. The played audio is the reference: a mic frame counts
as possible speech only if it is louder than the loudest echo the reference could cause at that moment (the
reference's level over the last `max_delay_ms`, less the echo path's `return_loss_db`) by `margin_db`. Energy
gating, not subtraction: it needs no estimate of the room's impulse response, so it holds for any delay up to
`max_delay_ms` and for reverberant rooms; the price is that a barge-in must be louder than the robot's echo, which a
person speaking to the robot is.
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from bolt_ros.voice.audio import level_db
from bolt_ros.voice.config import EchoConfig
from bolt_ros.voice.vad import FRAME, FRAME_S

SILENT_DB = -120.0


class EchoGate:
    def __init__(self, cfg: EchoConfig, keep_s: float = 10.0):
        self.cfg = cfg
        self._lock = threading.Lock()   # the reference arrives on the executor, the mic on the audio thread
        self._ref: deque[tuple[float, float]] = deque(maxlen=max(1, int(keep_s / FRAME_S)))  # (t_end, level dB)
        self._t_last_ref = -1e18

    def add_reference(self, x: np.ndarray, t_start: float) -> None:
        """Played audio (16 kHz float) whose first sample left the speaker at t_start."""
        with self._lock:
            for i in range(0, len(x), FRAME):
                block = x[i:i + FRAME]
                t_end = t_start + (i + len(block)) / (FRAME / FRAME_S)
                self._ref.append((t_end, level_db(block)))
                self._t_last_ref = max(self._t_last_ref, t_end)

    def robot_speaking(self, t: float) -> bool:
        """Whether the mic can still hear the robot at time t (playback plus the room's tail)."""
        with self._lock:
            return self._t_last_ref + (self.cfg.max_delay_ms + self.cfg.tail_ms) / 1000 >= t and bool(self._ref)

    def expected_echo_db(self, t_end: float) -> float:
        """The loudest echo a mic frame ending at t_end may hold."""
        lo = t_end - FRAME_S - (self.cfg.max_delay_ms + self.cfg.tail_ms) / 1000
        with self._lock:
            levels = [db for t, db in self._ref if lo <= t <= t_end + FRAME_S]
        return max(levels) - self.cfg.return_loss_db if levels else SILENT_DB

    def is_echo(self, frame: np.ndarray, t_end: float) -> bool:
        """True when the frame can be explained by the robot's own voice (so it must not count as speech)."""
        if not self.cfg.enabled:
            return False
        expected = self.expected_echo_db(t_end)
        return expected > SILENT_DB and level_db(frame) < expected + self.cfg.margin_db
