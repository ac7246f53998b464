"""Show the robot bolt_ros drives in Gazebo (and RViz), the ros_gz way. UNVERIFIED: Gazebo and ros_gz cannot be
installed on our machines (not in Debian 12 or on PyPI); this follows the ros_gz / gz_ros2_control conventions.

    ros2 launch bolt_ros gazebo.launch.py [robot:=sim|reachy_mini_sim|reachy_mini] [host:=...] [rviz:=true]
                                          [namespace:=robot]

- robot_state_publisher: robot_description (urdf/reachy_mini_like.urdf plus a ros2_control block for
  gz_ros2_control), TF from our joint_states;
- ros_gz_sim: Gazebo with an empty world, `create` spawns the model from robot_description;
- controller_manager spawners: joint_state_broadcaster (on its local topic) and a position controller
  (config/gz_controllers.yaml);
- ros_gz_bridge: /clock;
- bolt_ros: the robot node chosen by `robot` (ours, or Pollen's Reachy Mini in MuJoCo or for real) and gz_relay,
  which turns its joint_states into the position controller's commands: the Gazebo model mirrors that robot.
"""
import sys
from pathlib import Path

JOINTS = ("head_roll", "head_pitch", "head_yaw", "antenna_right", "antenna_left", "body_yaw")


def with_ros2_control(urdf: str, controllers: str) -> str:
    """The URDF plus gz_ros2_control's hardware block and plugin (kept out of the file itself, which the sim-only
    tools read)."""
    joints = "".join(f'<joint name="{j}"><command_interface name="position"/><state_interface name="position"/>'
                     f'</joint>' for j in JOINTS)
    block = (f'<ros2_control name="GazeboSimSystem" type="system"><hardware>'
             f'<plugin>gz_ros2_control/GazeboSimSystem</plugin></hardware>{joints}</ros2_control>'
             f'<gazebo><plugin filename="gz_ros2_control-system" name="gz_ros2_control::GazeboSimROS2ControlPlugin">'
             f'<parameters>{controllers}</parameters></plugin></gazebo>')
    return urdf.replace("</robot>", block + "</robot>")


def generate_launch_description():
    # isort: off  (ruff files `launch` as first- or third-party depending on the cwd: launch/ is also our folder)
    from ament_index_python.packages import get_package_share_directory
    from launch import LaunchDescription
    from launch.actions import (
        DeclareLaunchArgument,
        ExecuteProcess,
        GroupAction,
        IncludeLaunchDescription,
        OpaqueFunction,
    )
    from launch.conditions import IfCondition
    from launch.launch_description_sources import PythonLaunchDescriptionSource
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node, PushRosNamespace

    # isort: on
    from bolt_ros.graph import parse_arguments, robot_process

    share = Path(get_package_share_directory("bolt_ros"))
    controllers = str(share / "config" / "gz_controllers.yaml")
    urdf = with_ros2_control((share / "urdf" / "reachy_mini_like.urdf").read_text(), controllers)
    gz_launch = Path(get_package_share_directory("ros_gz_sim")) / "launch" / "gz_sim.launch.py"

    def robot_nodes(context):
        args = parse_arguments({"robot": LaunchConfiguration("robot").perform(context),
                                "host": LaunchConfiguration("host").perform(context)})
        spec = robot_process(args)
        return [GroupAction([
            PushRosNamespace(LaunchConfiguration("namespace")),
            Node(package="robot_state_publisher", executable="robot_state_publisher",
                 parameters=[{"robot_description": urdf, "use_sim_time": False}]),
            Node(package="ros_gz_sim", executable="create",
                 arguments=["-name", "reachy_mini_like", "-topic", "robot_description", "-z", "0.0"]),
            Node(package="controller_manager", executable="spawner",
                 arguments=["joint_state_broadcaster", "position_controller", "--param-file", controllers]),
            Node(package="bolt_ros", executable=spec.executable, parameters=[dict(spec.parameters)]),
            ExecuteProcess(cmd=[sys.executable, "-m", "bolt_ros.nodes.gz_relay"], output="screen"),
        ])]

    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value=""),
        DeclareLaunchArgument("robot", default_value="sim"),
        DeclareLaunchArgument("host", default_value=""),
        DeclareLaunchArgument("rviz", default_value="false"),
        IncludeLaunchDescription(PythonLaunchDescriptionSource(str(gz_launch)),
                                 launch_arguments={"gz_args": "-r empty.sdf"}.items()),
        Node(package="ros_gz_bridge", executable="parameter_bridge",
             arguments=["/clock@rosgraph_msgs/msg/Clock[gz.msgs.Clock"]),
        OpaqueFunction(function=robot_nodes),
        Node(package="rviz2", executable="rviz2", condition=IfCondition(LaunchConfiguration("rviz"))),
    ])
