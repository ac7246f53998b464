"""ros2 launch bolt_ros assistant.launch.py [model_path:=...] [draft_path:=...] [device:=cuda] [backend:=...]
[use_sim_robot:=...] [words_model_path:=...]

The graph comes from bolt_ros.graph, the same description `python -m bolt_ros.bringup` runs in one process;
here each entry becomes its own process. launch / launch_ros are imported inside generate_launch_description
only, so `processes()` works (and is tested) where they are not installed.
"""
from bolt_ros.graph import describe_graph, launch_arguments, parse_arguments


def processes(arguments: dict[str, str]) -> list[dict]:
    """The launch_ros Node(...) keyword arguments of every process, for the given launch arguments."""
    args = parse_arguments(arguments)
    return [{"package": "bolt_ros", "executable": p.executable, "namespace": args.namespace,
             "parameters": [dict(p.parameters)], "output": "screen", "emulate_tty": True}
            for p in describe_graph(args)]


def generate_launch_description():
    # isort: off  (ruff files `launch` as first- or third-party depending on the cwd: launch/ is also our folder)
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node
    # isort: on

    def nodes(context):
        values = {name: LaunchConfiguration(name).perform(context) for name in launch_arguments()}
        return [Node(**kw) for kw in processes(values)]

    declared = [DeclareLaunchArgument(name, default_value=default) for name, default in launch_arguments().items()]
    return LaunchDescription([*declared, OpaqueFunction(function=nodes)])
