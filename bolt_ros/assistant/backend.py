"""The one interface every chat engine sits behind (backend_factory.make_backend picks one from config).

A backend turns (messages, tools) into a stream of events. It never raises for a bad model output: a tool call
it cannot parse arrives as a ToolCallRequest with `error` set, so the tool loop can tell the model what went wrong.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class TextDelta:
    text: str


@dataclass
class ThoughtDelta:
    text: str


@dataclass
class ToolCallRequest:
    id: str
    name: str
    arguments: dict | None
    raw: str = ""
    error: str | None = None  # set when the call could not be parsed (bad JSON, not an object, no name)


@dataclass
class Finished:
    # ttft_ms, prompt_tokens, completion_tokens, tokens_per_second, acceptance_length (whatever the backend knows)
    stats: dict = field(default_factory=dict)


BackendEvent = TextDelta | ThoughtDelta | ToolCallRequest | Finished


class BackendError(RuntimeError):
    """The engine or server failed (unreachable, HTTP error, model missing); the message says which and why."""


class ChatBackend(Protocol):
    def stream_chat(self, messages: list[dict], tools: list[dict], *, enable_thinking: bool,
                    cancel: threading.Event, words_only: bool = False, attempt: int = 0,
                    temperature: float | None = None) -> Iterator[BackendEvent]:
        """One reply, streamed. words_only: `tools` were used in this turn but this reply may call none of them and
        must be words (OpenAI's tool_choice "none"; the embedded engine holds it to that with a grammar).
        attempt: the how-manieth new sample of the same prompt (a held-back reply's redraw): a backend with a fixed
        sampling seed draws it with another seed, else it would write the same reply again. temperature: this
        reply's sampling temperature instead of the backend's own (None: its own)."""
        ...
