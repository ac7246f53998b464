"""Our six-joint pose <-> what Pollen's Reachy Mini SDK speaks (a 4x4 head pose in the world frame, antennas
[right, left], body yaw), without importing the SDK (its import pulls GLib).

Our URDF chains body_yaw -> head_yaw -> head_pitch -> head_roll, so the head's world orientation is
Rz(body_yaw + head_yaw) Ry(head_pitch) Rx(head_roll): the SDK's create_head_pose(roll, pitch, yaw) convention
(scipy's extrinsic "xyz") with yaw = body_yaw + head_yaw. Keeping head_yaw relative to the body makes the real
robot's head-to-body yaw gap (<= 65 deg) a plain joint limit of ours. Antennas follow the SDK's sign convention
(sleep = [-3.05, +3.05] right, left), so they pass through unchanged.
"""
from __future__ import annotations

import math

import numpy as np

from bolt_ros.robot.config import JOINT_NAMES

# The robot's own actuated joints, in the order the daemon reports them (head_joint_positions: yaw_body then the six
# Stewart-platform motors; antennas: right, left). These are the MJCF joint names of reachy_mini's description.
HEAD_JOINT_NAMES: tuple[str, ...] = ("yaw_body", *(f"stewart_{i}" for i in range(1, 7)))
ANTENNA_JOINT_NAMES: tuple[str, ...] = ("right_antenna", "left_antenna")
REAL_JOINT_NAMES: tuple[str, ...] = HEAD_JOINT_NAMES + ANTENNA_JOINT_NAMES

ROLL, PITCH, YAW, ANT_R, ANT_L, BODY = (JOINT_NAMES.index(n) for n in
                                        ("head_roll", "head_pitch", "head_yaw", "antenna_right", "antenna_left",
                                         "body_yaw"))


def wrap(angle: float) -> float:
    """Angle in (-pi, pi]."""
    return math.atan2(math.sin(angle), math.cos(angle))


def rotation(roll: float, pitch: float, yaw: float) -> np.ndarray:
    """Rz(yaw) Ry(pitch) Rx(roll), [3, 3]."""
    cr, sr, cp, sp, cy, sy = (math.cos(roll), math.sin(roll), math.cos(pitch), math.sin(pitch), math.cos(yaw),
                              math.sin(yaw))
    return np.array([[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                     [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                     [-sp, cp * sr, cp * cr]])


def rpy(rot: np.ndarray) -> tuple[float, float, float]:
    """(roll, pitch, yaw) of Rz(yaw) Ry(pitch) Rx(roll); pitch in [-pi/2, pi/2]."""
    pitch = math.asin(max(-1.0, min(1.0, -float(rot[2, 0]))))
    return math.atan2(rot[2, 1], rot[2, 2]), pitch, math.atan2(rot[1, 0], rot[0, 0])


def to_sdk(pose: np.ndarray, offset: np.ndarray | None = None) -> tuple[np.ndarray, list[float], float]:
    """Our pose [n_joints] (+ an optional head translation [3], metres, e.g. a dance's bounce) -> (head 4x4 in the
    world frame, antennas [right, left], body_yaw)."""
    head = np.eye(4)
    head[:3, :3] = rotation(pose[ROLL], pose[PITCH], pose[BODY] + pose[YAW])
    if offset is not None:
        head[:3, 3] = offset
    return head, [float(pose[ANT_R]), float(pose[ANT_L])], float(pose[BODY])


def from_sdk(head: np.ndarray, antennas: list[float], body_yaw: float) -> np.ndarray:
    """The daemon's measured state -> our pose [n_joints]."""
    roll, pitch, yaw = rpy(np.asarray(head)[:3, :3])
    pose = np.zeros(len(JOINT_NAMES))
    pose[[ROLL, PITCH, YAW, BODY]] = roll, pitch, wrap(yaw - body_yaw), body_yaw
    pose[[ANT_R, ANT_L]] = antennas
    return pose
