"""The act-or-talk decision alone over the scripted conversations: is each turn's call (or none) the expected one?

    python bench/bench_intent_calls.py [--scripts bench/conversation_scripts.yaml ...] [--show-wrong]

No ROS and no words: the intent classifier of make run's config (config/assistant.yaml) on the default chat model
decides every turn of each conversation in order, the robot's last move being the one the script expected before
(what "again", "the other way" and "a bit more" act on), and a "show me" turn looking back at the person's last two
utterances (IntentClassifier.point_back). A turn is right when its resolved call matches the script's `expect` as
bench/conversation_scoring.py reads it (a `see` decision and a talk decision are both no call). Greedy and
deterministic: one run says it all, ~0.3 s a turn.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from conversation_scoring import call_matches, expected_calls

from bolt_ros.assistant.intent import POINT_BACK, IntentClassifier
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.default_models import resolve_model
from bolt_ros.train.prompts import assistant_messages

HERE = Path(__file__).parent


def expected_move(expect) -> str | None:
    """The name the robot records for the script's expected call (what the next turn's repeat acts on)."""
    want = expected_calls(expect)[0]
    if want is None:
        return None
    tool, args = want
    if tool == "play_animation":
        return args.get("name")
    if tool == "look" and "direction" in args:
        return f"look_{args['direction']}"
    if tool == "move_head" and "direction" in args:
        return f"more_{args['direction']}"
    return tool


def run(path: Path, classifier: IntentClassifier, tools: list[dict], registry, show_wrong: bool) -> tuple[int, int]:
    right = total = 0
    for conv in yaml.safe_load(path.read_text())["conversations"]:
        last, said = None, []
        for turn in conv["turns"]:
            if "say" not in turn:
                continue
            d = classifier.decide(turn["say"], tools, last)
            if d.label == POINT_BACK:
                d = classifier.point_back(d, list(reversed(said[-2:])), tools)
            call = registry.resolution(d.call.name, d.call.arguments) if d.call else None
            ok = call_matches(turn.get("expect"), [call] if d.call else [])
            right, total = right + ok, total + 1
            if show_wrong and not ok:
                top = sorted(d.probs.items(), key=lambda x: -x[1])[:3]
                print(f"  WRONG {conv['name']}: {turn['say']!r} -> {d.label} {call} (p_yes {d.p_request}, "
                      f"vetoed {d.vetoed}) top {[(k, round(v, 2)) for k, v in top]}")
            said.append(turn["say"])
            last = expected_move(turn.get("expect")) or last
    return right, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scripts", type=Path, nargs="+", default=[HERE / "conversation_scripts.yaml",
                                                               HERE / "conversation_scripts_heldout.yaml",
                                                               HERE / "conversation_scripts_heldout2.yaml"])
    ap.add_argument("--show-wrong", action="store_true")
    args = ap.parse_args(argv)
    from bolt_ros.assistant.config import from_ros_parameters, load_params_file
    from bolt_ros.assistant.tools import ToolRegistry
    from bolt_ros.graph import package_file
    from bolt_ros.robot.config import load_robot_config

    cfg = from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))
    tools = assistant_messages("")[1]  # what the classifier is shown: the robot's animations filled in
    registry = ToolRegistry(cfg.tools)  # how the bench reads a call (enum names only: resolution checks them)
    registry.tools["play_animation"].set_enum([a.name for a in load_robot_config().animations])
    classifier = IntentClassifier(Engine.load(resolve_model("default-chat"), n_ctx=2048), cfg.intent)
    for path in args.scripts:
        right, total = run(path, classifier, tools, registry, args.show_wrong)
        print(f"{path.name}: {right}/{total} calls right ({100 * right / total:.1f} %)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
