"""What a drafter is trained on: the target's own replies to the requests a robot assistant gets, rendered exactly as
the assistant renders them (its system prompt, its tool surface with the robot's animations), so the drafter learns
the text the deployed graph decodes - replies and tool calls alike.

Training utterances are generated from templates with a seed; `HELD_OUT` (used by bench/bench_dflash.py) shares no
utterance with them.
"""
from __future__ import annotations

import random

_VERBS = ["wave", "nod", "dance", "look left", "look right", "look up", "look down", "look at me", "shake your head",
          "say hello", "turn your head left", "celebrate", "look around", "look center"]
_ASKS = ["what do you see?", "tell me a joke", "how are you today?", "what is your name?", "who is in front of you?",
         "what can you do?", "describe the room", "do you like music?", "what time is it?", "tell me something fun",
         "are you a robot?", "what's the weather like?", "can you help me?", "introduce yourself",
         "say something nice", "what did you just do?", "count to five", "what colour is the sky?"]
_PREFIX = ["", "please ", "hey robot, ", "could you ", "can you ", "now ", "ok, ", "robot, "]
_SUFFIX = ["", " please", " for me", " now", " again", "!", " and tell me why"]

HELD_OUT = ["Please wave at my friend and say hi.", "Can you look to the left and tell me what is there?",
            "Nod if you understand me.", "What are you looking at right now?", "Do a little dance for us!",
            "Tell me a short story about a robot.", "Look up at the ceiling.", "How do you feel about people?"]


def training_utterances(n: int, seed: int = 0) -> list[str]:
    """n distinct utterances (commands and questions), none of them in HELD_OUT."""
    rng = random.Random(seed)
    held = {h.lower() for h in HELD_OUT}
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        core = rng.choice(_VERBS) if rng.random() < 0.55 else rng.choice(_ASKS)
        u = (rng.choice(_PREFIX) + core + (rng.choice(_SUFFIX) if not core.endswith("?") else "")).strip()
        u = u[0].upper() + u[1:]
        if u.lower() not in seen and u.lower() not in held:
            seen.add(u.lower())
            out.append(u)
        if len(seen) > 10 * n:  # the template space is exhausted
            break
    return out


def assistant_prompt_ids(engine, utterance: str) -> list[int]:
    """The token ids the assistant's embedded backend feeds `engine` for `utterance` (its messages, its tools)."""
    messages, tools = assistant_messages(utterance)
    return engine.tok.encode_segments(engine.chat_format.render(messages, tools=tools), add_bos=engine.tok.add_bos)


def assistant_messages(utterance: str) -> tuple[list[dict], list[dict]]:
    """(messages, tools) the assistant sends for `utterance` on the default config and the robot's animations."""
    from bolt_ros.assistant.config import from_ros_parameters, load_params_file
    from bolt_ros.assistant.tools import ToolRegistry
    from bolt_ros.graph import package_file
    from bolt_ros.robot.config import load_robot_config

    cfg = from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))
    registry = ToolRegistry(cfg.tools)
    animations = load_robot_config().animations
    for tool in registry.tools.values():
        if tool.spec.enum_from is not None:
            tool.set_enum([a.name for a in animations], [a.description for a in animations])
    messages = [{"role": "system", "content": cfg.system_prompt}, {"role": "user", "content": utterance}]
    return messages, registry.openai_tools()
