"""One graph description, two runners: the launch file (launch_ros) and `python -m bolt_ros.bringup` (one process)
describe the same nodes with the same parameters; bringup runs the whole graph with the console and stops
cleanly on one SIGINT."""
from __future__ import annotations

import importlib
import importlib.util
import math
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml
from conftest import BringupConsole

from bolt_ros.bringup import parse
from bolt_ros.console import MotionLines, move_words
from bolt_ros.graph import describe_graph, launch_arguments, package_file, parse_arguments

ROOT = Path(__file__).resolve().parent.parent
ARGS = {"backend": "scripted", "model_path": "/models/bolt-e4b.gguf", "use_caption_bridge": "false"}


def _launch_module():
    spec = importlib.util.spec_from_file_location("assistant_launch", ROOT / "launch" / "assistant.launch.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # must work without launch / launch_ros installed
    return mod


def _fake_launch(monkeypatch, recorded: list):
    """Minimal stand-ins for launch / launch_ros that record what the launch file builds."""
    class Conf:
        def __init__(self, name):
            self.name = name

        def perform(self, context):
            return context.launch_configurations[self.name]

    class Declare:
        def __init__(self, name, default_value):
            self.name, self.default = name, default_value

    class Opaque:
        def __init__(self, function):
            self.function = function

    class Node:
        def __init__(self, **kw):
            recorded.append(kw)

    mods = {"launch": types.ModuleType("launch"), "launch.actions": types.ModuleType("launch.actions"),
            "launch.substitutions": types.ModuleType("launch.substitutions"),
            "launch_ros": types.ModuleType("launch_ros"), "launch_ros.actions": types.ModuleType("launch_ros.actions")}
    mods["launch"].LaunchDescription = list
    mods["launch.actions"].DeclareLaunchArgument, mods["launch.actions"].OpaqueFunction = Declare, Opaque
    mods["launch.substitutions"].LaunchConfiguration = Conf
    mods["launch_ros.actions"].Node = Node
    for name, mod in mods.items():
        monkeypatch.setitem(sys.modules, name, mod)


def test_launch_file_and_bringup_describe_the_same_graph(monkeypatch):
    mod = _launch_module()
    recorded: list[dict] = []
    _fake_launch(monkeypatch, recorded)
    description = mod.generate_launch_description()
    declared = {a.name: a.default for a in description[:-1]}
    assert declared == launch_arguments()  # the launch file declares exactly the bringup's arguments
    values = {**declared, **ARGS}
    description[-1].function(types.SimpleNamespace(launch_configurations=values))
    # what bringup would start for the same arguments (`name:=value` on its command line)
    pairs, console, verbose = parse([f"{k}:={v}" for k, v in ARGS.items()])
    procs = describe_graph(parse_arguments(pairs))
    assert not console and not verbose
    assert [(r["executable"], r["parameters"]) for r in recorded] == [(p.executable, [p.parameters]) for p in procs]
    assert [p.executable for p in procs] == ["assistant_node", "sim_robot"]
    params = procs[0].parameters
    assert params["backend.kind"] == "scripted" and params["backend.model_path"] == "/models/bolt-e4b.gguf"
    assert procs[1].parameters == {"robot_config": str(package_file("config/robot.yaml"))}
    for p in procs:  # every executable is a module with main() (what scripts/<executable> runs)
        module = p.factory.partition(":")[0]
        assert p.executable in module and callable(importlib.import_module(module).main)


def test_graph_options_and_bad_arguments():
    procs = describe_graph(parse_arguments({"use_sim_robot": "false", "use_caption_bridge": "false"}))
    assert [p.executable for p in procs] == ["assistant_node"]
    assert procs[0].parameters["backend.kind"] == "embedded"  # config/assistant.yaml's choice
    assert [p.executable for p in describe_graph(parse_arguments({}))][-1] == "caption_bridge"
    with pytest.raises(ValueError, match="use_sim_robot"):
        parse_arguments({"use_sim_robot": "maybe"})
    with pytest.raises(ValueError, match=r"backend\.kind"):
        describe_graph(parse_arguments({"backend": "gpt"}))
    with pytest.raises(SystemExit):
        parse(["modelpath:=x"])


def _script_config(tmp_path) -> Path:
    data = yaml.safe_load(package_file("config/assistant.yaml").read_text())
    data["assistant_node"]["ros__parameters"]["backend"]["script"] = yaml.safe_dump([
        {"match": "wave", "reply": [{"text": "Hello there! "},
                                    {"tool_call": {"name": "play_animation", "arguments": {"name": "happy"}}}],
         "after_tool": [{"text": "That was a happy wiggle."}]}])
    path = tmp_path / "assistant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_bringup_console_runs_the_graph_and_stops_on_one_sigint(tmp_path):
    with BringupConsole("--config", str(_script_config(tmp_path)), "backend:=scripted",
                        "use_caption_bridge:=false") as console:
        console.wait_line(lambda s: "nodes running" in s)
        console.wait_line(lambda s: "name is one of" in s)  # the assistant learned the animations from the robot
        console.type("/see a person waving at you\nplease wave back\n")
        # the motion answers with its own line (config: the play_animation tool's first `say` line), not with a
        # words round over its result
        tools = yaml.safe_load(yaml.safe_load(package_file("config/assistant.yaml").read_text())[
            "assistant_node"]["ros__parameters"]["tools"])
        line = next(t for t in tools if t["name"] == "play_animation")["say"][0]
        console.wait_line(lambda s: s.startswith(f"Bolt: {line}"))
        # events and speech are different topics: their lines may arrive in either order
        console.wait_line(lambda s: "[tool] play_animation -> ok" in s)
        out = console.output()
        assert "That was a happy wiggle." not in out
        assert "[camera] a person waving at you" in out and "Bolt: Hello there!" in out
        assert '[tool] play_animation {"name": "happy"}' in out and "[tool] play_animation -> ok" in out
        # the robot moved while the console watched: one line where the move started, one where it ended
        console.wait_line(lambda s: s.startswith("[motion] stopped: head r/p/y"))
        assert "[motion] moving" in console.output() and "[moves: happy]" in out
        console.stop_with_sigint(exit_within=3.0)


def test_bringup_reports_a_bad_config_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("assistant_node:\n  ros__parameters:\n    max_tool_rounds: many\n")
    res = subprocess.run([sys.executable, "-m", "bolt_ros.bringup", "--config", str(bad)], capture_output=True,
                         text=True, timeout=60, env=os.environ.copy(), cwd=ROOT)
    assert res.returncode == 2 and "max_tool_rounds" in res.stderr and "Traceback" not in res.stderr


def test_node_processes_tune_the_interpreter_for_latency():
    """spin_nodes' first step: a short GIL switch interval, and the objects built at startup (modules, nodes, a
    loaded model) moved out of the garbage collector's generations, so full passes no longer stall the nodes."""
    code = ("import gc, sys; from bolt_ros.nodes.common import tune_interpreter, GIL_SWITCH_INTERVAL_S; "
            "before = gc.get_freeze_count(); tune_interpreter(); print(before, gc.get_freeze_count() > 10_000, "
            "abs(sys.getswitchinterval() - GIL_SWITCH_INTERVAL_S) < 1e-6)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["0", "True", "True"]


def test_the_console_a_person_reads_on_the_home_made_robot(tmp_path):
    """No --verbose: the conversation, one `[moves: ...]` line per call, a motion line where a move starts and one
    where it ends; no ROS log line and no JSON (they are in the log file, whose path it printed). The plain words
    for a move that cannot be done are in test_reachy_mini_nodes (the tools' ranges keep the home-made robot's
    moves inside its limits)."""
    data = yaml.safe_load(package_file("config/assistant.yaml").read_text())
    data["assistant_node"]["ros__parameters"]["backend"]["script"] = yaml.safe_dump([
        {"match": "left", "reply": [{"tool_call": {"name": "look", "arguments": {"direction": "left"}}}]},
        {"match": ".*", "reply": [{"text": "Hi there."}]}])
    config = tmp_path / "assistant.yaml"
    config.write_text(yaml.safe_dump(data))
    with BringupConsole("--config", str(config), "backend:=scripted", "use_caption_bridge:=false",
                        verbose=False) as console:
        log_line = console.wait_line(lambda s: s.startswith("bringup: logs in "))
        console.wait_line(lambda s: "nodes running" in s)
        console.type("hello\n")
        console.wait_line(lambda s: s == "Bolt: Hi there.\n")
        console.type("look left\n")
        console.wait_line(lambda s: s.startswith("[motion] stopped: head r/p/y"), timeout=20.0)
        time.sleep(1.0)
        out = console.output()
        console.stop_with_sigint(exit_within=3.0)
    assert "[moves: look left]" in out and "Bolt: Looking left." in out
    assert out.count("[motion] moving") == 1 and out.count("[motion] stopped") == 1, out
    assert "[INFO]" not in out and "{" not in out, out
    text = open(log_line.removeprefix("bringup: logs in ").split(" (")[0]).read()
    assert "[INFO]" in text and "tool look" in text


def test_motion_lines_come_where_a_move_starts_and_ends_not_for_creep_or_sway():
    names = ["head_roll", "head_pitch", "head_yaw", "antenna_right", "antenna_left", "body_yaw"]
    lines = MotionLines()

    def run(t0: float, t1: float, f) -> list[str]:
        out = []
        for k in range(int((t1 - t0) * 100)):
            t = t0 + k / 100
            out += [x for x in [lines.update(names, f(t), t)] if x]
        return out

    # at rest, creeping 1 deg/s for 10 s (the simulated head past its reach did), then swaying with the voice
    # (4 deg pitch, 12 deg antennas at 3 Hz): no line
    assert run(0, 10, lambda t: [0, 0, math.radians(t), 0, 0, 0]) == []
    sway = lambda t: [0, math.radians(4) * math.sin(18.8 * t), math.radians(10), math.radians(12) * math.sin(18.8 * t),  # noqa: E731
                      0, 0]
    assert run(10, 15, sway) == []
    # a look: 34 deg in 1 s, then still: one line where it starts, one where it ends
    look = lambda t: [0, 0, math.radians(10 + 24 * min(1.0, t - 15)), 0, 0, 0]  # noqa: E731
    out = run(15, 18, look)
    assert out[0] == "[motion] moving" and out[1].startswith("[motion] stopped: head r/p/y") and len(out) == 2
    assert "+34" in out[1]
    # the robot gone for 2 s (no joint states) and back elsewhere (a restarted simulator): its new rest, no line
    assert run(20, 21, lambda t: [0, 0, 0, -0.2, 0.2, 0]) == []
    # negative control: a threshold at the old console's 0.005 rad would have called the creep a move
    assert math.radians(1) / 100 < 0.005 < math.radians(1)


def test_move_words_say_a_call_as_a_person_would():
    assert move_words("look", '{"direction": "left"}') == "moves: look left"
    assert move_words("look_left", "{}") == "moves: look left"
    assert move_words("play_animation", '{"name": "shake_head", "speed": 1.0}') == "moves: shake head (speed 1)"
    assert move_words("move_head", '{"yaw": 60, "pitch": 30}') == "moves: move head (yaw 60, pitch 30)"
    assert move_words("list_animations", "") == "checks: list animations"
