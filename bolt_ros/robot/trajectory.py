"""Time-parameterised joint trajectories: interpolation profiles, joint/velocity limit enforcement, goto planning.

A pose is a float array [n_joints] in JOINT_NAMES order. A segment moves every joint from `start` to `end` along
one profile s(tau), tau = (t - t0) / duration in [0, 1]; the segment's duration is stretched so that the fastest
joint's peak velocity |end - start| * max(ds/dtau) / duration stays within its limit.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bolt_ros.robot.config import JOINT_NAMES, Interpolation, JointLimits, LimitMode

MIN_SEGMENT_S = 0.01  # one control period at 100 Hz: a jump is never commanded in zero time


class LimitError(ValueError):
    """A target the robot refuses (outside the joint limits, or not a number)."""


def _min_jerk(tau: float) -> tuple[float, float]:
    return tau**3 * (10 - 15 * tau + 6 * tau**2), 30 * tau**2 * (1 - tau) ** 2


def _linear(tau: float) -> tuple[float, float]:
    return tau, 1.0


def _ease_in_out(tau: float) -> tuple[float, float]:
    return 0.5 - 0.5 * math.cos(math.pi * tau), 0.5 * math.pi * math.sin(math.pi * tau)


# profile -> (tau -> (s, ds/dtau)), and the peak of ds/dtau, which sets the velocity-limited minimum duration
PROFILES: dict[str, Callable[[float], tuple[float, float]]] = {
    "min_jerk": _min_jerk, "linear": _linear, "ease_in_out": _ease_in_out}
PEAK_RATE: dict[str, float] = {"min_jerk": 1.875, "linear": 1.0, "ease_in_out": 0.5 * math.pi}


@dataclass(frozen=True)
class Segment:
    start: np.ndarray  # [n_joints]
    end: np.ndarray  # [n_joints]
    t0: float
    duration: float
    profile: Interpolation


class Trajectory:
    """Piecewise trajectory; sample(t) clamps t to [0, duration]."""

    def __init__(self, segments: list[Segment]):
        if not segments:
            raise ValueError("a trajectory needs at least one segment")
        self.segments = segments
        self.duration = segments[-1].t0 + segments[-1].duration

    @property
    def final(self) -> np.ndarray:
        return self.segments[-1].end

    def sample(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(position, velocity), each [n_joints], at time t from the start."""
        if t >= self.duration:
            return self.final.copy(), np.zeros_like(self.final)
        seg = next(s for s in self.segments if t < s.t0 + s.duration)
        tau = max(0.0, (t - seg.t0) / seg.duration)
        s, ds = PROFILES[seg.profile](tau)
        delta = seg.end - seg.start
        return seg.start + s * delta, (ds / seg.duration) * delta


def min_duration(start: np.ndarray, end: np.ndarray, max_velocity: np.ndarray, profile: Interpolation) -> float:
    """Shortest duration of a start->end segment whose peak joint velocity stays within max_velocity."""
    return float(np.max(np.abs(end - start) * PEAK_RATE[profile] / max_velocity))


def segment(start: np.ndarray, end: np.ndarray, t0: float, duration: float, profile: Interpolation,
            limits: JointLimits) -> tuple[Segment, float]:
    """A velocity-limited segment and the duration actually used (>= the requested one)."""
    used = max(duration, min_duration(start, end, limits.arrays()[2], profile), MIN_SEGMENT_S)
    return Segment(start.copy(), end.copy(), t0, used, profile), used


def enforce_limits(target: np.ndarray, limits: JointLimits, mode: LimitMode) -> tuple[np.ndarray, list[str]]:
    """The target to execute and notes about what was changed; LimitError when it is refused."""
    lower, upper, _ = limits.arrays()
    if not np.all(np.isfinite(target)):
        bad = [n for n, v in zip(JOINT_NAMES, target) if not math.isfinite(v)]
        raise LimitError(f"target refused: {', '.join(bad)} not a finite number")
    outside = (target < lower) | (target > upper)
    if not outside.any():
        return target.copy(), []
    problems = [f"{JOINT_NAMES[i]}={target[i]:.3f} outside [{lower[i]:.3f}, {upper[i]:.3f}]"
                for i in np.flatnonzero(outside)]
    if mode == "refuse":
        raise LimitError("target refused: " + "; ".join(problems))
    clamped = np.clip(target, lower, upper)
    return clamped, [f"clamped {JOINT_NAMES[i]} from {target[i]:.3f} to {clamped[i]:.3f}"
                     for i in np.flatnonzero(outside)]


def plan_goto(start: np.ndarray, target: np.ndarray, duration: float, profile: Interpolation,
              limits: JointLimits, mode: LimitMode) -> tuple[Trajectory, list[str]]:
    """One-segment move to `target`. NaN target entries keep the start value; duration <= 0 means as fast as the
    velocity limits allow. Returns the trajectory and human-readable notes (clamping, lengthened duration)."""
    if profile not in PROFILES:
        raise LimitError(f"unknown interpolation {profile!r}; expected one of {sorted(PROFILES)}")
    if not math.isfinite(duration):
        raise LimitError(f"duration must be a finite number, got {duration}")
    target = np.where(np.isnan(target), start, target)
    goal, notes = enforce_limits(target, limits, mode)
    seg, used = segment(start, goal, 0.0, max(duration, 0.0), profile, limits)
    if duration > 0 and used > duration + 1e-9:
        notes.append(f"duration lengthened from {duration:.3f} s to {used:.3f} s to respect velocity limits")
    return Trajectory([seg]), notes
