"""The simulated robot: one shared joint state (the single control point) published on `joint_states`.

`SimRobot` owns the MotionController that the animation and motion servers drive (goal_runner.GoalRunner follows
their goals; robot_node.RobotNode runs the loop); sim_robot_nodes.py builds the three nodes sharing it and runs them
in one process.
"""
from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from bolt_ros.msg import RobotPose
from bolt_ros.nodes.robot_node import RobotNode
from bolt_ros.robot import JOINT_NAMES, MotionController, RobotConfig


class SimRobotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    robot_config: str = ""  # path of the robot YAML (limits, animations); "" = the package's config/robot.yaml
    publish_rate_hz: float = Field(100.0, ge=1.0, le=1000.0)
    joint_states_topic: str = "joint_states"
    frame_id: str = "base_link"


def pose_to_msg(pose: np.ndarray) -> RobotPose:
    p = [float(v) for v in pose]
    return RobotPose(head_roll=p[0], head_pitch=p[1], head_yaw=p[2], antennas=[p[3], p[4]], body_yaw=p[5])


def msg_to_pose(msg: RobotPose) -> np.ndarray:  # [n_joints] in JOINT_NAMES order
    return np.array([msg.head_roll, msg.head_pitch, msg.head_yaw, msg.antennas[0], msg.antennas[1], msg.body_yaw],
                    dtype=float)


class SimRobot(RobotNode):
    def __init__(self, config: SimRobotConfig | None = None, robot: RobotConfig | None = None, **node_kwargs):
        super().__init__("sim_robot", config or SimRobotConfig(), robot, node_kwargs)
        self.controller = MotionController(self.robot.neutral_pose())
        self.start_loop("sim-robot-joint-states")

    def _cycle(self):
        position, velocity = self.controller.state()
        return JOINT_NAMES, position, velocity
