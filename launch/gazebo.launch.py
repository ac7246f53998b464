"""Show the simulated robot in Gazebo (and RViz) on a real ROS 2 install with ros_gz:

    ros2 launch bolt_ros gazebo.launch.py [rviz:=true] [namespace:=robot]

Gazebo gets the model from robot_description; bolt_ros' sim_robot (joint_states + play_animation, goto_pose,
list_animations) moves it kinematically, and robot_state_publisher turns joint_states into TF for RViz.
"""
from pathlib import Path

from ament_index_python.packages import get_package_share_directory
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, GroupAction, IncludeLaunchDescription
from launch.conditions import IfCondition
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node, PushRosNamespace


def generate_launch_description():
    share = Path(get_package_share_directory("bolt_ros"))
    urdf = (share / "urdf" / "reachy_mini_like.urdf").read_text()
    gz_launch = Path(get_package_share_directory("ros_gz_sim")) / "launch" / "gz_sim.launch.py"
    namespace = LaunchConfiguration("namespace")
    robot_nodes = GroupAction([
        PushRosNamespace(namespace),
        Node(package="robot_state_publisher", executable="robot_state_publisher",
             parameters=[{"robot_description": urdf}]),
        # the simulated robot: one process with the shared joint state and both servers
        Node(package="bolt_ros", executable="sim_robot",
             parameters=[{"robot_config": str(share / "config" / "robot.yaml")}]),
        Node(package="ros_gz_sim", executable="create",
             arguments=["-name", "reachy_mini_like", "-topic", "robot_description", "-z", "0.0"]),
    ])
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value=""),
        DeclareLaunchArgument("rviz", default_value="false"),
        IncludeLaunchDescription(PythonLaunchDescriptionSource(str(gz_launch)),
                                 launch_arguments={"gz_args": "-r empty.sdf"}.items()),
        robot_nodes,
        Node(package="rviz2", executable="rviz2", condition=IfCondition(LaunchConfiguration("rviz"))),
    ])
