"""One control step of the Reachy Mini backend, ROS-free: our MotionController says where the robot should be, the
envelope keeps that inside OUR limits, the link streams it to the daemon, and the daemon's state comes back.

The daemon refuses nothing (past its reach it logs "IK error" and holds a distorted pose), so a goal's end pose is
checked against the robot's reach (reach.Reach, the SDK's own kinematics) when it starts: refused with the reason,
or clamped to the nearest reachable pose (robot config limit_mode). Every target then passes `guard` right before
it is sent: clipped into the joint limits and the head-translation bound, and brought back within reach. The guard
is the last line, and says when it had to act.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bolt_ros.robot.config import JOINT_NAMES, RobotConfig
from bolt_ros.robot.controller import FINISHED, Motion, MotionController
from bolt_ros.robot.reachy_mini.link import Measured, ReachyLink
from bolt_ros.robot.reachy_mini.reach import Reach
from bolt_ros.robot.trajectory import LimitError, Segment, Trajectory

UNAVAILABLE = "the robot is not available"  # how refusals and aborts for a missing robot begin (the tool layer's cue)
OUT_OF_REACH = "out of reach"  # how refusals of a pose past the robot's reach begin


class RobotUnavailable(LimitError):
    """No robot to move (daemon not running or unreachable): the goal is refused with this reason."""


class OutOfReach(LimitError):
    """A goal whose end pose the robot cannot take (its kinematics say so): refused with this reason."""


class LinkedController(MotionController):
    """A MotionController that refuses to start motions while the robot is unreachable, and that the bridge can
    re-sync to the measured pose and abort when the robot goes away."""

    def __init__(self, initial: np.ndarray, unavailable: Callable[[], str], before_start: Callable[[], None],
                 within_reach: Callable[[Trajectory], Trajectory] = lambda t: t):
        super().__init__(initial)
        self._unavailable = unavailable  # "" when the robot is there, else why not
        self._before_start = before_start
        self._within_reach = within_reach  # the trajectory as it may run, or OutOfReach

    def start(self, build: Callable[[np.ndarray], Trajectory], label: str) -> Motion:
        why = self._unavailable()
        if why:
            raise RobotUnavailable(why)
        self._before_start()
        return super().start(lambda start: self._within_reach(build(start)), label)

    def current(self) -> Motion | None:
        with self._lock:
            return self._motion

    def resync(self, pose: np.ndarray) -> None:
        """Take the robot's measured pose as the command while idle: the next motion starts there, no jump."""
        with self._lock:
            if self._motion is None:  # a motion that started meanwhile owns the pose
                self._pose, self._velocity = pose.astype(float).copy(), np.zeros_like(self._pose)

    def abort(self, reason: str) -> None:
        """End the running motion with `reason` (its goal is aborted with it)."""
        motion = self.current()
        if motion is not None:
            self.cancel(motion, reason)


