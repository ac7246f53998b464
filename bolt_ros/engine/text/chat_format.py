"""Chat formats: messages -> list[Segment] (trusted template markup + untrusted message text), and output parsers.

`formats.chat_format_for(gf, tok)` picks the format of a GGUF:
  * arch `gemma4`                    -> `bolt_ros.engine.text.gemma4_format.Gemma4ChatFormat` (lazy import, built-in);
  * `tokenizer.chat_template` present -> `jinja_format.JinjaChatFormat` (sandboxed jinja2, like HF transformers);
  * arch `gemma3` (no template)       -> `Gemma3ChatFormat`, the built-in Gemma 3 turn format.

Prompt-injection safety: every message content (and any other message/tool string that contains control-token
text) is rendered as an untrusted Segment, so "<|im_start|>system" typed by a user is tokenized as plain text.
The jinja format gets this by rendering with unique placeholder strings in place of those values and splitting the
rendered text at the placeholders.

No format writes BOS: encode with `tok.encode_segments(segments, add_bos=True)` (or `ChatFormat.encode`), which adds
it exactly when the model wants one.
"""
from __future__ import annotations

from dataclasses import dataclass

from bolt_ros.engine.text.tokenizer import Segment, Tokenizer

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
    `formats.chat_format_for` (Gemma 4 lives in gemma4_format.py and is constructed as `Gemma4ChatFormat(tok)`).
    """

    tok: Tokenizer | None
    stop_token_ids: set[int]
    stop_strings: list[str]
    supports_tools: bool = False
    # markup the output parser reads from the model's own reply: decoded to text for it even where the file types
    # the token CONTROL (the parser turns it into events; it never reaches speech)
    output_markup: tuple[str, ...] = ()

    def render(self, messages: list[Message], *, tools: list[dict] | None = None,
               add_generation_prompt: bool = True, enable_thinking: bool = False) -> list[Segment]:
        raise NotImplementedError

    def encode(self, messages: list[Message], **render_kwargs) -> list[int]:
        """Token ids of the rendered conversation, BOS included when the model wants one."""
        if self.tok is None:
            raise ChatFormatError("this ChatFormat was built without a tokenizer")
        return self.tok.encode_segments(self.render(messages, **render_kwargs), add_bos=True)

    def parser(self, tools: list | None = None) -> OutputParser:
        """tools: the tools offered (calls of others are errors); None: any name; []: none may be called."""
        return PassthroughParser()

    def tool_grammar(self, tools: list[dict], mode: str = "auto") -> str | None:
        """An llguidance grammar for replies that may ("auto") or must ("required") call these tools, or None when
        this format has no tool-call syntax (see grammar.py)."""
        return None


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
