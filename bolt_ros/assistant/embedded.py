"""Backend on our own engine (bolt_ros.engine), with an optional DFlash drafter.

Written against the engine's intended API (Engine.load / chat_session / session.stream yielding chat_format
events and a final stats object); this adapter is the only place that knows it. The session is kept across
calls so the engine can reuse the KV cache of the unchanged prompt prefix; it is rebuilt when the system prompt
changes.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

from bolt_ros.assistant.backend import (
    BackendError,
    BackendEvent,
    Finished,
    TextDelta,
    ThoughtDelta,
    ToolCallRequest,
)


class EmbeddedBackend:
    def __init__(self, engine, sampling):
        self.engine = engine
        self.sampling = sampling
        self._session = None
        self._system: str | None = None
        self._ids = 0

    @classmethod
    def from_config(cls, cfg) -> EmbeddedBackend:
        try:
            from bolt_ros.engine.default_models import resolve_model
            from bolt_ros.engine.generate import Engine
            from bolt_ros.engine.sampling import SamplingParams
        except ImportError as e:
            raise BackendError(f"the embedded backend needs bolt_ros.engine ({e}); use backend.kind: openai "
                               "or scripted meanwhile") from e
        draft = resolve_model(cfg.draft_path) if cfg.draft_path else None
        engine = Engine.load(resolve_model(cfg.model_path), draft=draft)
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_tokens,
                                  seed=None if cfg.seed < 0 else cfg.seed)
        return cls(engine, sampling)

    def stream_chat(self, messages: list[dict], tools: list[dict], *, enable_thinking: bool,
                    cancel: threading.Event) -> Iterator[BackendEvent]:
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        if self._session is None or system != self._system:
            self._session, self._system = self.engine.chat_session(system=system), system
        rest = messages[1:] if system else messages
        for ev in self._session.stream(rest, tools=tools or None, enable_thinking=enable_thinking,
                                       sampling=self.sampling, cancel=cancel):
            out = self._convert(ev)
            if out is not None:
                yield out

    def _convert(self, ev) -> BackendEvent | None:
        kind = type(ev).__name__
        if kind == "TextEvent":
            return TextDelta(ev.text)
        if kind == "ThoughtEvent":
            return ThoughtDelta(ev.text)
        if kind == "ToolCallEvent":
            self._ids += 1
            args = getattr(ev, "arguments", None)
            err = getattr(ev, "error", None)
            return ToolCallRequest(getattr(ev, "id", None) or f"call_{self._ids}", getattr(ev, "name", "") or "",
                                   args if isinstance(args, dict) else None, raw=getattr(ev, "raw", "") or "",
                                   error=err or (None if isinstance(args, dict) else "arguments are not an object"))
        # anything else is the final stats object (dataclass or dict)
        stats = dataclasses.asdict(ev) if dataclasses.is_dataclass(ev) else dict(ev) if isinstance(ev, dict) else {}
        return Finished(stats) if stats else None
