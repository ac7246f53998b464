"""Gemma 4 tool-call value syntax: `call:NAME{key:<|"|>text<|"|>,n:3,flag:true,obj:{...},arr:[...]}`.

The serializer mirrors the `format_argument` macro of the Gemma 4 chat template (llama.cpp
models/templates/gemma4.jinja): strings are wrapped in the single token `<|"|>` with no escaping, mapping
keys are sorted case-insensitively (jinja `dictsort`) and written bare (tool calls, tool responses) or
quoted (schemas, `escape_keys=True`), booleans are `true`/`false`, numbers are Python `repr`.
The parser accepts that syntax (llama.cpp `common/parsers/gemma4.cpp` grammar: keys `[^:}]+`, optional
whitespace after `{`, `[`, `,`, `:`) plus a few things models produce in practice: `<|"|>`-quoted keys,
JSON double-quoted strings and `null`.

Serialization yields `(text, is_markup)` parts so a chat format can keep data (which may come from users or
tools) out of trusted, control-token-parsed segments: only the `<|"|>` delimiters are markup.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator

QUOTE = '<|"|>'
CALL_PREFIX = "call:"

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_WS = " \t\r\n"

Part = tuple[str, bool]  # (text, is_markup)


class ToolCallSyntaxError(ValueError):
    """A tool call body that does not follow the `call:NAME{...}` syntax; the message says where."""


# ---------------------------------------------------------------------------------------------- serializer


def sorted_items(mapping: dict) -> list[tuple[str, object]]:
    """Items in jinja `dictsort` order (case-insensitive key sort, stable)."""
    return sorted(mapping.items(), key=lambda kv: kv[0].lower() if isinstance(kv[0], str) else kv[0])


def value_parts(value, *, escape_keys: bool = False) -> Iterator[Part]:
    """The template's `format_argument(value, escape_keys)` as (text, is_markup) parts."""
    if isinstance(value, str):
        yield QUOTE, True
        if value:
            yield value, False
        yield QUOTE, True
    elif isinstance(value, bool):
        yield ("true" if value else "false"), False
    elif value is None:
        # Python jinja would print "None"; the parsers (ours, llama.cpp's) read JSON `null`.
        yield "null", False
    elif isinstance(value, int):
        yield str(value), False
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"tool-call values must be finite numbers, got {value!r}")
        yield repr(value), False
    elif isinstance(value, dict):
        yield "{", False
        for i, (key, item) in enumerate(sorted_items(value)):
            if not isinstance(key, str):
                raise ValueError(f"tool-call object keys must be strings, got {key!r}")
            if i:
                yield ",", False
            if escape_keys:
                yield from value_parts(key)
            else:
                yield key, False
            yield ":", False
            yield from value_parts(item, escape_keys=escape_keys)
        yield "}", False
    elif isinstance(value, (list, tuple)):
        yield "[", False
        for i, item in enumerate(value):
            if i:
                yield ",", False
            yield from value_parts(item, escape_keys=escape_keys)
        yield "]", False
    else:
        raise ValueError(f"cannot write {type(value).__name__} value {value!r} in a Gemma 4 tool call")


def object_body_parts(mapping: dict) -> Iterator[Part]:
    """`key:value,...` of a top-level call/response object (bare keys, dictsort order), without braces."""
    for i, (key, item) in enumerate(sorted_items(mapping)):
        if i:
            yield ",", False
        yield str(key), False
        yield ":", False
        yield from value_parts(item)


def call_parts(name: str, arguments: dict) -> Iterator[Part]:
    """`call:NAME{...}` (without the `<|tool_call>` / `<tool_call|>` tokens around it)."""
    yield CALL_PREFIX, True
    yield name, False
    yield "{", False
    yield from object_body_parts(arguments)
    yield "}", False


def join_parts(parts) -> str:
    return "".join(text for text, _ in parts)


def format_value(value, *, escape_keys: bool = False) -> str:
    return join_parts(value_parts(value, escape_keys=escape_keys))


def format_call(name: str, arguments: dict) -> str:
    return join_parts(call_parts(name, arguments))


# ---------------------------------------------------------------------------------------------- parser


