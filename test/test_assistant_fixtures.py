"""Helpers shared by the assistant's ROS tests (no tests here): the assistant node on the simulated robot, with
a probe node that records speech, events and joint states with arrival times."""
from __future__ import annotations

import time

from bolt_ros.msg import AssistantEvent, Caption
from conftest import wait_for
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from bolt_ros.assistant.config import AssistantConfig, from_ros_parameters, load_params_file
from bolt_ros.assistant.scripted import ScriptedBackend
from bolt_ros.graph import package_file

# tools that do not belong in the product config: an unreachable server and a raw pose without argument limits
EXTRA_TOOLS = """
- name: missing_server
  description: a tool whose action server is not running
  kind: action
  target: no_such_action
  type: bolt_ros/action/PlayAnimation
  server_timeout_s: 0.2
  goal: {name: wave}
- name: raw_yaw
  description: head yaw in radians, unchecked here (the motion server must refuse out-of-limit targets)
  kind: action
  target: goto_pose
  type: bolt_ros/action/GotoPose
  parameters: {type: object, properties: {yaw: {type: number}}, required: [yaw]}
  goal: {target.head_yaw: {arg: yaw}, duration: 0.3}
- name: slow_accept
  description: a server that takes longer to accept a goal than this tool waits
  kind: action
  target: slow_accept
  type: bolt_ros/action/GotoPose
  timeout_s: 0.2
  goal: {duration: 0.1}
- name: lossy_goto
  description: a long head turn whose acceptance the test's middleware double loses
  kind: action
  target: goto_pose
  type: bolt_ros/action/GotoPose
  timeout_s: 0.3
  parameters: {type: object, properties: {yaw: {type: number}}, required: [yaw]}
  goal: {target.head_yaw: {arg: yaw}, duration: 2.0}
- name: hasty_animation
  description: an animation with a timeout shorter than the animation
  kind: action
  target: play_animation
  type: bolt_ros/action/PlayAnimation
  timeout_s: 0.3
  parameters: {type: object, properties: {name: {type: string}}, required: [name]}
  goal: {name: {arg: name}}
"""


def product_config(*, say: bool = False, **updates) -> AssistantConfig:
    """config/assistant.yaml plus the test tools. Without `say`, the tools' own lines are off: these tests drive the
    round that sends a tool's result back to the model for words (what a failed or a wordless tool still gets), which
    a motion's line replaces in the product (test/test_bringup.py and test_conversation_design.py cover that)."""
    params = load_params_file(package_file("config/assistant.yaml"), "assistant_node")
    params["tools"] += EXTRA_TOOLS
    cfg = from_ros_parameters({**params, **updates})
    if not say:
        cfg.tools = [t.model_copy(update={"say": []}) for t in cfg.tools]
    return cfg


class Probe:
    """A node recording tts/say, assistant/events and joint_states as (perf_counter, msg); publishes inputs."""

    def __init__(self, ros):
        self.node = ros.node("probe")
        self.tts, self.events, self.joints = [], [], []
        self.node.create_subscription(String, "tts/say", lambda m: self.tts.append((time.perf_counter(), m.data)), 50)
        self.node.create_subscription(AssistantEvent, "assistant/events",
                                      lambda m: self.events.append((time.perf_counter(), m)), 500)
        self.node.create_subscription(JointState, "joint_states",
                                      lambda m: self.joints.append((time.perf_counter(), m)), 500)
        self.say_pub = self.node.create_publisher(String, "speech/transcript", 10)
        self.caption_pub = self.node.create_publisher(Caption, "perception/caption", 100)

    def connected(self, assistant) -> None:
        wait_for(lambda: self.say_pub.get_subscription_count() and self.caption_pub.get_subscription_count()
                 and assistant.count_subscribers("tts/say") and self.joints, what="graph connections")

    def say(self, text: str) -> float:
        t = time.perf_counter()
        self.say_pub.publish(String(data=text))
        return t

    def see(self, text: str) -> None:
        self.caption_pub.publish(Caption(source="test", text=text, confidence=0.9))

    def spoken(self) -> list[str]:
        return [t for _, t in self.tts]

    def of_type(self, kind: int) -> list[AssistantEvent]:
        return [m for _, m in self.events if m.type == kind]

    def head_yaw(self) -> float:
        js = self.joints[-1][1]
        return js.position[list(js.name).index("head_yaw")]


def start(ros, script, *, token_delay_s: float = 0.0, **config_updates):
    """The simulated robot (the other engineer's nodes), the assistant with a scripted backend, and a probe."""
    from bolt_ros.nodes.assistant_node import AssistantNode
    from bolt_ros.nodes.sim_robot_nodes import make_sim_robot_nodes

    ros.add(*make_sim_robot_nodes(context=ros.context))
    backend = ScriptedBackend(script, token_delay_s=token_delay_s)
    assistant = ros.add(AssistantNode(product_config(**config_updates), backend=backend, context=ros.context))
    probe = Probe(ros)
    probe.connected(assistant)
    wait_for(lambda: assistant.registry.tools["play_animation"].enum_values, what="animation names from the robot")
    return assistant, backend, probe


def tool_messages(backend) -> list[dict]:
    """Every tool result the model was shown, in order."""
    seen, out = set(), []
    for req in backend.requests:
        for m in req["messages"]:
            if m["role"] == "tool" and m["tool_call_id"] not in seen:
                seen.add(m["tool_call_id"])
                out.append(m)
    return out
