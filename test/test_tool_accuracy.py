"""The mission on the real default chat model (Qwen2.5-Coder-0.5B-Instruct, embedded engine, greedy): robot requests
sent as `converse` goals to the assistant node on the simulated robot; the tool calls it makes (names and arguments,
after the router's resolution) must be right for at least 10 of the 12+ utterances.

Each utterance is its own conversation (conversation_id), so one miss cannot steer the next. `expected` is the
resolved call (tool name, arguments that must match) or None for a question that needs no tool. Run alone for the
per-utterance table: `python -m pytest -s test/test_tool_accuracy.py`.
"""
from __future__ import annotations

import json
import time

import pytest
from action_msgs.msg import GoalStatus
from bolt_ros.action import Converse
from conftest import wait_for
from rclpy.action import ActionClient
from test_assistant_fixtures import Probe

from bolt_ros.assistant.config import from_ros_parameters, load_params_file
from bolt_ros.graph import package_file

# (utterance, expected first resolved call: (tool, {argument: value}) or None = no tool call)
CASES = [
    ("Please dance for me!", ("play_animation", {"name": "dance"})),
    ("Can you nod your head?", ("play_animation", {"name": "nod"})),
    ("Shake your head to say no.", ("play_animation", {"name": "shake_head"})),
    ("Show me that you are happy!", ("play_animation", {"name": "happy"})),
    ("Time to go to sleep, Bolt.", ("play_animation", {"name": "sleep"})),
    ("Act surprised!", ("play_animation", {"name": "surprised"})),
    ("Look to your left.", ("look", {"direction": "left"})),
    ("Look to the right, please.", ("look", {"direction": "right"})),
    ("Look up at the ceiling.", ("look", {"direction": "up"})),
    ("Look down at the floor.", ("look", {"direction": "down"})),
    ("What is the capital of France?", None),
    ("Which animations do you know? Check your list.", ("list_animations", {})),
]
BAR = 10


def _right(expected, calls: list[tuple[str, dict] | None]) -> bool:
    if expected is None:
        return not calls
    if not calls or calls[0] is None:
        return False
    name, args = calls[0]
    return name == expected[0] and all(args.get(k) == v for k, v in expected[1].items())


@pytest.mark.slow
def test_default_model_calls_the_right_tools_through_the_graph(ros):
    from bolt_ros.nodes.assistant_node import AssistantNode
    from bolt_ros.nodes.sim_robot_nodes import make_sim_robot_nodes

    params = load_params_file(package_file("config/assistant.yaml"), "assistant_node")
    cfg = from_ros_parameters({**params, "backend.temperature": 0.0, "backend.seed": 0, "backend.max_tokens": 96})
    ros.add(*make_sim_robot_nodes(context=ros.context))
    assistant = ros.add(AssistantNode(cfg, context=ros.context))
    probe = Probe(ros)
    probe.connected(assistant)
    client = ActionClient(probe.node, Converse, "converse")
    assert client.wait_for_server(timeout_sec=5.0)
    wait_for(lambda: assistant.registry.tools["play_animation"].enum_values, what="animation names from the robot")

    rows, right = [], 0
    for i, (utterance, expected) in enumerate(CASES):
        t0 = time.perf_counter()
        handle = ros.result(client.send_goal_async(Converse.Goal(utterance=utterance, conversation_id=f"u{i}")))
        res = ros.result(handle.get_result_async(), timeout=120, what=f"the reply to {utterance!r}")
        assert res.status == GoalStatus.STATUS_SUCCEEDED, res.result.error
        calls = [assistant.registry.resolution(c.name, json.loads(c.arguments or "{}")) for c in res.result.tool_calls]
        ok = _right(expected, calls)
        right += ok
        rows.append((utterance, [(c.name, c.arguments) for c in res.result.tool_calls], res.result.text, ok,
                     time.perf_counter() - t0))
    print("\n| utterance | tool calls (as the model wrote them) | reply | right | turn s |\n|---|---|---|---|---|")
    for u, c, text, ok, dt in rows:
        print(f"| {u} | {c} | {text[:60]!r} | {'yes' if ok else 'NO'} | {dt:.1f} |")
    print(f"{right}/{len(CASES)} right")
    assert right >= BAR, f"only {right}/{len(CASES)} right (bar {BAR})"
