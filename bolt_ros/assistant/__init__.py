"""Conversation logic of the robot assistant, free of ROS: backends, memory, sentence splitting, tools, tool loop."""
