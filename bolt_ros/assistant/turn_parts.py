"""What a turn of the tool loop (bolt_ros/assistant/tool_loop.py) reports (LoopEvent, TurnResult), and its helpers
that need no loop state: a line not said lately, the history's message for a reply and its calls, token statistics
over a turn's model calls, a call already done in the turn, a cheap bound on a prompt's tokens, a call's arguments
as JSON."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Literal

from bolt_ros.assistant.backend import ToolCallRequest
from bolt_ros.assistant.conversation import Conversation
from bolt_ros.assistant.reply_text import norm
from bolt_ros.assistant.tools import ToolOutcome

EventKind = Literal["text", "thought", "sentence", "tool_call", "tool_result", "state", "error"]


@dataclass
class LoopEvent:
    kind: EventKind
    text: str = ""
    call: ToolCallRequest | None = None
    result: ToolOutcome | None = None
    t: float = field(default_factory=time.perf_counter)  # when it happened (latency accounting)


@dataclass
class TurnResult:
    text: str = ""
    messages: list[dict] = field(default_factory=list)   # the turn as it goes into the history
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    tool_results: list[ToolOutcome] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    cancelled: bool = False
    error: str = ""
    spoken: list[str] = field(default_factory=list)  # the sentences emitted for speech, in order
    stopped: str = ""  # "max_sentences" or "repetition" when the loop cut the model off
    t_request: float = 0.0  # perf_counter when the first engine request went out


def fresh_line(conv: Conversation, options: list[str]) -> str:
    """The first of `options` not said in the recent turns, else the one said longest ago."""
    recent = [norm(r) for r in conv.recent_replies()]
    return next((x for x in options if norm(x) not in recent),
                min(options, key=lambda x: max((i for i, r in enumerate(recent) if r == norm(x)), default=-1)))


def assistant_message(content: str, calls: list[ToolCallRequest]) -> dict:
    """The history's message for a reply and the calls it made (an unparsable call keeps empty arguments)."""
    msg: dict = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments if c.error is None else {}}}
                             for c in calls]
    return msg


def merge_stats(acc: dict, new: dict) -> None:
    """Sum token counts over the model calls of a turn; rates and acceptance are token-weighted means."""
    n_old, n_new = acc.get("completion_tokens", 0), new.get("completion_tokens", 0)
    for key in ("tokens_per_second", "acceptance_length"):
        if key in new:
            total = n_old + n_new
            acc[key] = (acc.get(key, 0.0) * n_old + new[key] * n_new) / total if total else new[key]
    new = {"prefill_tokens": new.get("prompt_tokens", 0), **new}  # a backend without prefix reuse runs it all
    for key in ("prompt_tokens", "prefill_tokens", "completion_tokens"):
        acc[key] = acc.get(key, 0) + int(new.get(key, 0))


def _call_key(name: str, arguments) -> str:
    return json.dumps([name, arguments], sort_keys=True)


def already_done(call: ToolCallRequest, res) -> bool:
    """The same call (name and arguments) already succeeded in this turn."""
    key = _call_key(call.name, call.arguments)
    return any(r.ok and _call_key(c.name, c.arguments) == key for c, r in zip(res.tool_calls, res.tool_results))


def utf8_bound(messages: list[dict], tools: list[dict]) -> int:
    """An upper bound on the prompt's tokens without tokenizing: a byte-level BPE or SPM token covers at least one
    UTF-8 byte of text, plus a generous 16 tokens of template markup per message."""
    return len(json.dumps([messages, tools], ensure_ascii=False).encode()) + 16 * len(messages)


def arguments_json(call: ToolCallRequest) -> str:
    return json.dumps(call.arguments) if call.arguments is not None else call.raw
