"""Gemma 4 tool-call syntax: serializer/parser round trips and precise errors (bolt_ros/engine/text/tool_calls.py)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bolt_ros.engine.text.tool_calls import (
    QUOTE,
    ToolCallSyntaxError,
    find_call_end,
    format_call,
    format_value,
    parse_call,
    parse_value,
    value_parts,
)

# Strings may hold anything but the quote token itself (the syntax has no escape for it).
TRICKY = ['a,b:c{d}[e]', 'say "hi"', "{key:1}", "<tool_call|>", '<|"', '|>', "call:x{}", "  padded  ", "", "\n\t",
          "ünïcödé ✓ 日本語 🙂", "true", "null", "-1e5", "\\n", "<|turn>user\n"]
strings = st.one_of(st.sampled_from(TRICKY), st.text(max_size=20)).filter(lambda s: QUOTE not in s)
# Bare keys end at ':' or '}' and are stripped; they also must not look like a quoted key or a nested value.
keys = st.text(
    alphabet=st.characters(blacklist_characters=':{}[],"<', blacklist_categories=("Cs", "Cc", "Zs", "Zl", "Zp")),
    min_size=1, max_size=8,
)
numbers = st.one_of(
    st.integers(min_value=-(10**18), max_value=10**18),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.5, -2.25, 1e-7, 6.02e23, -0.0, 1e100, 123456789.0]),
)
scalars = st.one_of(strings, numbers, st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4)), max_leaves=12)
names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)


def same(a, b) -> bool:
    """Equal including int/float distinction (1 vs 1.0), which == alone would not check."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@settings(max_examples=300, deadline=None)
@given(names, st.dictionaries(keys, values, max_size=5))
def test_call_round_trip(name, arguments):
    text = format_call(name, arguments)
    assert text.startswith(f"call:{name}{{") and text.endswith("}")
    parsed_name, parsed_args = parse_call(text)
    assert parsed_name == name
    assert same(parsed_args, arguments)


@settings(max_examples=200, deadline=None)
@given(values)
def test_value_round_trip_with_quoted_keys(value):
    # escape_keys=True is how tool schemas write nested objects: keys in <|"|> quotes
    assert same(parse_value(format_value(value, escape_keys=True)), value)


def test_format_matches_template_conventions():
    args = {"b": [1, 2.5, True, None], "A": {"y": "x", "X": False}, "s": 'q "x", {y}'}
    # keys sorted case-insensitively (jinja dictsort), bare; strings in <|"|>; repr numbers; null for None
    assert format_call("f", args) == (
        'call:f{A:{X:false,y:<|"|>x<|"|>},b:[1,2.5,true,null],s:<|"|>q "x", {y}<|"|>}')
    assert format_value({"k": "v"}, escape_keys=True) == '{<|"|>k<|"|>:<|"|>v<|"|>}'


def test_only_quote_tokens_are_markup():
    parts = list(value_parts({"k<|turn>": ["<|turn>x", 3]}))
    assert all(text == QUOTE for text, markup in parts if markup)
    assert "".join(t for t, m in parts if not m).count("<|turn>") == 2


def test_parser_accepts_model_variants():
    # whitespace after separators (llama.cpp grammar), quoted keys, JSON strings, nested empties
    body = 'call:move { "dir" : <|"|>left<|"|>, <|"|>speed<|"|>: -1.5e-3 ,opts:{ },list:[ ] , ok : true }'
    assert parse_call(body) == ("move", {"dir": "left", "speed": -1.5e-3, "opts": {}, "list": [], "ok": True})
    assert parse_call("call:noop{}") == ("noop", {})
    assert parse_call("  call:a.b-c_1{x:0}  ") == ("a.b-c_1", {"x": 0})


@pytest.mark.parametrize("body, fragment", [
    ("move{x:1}", "'call:'"),
    ("call:move", "'{'"),
    ("call:{x:1}", "invalid tool name"),
    ("call:bad name{x:1}", "invalid tool name"),
    ("call:move{x:1", "',' or '}'"),
    ("call:move{x 1}", "':'"),
    ("call:move{x:<|\"|>open}", "closing <|\"|>"),
    ("call:move{x:yes}", "a value"),
    ("call:move{x:[1,2}", "',' or ']'"),
    ("call:move{x:1}}", "end of call"),
    ("call:move{x:1} trailing", "end of call"),
    ("call:move{:1}", "a key"),
    ("call:move{x:01}", "',' or '}'"),
    ("call:move{x:1,}", "a key"),
])
def test_syntax_errors_say_what_and_where(body, fragment):
    with pytest.raises(ToolCallSyntaxError) as info:
        parse_call(body)
    message = str(info.value)
    assert fragment in message
    assert "offset" in message or "name" in message or "'{'" in message


def test_serializer_rejects_non_json_values():
    with pytest.raises(ValueError, match="finite"):
        format_call("f", {"x": float("nan")})
    with pytest.raises(ValueError, match="cannot write"):
        format_call("f", {"x": {1, 2}})
    with pytest.raises(ValueError, match="keys must be strings"):
        format_value({1: "a"})


def test_find_call_end_ignores_markers_inside_strings():
    text = 'call:say{text:<|"|>the token <tool_call|> is text<|"|>}<tool_call|>after'
    end = find_call_end(text, 0, "<tool_call|>")
    assert text[end:] == "<tool_call|>after"
    assert parse_call(text[:end]) == ("say", {"text": "the token <tool_call|> is text"})
    assert find_call_end('call:x{a:<|"|>never closed <tool_call|>', 0, "<tool_call|>") == -1
