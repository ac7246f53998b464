"""Chat templates from GGUF metadata (`tokenizer.chat_template`), rendered with sandboxed jinja2 like HF transformers.

Imported only for models that bring a template: jinja2 costs a few MiB the other formats do not need.
"""
from __future__ import annotations

import json
import secrets
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .chat_format import ChatFormat, ChatFormatError, Message, _check_messages, _normalize
from .tokenizer import Segment, Tokenizer


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
    rendering; the result is split at the placeholders into trusted template text and untrusted values. If the
    template transforms a value (so the placeholder no longer stands for it verbatim), rendering fails with a
    ChatFormatError rather than risk trusting user text.
    """

    def __init__(self, template: str, tok: Tokenizer | None = None):
        try:
            self.template = make_jinja_env().from_string(template)
        except jinja2.TemplateError as e:
            raise ChatFormatError(f"invalid chat template: {e}") from None
        self.source = template
        self.tok = tok
        self.supports_tools = "tools" in template
        self.stop_strings = []
        self.stop_token_ids = set(tok.eog_ids) if tok is not None else set()
        self._bos = tok.token_text(tok.bos_id) if tok is not None and tok.bos_id is not None else ""
        self._eos = tok.token_text(tok.eos_id) if tok is not None and tok.eos_id is not None else ""
        ctl = [tok.token_text(i) for i in sorted(tok.control_ids)] if tok is not None else []
        self._control_texts = tuple(t for t in ctl if t)

    def render_text(self, messages: list[Message], *, tools: list[dict] | None = None,
                    add_generation_prompt: bool = True, enable_thinking: bool = False) -> str:
        """The plain rendered string (everything in it would be parsed as special: for inspection and tests)."""
        _check_messages(messages)
        return self._render(_normalize(messages), tools, add_generation_prompt, enable_thinking)

    def render(self, messages: list[Message], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, enable_thinking: bool = False) -> list[Segment]:
        _check_messages(messages)
        messages = _normalize(messages)
        nonce = secrets.token_hex(8)
        values: list[str] = []

        def hide(value: str) -> str:
            values.append(value)
            return f"\x02bolt-{nonce}-{len(values) - 1}\x03"

        safe_msgs = [self._hide_message(m, hide) for m in messages]
        safe_tools = self._hide_strings(tools, hide) if tools is not None else None
        rendered = self._render(safe_msgs, safe_tools, add_generation_prompt, enable_thinking)
        expected = self._render(messages, tools, add_generation_prompt, enable_thinking)
        for strip in (False, True):  # templates that `| trim` contents are common
            segs = self._split(rendered, nonce, [v.strip() for v in values] if strip else values)
            if "".join(s.text for s in segs) == expected:
                return [s for s in segs if s.text]
        raise ChatFormatError("the chat template transforms message text (so it cannot be kept apart from "
                              "the template's own markup); refusing to render it as trusted text")

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
    def _split(rendered: str, nonce: str, values: list[str]) -> list[Segment]:
        segs: list[Segment] = []
        head = f"\x02bolt-{nonce}-"
        pos = 0
        while True:
            start = rendered.find(head, pos)
            if start < 0:
                segs.append(Segment(rendered[pos:], trusted=True))
                return segs
            end = rendered.find("\x03", start)
            index = rendered[start + len(head):end]
            if end < 0 or not index.isdigit() or int(index) >= len(values):
                raise ChatFormatError("the chat template mangled a message placeholder")
            segs += [Segment(rendered[pos:start], trusted=True), Segment(values[int(index)], trusted=False)]
            pos = end + 1
