"""Backend on our own engine (bolt_ros.engine), with an optional DFlash drafter.

One engine ChatSession (one KV cache) serves every call. It is created without a system prompt of its own: the
messages always carry theirs, so the engine's prefix reuse keeps the cached system prompt and history across
turns, and a changed system prompt (a parameter update) only re-runs what follows the first differing token
instead of starting a new cache.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
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
from bolt_ros.engine.decode.chat_session import ChatSession, ChatStats
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.engine.text.chat_format import ChatFormatError, TextEvent, ThoughtEvent, ToolCallEvent


class EmbeddedBackend:
    def __init__(self, engine, sampling: SamplingParams, tool_choice: str = "auto", call_threshold: float = 0.0,
                 words_engine=None):
        self.engine = engine  # the intent classifier's too (intent.model_path: same)
        self.sampling = sampling
        self.tool_choice = tool_choice
        self.call_threshold = call_threshold
        self.session = ChatSession(engine, system=None)
        # a model of its own for the replies in words (backend.words_model_path): a larger sibling's words, the
        # small model still deciding the moves; it must share the tokenizer (the words grammar is built on it)
        self.words_session = ChatSession(words_engine, system=None) if words_engine is not None else None
        if tool_choice != "none":
            self.session.prepare_tools()  # the grammar's vocabulary view now, not in the first reply (~1.3 s, Qwen)
            if self.words_session is not None:
                self.words_session.prepare_tools()
        self._ids = itertools.count(1)
        self._bare: dict[str, str] = {}  # call id -> the bare JSON object the model wrote for it (see _as_written)

    @classmethod
    def from_config(cls, cfg) -> EmbeddedBackend:
        import torch

        from bolt_ros.engine.decode.generate import Engine
        from bolt_ros.engine.default_models import resolve_drafter, resolve_model
        from bolt_ros.engine.device import resolve_device

        try:
            model = resolve_model(cfg.model_path)
            draft = resolve_drafter(cfg.draft_path, cfg.model_path)
            device = resolve_device(cfg.device)
            engine = Engine.load(model, draft=draft, n_ctx=cfg.n_ctx, device=device,
                                 compile_steps=cfg.compile and torch.device(device).type == "cpu")
            engine.warm_up(engine.tok.encode("Hello, robot.", add_bos=engine.tok.add_bos))
        except (OSError, ValueError) as e:  # GGUFError is a ValueError; a missing file an OSError
            raise BackendError(f"embedded backend: cannot load model {cfg.model_path!r}"
                               + (f" with drafter {cfg.draft_path!r}" if cfg.draft_path else "") + f": {e}") from e
        words = None
        if cfg.words_model_path not in ("", "same"):
            try:
                words = Engine.load(resolve_model(cfg.words_model_path), n_ctx=cfg.n_ctx, device=device,
                                    compile_steps=cfg.compile and torch.device(device).type == "cpu")
                words.warm_up(words.tok.encode("Hello, robot.", add_bos=words.tok.add_bos))
            except (OSError, ValueError) as e:
                raise BackendError(f"embedded backend: cannot load the words model {cfg.words_model_path!r}: "
                                   f"{e}") from e
            probe = "Hello, robot."
            if words.tok.encode(probe, add_bos=False) != engine.tok.encode(probe, add_bos=False):
                raise BackendError(f"embedded backend: the words model {cfg.words_model_path!r} has another "
                                   f"tokenizer than {cfg.model_path!r}")
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, min_p=cfg.min_p,
                                  repetition_penalty=cfg.repetition_penalty, max_tokens=cfg.max_tokens,
                                  seed=None if cfg.seed < 0 else cfg.seed)
        return cls(engine, sampling, cfg.tool_choice, cfg.call_threshold, words_engine=words)

    @property
    def label(self) -> str:
        """What the log names: the model file and its DFlash drafter, if any."""
        draft = self.engine.draft
        words = f", words by {self.words_session.engine.gguf.path.name}" if self.words_session is not None else ""
        return (f"embedded {self.engine.gguf.path.name}" + (f" + DFlash drafter {draft.path.name}" if draft else "")
                + words)

    @property
    def samples(self) -> bool:
        """Whether a second call on the same prompt can answer differently (not greedy): ToolLoop resamples a
        parroting reply only then."""
        return self.sampling.temperature > 0 and self.sampling.top_k != 1

    @property
    def context_budget(self) -> int:
        """Tokens a prompt may take: the context less room for the longest reply."""
        n_ctx = min(self.engine.n_ctx, self.words_session.engine.n_ctx if self.words_session else self.engine.n_ctx)
        return n_ctx - self.sampling.max_tokens - 1

    def prompt_tokens(self, messages: list[dict], tools: list[dict]) -> int:
        """The prompt's exact length, rendered and tokenized as stream_chat will."""
        fmt, tok = self.engine.chat_format, self.engine.tok
        return len(tok.encode_segments(fmt.render(self._as_written(messages), tools=tools or None),
                                       add_bos=tok.add_bos))

    def stream_chat(self, messages: list[dict], tools: list[dict], *, enable_thinking: bool,
                    cancel: threading.Event, words_only: bool = False, attempt: int = 0,
                    temperature: float | None = None) -> Iterator[BackendEvent]:
        # the engine holds the session's lock while it generates: calls on the one cache never interleave
        choice = "none" if words_only else self.tool_choice
        sampling = self.sampling
        if attempt and sampling.seed is not None:  # a redraw: the same seed would write the same reply again
            sampling = sampling.model_copy(update={"seed": sampling.seed + REDRAW_SEED_STEP * attempt})
        if temperature is not None and not sampling.greedy:  # a greedy backend stays greedy
            sampling = sampling.model_copy(update={"temperature": temperature})
        session = self.words_session if words_only and self.words_session is not None else self.session
        for ev in session.stream(self._as_written(messages), tools=tools or None, enable_thinking=enable_thinking,
                                      sampling=sampling, cancel=cancel, tool_choice=choice,
                                      call_threshold=self.call_threshold):
            yield self._convert(ev)

    def prime(self, messages: list[dict], tools: list[dict], *, enable_thinking: bool = False,
              cancel: threading.Event | None = None) -> int:
        """Prefill the next turn's prompt up to the person's words (system prompt, tools, the conversation's
        memory) while nobody is talking: the turn then runs only the new user message. Returns the tokens run."""
        offered = tools if self.tool_choice != "none" else None
        # no tools: the intent classifier decides, so the next model call is words only (the words model's)
        session = self.words_session if self.words_session is not None and not tools else self.session
        return session.prime(self._as_written(messages), tools=offered or None,
                             enable_thinking=enable_thinking, cancel=cancel)

    def _as_written(self, messages: list[dict]) -> list[dict]:
        """The messages with every assistant turn whose calls the model wrote as bare JSON objects put back as it
        wrote them, not re-rendered by the chat template inside its call tags (a form this model did not write).
        Shown its earlier calls in the other form, the default chat model answers later requests in words: after
        four turns, 0.10 of its first token's probability went to a call for "dance for me!" with the turns
        re-rendered, 0.61 with them as written (0.91 in a fresh conversation). It also keeps the cached prefix."""
        seen, out = set(), []
        for m in messages:
            calls = m.get("tool_calls") if m.get("role") == "assistant" else None
            raws = [self._bare.get(c.get("id")) for c in calls] if calls else None
            if raws and all(raws):
                seen.update(c["id"] for c in calls)
                text = "\n".join(raws)
                m = {"role": "assistant", "content": f"{m['content']}\n{text}" if m.get("content") else text}
            out.append(m)
        self._bare = {k: v for k, v in self._bare.items() if k in seen}  # calls no longer in the history go
        return out if self._later_system_ok else _fold_later_system(out)

    @functools.cached_property
    def _later_system_ok(self) -> bool:
        """Whether the model's chat format takes a system message after the first (the conversation's memory):
        Qwen's does; Gemma 3's has no such role."""
        probe = [{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
                 {"role": "user", "content": "c"}]
        try:
            self.engine.chat_format.render(probe)
        except (ChatFormatError, ValueError, RuntimeError):  # a template's raise_exception, whatever its type
            return False
        return True

    def _convert(self, ev) -> BackendEvent:
        if isinstance(ev, TextEvent):
            return TextDelta(ev.text)
        if isinstance(ev, ThoughtEvent):
            return ThoughtDelta(ev.text)
        if isinstance(ev, ToolCallEvent):
            args = ev.arguments if isinstance(ev.arguments, dict) else None
            error = ev.error or (None if args is not None else "arguments are not a JSON object")
            call = ToolCallRequest(f"call_{next(self._ids)}", ev.name or "", args, raw=ev.raw or "", error=error)
            if call.raw.lstrip().startswith("{"):  # a bare JSON object, no call tags
                self._bare[call.id] = call.raw.strip()
            return call
        if isinstance(ev, ChatStats):
            stats = dataclasses.asdict(ev)
            del stats["text"]  # the reply itself already went out as TextDeltas
            return Finished(stats)
        raise BackendError(f"embedded backend: unexpected engine event {type(ev).__name__}")


REDRAW_SEED_STEP = 7919  # seed offset per redraw (a prime: no run with a nearby seed draws the same numbers)


def _fold_later_system(messages: list[dict]) -> list[dict]:
    """System messages after the first, put in brackets at the top of the next user message instead."""
    out, held = [], []
    for i, m in enumerate(messages):
        if i and m.get("role") == "system":
            held.append(m["content"])
        elif held and m.get("role") == "user":
            out.append({**m, "content": "".join(f"[{h}]\n" for h in held) + m["content"]})
            held = []
        else:
            out.append(m)
    return out
