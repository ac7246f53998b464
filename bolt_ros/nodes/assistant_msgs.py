"""The assistant node's messages: the tool loop's events, calls, results and stats as bolt_ros messages."""
from __future__ import annotations

from bolt_ros.assistant.turn_parts import arguments_json
from bolt_ros.msg import AssistantEvent, GenerationStats, ToolCall, ToolResult

KIND = {"text": AssistantEvent.TEXT_DELTA, "sentence": AssistantEvent.SENTENCE, "tool_call": AssistantEvent.TOOL_CALL,
        "tool_result": AssistantEvent.TOOL_RESULT, "state": AssistantEvent.STATE,
        "thought": AssistantEvent.THOUGHT_DELTA, "error": AssistantEvent.ERROR}


def tool_call_msg(call) -> ToolCall:
    return ToolCall(id=call.id, name=call.name, arguments=arguments_json(call))


def tool_result_msg(r) -> ToolResult:
    return ToolResult(id=r.id, name=r.name, ok=r.ok, content=r.content if r.ok else "", error=r.error)


def stats_msg(s: dict) -> GenerationStats:
    return GenerationStats(ttft_ms=float(s.get("ttft_ms", 0.0)), prompt_tokens=int(s.get("prompt_tokens", 0)),
                           prefill_tokens=int(s.get("prefill_tokens", 0)),
                           completion_tokens=int(s.get("completion_tokens", 0)),
                           tokens_per_second=float(s.get("tokens_per_second", 0.0)),
                           acceptance_length=float(s.get("acceptance_length", 1.0)),
                           tool_rounds=int(s.get("tool_rounds", 0)), total_ms=float(s.get("total_ms", 0.0)))
