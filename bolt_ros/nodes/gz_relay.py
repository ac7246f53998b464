"""joint_states (ours: the simulated robot's or the Reachy Mini's measured pose) -> the Gazebo model's
position_controller/commands (std_msgs/Float64MultiArray, config/gz_controllers.yaml joint order), so the model in
Gazebo mirrors the robot bolt_ros drives. Used by launch/gazebo.launch.py (unverified: no Gazebo on our machines).

    python -m bolt_ros.nodes.gz_relay
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from bolt_ros.nodes.common import declare_config, run_nodes
from bolt_ros.robot import JOINT_NAMES


class GzRelayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    joint_states_topic: str = "joint_states"
    commands_topic: str = "position_controller/commands"


class GzRelay(Node):
    def __init__(self, config: GzRelayConfig | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "gz_relay"), **node_kwargs)
        self.config = declare_config(self, config or GzRelayConfig())
        self._pub = self.create_publisher(Float64MultiArray, self.config.commands_topic, 10)
        self.create_subscription(JointState, self.config.joint_states_topic, self._relay, 10)

    def _relay(self, msg: JointState) -> None:
        by_name = dict(zip(msg.name, msg.position))
        if all(n in by_name for n in JOINT_NAMES):  # our six joints, whatever else the message carries
            self._pub.publish(Float64MultiArray(data=[float(by_name[n]) for n in JOINT_NAMES]))


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(lambda: [GzRelay()], args))


if __name__ == "__main__":
    main()
