# Source me (bash):  . scripts/env.sh   -> the .venv, the colcon install tree, and this checkout first on PYTHONPATH.
_bolt_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$_bolt_root/.venv/bin/activate"
. "$_bolt_root/install/setup.bash"
export PYTHONPATH="$_bolt_root${PYTHONPATH:+:$PYTHONPATH}"
export ROS_AUTOMATIC_DISCOVERY_RANGE=${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
unset _bolt_root
