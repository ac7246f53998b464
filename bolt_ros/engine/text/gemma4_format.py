"""Gemma 4 (and Nemotron Bolt E4B) chat format: prompt rendering and streaming output parsing.

(Over 400 lines on purpose: the renderer and the streaming parser are the two directions of one markup, and its
quirks - channels, `<|"|>` strings, tool responses - must be written and read the same way in one place.)

Rendering mirrors the Gemma 4 chat template shipped in GGUF files (llama.cpp models/templates/gemma4.jinja,
saved as test/fixtures/gemma4_chat_template.jinja; test_gemma4_format.py renders both and compares), including
its quirks, so prompts are token-identical to what the model was served with elsewhere. The differences are
deliberate and documented where they happen:
  * no `<bos>`: the tokenizer adds it (`encode_segments(..., add_bos=True)`), the template writes `{{ bos_token }}`;
  * OpenAI-style `role: "tool"` messages are folded into the preceding assistant turn the way llama.cpp does for
    this template (`convert_tool_responses_gemma4`), so callers keep the usual message shape;
  * JSON-string tool-call arguments are parsed into objects (llama.cpp `func_args_not_string`);
  * `None` values are written `null` (Python jinja would print `None`);
  * a tool `parameters` object without `type` counts as OBJECT (the template would leave its brace unclosed).
Every piece of text that comes from a message or a tool (names, keys, strings) is an untrusted Segment; only the
markup written here (`<|turn>`, `<|"|>`, ...) is trusted, so user text that imitates control tokens stays text.

Parsing: `Gemma4OutputParser` turns the streamed completion into TextEvent / ThoughtEvent / ToolCallEvent,
hiding `<|channel>thought\\n...<channel|>` and `<|tool_call>call:NAME{...}<tool_call|>` markup; bad calls become
ToolCallEvent(error=...) with a message meant to be fed back to the model, never exceptions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from bolt_ros.engine.text.chat_format import (
    ChatFormat,
    ChatFormatError,
    TextEvent,
    ThoughtEvent,
    ToolCallEvent,
    message_text,
)
from bolt_ros.engine.text.tokenizer import Segment
from bolt_ros.engine.text.tool_calls import (
    CALL_PREFIX,
    QUOTE,
    ToolCallSyntaxError,
    find_call_end,
    object_body_parts,
    parse_call,
    sorted_items,
    value_parts,
)

TURN_OPEN, TURN_CLOSE = "<|turn>", "<turn|>"
THINK = "<|think|>"
CHANNEL_OPEN, CHANNEL_CLOSE = "<|channel>", "<channel|>"
TOOL_OPEN, TOOL_CLOSE = "<|tool>", "<tool|>"
CALL_OPEN, CALL_CLOSE = "<|tool_call>", "<tool_call|>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<|tool_response>", "<tool_response|>"
EMPTY_THOUGHT = CHANNEL_OPEN + "thought\n" + CHANNEL_CLOSE
# The model ends its turn with <turn|>; after a tool call it emits <|tool_response> and waits for the result.
STOP_STRINGS = [TURN_CLOSE, RESPONSE_OPEN, "<eos>"]

CONVERSATIONAL_PROMPT = (
    "You are talking with people out loud through a speaker, so everything you write is spoken. "
    "Answer in one to three short, natural sentences. Use plain words only: no markdown, no lists, "
    "no headings, no code, no emoji, no symbols that cannot be read aloud. If more detail would help, "
    "offer it briefly instead of giving it all at once."
)

_SCHEMA_KEYS = ("description", "type", "properties", "required", "nullable")
_ROLES = {"system", "developer", "user", "assistant", "tool"}


# ---------------------------------------------------------------------------------------------- rendering


class _Out:
    """Accumulates segments, merging neighbours of equal trust."""

    def __init__(self):
        self.segments: list[Segment] = []

    def add(self, text: str, trusted: bool):
        if not text:
            return
        if self.segments and self.segments[-1].trusted == trusted:
            text = self.segments.pop().text + text
        self.segments.append(Segment(text, trusted))

    def markup(self, text: str):
        self.add(text, True)

    def data(self, text: str):
        self.add(text, False)

    def parts(self, parts):
        for text, is_markup in parts:
            self.add(text, is_markup)

    def quoted(self, text: str):
        self.markup(QUOTE)
        self.data(text)
        self.markup(QUOTE)

    def text(self) -> str:
        return "".join(s.text for s in self.segments)


def _get(obj, key):
    """jinja `obj[key]`: None (undefined) when obj is not a mapping or lacks the key."""
    return obj.get(key) if isinstance(obj, dict) else None


def _first_type(type_value) -> str:
    """A schema `type` as the template writes it: upper-cased, first non-"null" entry of a list."""
    if isinstance(type_value, str):
        return type_value.upper()
    if isinstance(type_value, list):
        return next((str(t) for t in type_value if t != "null"), "").upper()
    return ""


def _write_parameters(out: _Out, properties: dict):
    """The template's `format_parameters` macro (quirks kept: property names equal to schema keywords are
    skipped; `,properties:` / `,items:` get a comma even when nothing precedes them)."""
    first = True
    for key, value in sorted_items(properties):
        if key in _SCHEMA_KEYS:
            continue
        if not first:
            out.data(",")
        first = False
        etype = _first_type(_get(value, "type"))
        out.data(f"{key}:{{")
        add_comma = False
        if _get(value, "description"):
            out.data("description:")
            out.quoted(str(value["description"]))
            add_comma = True
        if _get(value, "nullable"):
            out.data("," if add_comma else "")
            add_comma = True
            out.data("nullable:true")
        if etype == "STRING":
            if _get(value, "enum"):
                out.data("," if add_comma else "")
                add_comma = True
                out.data("enum:")
                out.parts(value_parts(value["enum"], escape_keys=True))
        elif etype == "OBJECT":
            out.data(",properties:{")
            nested = _get(value, "properties")
            _write_parameters(out, nested if isinstance(nested, dict) else value)
            out.data("}")
            if _get(value, "required"):
                out.data(",required:[")
                _write_quoted_list(out, value["required"])
                out.data("]")
        elif etype == "ARRAY":
            items = _get(value, "items")
            if isinstance(items, dict) and items:
                out.data(",items:{")
                _write_items(out, items)
                out.data("}")
        out.data("," if add_comma else "")
        out.data("type:")
        out.quoted(etype)
        out.data("}")


def _write_items(out: _Out, items: dict):
    first = True
    for item_key, item_value in sorted_items(items):
        if item_value is None:
            continue
        if not first:
            out.data(",")
        first = False
        if item_key == "properties":
            out.data("properties:{")
            if isinstance(item_value, dict):
                _write_parameters(out, item_value)
            out.data("}")
        elif item_key == "required":
            out.data("required:[")
            _write_quoted_list(out, item_value)
            out.data("]")
        elif item_key == "type":
            out.data("type:")
            out.quoted(_first_type(item_value))
        else:
            out.data(f"{item_key}:")
            out.parts(value_parts(item_value, escape_keys=True))


def _write_quoted_list(out: _Out, items):
    for i, item in enumerate(items):
        out.data("," if i else "")
        out.quoted(str(item))


def _write_declaration(out: _Out, tool: dict):
    """`<|tool>declaration:NAME{description:...,parameters:{...}}<tool|>` (the `format_function_declaration`
    macro). A parameters object without `type` is treated as OBJECT: the template would leave it unclosed."""
    fn = tool.get("function", tool)
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ChatFormatError(f"tool declaration needs function.name: {tool!r}")
    out.markup(TOOL_OPEN + "declaration:")
    out.data(fn["name"] + "{description:")
    out.quoted(str(fn.get("description") or ""))
    params = fn.get("parameters")
    if params:
        out.data(",parameters:{")
        if _get(params, "properties"):
            out.data("properties:{")
            _write_parameters(out, params["properties"])
            out.data("},")
        if _get(params, "required"):
            out.data("required:[")
            _write_quoted_list(out, params["required"])
            out.data("],")
        out.data("type:")
        out.quoted(_first_type(params.get("type", "object")))
        out.data("}")
    if "response" in fn:
        response = fn["response"] or {}
        out.data(",response:{")
        if _get(response, "description"):
            out.data("description:")
            out.quoted(str(response["description"]))
            out.data(",")
        if _first_type(_get(response, "type")) == "OBJECT":
            out.data("type:")
            out.quoted("OBJECT")
            out.data("}")
    out.data("}")
    out.markup(TOOL_CLOSE)


def strip_thinking(text: str) -> str:
    """Drop `<|channel>...<channel|>` blocks from a history model turn (the template's `strip_thinking`)."""
    kept = []
    for part in text.split(CHANNEL_CLOSE):
        kept.append(part.split(CHANNEL_OPEN)[0] if CHANNEL_OPEN in part else part)
    return "".join(kept).strip()


def _call_arguments(call: dict) -> tuple[str, dict | str]:
    fn = call.get("function", call)
    name, arguments = fn.get("name"), fn.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ChatFormatError(f"tool call needs function.name: {call!r}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return name, arguments  # written verbatim, as the template does with string arguments
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, (dict, str)):
        raise ChatFormatError(f"tool call arguments must be an object, got {type(arguments).__name__}")
    return name, arguments


def _tool_result(message: dict):
    """A tool message's content as the object the template renders: JSON is decoded, other text kept."""
    content = message_text(message)
    try:
        return json.loads(content)
    except json.JSONDecodeError:
        return content


def fold_tool_messages(messages: list[dict]) -> list[dict]:
    """assistant(tool_calls) -> tool... -> [assistant(content)] becomes one assistant message with
    `tool_responses` (llama.cpp `convert_tool_responses_gemma4`). Results are named by the call they answer:
    `tool_call_id` first, then position, then the tool message's own `name`."""
    out, i = [], 0
    while i < len(messages):
        msg = messages[i]
        if msg.get("role") != "assistant" or not msg.get("tool_calls"):
            out.append(msg)
            i += 1
            continue
        calls = msg["tool_calls"]
        by_id = {c.get("id"): _call_arguments(c)[0] for c in calls if c.get("id")}
        responses = []
        i += 1
        while i < len(messages) and messages[i].get("role") == "tool":
            tool_msg = messages[i]
            name = by_id.get(tool_msg.get("tool_call_id"))
            if name is None and len(responses) < len(calls):
                name = _call_arguments(calls[len(responses)])[0]
            name = name or tool_msg.get("name") or tool_msg.get("tool_call_id") or "unknown"
            responses.append({"name": name, "response": _tool_result(tool_msg)})
            i += 1
        folded = {"role": "assistant", "tool_calls": calls}
        if responses:
            folded["tool_responses"] = responses
        # The template writes content after the calls and responses, so the answer that follows the results
        # belongs there; llama.cpp drops text written alongside the calls, we keep it when nothing follows.
        nxt = messages[i] if i < len(messages) else None
        if nxt is not None and nxt.get("role") == "assistant" and not nxt.get("tool_calls") and nxt.get("content"):
            folded["content"] = nxt["content"]
            i += 1
        elif msg.get("content"):
            folded["content"] = msg["content"]
        out.append(folded)
    return out


def _write_response(out: _Out, response: dict):
    name = response.get("name") or "unknown"
    value = response.get("response")
    out.markup(RESPONSE_OPEN + "response:")
    out.data(str(name) + "{")
    if isinstance(value, dict):
        out.parts(object_body_parts(value))
    else:
        out.data("value:")
        out.parts(value_parts(value))
    out.data("}")
    out.markup(RESPONSE_CLOSE)


def _check_messages(messages: list[dict]):
    if not messages:
        raise ChatFormatError("messages must not be empty")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or msg.get("role") not in _ROLES:
            role = msg.get("role") if isinstance(msg, dict) else msg
            raise ChatFormatError(f"message {i}: role must be one of {sorted(_ROLES)}, got {role!r}")


def render_gemma4(messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = True,
                  enable_thinking: bool = False, conversational: bool = False) -> list[Segment]:
    """Render a conversation as Gemma 4 prompt segments (without `<bos>`, see the module docstring)."""
    _check_messages(messages)
    messages = fold_tool_messages(messages)
    out = _Out()
    has_system = messages[0]["role"] in ("system", "developer")
    system_text = message_text(messages[0]).strip() if has_system else ""
    if conversational:
        system_text = f"{system_text}\n\n{CONVERSATIONAL_PROMPT}" if system_text else CONVERSATIONAL_PROMPT
    body = messages[1:] if has_system else messages
    prev = None
    if enable_thinking or tools or system_text or has_system:
        out.markup(TURN_OPEN + "system\n" + (THINK if enable_thinking else ""))
        out.data(system_text)
        for tool in tools or []:
            _write_declaration(out, tool)
        out.markup(TURN_CLOSE + "\n")
    for msg in body:
        prev = _write_message(out, msg)
    if add_generation_prompt:
        if prev != "tool_response":
            out.markup(TURN_OPEN + "model\n")
        if not enable_thinking:
            out.markup(EMPTY_THOUGHT)
    return out.segments


def _write_message(out: _Out, msg: dict) -> str | None:
    """One turn; returns what it ended with ("tool_call", "tool_response" or None), like the template's
    `prev_message_type`: after tool responses the model turn stays open for the model to continue."""
    role = "model" if msg["role"] == "assistant" else msg["role"]
    out.markup(TURN_OPEN + role + "\n")
    last = None
    for call in msg.get("tool_calls") or []:
        name, arguments = _call_arguments(call)
        out.markup(CALL_OPEN + CALL_PREFIX)
        out.data(name + "{")
        if isinstance(arguments, str):
            out.data(arguments)  # unparseable JSON text: verbatim, as the template writes string arguments
        else:
            out.parts(object_body_parts(arguments))
        out.data("}")
        out.markup(CALL_CLOSE)
        last = "tool_call"
    for response in msg.get("tool_responses") or []:
        _write_response(out, response)
        last = "tool_response"
    content = message_text(msg)
    out.data(strip_thinking(content) if role == "model" else content.strip())
    if not (msg.get("tool_responses") and not content):
        out.markup(TURN_CLOSE + "\n")
    return last


# ---------------------------------------------------------------------------------------------- parsing

# Any of these ends the model's message: the engine normally stops on them first, the parser also copes when not.
_END_MARKERS = (TURN_CLOSE, RESPONSE_OPEN, TURN_OPEN, "<eos>")
_TEXT_MARKERS = (CHANNEL_OPEN, CHANNEL_CLOSE, CALL_OPEN, *_END_MARKERS)
_THOUGHT_HEADER = "thought\n"
_CALL_SHAPE = "call:NAME{key:value,...} with strings in <|\"|> quotes, e.g. call:set_volume{level:5}"


def _held_back(buf: str, markers) -> int:
    """Length of the longest suffix of buf that could still grow into one of markers."""
    for k in range(min(len(buf), max(map(len, markers)) - 1), 0, -1):
        tail = buf[-k:]
        if any(m.startswith(tail) for m in markers):
            return k
    return 0


def _tool_names(tools) -> set[str] | None:
    if tools is None:
        return None
    names = set()
    for tool in tools:
        if isinstance(tool, str):
            names.add(tool)
        else:
            fn = tool.get("function", tool)
            names.add(fn["name"])
    return names


@dataclass
class Gemma4OutputParser:
    """Incremental parser of one model message: feed(text_delta) -> events, finish() -> last events.

    Text is released as soon as it cannot be the start of a marker; thoughts stream as ThoughtEvents; a tool
    call is buffered until `<tool_call|>` and then emitted whole. Problems (bad syntax, unknown tool, a call
    left open, prose after a call) become ToolCallEvent(error=...) and parsing goes on.
    """

    tools: list | None = None  # OpenAI tool dicts or names; when given, other names are errors
    _known: set[str] | None = field(init=False, default=None)
    _buf: str = field(init=False, default="")
    _state: str = field(init=False, default="text")  # text | header | thought | call | done
    _after_call: bool = field(init=False, default=False)
    _stray: str = field(init=False, default="")  # text seen after a tool call, reported as an error

    def __post_init__(self):
        self._known = _tool_names(self.tools)

    def feed(self, delta: str) -> list:
        events: list = []
        if self._state != "done":
            self._buf += delta
            while self._step(events):
                pass
        return events

    def finish(self) -> list:
        events: list = []
        if self._state in ("text", "header"):
            self._text(events, self._buf) if self._state == "text" else self._thought(events, self._buf)
        elif self._state == "thought":
            self._thought(events, self._buf)
        elif self._state == "call":
            raw = CALL_OPEN + self._buf
            events.append(self._error(raw, f"the tool call was not closed with <tool_call|>: {raw!r}"))
        self._flush_stray(events)
        self._buf, self._state = "", "done"
        return events

    # one transition per call; False when more input is needed
    def _step(self, events: list) -> bool:
        if self._state == "text":
            return self._step_text(events)
        if self._state == "header":
            return self._step_header()
        if self._state == "thought":
            return self._step_thought(events)
        if self._state == "call":
            return self._step_call(events)
        return False

    def _step_text(self, events: list) -> bool:
        hits = [(i, m) for m in _TEXT_MARKERS if (i := self._buf.find(m)) >= 0]
        if not hits:
            keep = _held_back(self._buf, _TEXT_MARKERS)
            self._text(events, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        i, marker = min(hits)
        self._text(events, self._buf[:i])
        self._buf = self._buf[i + len(marker) :]
        if marker == CHANNEL_OPEN:
            self._flush_stray(events)
            self._state = "header"
        elif marker == CALL_OPEN:
            self._flush_stray(events)
            self._state = "call"
        elif marker in _END_MARKERS:
            self._flush_stray(events)
            self._buf, self._state = "", "done"
            return False
        # a lone <channel|> (models sometimes close an empty channel twice) is dropped
        return True

    def _step_header(self) -> bool:
        # `<|channel>thought\n`: the channel name is not part of the thought; wait until it can be told apart
        if len(self._buf) < len(_THOUGHT_HEADER) and _THOUGHT_HEADER.startswith(self._buf):
            return False
        if self._buf.startswith(_THOUGHT_HEADER):
            self._buf = self._buf[len(_THOUGHT_HEADER) :]
        self._state = "thought"
        return True

    def _step_thought(self, events: list) -> bool:
        i = self._buf.find(CHANNEL_CLOSE)
        if i < 0:
            keep = _held_back(self._buf, (CHANNEL_CLOSE,))
            self._thought(events, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        self._thought(events, self._buf[:i])
        self._buf = self._buf[i + len(CHANNEL_CLOSE) :]
        self._state = "text"
        return True

    def _step_call(self, events: list) -> bool:
        end = find_call_end(self._buf, 0, CALL_CLOSE)
        if end < 0:
            return False
        body = self._buf[:end]
        self._buf = self._buf[end + len(CALL_CLOSE) :]
        events.append(self._call(body))
        self._after_call, self._state = True, "text"
        return True

    def _text(self, events: list, text: str):
        if not text:
            return
        if self._after_call:
            self._stray += text
        else:
            events.append(TextEvent(text=text))

    def _thought(self, events: list, text: str):
        if text:
            events.append(ThoughtEvent(text=text))

    def _flush_stray(self, events: list):
        stray, self._stray = self._stray, ""
        if stray.strip():
            message = f"text after a tool call is not allowed; end the turn after the call(s). Got: {stray.strip()!r}"
            events.append(self._error(stray, message))

    def _call(self, body: str):
        raw = CALL_OPEN + body + CALL_CLOSE
        try:
            name, arguments = parse_call(body)
        except ToolCallSyntaxError as e:
            return self._error(raw, f"could not parse tool call {raw!r}: {e}. Expected {_CALL_SHAPE}",
                               name=_guess_name(body))
        if self._known is not None and name not in self._known:
            known = ", ".join(sorted(self._known)) or "none"
            return ToolCallEvent(name=name, arguments=arguments, raw=raw,
                                 error=f"unknown tool {name!r}; available tools: {known}")
        return ToolCallEvent(name=name, arguments=arguments, raw=raw, error=None)

    @staticmethod
    def _error(raw: str, message: str, name: str = ""):
        return ToolCallEvent(name=name, arguments=None, raw=raw, error=message)


def _guess_name(body: str) -> str:
    """The tool name of a call that failed to parse, when one is readable (helps address the error)."""
    body = body.strip()
    if not body.startswith(CALL_PREFIX):
        return ""
    name = body[len(CALL_PREFIX) :].split("{", 1)[0].strip()
    return name if name.replace("_", "a").replace(".", "a").replace("-", "a").isalnum() else ""


# ---------------------------------------------------------------------------------------------- ChatFormat


class Gemma4ChatFormat(ChatFormat):
    """ChatFormat for `gemma4` GGUFs (Gemma 4, Nemotron Bolt E4B)."""

    supports_tools = True
    output_markup = (CHANNEL_OPEN, CHANNEL_CLOSE, CALL_OPEN, CALL_CLOSE, '<|"|>')

    def __init__(self, tok=None):
        self.tok = tok
        self.stop_strings = list(STOP_STRINGS)
        ids = {tok.token_id(s) for s in STOP_STRINGS} if tok is not None else set()
        self.stop_token_ids = {i for i in ids if i is not None} | (set(tok.eog_ids) if tok is not None else set())

    def render(self, messages: list[dict], *, tools: list[dict] | None = None, add_generation_prompt: bool = True,
               enable_thinking: bool = False, conversational: bool = False) -> list[Segment]:
        return render_gemma4(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                             enable_thinking=enable_thinking, conversational=conversational)

    def parser(self, tools: list | None = None) -> Gemma4OutputParser:
        return Gemma4OutputParser(tools=tools)

    def tool_grammar(self, tools: list[dict], mode: str = "auto") -> str:
        from bolt_ros.engine.text.grammar import gemma4_grammar  # lazy: only constrained generations need it
        return gemma4_grammar(tools, mode)