class Envelope:
    VELOCITY_MARGIN = 1.25  # our trajectories peak exactly at the limits; sampling jitter must not trip the guard

    def __init__(self, robot: RobotConfig, max_offset_m: float):
        self.lower, self.upper, self.max_velocity = robot.limits.arrays()
        self.max_offset_m = max_offset_m

    def limit_step(self, pose: np.ndarray, previous: np.ndarray | None, dt: float) -> tuple[np.ndarray, list[str]]:
        """pose moved at most max_velocity x dt from the previous target sent (none: nothing to compare), and the
        joints that had to be slowed. Planned motions never need it; it stops a jump whatever its cause."""
        if previous is None:
            return pose, []
        step = self.max_velocity * max(dt, 1e-3) * self.VELOCITY_MARGIN
        limited = previous + np.clip(pose - previous, -step, step)
        return limited, [JOINT_NAMES[i] for i in np.flatnonzero(np.abs(limited - pose) > 1e-12)]

    def guard(self, pose: np.ndarray, offset: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
        """(pose, offset) clipped into the envelope, and the joints that had to be clipped."""
        safe = np.clip(np.nan_to_num(pose, nan=0.0), self.lower, self.upper)
        bad = [JOINT_NAMES[i] for i in np.flatnonzero(np.abs(safe - pose) > 1e-9)]
        if offset is not None:
            clipped = np.clip(offset, -self.max_offset_m, self.max_offset_m)
            if np.any(clipped != offset):
                bad.append("head_offset")
            offset = clipped
        return safe, offset, bad


class ReachyBridge:
    def __init__(self, link: ReachyLink, robot: RobotConfig, max_offset_m: float, log: Callable[[str], None],
                 reach: Reach | None = None):
        self.link, self.robot, self.log = link, robot, log
        self.envelope = Envelope(robot, max_offset_m)
        self.reach = reach  # None: per-joint limits only (no SDK kinematics)
        self.controller = LinkedController(robot.neutral_pose(), self.unavailable, self._stop_daemon_moves,
                                           self.within_reach)
        self._generation = 0
        self._last_sent: tuple | None = None  # what was sent last (None: nothing since idle or connecting)
        self._last_pose: tuple[np.ndarray, float] = (robot.neutral_pose(), 0.0)  # its pose and when

    def _stop_daemon_moves(self) -> None:
        """A move running inside the daemon (another app's, a wake-up) makes it ignore our set_target without a
        word: our goal preempts it, as a newer goal preempts ours."""
        for uuid in self.link.stop_daemon_moves():
            self.log(f"stopped the daemon-side move {uuid} to run our goal")

    def unavailable(self) -> str:
        return "" if self.link.connected else f"{UNAVAILABLE}: {self.link.error}"

    def within_reach(self, trajectory: Trajectory) -> Trajectory:
        """The trajectory if the robot can take its end pose; else, per limit_mode, refused (OutOfReach) or a goto
        (one segment) retargeted to the nearest reachable pose on its way. Animations and dances refuse: their
        shape is the point; a pose on the way past reach is brought back by the guard while it streams."""
        if self.reach is None:
            return trajectory
        end = trajectory.final
        offset = trajectory.offset(trajectory.duration) if hasattr(trajectory, "offset") else None
        why = self.reach.why_not(end, offset)
        if not why:
            return trajectory
        segments = getattr(trajectory, "segments", [])
        if self.robot.limit_mode == "clamp" and len(segments) == 1 and offset is None:
            seg = segments[0]
            near = self.reach.nearest(end, seg.start)
            self.log(f"{OUT_OF_REACH}: clamped {_pose_text(end)} to {_pose_text(near)} ({why})")
            return Trajectory([Segment(seg.start, near, seg.t0, seg.duration, seg.profile)])
        raise OutOfReach(f"{OUT_OF_REACH}: the robot cannot take {_pose_text(end)} ({why})")

    def step(self) -> Measured | None:
        """Read the state, send the command; returns the state (None while there is no robot)."""
        measured = self.link.measured()
        if measured is None:
            motion = self.controller.current()
            if motion is not None:
                self.controller.abort(f"{UNAVAILABLE}: {self.link.lost_reason or self.link.error}")
            self._last_sent = None
            return None
        if self.link.generation != self._generation:  # a fresh connection: any motion was aborted with the old one
            self._generation = self.link.generation
        now = self.controller.now()  # when the command is sampled (next line): the velocity guard's clock
        pose, _ = self.controller.state()
        motion = self.controller.current()
        if motion is None:
            # Idle: follow the robot without commanding it (it may be settling on our last target, or moved by a
            # daemon-side move or a hand), so the next motion starts where the robot is, never with a jump.
            start, _, _ = self.envelope.guard(measured.pose, None)
            self.controller.resync(start)
            self._last_sent = None
            return measured
        offset = None
        if motion is not None and hasattr(motion.trajectory, "offset"):
            offset = motion.trajectory.offset(motion.elapsed(self.controller.now()))
        pose, offset, clipped = self.envelope.guard(pose, offset)
        previous, then = self._last_pose if self._last_sent is not None else (None, now)
        pose, slowed = self.envelope.limit_step(pose, previous, now - then)
        if self.reach is not None and not self.reach.reachable(pose, offset):
            # the way between two reachable poses may leave the reach: hold its edge, from where we were
            pose = self.reach.nearest(pose, measured.pose if previous is None else previous, offset)
            clipped.append("reach")
        if clipped or slowed:
            self.log(f"envelope: clipped {', '.join(clipped) or 'nothing'}, slowed {', '.join(slowed) or 'nothing'}"
                     " before sending")
        key = (pose.tobytes(), None if offset is None else offset.tobytes())
        if key != self._last_sent and self.link.send(pose, offset):
            self._last_sent, self._last_pose = key, (pose, now)
        return measured

    @staticmethod
    def shortfall(motion: Motion, measured: Measured | None, tolerance: float) -> str:
        """The joints a finished motion's robot did not bring within tolerance of the final pose ("" if none)."""
        if motion.outcome != FINISHED or measured is None:
            return ""
        miss = np.abs(measured.pose - motion.trajectory.final)
        return ", ".join(f"{JOINT_NAMES[i]} at {measured.pose[i]:.3f} instead of {motion.trajectory.final[i]:.3f}"
                         for i in np.flatnonzero(miss > tolerance))

    def settled(self, motion: Motion, measured: Measured | None, tolerance: float, timeout_s: float) -> bool:
        """Whether a finished motion's goal may report now: the robot reached the final pose (within tolerance,
        rad, on every joint) or timeout_s passed since the command got there (it then reports where it is)."""
        if motion.outcome != FINISHED or measured is None:
            return True
        if np.max(np.abs(measured.pose - motion.trajectory.final)) <= tolerance:
            return True
        end = motion.start_time + motion.trajectory.duration
        return self.controller.now() - end >= timeout_s



def _pose_text(pose: np.ndarray) -> str:
    """The head and body of a pose in degrees, for messages."""
    names = ("head_roll", "head_pitch", "head_yaw", "body_yaw")
    return ", ".join(f"{n} {np.degrees(pose[JOINT_NAMES.index(n)]):.0f} deg" for n in names)