class _Reader:
    """Recursive-descent reader over one call body; every error names the offset and what was expected."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def fail(self, expected: str):
        snippet = self.text[self.pos : self.pos + 20]
        found = repr(snippet) if snippet else "end of call"
        raise ToolCallSyntaxError(f"expected {expected} at offset {self.pos}, found {found}")

    def skip_ws(self):
        while self.pos < len(self.text) and self.text[self.pos] in _WS:
            self.pos += 1

    def peek(self, literal: str) -> bool:
        return self.text.startswith(literal, self.pos)

    def expect(self, literal: str):
        if not self.peek(literal):
            self.fail(repr(literal))
        self.pos += len(literal)

    def value(self):
        self.skip_ws()
        if self.peek(QUOTE):
            return self.quoted()
        if self.peek('"'):
            return self.json_string()
        if self.peek("{"):
            return self.mapping()
        if self.peek("["):
            return self.array()
        for word, val in (("true", True), ("false", False), ("null", None)):
            if self.peek(word):
                self.pos += len(word)
                return val
        match = _NUMBER.match(self.text, self.pos)
        if match:
            self.pos = match.end()
            token = match.group()
            return float(token) if any(c in token for c in ".eE") else int(token)
        self.fail('a value (<|"|>string<|"|>, number, true, false, null, {...} or [...])')

    def quoted(self) -> str:
        start = self.pos + len(QUOTE)
        end = self.text.find(QUOTE, start)
        if end < 0:
            self.fail('a closing <|"|> for the string')
        self.pos = end + len(QUOTE)
        return self.text[start:end]

    def json_string(self) -> str:
        try:
            val, end = json.JSONDecoder().raw_decode(self.text, self.pos)
        except json.JSONDecodeError:
            self.fail("a well-formed string")
        self.pos = end
        return val

    def key(self) -> str:
        self.skip_ws()
        if self.peek(QUOTE):
            return self.quoted()
        if self.peek('"'):
            return self.json_string()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ":}":
            self.pos += 1
        key = self.text[start : self.pos].strip()
        if not key:
            self.pos = start
            self.fail("a key")
        if any(c in key for c in ",{[") or QUOTE in key:
            self.pos = start
            self.fail("a key (letters, digits, _ ...) followed by ':'")
        return key

    def mapping(self) -> dict:
        self.expect("{")
        out: dict = {}
        self.skip_ws()
        if self.peek("}"):
            self.pos += 1
            return out
        while True:
            key = self.key()
            self.skip_ws()
            self.expect(":")
            out[key] = self.value()
            self.skip_ws()
            if self.peek(","):
                self.pos += 1
                continue
            if self.peek("}"):
                self.pos += 1
                return out
            self.fail("',' or '}'")

    def array(self) -> list:
        self.expect("[")
        out: list = []
        self.skip_ws()
        if self.peek("]"):
            self.pos += 1
            return out
        while True:
            out.append(self.value())
            self.skip_ws()
            if self.peek(","):
                self.pos += 1
                continue
            if self.peek("]"):
                self.pos += 1
                return out
            self.fail("',' or ']'")


def parse_value(text: str):
    """Parse one value in tool-call syntax (the whole text must be consumed)."""
    reader = _Reader(text)
    val = reader.value()
    reader.skip_ws()
    if reader.pos != len(text):
        reader.fail("end of value")
    return val


def parse_call(body: str) -> tuple[str, dict]:
    """Parse `call:NAME{...}` (the text between `<|tool_call>` and `<tool_call|>`) into (name, arguments).

    Raises ToolCallSyntaxError with the offset and what was expected.
    """
    reader = _Reader(body)
    reader.skip_ws()
    reader.expect(CALL_PREFIX)
    brace = body.find("{", reader.pos)
    if brace < 0:
        raise ToolCallSyntaxError(f"expected '{{' after the tool name in {body[:60]!r}")
    name = body[reader.pos : brace].strip()
    if not _NAME.fullmatch(name):
        raise ToolCallSyntaxError(f"invalid tool name {name!r}")
    reader.pos = brace
    arguments = reader.mapping()
    reader.skip_ws()
    if reader.pos != len(body):
        reader.fail("end of call after the closing '}'")
    return name, arguments


def find_call_end(text: str, start: int, end_marker: str) -> int:
    """Index of `end_marker` in `text[start:]` that is not inside a `<|"|>` string, or -1."""
    pos, in_string = start, False
    while True:
        q = text.find(QUOTE, pos)
        e = -1 if in_string else text.find(end_marker, pos)
        if e >= 0 and (q < 0 or e < q):
            return e
        if q < 0:
            return -1
        in_string = not in_string
        pos = q + len(QUOTE)
