"""Hermes-style tool calls (Qwen 2.5, Hermes, ...): streaming parser of `<tool_call>{json}</tool_call>` output.

A template that renders `tools` (Qwen 2.5's writes `<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` into
its system prompt) gets this parser from `JinjaChatFormat.parser`. It understands:
  * tagged calls, several per reply, with text before, between and after them;
  * a *bare* JSON call at the start of a reply (or right after another call), `{"name": ..., "arguments": {...}}`
    without tags: the small Qwen 2.5 Coder models answer that way, and the 1.5B doubles the braces (`{{...}}`) the
    way its template's instructions are written. Bare JSON counts as a call only when tools were offered; other
    JSON (an object without "name") stays text.
Whitespace between or after calls is dropped, and so is whitespace just before a call: the template writes the
separators itself when the reply comes back as history, so the prompt then matches what the model produced.

Problems (bad JSON, an unknown tool, a call left open) become ToolCallEvent(error=...) with a message meant to be
fed back to the model, never exceptions. The parser only ever sees model output: a `<tool_call>` typed by a user or
found in a tool result is part of the prompt, not of the stream this parses.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from bolt_ros.engine.text.chat_format import OutputEvent, OutputParser, TextEvent, ToolCallEvent

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_WS = " \t\r\n"
_CALL_SHAPE = '<tool_call>\n{"name": "TOOL", "arguments": {...}}\n</tool_call>'


class HermesCallError(ValueError):
    """A call body that is not `{"name": str, "arguments": object}`; the message says what is wrong."""


def tool_names(tools) -> set[str] | None:
    """Names of OpenAI tool dicts (or plain names); None when no tools were given (then any name is accepted)."""
    if tools is None:
        return None
    return {t if isinstance(t, str) else t.get("function", t).get("name") for t in tools}


def _outside_strings(text: str, start: int = 0):
    """Indices of the characters of text[start:] outside JSON strings (the quotes themselves excluded)."""
    in_string, escaped = False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        else:
            yield i


def json_object_end(text: str, start: int = 0) -> int:
    """Index just past the brace-balanced object that opens at text[start] ('{'), or -1 while it is incomplete.
    Braces inside JSON strings do not count."""
    depth = 0
    for i in _outside_strings(text, start):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return -1


def _undouble(text: str) -> str:
    """`{{` -> `{` and `}}` -> `}` outside strings (a call written with every brace doubled)."""
    drop, second = set(), -1
    for i in _outside_strings(text):
        if i != second and text[i] in "{}" and text.startswith(text[i] * 2, i):
            drop.add(i)
            second = i + 1  # the pair's second brace stays and starts no pair of its own
    return "".join(c for i, c in enumerate(text) if i not in drop)


def _decode(body: str):
    """The JSON value of a call body: as written, with one outer brace pair removed, or with all braces undoubled."""
    body = body.strip()
    candidates = [body]
    if body.startswith("{{") and body.endswith("}}"):
        candidates += [body[1:-1], _undouble(body)]
    error = None
    for text in candidates:
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            error = error or e
    raise HermesCallError(f"invalid JSON ({error.msg} at offset {error.pos})")


def parse_call_body(body: str) -> tuple[str, dict]:
    """(name, arguments) of a call body; raises HermesCallError. `parameters` is accepted for `arguments`, and
    arguments given as a JSON string are decoded (both are seen in practice)."""
    value = _decode(body)
    if not isinstance(value, dict):
        raise HermesCallError(f"a call must be a JSON object, not {type(value).__name__}")
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise HermesCallError('the call has no "name" string')
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise HermesCallError(f"arguments of {name!r} are a string that is not JSON") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise HermesCallError(f'"arguments" of {name!r} must be an object, not {type(arguments).__name__}')
    return name, arguments


def _close_index(buf: str) -> int:
    """Index of the CLOSE tag in a call buffer, skipping any inside a JSON string; -1 if not there yet."""
    return next((i for i in _outside_strings(buf) if buf.startswith(CLOSE, i)), -1)


def _held_back(buf: str, marker: str) -> int:
    """Length of the longest suffix of buf that could still grow into marker."""
    for k in range(min(len(buf), len(marker) - 1), 0, -1):
        if marker.startswith(buf[-k:]):
            return k
    return 0


@dataclass
class HermesOutputParser(OutputParser):
    """Incremental parser of one reply: feed(text_delta) -> events, finish() -> the last events.

    Text streams as soon as it cannot be the start of `<tool_call>` (trailing whitespace waits to see whether a call
    follows); calls are buffered until they close and come out whole. A reply (or the text after a call) that opens
    with `{` is held until the object closes, then judged: a call, or text after all.
    """

    tools: list | None = None  # OpenAI tool dicts or names; when given, other names are errors
    _known: set[str] | None = field(init=False, default=None)
    _buf: str = field(init=False, default="")
    _ws: str = field(init=False, default="")  # trailing whitespace of the text, held until we see what follows
    _state: str = field(init=False, default="lead")  # lead | text | call | bare
    _calls: int = field(init=False, default=0)

    def __post_init__(self):
        self._known = tool_names(self.tools)

    @property
    def _bare_allowed(self) -> bool:
        return bool(self._known)  # only when tools were offered: otherwise a JSON answer is just text

    def feed(self, delta: str) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        self._buf += delta
        while self._step(events, final=False):
            pass
        return events

    def finish(self) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        while True:
            while self._step(events, final=True):
                pass
            cut = self._buf.find(CLOSE) if self._state == "call" else -1
            if cut < 0:
                break
            # the close tag sat inside an unterminated string: the JSON is broken, so cut at the tag after all
            body, self._buf = self._buf[:cut], self._buf[cut + len(CLOSE):]
            events.append(self._call(body, OPEN + body + CLOSE))
            self._calls += 1
            self._state = "lead"
        if self._state == "call":
            events.append(self._unclosed_call())
        elif self._state == "bare":
            events.extend(self._judge_bare(self._buf, final=True))
        elif self._state == "text":
            self._text(events, self._buf)
        if self._ws and not self._calls:
            events.append(TextEvent(self._ws))  # the reply's own trailing (or only) whitespace
        self._buf, self._ws, self._state = "", "", "lead"
        return events

    # one transition per call; False when more input is needed
    def _step(self, events: list, final: bool) -> bool:
        if self._state == "lead":
            stripped = self._buf.lstrip(_WS)
            if not stripped:
                if not self._calls:
                    self._ws += self._buf  # leading whitespace of the reply is kept with the text that follows
                self._buf = ""
                return False
            if not self._calls:
                self._ws += self._buf[: len(self._buf) - len(stripped)]
            self._buf = stripped
            self._state = "bare" if stripped[0] == "{" and self._bare_allowed else "text"
            return True
        if self._state == "text":
            return self._step_text(events, final)
        if self._state == "call":
            return self._step_call(events)
        if self._state == "bare":
            return self._step_bare(events, final)
        return False

    def _step_text(self, events: list, final: bool) -> bool:
        i = self._buf.find(OPEN)
        if i < 0:
            keep = 0 if final else _held_back(self._buf, OPEN)
            self._text(events, self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep:]
            return False
        self._text(events, self._buf[:i])
        self._ws = ""  # whitespace just before a call: the template writes its own
        self._buf = self._buf[i + len(OPEN):]
        self._state = "call"
        return True

    def _step_call(self, events: list) -> bool:
        end = _close_index(self._buf)
        if end < 0:
            return False
        body = self._buf[:end]
        self._buf = self._buf[end + len(CLOSE):]
        events.append(self._call(body, OPEN + body + CLOSE))
        self._calls += 1
        self._state = "lead"
        return True

    def _step_bare(self, events: list, final: bool) -> bool:
        head = self._buf.lstrip("{").lstrip(_WS)
        if head and head[0] not in '"{}':  # `{` then prose: cannot be a JSON call, so it is text
            self._state = "text"
            return True
        end = json_object_end(self._buf)
        if end < 0:
            return False
        candidate, self._buf = self._buf[:end], self._buf[end:]
        produced = self._judge_bare(candidate, final)
        events.extend(produced)
        if any(isinstance(e, ToolCallEvent) for e in produced):
            self._calls += 1
            self._state = "lead"
        else:
            self._state = "text"
        return True

    def _judge_bare(self, candidate: str, final: bool) -> list[OutputEvent]:
        """A closed (or, at the end, unfinished) bare object: a call, a malformed call, or plain text."""
        looks_like_call = '"name"' in candidate
        try:
            value = _decode(candidate)
        except HermesCallError as e:
            if not looks_like_call:
                return self._as_text(candidate)
            what = "unfinished" if final and json_object_end(candidate) < 0 else "malformed"
            return [ToolCallEvent(name=_guess_name(candidate), arguments=None, raw=candidate,
                                  error=f"could not parse the {what} tool call {candidate!r}: {e}. "
                                        f"Write calls as {_CALL_SHAPE}")]
        if not isinstance(value, dict) or "name" not in value:
            return self._as_text(candidate)
        return [self._call(candidate, candidate)]

    def _as_text(self, text: str) -> list[OutputEvent]:
        events: list[OutputEvent] = []
        self._text(events, text)
        return events

    def _text(self, events: list, text: str):
        if not text:
            return
        body = text.rstrip(_WS)
        if body:
            events.append(TextEvent(self._ws + body))
            self._ws = ""
        self._ws += text[len(body):]

    def _call(self, body: str, raw: str) -> ToolCallEvent:
        try:
            name, arguments = parse_call_body(body)
        except HermesCallError as e:
            return ToolCallEvent(name=_guess_name(body), arguments=None, raw=raw,
                                 error=f"could not parse tool call {raw!r}: {e}. Write calls as {_CALL_SHAPE}")
        if self._known is not None and name not in self._known:
            known = ", ".join(sorted(n for n in self._known if n)) or "none"
            return ToolCallEvent(name=name, arguments=arguments, raw=raw,
                                 error=f"unknown tool {name!r}; available tools: {known}")
        return ToolCallEvent(name=name, arguments=arguments, raw=raw, error=None)

    def _unclosed_call(self) -> ToolCallEvent:
        raw = OPEN + self._buf
        event = self._call(self._buf, raw)
        if event.error is None:
            return event  # complete JSON with the closing tag missing (the model stopped right after it): unambiguous
        return ToolCallEvent(name=event.name, arguments=None, raw=raw,
                             error=f"the tool call was not closed with {CLOSE}: {raw!r}. Write calls as {_CALL_SHAPE}")


def _guess_name(body: str) -> str:
    """The tool name of a call that failed to parse, when one is readable (helps address the error)."""
    at = body.find('"name"')
    if at < 0:
        return ""
    rest = body[at + 6:].lstrip(_WS)
    if not rest.startswith(":"):
        return ""
    rest = rest[1:].lstrip(_WS)
    if not rest.startswith('"'):
        return ""
    end = rest.find('"', 1)
    name = rest[1:end] if end > 0 else ""
    return name if name.replace("_", "a").replace(".", "a").replace("-", "a").isalnum() else ""
