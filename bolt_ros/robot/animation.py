"""Animations from the library become velocity-limited trajectories starting at the robot's current pose."""
from __future__ import annotations

import math

import numpy as np

from bolt_ros.robot.config import JOINT_NAMES, Animation, RobotConfig
from bolt_ros.robot.trajectory import Trajectory, segment


def build_animation(anim: Animation, start: np.ndarray, config: RobotConfig, speed: float = 1.0) -> Trajectory:
    """Keyframe k is reached (t_k - t_{k-1}) / speed after keyframe k-1 (keyframe 0 from `start`), each segment
    lengthened where the velocity limits demand it. speed <= 0 means 1.0."""
    if not math.isfinite(speed) or speed > 100:
        raise ValueError(f"speed must be a finite number <= 100, got {speed}")
    speed = speed if speed > 0 else 1.0
    pose, t, prev_time, segments = start.copy(), 0.0, 0.0, []
    for kf in anim.keyframes:
        target = pose.copy()
        for joint, value in kf.pose.items():
            target[JOINT_NAMES.index(joint)] = value
        seg, used = segment(pose, target, t, (kf.time - prev_time) / speed, kf.interpolation, config.limits)
        segments.append(seg)
        pose, t, prev_time = target, t + used, kf.time
    return Trajectory(segments)


def animation_duration(anim: Animation, config: RobotConfig) -> float:
    """Duration at speed 1 from the neutral pose (what ListAnimations reports)."""
    return build_animation(anim, config.neutral_pose(), config).duration
