"""A deterministic backend: replies come from a script, for exact assertions in tests and model-free demos.

A script is a function messages -> steps, or a YAML list of rules:

    - match: "wave|hello"          # regex (case-insensitive) searched in the latest user message
      reply:                       # steps of the first model call of the turn
        - text: "Hello! "
        - tool_call: {name: play_animation, arguments: {name: wave}}
      after_tool:                  # steps of each model call that follows tool results
        - text: "There, I waved."
    - match: ".*"
      reply: [{text: "I heard you."}]

A step is {text: str} (streamed word by word), {thought: str}, {tool_call: {name, arguments, id?}} or
{tool_call_raw: str} (an unparsable call). Every request is recorded in `requests` for assertions.
"""
from __future__ import annotations

import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import yaml

from bolt_ros.assistant.backend import BackendEvent, Finished, TextDelta, ThoughtDelta, ToolCallRequest

Script = Callable[[list[dict]], list[dict]]


class ScriptedBackend:
    def __init__(self, script: Script | list[dict], *, token_delay_s: float = 0.0, max_log: int = 1000):
        self.script = script if callable(script) else _rules(script)
        self.token_delay_s = token_delay_s
        self.requests: deque[dict[str, Any]] = deque(maxlen=max_log)  # the newest requests: bounded on long runs
        self._ids = 0

    @classmethod
    def from_config(cls, cfg) -> ScriptedBackend:
        rules = yaml.safe_load(cfg.script) if cfg.script.strip() else [{"match": ".*", "reply": [
            {"text": "I am running on the scripted backend, so I can only echo: "}, {"echo": True}]}]
        if not isinstance(rules, list):
            raise ValueError("backend.script must be a YAML list of rules")
        return cls(rules, token_delay_s=cfg.token_delay_s)

    def stream_chat(self, messages: list[dict], tools: list[dict], *, enable_thinking: bool,
                    cancel: threading.Event, words_only: bool = False, attempt: int = 0,
                    temperature: float | None = None) -> Iterator[BackendEvent]:
        self.requests.append({"messages": [dict(m) for m in messages], "tools": tools,
                              "enable_thinking": enable_thinking, "words_only": words_only, "t": time.perf_counter()})
        n = 0
        for step in self.script(messages):
            for ev in self._events(step, messages):
                if cancel.is_set():
                    return
                if self.token_delay_s and isinstance(ev, TextDelta | ThoughtDelta):
                    cancel.wait(self.token_delay_s)
                n += 1
                yield ev
        yield Finished({"completion_tokens": n, "prompt_tokens": sum(len(m.get("content") or "") for m in messages)})

    def _events(self, step: dict, messages: list[dict]) -> Iterator[BackendEvent]:
        if "text" in step or "thought" in step or step.get("echo"):
            text = _last_user(messages) if step.get("echo") else step.get("text", step.get("thought", ""))
            kind = ThoughtDelta if "thought" in step else TextDelta
            for word in re.findall(r"\S+\s*|\s+", text):  # word-sized deltas, whitespace kept
                yield kind(word)
        elif "tool_call" in step:
            tc = step["tool_call"]
            self._ids += 1
            yield ToolCallRequest(tc.get("id", f"call_{self._ids}"), tc["name"], tc.get("arguments", {}),
                                  raw=repr(tc))
        elif "tool_call_raw" in step:
            self._ids += 1
            yield ToolCallRequest(f"call_{self._ids}", "", None, raw=step["tool_call_raw"],
                                  error=f"not a JSON tool call: {step['tool_call_raw']!r}")
        else:
            raise ValueError(f"unknown script step {step!r}")


def _last_user(messages: list[dict]) -> str:
    text = next((m.get("content") or "" for m in reversed(messages) if m["role"] == "user"), "")
    return text.rsplit("]\n", 1)[-1]  # without the scene block


def _rules(rules: list[dict]) -> Script:
    compiled = [(re.compile(r.get("match", ".*"), re.I | re.S), r.get("reply", []), r.get("after_tool", []))
                for r in rules]

    def script(messages: list[dict]) -> list[dict]:
        user = _last_user(messages)
        after_tool = bool(messages) and messages[-1]["role"] == "tool"
        for pattern, reply, after in compiled:
            if pattern.search(user):
                return after if after_tool else reply
        return []
    return script
