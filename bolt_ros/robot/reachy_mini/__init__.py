"""Pollen's Reachy Mini (a real one, or its MuJoCo simulator) behind our robot contract, ROS-free: the daemon as a
child process (daemon), the SDK connection (link), our pose <-> the SDK's (convert), the control step and safety
envelope (bridge), the dances library (dances) and offscreen pictures (render). The node is
bolt_ros/nodes/reachy_mini_nodes.py. Nothing here imports the SDK at module level: it pulls GLib."""
