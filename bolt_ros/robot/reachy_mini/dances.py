"""The 20 moves of Pollen's reachy-mini-dances-library as entries of our animation library.

Each move is a function of time written for the real robot (head orientation and translation, antennas). We sample
it once at 100 Hz into our pose space, clip every sample into OUR joint limits and slew-limit the samples to our
velocity limits (the daemon refuses nothing, so the envelope is ours to keep), and play it as a trajectory: a
velocity-limited lead-in from wherever the robot is to the move's first pose, then the samples. The body keeps its
yaw (the moves do not turn it). The head translation a move asks for is carried beside the pose (`offset`), bounded
by `max_offset_m`.
"""
from __future__ import annotations

import numpy as np

from bolt_ros.robot.config import JOINT_NAMES, RobotConfig
from bolt_ros.robot.library import LibraryEntry
from bolt_ros.robot.reachy_mini.convert import ANT_L, ANT_R, BODY, PITCH, ROLL, YAW, rpy
from bolt_ros.robot.trajectory import PROFILES, segment

SAMPLE_HZ = 100.0


def slew_limited(poses: np.ndarray, max_step: np.ndarray) -> np.ndarray:
    """The samples [n, n_joints] with every joint's step between samples within max_step [n_joints] (our velocity
    limits x the sample period): some moves are square waves (grid_snap jumps ~23x faster than our head limit) or
    sharp jerks (yeah_nod ~9x). A jump becomes a ramp at the limit; samples are appended until the last pose is
    reached, so the move ends where it was written to."""
    out = [poses[0]]
    for target in [*poses[1:], *([poses[-1]] * 10_000)]:
        if len(out) >= len(poses) and np.array_equal(out[-1], poses[-1]):
            break
        out.append(out[-1] + np.clip(target - out[-1], -max_step, max_step))
    return np.array(out)


class DanceTrajectory:
    """Duck-types bolt_ros.robot.trajectory.Trajectory (duration, final, sample) and adds offset(t)."""

    def __init__(self, lead_in, poses: np.ndarray, offsets: np.ndarray, dt: float):
        self.lead_in = lead_in  # Segment from the start pose to poses[0]
        self.poses, self.offsets, self.dt = poses, offsets, dt  # [n, n_joints], [n, 3], s per sample
        self.t_dance = lead_in.duration
        self.duration = self.t_dance + dt * (len(poses) - 1)

    @property
    def final(self) -> np.ndarray:
        return self.poses[-1]

    def _at(self, table: np.ndarray, t: float) -> np.ndarray:
        x = min(max((t - self.t_dance) / self.dt, 0.0), len(table) - 1.0)
        i = min(int(x), len(table) - 2)
        return table[i] + (x - i) * (table[i + 1] - table[i])

    def sample(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        if t < self.t_dance:
            s = self.lead_in
            tau = max(0.0, t / s.duration)
            pos, rate = PROFILES[s.profile](tau)
            return s.start + pos * (s.end - s.start), (rate / s.duration) * (s.end - s.start)
        if t >= self.duration:
            return self.final.copy(), np.zeros_like(self.final)
        i = min(int((t - self.t_dance) / self.dt), len(self.poses) - 2)
        return self._at(self.poses, t), (self.poses[i + 1] - self.poses[i]) / self.dt

    def offset(self, t: float) -> np.ndarray:
        """Head translation [3] in metres at time t (zero during the lead-in)."""
        return np.zeros(3) if t < self.t_dance else self._at(self.offsets, t)


class DanceMoves:
    """The library's moves sampled once; `entries(robot)` makes them library entries."""

    def __init__(self, robot: RobotConfig, max_offset_m: float):
        from reachy_mini_dances_library.collection.dance import AVAILABLE_MOVES
        from reachy_mini_dances_library.dance_move import DanceMove

        self.robot = robot
        lower, upper, _ = robot.limits.arrays()
        self.tables: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.descriptions: dict[str, str] = {}
        self.clipped: dict[str, list[str]] = {}  # move -> joints our envelope clipped (logged by the node)
        for name, (_fn, _params, meta) in AVAILABLE_MOVES.items():
            move = DanceMove(name)
            n = int(move.duration * SAMPLE_HZ) + 1
            poses, offsets = np.zeros((n, len(lower))), np.zeros((n, 3))
            for k in range(n):
                head, antennas, _body = move.evaluate(min(k / SAMPLE_HZ, move.duration))
                roll, pitch, yaw = rpy(head[:3, :3])
                poses[k, [ROLL, PITCH, YAW, ANT_R, ANT_L]] = roll, pitch, yaw, antennas[0], antennas[1]
                offsets[k] = head[:3, 3]
            clipped = np.clip(poses, lower, upper)
            self.clipped[name] = [j for j, bad in zip(JOINT_NAMES, np.any(clipped != poses, axis=0)) if bad]
            self.tables[name] = clipped, np.clip(offsets, -max_offset_m, max_offset_m)
            self.descriptions[name] = f"{meta.get('description', name)} (dance move, {move.duration:.1f} s)"

    def build(self, name: str, start: np.ndarray, speed: float) -> DanceTrajectory:
        if not np.isfinite(speed) or speed > 100:
            raise ValueError(f"speed must be a finite number <= 100, got {speed}")
        speed = speed if speed > 0 else 1.0
        poses, offsets = self.tables[name]
        poses = poses.copy()
        poses[:, BODY] = start[BODY]  # the moves do not turn the body: it stays where it is
        dt = 1.0 / (SAMPLE_HZ * speed)
        poses = slew_limited(poses, self.robot.limits.arrays()[2] * dt)
        offsets = np.concatenate([offsets, np.repeat(offsets[-1:], len(poses) - len(offsets), axis=0)])
        lead_in, _ = segment(start, poses[0], 0.0, 0.3 / speed, "min_jerk", self.robot.limits)
        return DanceTrajectory(lead_in, poses, offsets, dt)

    def entries(self) -> list[LibraryEntry]:
        neutral = self.robot.neutral_pose()
        return [LibraryEntry(name, self.descriptions[name], self.build(name, neutral, 1.0).duration,
                             lambda pose, speed, name=name: self.build(name, pose, speed))
                for name in self.tables]
