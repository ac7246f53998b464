"""Multi-turn chat on one engine session: render -> tokens (prefix reused) -> stream -> parsed events."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from .chat_format import OutputEvent, TextEvent, ThoughtEvent, ToolCallEvent
from .generate import Engine, GenerationResult
from .sampling import SamplingParams


@dataclass
class ChatStats:
    text: str
    finish_reason: str
    ttft_ms: float
    prompt_tokens: int
    prefill_tokens: int  # prompt tokens actually run (the rest was reused from the previous turn)
    completion_tokens: int
    tokens_per_second: float
    acceptance_length: float  # mean tokens committed per target pass (1.0 without a drafter)


class ChatSession:
    """A conversation's KV cache. `stream()` takes the whole message list each turn; only the new suffix is run."""

    def __init__(self, engine: Engine, system: str | None = None, *, use_draft: bool = True):
        self.engine, self.system, self.use_draft = engine, system or None, use_draft
        self.session = engine.new_session()
        self.history: list[dict] = []  # used by send()
        self.last_stats: dict = {}

    def _messages(self, messages: list[dict]) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + list(messages)

    def stream(self, messages: list[dict], *, tools: list[dict] | None = None, enable_thinking: bool = False,
               sampling: SamplingParams | None = None,
               cancel: threading.Event | None = None) -> Iterator[OutputEvent | ChatStats]:
        fmt, tok = self.engine.chat_format, self.engine.tok
        segments = fmt.render(self._messages(messages), tools=tools, enable_thinking=enable_thinking)
        ids = tok.encode_segments(segments, add_bos=tok.add_bos)
        params = (sampling or SamplingParams()).model_copy(deep=True)
        params.stop_token_ids = sorted(set(params.stop_token_ids) | set(fmt.stop_token_ids))
        params.stop = list(dict.fromkeys([*params.stop, *fmt.stop_strings]))
        parser = fmt.parser(tools) if tools else fmt.parser()
        result: GenerationResult | None = None
        for ev in self.engine.stream(ids, params, session=self.session, cancel=cancel, use_draft=self.use_draft):
            if isinstance(ev, GenerationResult):
                result = ev
            elif ev.text:
                yield from parser.feed(ev.text)
        yield from parser.finish()
        t = result.timings
        spec = result.spec or {}
        stats = ChatStats(
            text=result.text, finish_reason=result.finish_reason, ttft_ms=t.ttft_s * 1e3,
            prompt_tokens=t.prompt_tokens, prefill_tokens=t.prefill_tokens,
            completion_tokens=len(result.completion_ids), tokens_per_second=t.decode_tok_s,
            acceptance_length=float(spec.get("tokens_per_pass", 1.0)))
        self.last_stats = {**stats.__dict__, "decode_tok_s": t.decode_tok_s}
        yield stats

    def send(self, user_text: str, *, params: SamplingParams | None = None,
             cancel: threading.Event | None = None) -> Iterator[OutputEvent]:
        """One user turn against the kept history (for `bolt chat`); the reply is appended to the history."""
        self.history.append({"role": "user", "content": user_text})
        reply, calls = [], []
        for ev in self.stream(self.history, sampling=params, cancel=cancel):
            if isinstance(ev, ChatStats):
                continue
            if isinstance(ev, TextEvent):
                reply.append(ev.text)
            elif isinstance(ev, ToolCallEvent) and ev.error is None:
                calls.append({"type": "function", "function": {"name": ev.name, "arguments": ev.arguments}})
            elif isinstance(ev, ThoughtEvent):
                pass  # thoughts are never fed back into the history
            yield ev
        msg = {"role": "assistant", "content": "".join(reply).strip()}
        if calls:
            msg["tool_calls"] = calls
        self.history.append(msg)

