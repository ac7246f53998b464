"""Chat formats: messages -> list[Segment] (trusted template markup + untrusted message text), and output parsers.

`ChatFormat.for_model(gf, tok)` picks the format of a GGUF:
  * arch `gemma4`                    -> `bolt_ros.engine.gemma4_format.Gemma4ChatFormat` (lazy import, built-in);
  * `tokenizer.chat_template` present -> `JinjaChatFormat` (sandboxed jinja2, rendered like HF transformers);
  * arch `gemma3` (no template)       -> `Gemma3ChatFormat`, the built-in Gemma 3 turn format.

Prompt-injection safety: every message content (and any other message/tool string that contains control-token
text) is rendered as an untrusted Segment, so "<|im_start|>system" typed by a user is tokenized as plain text.
The jinja format gets this by rendering with unique placeholder strings in place of those values and splitting the
rendered text at the placeholders.

No format writes BOS: encode with `tok.encode_segments(segments, add_bos=True)` (or `ChatFormat.encode`), which adds
it exactly when the model wants one.
"""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .gguf_file import GGUFFile
from .tokenizer import Segment, Tokenizer

Message = dict  # {"role": "system"|"user"|"assistant"|"tool", "content": str, "tool_calls"?: [...], ...}


class ChatFormatError(ValueError):
    """Messages the format cannot render, or a chat template that fails."""


# ------------------------------------------------------------------------------------------ output events / parsers

@dataclass
class TextEvent:
    text: str


@dataclass
class ThoughtEvent:
    text: str


@dataclass
class ToolCallEvent:
    name: str
    arguments: dict | None
    raw: str
    error: str | None = None  # set when the call is malformed; a message meant to be fed back to the model


OutputEvent = TextEvent | ThoughtEvent | ToolCallEvent


class OutputParser:
    """Streaming parser of one model message: feed(text delta) -> events; finish() -> the last events."""

    def feed(self, delta: str) -> list[OutputEvent]:
        raise NotImplementedError

    def finish(self) -> list[OutputEvent]:
        raise NotImplementedError


class PassthroughParser(OutputParser):
    """For formats without thinking or tool-call markup: all output is text."""

    def feed(self, delta: str) -> list[OutputEvent]:
        return [TextEvent(delta)] if delta else []

    def finish(self) -> list[OutputEvent]:
        return []


# ------------------------------------------------------------------------------------------------------ base class

class ChatFormat:
    """Renders a conversation into Segments. Subclasses set tok, stop_token_ids and stop_strings.

    Extension point: a new built-in format subclasses ChatFormat with the same render() signature and is added to
    `for_model` (Gemma 4 lives in gemma4_format.py and is constructed as `Gemma4ChatFormat(tok)`).
    """

    tok: Tokenizer | None
    stop_token_ids: set[int]
    stop_strings: list[str]
    supports_tools: bool = False

    @classmethod
    def for_model(cls, gf: GGUFFile, tok: Tokenizer) -> ChatFormat:
        arch = gf.arch()
        if arch == "gemma4":
            from .gemma4_format import Gemma4ChatFormat  # lazy: only Gemma 4 models need it
            return Gemma4ChatFormat(tok)
        template = gf.metadata.get("tokenizer.chat_template")
        if isinstance(template, str) and template.strip():
            return JinjaChatFormat(template, tok)
        if arch in ("gemma3", "gemma2", "gemma"):
            return Gemma3ChatFormat(tok)
        raise ChatFormatError(f"{gf.path.name}: no tokenizer.chat_template and no built-in chat format for "
                              f"architecture {arch!r}")

    def render(self, messages: list[Message], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, enable_thinking: bool = False) -> list[Segment]:
        raise NotImplementedError

    def encode(self, messages: list[Message], **render_kwargs) -> list[int]:
        """Token ids of the rendered conversation, BOS included when the model wants one."""
        if self.tok is None:
            raise ChatFormatError("this ChatFormat was built without a tokenizer")
        return self.tok.encode_segments(self.render(messages, **render_kwargs), add_bos=True)

    def parser(self, tools: list | None = None) -> OutputParser:
        return PassthroughParser()


def message_text(message: Message) -> str:
    """A message's content as one string (OpenAI content parts are joined, None is empty)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
            else:
                raise ChatFormatError(f"unsupported content part {part!r} (only text parts)")
        return "".join(texts)
    raise ChatFormatError(f"message content must be a string or a list of text parts, not {type(content).__name__}")


def _normalize(messages: list[Message]) -> list[Message]:
    """Content-part lists become plain strings, so the template sees one shape."""
    return [{**m, "content": message_text(m)} if isinstance(m.get("content"), list) else m for m in messages]


def _check_messages(messages: list[Message]) -> None:
    if not isinstance(messages, list):
        raise ChatFormatError(f"messages must be a list, not {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatFormatError(f"messages[{i}] must be a dict with a string 'role', got {m!r}")


# ---------------------------------------------------------------------------------------------------- Gemma 3

class Gemma3ChatFormat(ChatFormat):
    """Gemma 3's turn format (the HF chat template of Gemma 3, without its `{{ bos_token }}`):

        <start_of_turn>user\\n{system}\\n\\n{user}<end_of_turn>\\n<start_of_turn>model\\n{assistant}<end_of_turn>\\n...

    There is no system role: the system prompt is folded into the first user turn. Contents are trimmed like the
    template's `| trim`. Gemma 3 has no tool tokens: `tool` messages become user turns and `tools` are not rendered.
    """

    START, END = "<start_of_turn>", "<end_of_turn>"

    def __init__(self, tok: Tokenizer | None = None):
        self.tok = tok
        self.stop_strings = []
        self.stop_token_ids = set(tok.eog_ids) if tok is not None else set()
        if tok is not None:
            for name in (self.END, "<eos>"):
                tid = tok.token_id(name)
                if tid is not None:
                    self.stop_token_ids.add(tid)

    def render(self, messages: list[Message], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, enable_thinking: bool = False) -> list[Segment]:
        _check_messages(messages)
        system = None
        if messages and messages[0]["role"] == "system":
            system, messages = message_text(messages[0]), messages[1:]
        if system is not None and not messages:
            messages = [{"role": "user", "content": ""}]  # keep the system prompt even before the first user turn
        segs: list[Segment] = []
        for i, m in enumerate(messages):
            role = {"assistant": "model", "user": "user", "tool": "user"}.get(m["role"])
            if role is None:
                raise ChatFormatError(f"Gemma 3 has no {m['role']!r} role (system is only allowed first)")
            segs.append(Segment(f"{self.START}{role}\n", trusted=True))
            if i == 0 and system is not None:
                segs += [Segment(system, trusted=False), Segment("\n\n", trusted=True)]
            segs += [Segment(message_text(m).strip(), trusted=False), Segment(f"{self.END}\n", trusted=True)]
        if add_generation_prompt:
            segs.append(Segment(f"{self.START}model\n", trusted=True))
        return [s for s in segs if s.text]


# ------------------------------------------------------------------------------------------------------- jinja

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
