"""The robot's voice moves its head: the played audio's loudness envelope drives small pitch/roll/yaw and antenna
offsets, as slow incommensurate sines scaled by how loud the robot is right now (silence: no offset). Deterministic
in the audio and the time, so the same sentence moves the same way. The pose sent is kept inside the robot's joint
limits (`within`), whatever pose speech starts from."""
from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

from bolt_ros.voice.audio import level_db
from bolt_ros.voice.config import SwayConfig

WINDOW_S = 0.05                         # envelope resolution
# (frequency Hz, phase) per offset: incommensurate, so the motion never looks like a loop
WAVES = {"pitch": (1.7, 0.0), "roll": (1.1, 1.3), "yaw": (0.7, 2.1), "antennas": (2.3, 0.6)}


class Sway:
    def __init__(self, cfg: SwayConfig):
        self.cfg = cfg
        self._env: deque[tuple[float, float]] = deque(maxlen=2000)   # (time, loudness 0..1)
        self._lock = threading.Lock()

    def add_audio(self, x: np.ndarray, rate: int, t_start: float) -> None:
        """Played audio (float mono) whose first sample plays at t_start."""
        n = max(1, int(rate * WINDOW_S))
        with self._lock:
            for i in range(0, len(x), n):
                db = level_db(x[i:i + n])
                loud = (db - self.cfg.quiet_db) / (self.cfg.loud_db - self.cfg.quiet_db)
                self._env.append((t_start + i / rate, min(1.0, max(0.0, loud))))

    def loudness(self, t: float) -> float:
        """The envelope `lag_ms` before t (0 where nothing played)."""
        t -= self.cfg.lag_ms / 1000
        with self._lock:
            return next((v for tt, v in reversed(self._env) if tt <= t < tt + WINDOW_S), 0.0)

    def speaking(self, t: float) -> bool:
        with self._lock:
            return bool(self._env) and self._env[-1][0] + WINDOW_S + self.cfg.lag_ms / 1000 >= t

    def offsets(self, t: float) -> dict[str, float]:
        """Radians: head_pitch, head_roll, head_yaw, antenna_right, antenna_left (the antennas mirror each other)."""
        a = self.loudness(t)
        wave = {k: a * math.sin(2 * math.pi * f * t + ph) for k, (f, ph) in WAVES.items()}
        c = self.cfg
        return {"head_pitch": math.radians(c.pitch_deg) * wave["pitch"],
                "head_roll": math.radians(c.roll_deg) * wave["roll"],
                "head_yaw": math.radians(c.yaw_deg) * wave["yaw"],
                "antenna_right": math.radians(c.antenna_deg) * wave["antennas"],
                "antenna_left": -math.radians(c.antenna_deg) * wave["antennas"]}


def within(pose: dict[str, float], envelope: dict[str, tuple[float, float]]) -> dict[str, float]:
    """The pose with each joint clamped into its (lower, upper) range; joints the envelope does not name as they are.
    Near a limit an offset would take the target out of range and the motion server refuses the whole goal: after
    "go to sleep" (antennas +-3.05 rad against limits of +-3.1, head pitch 0.55 against 0.6) every sway goal was
    refused and the robot kept still (issue 33); clamped, it still sways away from the limit."""
    return {j: min(max(v, envelope[j][0]), envelope[j][1]) if j in envelope else v for j, v in pose.items()}
