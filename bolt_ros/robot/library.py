"""The animation library a robot offers on `list_animations` / `play_animation`: a name, a description, a duration
at speed 1, and how to build the motion from the robot's current pose. The simulated robot's library is its
config's keyframe animations; the Reachy Mini's adds the dances library's moves (robot/reachy_mini/dances.py)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bolt_ros.robot.animation import animation_duration, build_animation
from bolt_ros.robot.config import RobotConfig
from bolt_ros.robot.trajectory import Trajectory


@dataclass(frozen=True)
class LibraryEntry:
    name: str
    description: str
    duration: float  # s, at speed 1 from the neutral pose (what ListAnimations reports)
    build: Callable[[np.ndarray, float], Trajectory]  # (start pose, speed) -> the motion; ValueError = refused


class AnimationLibrary:
    def __init__(self, entries: list[LibraryEntry]):
        self.entries = {e.name: e for e in entries}

    def get(self, name: str) -> LibraryEntry | None:
        return self.entries.get(name)

    def names(self) -> list[str]:
        return list(self.entries)

    def extended(self, more: list[LibraryEntry]) -> AnimationLibrary:
        """This library plus `more` (a name already here keeps its first entry)."""
        return AnimationLibrary([*self.entries.values(), *(e for e in more if e.name not in self.entries)])


def config_library(robot: RobotConfig) -> AnimationLibrary:
    """The keyframe animations of a robot config."""
    def entry(anim) -> LibraryEntry:
        return LibraryEntry(anim.name, anim.description, animation_duration(anim, robot),
                            lambda pose, speed: build_animation(anim, pose, robot, speed))
    return AnimationLibrary([entry(a) for a in robot.animations])
