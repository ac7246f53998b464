"""ROS-free logic of the simulated robot: config and limits, trajectories, animations, the shared controller."""
from bolt_ros.robot.animation import animation_duration, build_animation
from bolt_ros.robot.config import (
    JOINT_NAMES,
    Animation,
    JointLimit,
    JointLimits,
    Keyframe,
    RobotConfig,
    RobotConfigError,
    default_config_path,
    load_robot_config,
)
from bolt_ros.robot.controller import CANCELLED, FINISHED, PREEMPTED, Motion, MotionController
from bolt_ros.robot.trajectory import PROFILES, LimitError, Trajectory, enforce_limits, min_duration, plan_goto

__all__ = [
    "CANCELLED", "FINISHED", "JOINT_NAMES", "PREEMPTED", "PROFILES", "Animation", "JointLimit", "JointLimits",
    "Keyframe", "LimitError", "Motion", "MotionController", "RobotConfig", "RobotConfigError", "Trajectory",
    "animation_duration", "build_animation", "default_config_path", "enforce_limits", "load_robot_config",
    "min_duration", "plan_goto",
]
