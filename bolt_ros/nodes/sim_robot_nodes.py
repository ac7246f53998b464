"""The simulated robot of the launch graph: the robot node and its animation and motion servers in one process,
sharing one joint state.

    python -m bolt_ros.nodes.sim_robot_nodes [--ros-args ...]
"""
from __future__ import annotations

from rclpy.node import Node

from bolt_ros.nodes.animation_server import AnimationServer
from bolt_ros.nodes.common import run_nodes
from bolt_ros.nodes.motion_server import MotionServer
from bolt_ros.nodes.sim_robot import SimRobot, SimRobotConfig


def make_sim_robot_nodes(sim_config: SimRobotConfig | None = None, animation_config=None, motion_config=None,
                         **node_kwargs) -> list[Node]:
    """[SimRobot, AnimationServer, MotionServer] sharing one joint state; node_kwargs (context, namespace, ...)
    go to every node."""
    sim = SimRobot(sim_config, **node_kwargs)
    return [sim, AnimationServer(sim, animation_config, **node_kwargs), MotionServer(sim, motion_config, **node_kwargs)]


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(make_sim_robot_nodes, args))


if __name__ == "__main__":
    main()
