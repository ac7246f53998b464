"""bolt_ros: a local conversational brain for robots.

`bolt_ros.engine` (ROS-free inference), `bolt_ros.nodes` (ROS 2 adapters), `bolt_ros.kernels` (Triton), and the
rosidl-generated `bolt_ros.msg`, `bolt_ros.srv`, `bolt_ros.action`.
"""
# The generated interfaces and our sources may live in different directories (colcon install tree vs. a source
# checkout); let `bolt_ros.msg` resolve from whichever sys.path entry holds it.
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
__version__ = "0.1.0"
