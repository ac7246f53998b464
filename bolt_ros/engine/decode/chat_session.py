"""Multi-turn chat on one engine session: render -> tokens (prefix reused) -> stream -> parsed events."""
from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from bolt_ros.engine.decode.generate import Engine, GenerationResult
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.engine.text.chat_format import OutputEvent, TextEvent, ThoughtEvent, ToolCallEvent


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


_STRUCTURE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> its structure_tokens


def structure_tokens(tok, n: int) -> torch.Tensor:
    """[n] bool: the tokens whose text opens structure (after any spaces: `{`, `<`, `[` or a backtick), i.e. a tool
    call in any shape or markup, never a spoken word. Built once per tokenizer (~1 s for 152k tokens)."""
    mask = _STRUCTURE.get(tok)
    if mask is None or mask.shape[0] != n:
        opens = [bool(t) and t[0] in "{<[`" for t in (tok.decode([i]).lstrip() if i < tok.vocab_size else ""
                                                   for i in range(n))]
        mask = _STRUCTURE[tok] = torch.tensor(opens, dtype=torch.bool)
    return mask


class ChatSession:
    """A conversation's KV cache. `stream()` takes the whole message list each turn; only the new suffix is run."""

    def __init__(self, engine: Engine, system: str | None = None, *, use_draft: bool = True):
        self.engine, self.system, self.use_draft = engine, system or None, use_draft
        self.session = engine.new_session()
        self.history: list[dict] = []  # used by send()
        self.last_stats: dict = {}
        self.last_prefill_tokens = -1  # prompt tokens the last reply ran (the rest was cached)
        self.last_call_probability = -1.0  # call_threshold's measure for the last reply (-1: not decided)

    def _messages(self, messages: list[dict]) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + list(messages)

    def stream(self, messages: list[dict], *, tools: list[dict] | None = None, enable_thinking: bool = False,
               sampling: SamplingParams | None = None, cancel: threading.Event | None = None,
               tool_choice: str | dict = "auto", constrain: bool = True,
               call_threshold: float = 0.0) -> Iterator[OutputEvent | ChatStats]:
        """One reply to `messages`, as parsed events and then ChatStats.

        tool_choice: "auto" (the model may call a tool), "required" (the reply is tool calls, from its first token),
        "none" (no tools are shown; with `tools` given and a tool grammar the reply is held to words - no call
        syntax, not empty -, else a call written anyway comes back as an error event), or OpenAI's
        {"type": "function", "function": {"name": N}} (calls of that tool only). With tools offered and a format
        that has a tool grammar, calls are schema-constrained (grammar.py) unless constrain=False.

        call_threshold (with "auto" and a grammar): whether the reply calls or speaks is decided once, before its first
        token, by the probability the model gives to opening structure (`{`, `<`, `[`, a code fence: a call in any
        shape) against words: at least call_threshold -> calls only, in the format's syntax; less -> words only.
        Left to sampling (0), the single likeliest token decides, and a call's mass sits on one token (`{`) while
        words spread over many: Qwen2.5-Coder-0.5B called `sleep` for "I slept badly" at 0.25 call probability. The
        1.5B at 0.7-0.8 wrote its calls in other shapes (```json, <tools>) that no grammar branch took as calls."""
        from bolt_ros.engine.text.grammar import (
            resolve_tool_choice,  # no llguidance import: that happens only when decoding
        )
        fmt, tok = self.engine.chat_format, self.engine.tok
        callable_tools, mode = resolve_tool_choice(tools, tool_choice)
        grammar = None
        if constrain and (callable_tools or (tools and mode == "none")):  # "none" with tools: words only
            grammar = fmt.tool_grammar(callable_tools or tools, mode)
        # "none" shows no tools even where a grammar holds the reply to words: shown them, Qwen2.5 0.5B wrote
        # "```json" and a call in prose after every tool result; without them it answers in sentences
        offered = tools if mode != "none" else None
        segments = fmt.render(self._messages(messages), tools=offered or None, enable_thinking=enable_thinking)
        ids = tok.encode_segments(segments, add_bos=tok.add_bos)
        decided = (0, 0.0)  # (tokens, seconds) the decision's prefill ran: the stats count them
        if call_threshold > 0 and grammar is not None and mode == "auto" and callable_tools:
            t0 = time.perf_counter()
            grammar = self._decide(ids, callable_tools, call_threshold, cancel) or grammar
            decided = (self.session.last_prefill, time.perf_counter() - t0)
        params = (sampling or SamplingParams()).model_copy(deep=True)
        params.stop_token_ids = sorted(set(params.stop_token_ids) | set(fmt.stop_token_ids))
        params.stop = list(dict.fromkeys([*params.stop, *fmt.stop_strings]))
        parser = fmt.parser(offered) if offered else fmt.parser([] if tools and mode == "none" else None)
        result: GenerationResult | None = None
        self.last_prefill_tokens = -1
        for ev in self.engine.stream(ids, params, session=self.session, cancel=cancel, use_draft=self.use_draft,
                                     grammar=grammar):
            if self.last_prefill_tokens < 0:  # known from the first event on, even if the caller closes the stream
                self.last_prefill_tokens = self.session.last_prefill + decided[0]
            if isinstance(ev, GenerationResult):
                result = ev
            elif ev.text:
                yield from parser.feed(ev.text)
        yield from parser.finish()
        t = result.timings
        spec = result.spec or {}
        stats = ChatStats(
            text=result.text, finish_reason=result.finish_reason, ttft_ms=(t.ttft_s + decided[1]) * 1e3,
            prompt_tokens=t.prompt_tokens, prefill_tokens=t.prefill_tokens + decided[0],
            completion_tokens=len(result.completion_ids), tokens_per_second=t.decode_tok_s,
            acceptance_length=float(spec.get("tokens_per_pass", 1.0)))
        self.last_stats = {**stats.__dict__, "decode_tok_s": t.decode_tok_s, "grammar": result.grammar, "spec": spec}
        yield stats

    def _decide(self, ids: list[int], tools: list[dict], threshold: float, cancel) -> str | None:
        """The grammar for a reply decided as calls or as words (see stream); None when cancelled."""
        logits = self.engine.next_logits(ids, self.session, use_draft=self.use_draft, cancel=cancel)
        if logits is None:
            return None
        p = torch.softmax(logits.float(), -1)
        self.last_call_probability = float(p[structure_tokens(self.engine.tok, p.shape[-1])].sum())
        return self.engine.chat_format.tool_grammar(tools, "calls" if self.last_call_probability >= threshold
                                                    else "none")

    def prime(self, messages: list[dict], *, tools: list[dict] | None = None, enable_thinking: bool = False,
              cancel: threading.Event | None = None) -> int:
        """Prefill what the next stream(messages + [a user message], tools) will start with: the rendering up to
        where the user's words begin (found as the common prefix of two renderings with different words, so any
        chat template works). Returns the tokens run."""
        fmt, tok = self.engine.chat_format, self.engine.tok
        a, b = ([*self._messages(messages), {"role": "user", "content": w}] for w in ("a", "b"))
        ids_a, ids_b = (tok.encode_segments(fmt.render(m, tools=tools or None, enable_thinking=enable_thinking),
                                            add_bos=tok.add_bos) for m in (a, b))
        n = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
        return self.engine.prime(ids_a[:n], self.session, use_draft=self.use_draft, cancel=cancel)

    def prepare_tools(self) -> None:
        """Build the grammar's view of the vocabulary now (0.4 s for 49k tokens, 1.3 s for Qwen's 152k, 1.9 s for
        Gemma's 262k) instead of in the first reply that offers tools. Safe to call from a background thread."""
        from bolt_ros.engine.text.grammar import lltokenizer
        lltokenizer(self.engine.tok, set(self.engine.tok.eog_ids) | set(self.engine.chat_format.stop_token_ids))
        structure_tokens(self.engine.tok, self.engine.cfg.n_vocab)   # for call_threshold's decision

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

