"""Typed configuration of the simulated Reachy-Mini-like robot: joint limits, limit policy, animation library.

Loaded from config/robot.yaml. Units are radians and seconds (REP 103). Every check that can fail on a config
file runs at load time, so a bad library is a clear error at startup instead of a motion refused at runtime.
"""
from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError, field_validator, model_validator

# Order of every pose vector in bolt_ros.robot; also the sensor_msgs/JointState names and the URDF joint names.
JOINT_NAMES: tuple[str, ...] = ("head_roll", "head_pitch", "head_yaw", "antenna_right", "antenna_left", "body_yaw")
JointName = Literal["head_roll", "head_pitch", "head_yaw", "antenna_right", "antenna_left", "body_yaw"]
Interpolation = Literal["min_jerk", "linear", "ease_in_out"]
LimitMode = Literal["refuse", "clamp"]


class RobotConfigError(ValueError):
    """A robot config file that cannot be used; the message names the file and the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JointLimit(_Strict):
    lower: float
    upper: float
    max_velocity: PositiveFloat  # rad/s

    @model_validator(mode="after")
    def _ordered(self) -> JointLimit:
        if not (math.isfinite(self.lower) and math.isfinite(self.upper) and self.lower < self.upper):
            raise ValueError(f"need finite lower < upper, got [{self.lower}, {self.upper}]")
        return self


class JointLimits(_Strict):
    # Reachy Mini's head is a Stewart platform; these are the real robot's ranges (config/robot.yaml says where each
    # comes from): roll/pitch inside its ~40 deg reach, head yaw relative to the body within its 65 deg gap, the
    # body's +-160 deg, antennas past the SDK's sleep pose (+-3.05).
    head_roll: JointLimit = JointLimit(lower=-0.6, upper=0.6, max_velocity=3.0)
    head_pitch: JointLimit = JointLimit(lower=-0.6, upper=0.6, max_velocity=3.0)
    head_yaw: JointLimit = JointLimit(lower=-1.1344, upper=1.1344, max_velocity=4.0)
    antenna_right: JointLimit = JointLimit(lower=-3.1, upper=3.1, max_velocity=10.0)
    antenna_left: JointLimit = JointLimit(lower=-3.1, upper=3.1, max_velocity=10.0)
    body_yaw: JointLimit = JointLimit(lower=-2.7925, upper=2.7925, max_velocity=2.0)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(lower, upper, max_velocity), each [n_joints] in JOINT_NAMES order."""
        rows = [getattr(self, n) for n in JOINT_NAMES]
        return (np.array([r.lower for r in rows]), np.array([r.upper for r in rows]),
                np.array([r.max_velocity for r in rows]))


class Keyframe(_Strict):
    time: PositiveFloat  # seconds from the start of the animation (at speed 1)
    pose: dict[JointName, float]  # joints left out keep the value of the previous keyframe (or the start pose)
    interpolation: Interpolation = "min_jerk"  # of the segment that ends at this keyframe


class Animation(_Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    description: str = Field(min_length=1)
    keyframes: list[Keyframe] = Field(min_length=1)

    @field_validator("keyframes")
    @classmethod
    def _increasing(cls, kfs: list[Keyframe]) -> list[Keyframe]:
        times = [k.time for k in kfs]
        if any(b <= a for a, b in itertools.pairwise(times)):
            raise ValueError(f"keyframe times must strictly increase, got {times}")
        return kfs

    @property
    def nominal_duration(self) -> float:
        return self.keyframes[-1].time


class RobotConfig(_Strict):
    limits: JointLimits = JointLimits()
    limit_mode: LimitMode = "refuse"  # what a target outside the limits gets: refused with a message, or clamped
    neutral: dict[JointName, float] = {}  # start pose; joints left out are 0
    animations: list[Animation] = []

    @model_validator(mode="after")
    def _consistent(self) -> RobotConfig:
        names = [a.name for a in self.animations]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate animation names: {dupes}")
        self._check_within("neutral", self.neutral)
        for a in self.animations:
            for i, k in enumerate(a.keyframes):
                self._check_within(f"animation {a.name!r} keyframe {i}", k.pose)
        return self

    def _check_within(self, where: str, pose: dict[str, float]) -> None:
        for joint, value in pose.items():
            lim: JointLimit = getattr(self.limits, joint)
            if not (lim.lower <= value <= lim.upper):
                raise ValueError(f"{where}: {joint}={value} is outside [{lim.lower}, {lim.upper}]")

    def neutral_pose(self) -> np.ndarray:  # [n_joints]
        return np.array([self.neutral.get(n, 0.0) for n in JOINT_NAMES])

    def animation(self, name: str) -> Animation | None:
        return next((a for a in self.animations if a.name == name), None)


def default_config_path() -> Path:
    """config/robot.yaml of this checkout, else of an installed bolt_ros (share/bolt_ros/config)."""
    here = Path(__file__).resolve().parents[2] / "config" / "robot.yaml"
    if here.is_file():
        return here
    for prefix in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep):
        p = Path(prefix) / "share" / "bolt_ros" / "config" / "robot.yaml"
        if prefix and p.is_file():
            return p
    raise RobotConfigError(f"no robot config found (looked at {here} and share/bolt_ros/config in AMENT_PREFIX_PATH)")


def load_robot_config(path: str | os.PathLike | None = None) -> RobotConfig:
    """Read and validate a robot YAML file (None or "" = the package default). The file may hold the config at
    its top level or under a `robot:` key."""
    p = Path(path) if path else default_config_path()
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise RobotConfigError(f"cannot read robot config {p}: {e}") from e
    if isinstance(data, dict) and "robot" in data:
        data = data["robot"]
    try:
        return RobotConfig.model_validate(data or {})
    except ValidationError as e:
        raise RobotConfigError(f"invalid robot config {p}:\n{e}") from e
