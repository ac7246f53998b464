"""Chat templates from GGUF metadata (`tokenizer.chat_template`), rendered with sandboxed jinja2 like HF transformers.

Imported only for models that bring a template: jinja2 costs a few MiB the other formats do not need.

Tools: a template that renders `tools` gets the Hermes tool-call parser (hermes_calls.py); one that also writes
`<tool_call>` (Qwen 2.5's, Hermes-style) gets the Hermes grammar (grammar.py) too. History calls may carry
OpenAI-style JSON-string arguments; they are decoded to objects first, as llama.cpp does for such templates, so
`arguments | tojson` writes the object.
"""
from __future__ import annotations

import json
import secrets
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from bolt_ros.engine.text.chat_format import (
    ChatFormat,
    ChatFormatError,
    Message,
    OutputParser,
    PassthroughParser,
    _check_messages,
    _normalize,
)
from bolt_ros.engine.text.tokenizer import Segment, Tokenizer


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF transformers' tojson: unlike jinja's built-in it does not HTML-escape
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def make_jinja_env() -> ImmutableSandboxedEnvironment:
    """The environment HF transformers renders chat templates in (sandboxed, trim_blocks, lstrip_blocks)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class JinjaChatFormat(ChatFormat):
    """A GGUF `tokenizer.chat_template`, rendered with jinja2 like HF transformers does.

    Message contents (and any string containing control-token text) are replaced by unique placeholders before
    rendering; the result is split at the placeholders into trusted template text and untrusted values. A value may
    appear verbatim, trimmed, or JSON-escaped (inside `tojson`, e.g. a tool-call argument or tool description: the
    placeholder's private-use delimiters survive json.dumps); if the template transforms it otherwise, rendering
    fails with a ChatFormatError rather than risk trusting user text.
    """

    def __init__(self, template: str, tok: Tokenizer | None = None):
        try:
            self.template = make_jinja_env().from_string(template)
        except jinja2.TemplateError as e:
            raise ChatFormatError(f"invalid chat template: {e}") from None
        self.source = template
        self.tok = tok
        self.supports_tools = "tools" in template
        self.output_markup = ("<tool_call>", "</tool_call>") if self.supports_tools else ()
        self.stop_strings = []
        self.stop_token_ids = set(tok.eog_ids) if tok is not None else set()
        self._bos = tok.token_text(tok.bos_id) if tok is not None and tok.bos_id is not None else ""
        self._eos = tok.token_text(tok.eos_id) if tok is not None and tok.eos_id is not None else ""
        # strings that carry text of tokens matched only in trusted text (control tokens, and markup-shaped ones
        # like `<tool_call>`) are hidden from the template, so they stay untrusted wherever it writes them
        special = set(tok.control_ids) | set(getattr(tok, "structural_ids", ())) if tok is not None else set()
        self._control_texts = tuple(t for t in (tok.token_text(i) for i in sorted(special)) if t)

    def render_text(self, messages: list[Message], *, tools: list[dict] | None = None,
                    add_generation_prompt: bool = True, enable_thinking: bool = False) -> str:
        """The plain rendered string (everything in it would be parsed as special: for inspection and tests)."""
        _check_messages(messages)
        messages = [_object_arguments(m) for m in _normalize(messages)]
        return self._render(messages, tools, add_generation_prompt, enable_thinking)

    def render(self, messages: list[Message], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, enable_thinking: bool = False) -> list[Segment]:
        _check_messages(messages)
        messages = [_object_arguments(m) for m in _normalize(messages)]
        nonce = secrets.token_hex(8)
        values: list[str] = []

        def hide(value: str) -> str:
            values.append(value)
            return f"{_PH_OPEN}bolt-{nonce}-{len(values) - 1}{_PH_CLOSE}"

        safe_msgs = [self._hide_message(m, hide) for m in messages]
        safe_tools = self._hide_strings(tools, hide) if tools is not None else None
        rendered = self._render(safe_msgs, safe_tools, add_generation_prompt, enable_thinking)
        expected = self._render(messages, tools, add_generation_prompt, enable_thinking)
        segs = self._align(self._split(rendered, nonce, len(values)), values, expected)
        if segs is None:
            raise ChatFormatError("the chat template transforms message text (so it cannot be kept apart from "
                                  "the template's own markup); refusing to render it as trusted text")
        return [s for s in segs if s.text]

    def parser(self, tools: list | None = None) -> OutputParser:
        if not self.supports_tools:
            return PassthroughParser()
        from bolt_ros.engine.text.hermes_calls import HermesOutputParser  # lazy, like the format itself
        return HermesOutputParser(tools=tools)

    def tool_grammar(self, tools: list[dict], mode: str = "auto") -> str | None:
        if not (self.supports_tools and "<tool_call>" in self.source):
            return None  # a template with another call syntax: unconstrained (the parser still reads bare JSON)
        from bolt_ros.engine.text.grammar import hermes_grammar
        return hermes_grammar(tools, mode)

    # -- helpers -------------------------------------------------------------------------------------------------

    def _render(self, messages, tools, add_generation_prompt, enable_thinking) -> str:
        try:
            text = self.template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        enable_thinking=enable_thinking, bos_token=self._bos, eos_token=self._eos)
        except jinja2.TemplateError as e:
            raise ChatFormatError(f"chat template error: {e}") from None
        if self._bos and self.tok.add_bos and text.startswith(self._bos):
            text = text[len(self._bos):]  # BOS is the tokenizer's job (encode_segments(add_bos=True))
        return text

    def _hide_message(self, m: Message, hide) -> Message:
        out = dict(m)
        if isinstance(m.get("content"), str) and m["content"]:
            out["content"] = hide(m["content"])
        for key, val in m.items():
            if key != "content":  # roles too: a role that carries control-token text is user text, not markup
                out[key] = self._hide_strings(val, hide)
        return out

    def _hide_strings(self, value: Any, hide) -> Any:
        """Hide the strings (tool names, arguments, descriptions) that could smuggle control-token text."""
        if isinstance(value, str):
            return hide(value) if any(t in value for t in self._control_texts) else value
        if isinstance(value, dict):
            return {k: self._hide_strings(v, hide) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._hide_strings(v, hide) for v in value]
        return value

    @staticmethod
    def _split(rendered: str, nonce: str, n_values: int) -> list[str | int]:
        """The rendered text as [template text, value index, template text, ...]."""
        pieces: list[str | int] = []
        head = f"{_PH_OPEN}bolt-{nonce}-"
        pos = 0
        while True:
            start = rendered.find(head, pos)
            if start < 0:
                pieces.append(rendered[pos:])
                return pieces
            end = rendered.find(_PH_CLOSE, start)
            index = rendered[start + len(head):end]
            if end < 0 or not index.isdigit() or int(index) >= n_values:
                raise ChatFormatError("the chat template mangled a message placeholder")
            pieces += [rendered[pos:start], int(index)]
            pos = end + 1

    @staticmethod
    def _align(pieces: list[str | int], values: list[str], expected: str) -> list[Segment] | None:
        """Segments whose text is exactly `expected`: each value in the form the template wrote it (verbatim,
        trimmed or JSON-escaped), chosen so that the template text after it follows; None when none fits."""
        segs: list[Segment] = []
        pos = 0
        for k, piece in enumerate(pieces):
            if isinstance(piece, str):
                if not expected.startswith(piece, pos):
                    return None
                segs.append(Segment(piece, trusted=True))
                pos += len(piece)
                continue
            value, after = values[piece], pieces[k + 1]
            forms = dict.fromkeys([value, value.strip(), json.dumps(value, ensure_ascii=False)[1:-1],
                                   json.dumps(value)[1:-1]])
            form = next((f for f in forms if expected.startswith(f, pos)
                         and expected.startswith(after, pos + len(f))), None)
            if form is None:
                return None
            segs.append(Segment(form, trusted=False))
            pos += len(form)
        return segs if pos == len(expected) else None


# Placeholder delimiters: private-use characters, which json.dumps(ensure_ascii=False) (the templates' `tojson`)
# leaves as they are, unlike control characters.
_PH_OPEN, _PH_CLOSE = "\ue000", "\ue001"


def _object_arguments(message: Message) -> Message:
    """An assistant message whose tool calls carry JSON-string arguments (OpenAI style), with them decoded."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not any(_string_arguments(c) for c in calls):
        return message
    out = []
    for call in calls:
        if _string_arguments(call):
            fn = call.get("function", call)
            try:
                args = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
            except json.JSONDecodeError:
                args = fn["arguments"]  # not JSON: written as the string it is
            fn = {**fn, "arguments": args}
            call = {**call, "function": fn} if "function" in call else fn
        out.append(call)
    return {**message, "tool_calls": out}


def _string_arguments(call) -> bool:
    fn = call.get("function", call) if isinstance(call, dict) else None
    return isinstance(fn, dict) and isinstance(fn.get("arguments"), str)
