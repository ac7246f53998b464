"""The single control point of the simulated robot (Reachy Mini's MovementManager idea): one writer of the joint
state, shared by the animation and motion servers. Starting a motion preempts the running one; the last command
wins. The pose is computed from the clock on demand, so no thread has to tick it for motions to progress.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bolt_ros.robot.trajectory import Trajectory

FINISHED, CANCELLED, PREEMPTED = "finished", "cancelled", "preempted"


@dataclass
class Motion:
    label: str
    trajectory: Trajectory
    start_time: float
    done: threading.Event = field(default_factory=threading.Event)
    outcome: str | None = None  # FINISHED / CANCELLED / PREEMPTED once done
    reason: str = ""  # e.g. what preempted it

    def elapsed(self, now: float) -> float:
        return min(max(now - self.start_time, 0.0), self.trajectory.duration)

    def progress(self, now: float) -> float:
        d = self.trajectory.duration
        return 1.0 if d <= 0 else self.elapsed(now) / d


class MotionController:
    def __init__(self, initial: np.ndarray, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._pose = initial.astype(float).copy()  # [n_joints] where the robot is when no motion runs
        self._velocity = np.zeros_like(self._pose)
        self._motion: Motion | None = None

    def now(self) -> float:
        return self._clock()

    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """Current (position, velocity), each [n_joints]; finishes the running motion when its time is up."""
        with self._lock:
            self._advance(self._clock())
            return self._pose.copy(), self._velocity.copy()

    def start(self, build: Callable[[np.ndarray], Trajectory], label: str) -> Motion:
        """Start the trajectory build(current pose), preempting the running motion. build runs under the lock, so
        the trajectory starts exactly where the robot is; its exceptions (e.g. LimitError) propagate and leave
        the running motion untouched."""
        with self._lock:
            now = self._clock()
            self._advance(now)
            trajectory = build(self._pose.copy())
            if self._motion is not None:
                self._finish(self._motion, PREEMPTED, f"preempted by {label}")
            self._motion = Motion(label, trajectory, now)
            return self._motion

    def cancel(self, motion: Motion, reason: str = "cancelled") -> None:
        """Stop `motion` where it is now (no-op when it already ended)."""
        with self._lock:
            self._advance(self._clock())
            if self._motion is motion:
                self._velocity[:] = 0.0
                self._finish(motion, CANCELLED, reason)

    def _advance(self, now: float) -> None:
        m = self._motion
        if m is None:
            return
        self._pose, self._velocity = m.trajectory.sample(now - m.start_time)
        if now - m.start_time >= m.trajectory.duration:
            self._finish(m, FINISHED, "")

    def _finish(self, motion: Motion, outcome: str, reason: str) -> None:
        motion.outcome, motion.reason = outcome, reason
        motion.done.set()
        if self._motion is motion:
            self._motion = None
