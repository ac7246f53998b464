"""Schema-constrained tool calls with llguidance: grammars from the declared tools, a token matcher per generation.

Grammars (Lark, llguidance dialect) cover a whole reply and are *lazy*: text is free until the model opens a call, then
the call must name a declared tool and its arguments must follow that tool's JSON schema (types, required keys,
`enum`/`const`, numeric minimum/maximum, string/array lengths; objects without `additionalProperties` get none, as with
OpenAI's strict mode). Two syntaxes:
  * Hermes / Qwen 2.5 (`hermes_grammar`): `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, with JSON
    written the way the template's `tojson` writes history (", " and ": ", no other whitespace); in "auto" a reply
    whose first non-space character is `{` must be a bare JSON call (what the small Qwen models do);
  * Gemma 4 (`gemma4_grammar`): `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:3}<tool_call|>`, keys in the
    template's sorted order.
"required" forces a call from the first token (no thought before it), "calls" too in either Hermes shape (for
ChatSession's call_threshold); "none" offers no tools, and `words_grammar` keeps the reply to words: no call opener
anywhere, no bare JSON call, not empty (the tool loop's ask when a turn must end in speech).

At run time a `Constraint` (one llguidance matcher) rides on the Sampler. Checking a sampled token costs ~2 us, a full
vocabulary mask 0.1-2 ms (49k-262k tokens), so the sampler tries the model's own choice first and masks only if the
grammar rejects it: exactly the masked distribution (Sampler.sample). Every sampled token is committed, so plain
decoding and DFlash verification (each drafted row sampled in turn) advance the matcher alike, an accepted draft always
satisfies the grammar, and a run cut short rolls the matcher back.
"""
from __future__ import annotations

import json
import re
import time
import warnings
import weakref
from typing import Any

import numpy as np
import torch

from bolt_ros.engine.text.tokenizer import UNUSED, Tokenizer

TOOL_CHOICES = ("auto", "required", "none")
# JSON as json.dumps (and so the templates' `tojson`) writes it: the model then sees its own calls in the history
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ", "lenient": True}


class GrammarError(ValueError):
    """A grammar llguidance rejects, or a tool_choice that cannot be honoured."""


# ---------------------------------------------------------------------------------------------- tools and schemas

def function_of(tool: dict) -> dict:
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise GrammarError(f"tool declaration needs function.name: {tool!r}")
    return fn


def resolve_tool_choice(tools: list[dict] | None, tool_choice: str | dict | None) -> tuple[list[dict] | None, str]:
    """(the tools calls may use, mode "auto" | "required" | "none"). OpenAI's {"type": "function", "function":
    {"name": N}} forces that one tool."""
    tools = list(tools) if tools else None
    if tool_choice is None:
        tool_choice = "auto"
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        chosen = [t for t in tools or [] if function_of(t)["name"] == name]
        if not chosen:
            raise GrammarError(f"tool_choice names tool {name!r}, which is not among the tools offered")
        return chosen, "required"
    if tool_choice not in TOOL_CHOICES:
        raise GrammarError(f"tool_choice must be one of {TOOL_CHOICES} or {{'type': 'function', 'function': "
                           f"{{'name': ...}}}}, got {tool_choice!r}")
    if tool_choice == "required" and not tools:
        raise GrammarError("tool_choice='required' needs at least one tool")
    return (None if tool_choice == "none" else tools), tool_choice


def strict_schema(schema: Any) -> Any:
    """A copy of a JSON schema in which objects that do not say otherwise allow no extra keys."""
    if isinstance(schema, list):
        return [strict_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict_schema(v) for k, v in schema.items()}
    if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def parameters_of(tool: dict) -> dict:
    params = function_of(tool).get("parameters") or {}
    params = {"type": "object", **params} if "type" not in params else params
    return strict_schema(params)


def lark_literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------- Hermes / Qwen

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"


def hermes_call_schema(tools: list[dict]) -> dict:
    calls = [{"type": "object", "properties": {"name": {"const": function_of(t)["name"]},
                                               "arguments": parameters_of(t)},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    return {"anyOf": calls, "x-guidance": JSON_STYLE}


# Spoken text never holds a JSON object: `{` then `"` is how a call written as text starts (sampled Qwen 0.5B said
# `({"name": "nod", "arguments": {}})` after a nod), while braces around words stay allowed.
NO_JSON = r'~/(?s:.*)\{[ \t\r\n]*"(?s:.*)/'


def words_grammar(opener: str, bare_json: bool) -> str:
    """A reply of words only: some non-space text, without `opener`, a code fence or a JSON object anywhere, not
    opening with a bracket (bare_json: nor `{`). Held only to "no call", Qwen2.5 0.5B answered tool results with
    "```json"."""
    first = r"[ \t\r\n]*[^ \t\r\n{<\[`]" if bare_json else r"[ \t\r\n]*[^ \t\r\n<\[`]"
    banned = re.escape(opener).replace("/", "\\/")
    return (f"%llguidance {{}}\nstart: WORDS\n"
            f"WORDS: /{first}(?s:.*)/ & ~/(?s:.*)({banned}|```)(?s:.*)/ & {NO_JSON}\n")


def hermes_grammar(tools: list[dict], mode: str = "auto") -> str:
    """The whole reply for a Hermes-style template (see the module docstring)."""
    if mode == "none":
        return words_grammar(HERMES_OPEN, bare_json=True)
    schema = json.dumps(hermes_call_schema(tools), ensure_ascii=False)
    common = f"""
call_json: %json {schema}
body: "\\n" call_json "\\n{HERMES_CLOSE}"
TEXT: /(?s:.*)/ & {NO_JSON}
"""
    if mode == "required":  # the trained shape: calls one per block, a newline between blocks
        return f'%llguidance {{}}\nstart: "{HERMES_OPEN}" body ("\\n{HERMES_OPEN}" body)*\n' + common
    if mode == "calls":  # either shape (bare, as small Qwens write, or tagged); bounded spaces: no endless blanks
        return f"""%llguidance {{}}\nstart: bare_reply | "{HERMES_OPEN}" body ("\\n{HERMES_OPEN}" body)*
bare_reply: WS? call_json ("\\n" call_json)* WS?\nWS: /[ \\t\\r\\n]{{1,2}}/\n""" + common
    # TEXT0: a first text that does not open with `{` (that opens a bare call instead); lazy heads end at the opener
    return f"""%llguidance {{}}
start: bare_reply | TEXT0 | head0 body (head body)* TEXT
bare_reply: WS? call_json ("\\n" call_json)* WS?
head0[lazy]: TEXT0 "{HERMES_OPEN}"
head[lazy]: TEXT "{HERMES_OPEN}"
TEXT0: /(?s:.*)/ & ~/[ \\t\\r\\n]*\\{{(?s:.*)/ & {NO_JSON}
WS: /[ \\t\\r\\n]+/
""" + common


# ---------------------------------------------------------------------------------------------- Gemma 4

G4_OPEN, G4_CLOSE, G4_QUOTE = "<|tool_call>", "<tool_call|>", '<|"|>'
_G4_ANY = r"""
g4_any: G4_STR | G4_NUM | "true" | "false" | "null" | g4_obj | g4_arr
g4_obj: "{" (G4_KEY ":" g4_any ("," G4_KEY ":" g4_any)*)? "}"
g4_arr: "[" (g4_any ("," g4_any)*)? "]"
G4_KEY: /[A-Za-z_][A-Za-z0-9_]*/
G4_NUM: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
G4_STR: "<|\"|>" (/(?s:.)*/ & ~/(?s:.)*<\|"\|>(?s:.)*/) "<|\"|>"
"""


class _Gemma4Rules:
    """Lark rules for Gemma 4 values (tool_calls.py syntax) that follow a JSON schema; unknown shapes get any value."""

    def __init__(self):
        self.rules: list[str] = []
        self.uses_any = False

    def rule(self, body: str, upper: bool = False) -> str:
        name = f"{'G4T' if upper else 'g4r'}{len(self.rules)}"
        self.rules.append(f"{name}: {body}")
        return name

    def value(self, s: Any) -> str:
        if not isinstance(s, dict):
            return self.any()
        if "const" in s or "enum" in s:
            from bolt_ros.engine.text.tool_calls import format_value
            values = [s["const"]] if "const" in s else list(s["enum"])
            return self.rule(" | ".join(lark_literal(format_value(v)) for v in values))
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list) and s[key]:
                return self.rule(" | ".join(self.value(x) for x in s[key]))
        kind = s.get("type")
        if isinstance(kind, list):
            return self.rule(" | ".join(self.value({**s, "type": k}) for k in kind))
        if kind == "string":
            lo, hi = int(s.get("minLength", 0)), s.get("maxLength")
            rep = f"{{{lo},{int(hi)}}}" if hi is not None else f"{{{lo},}}"
            return self.rule(f'"<|\\"|>" (/(?s:.){rep}/ & ~/(?s:.)*<\\|"\\|>(?s:.)*/) "<|\\"|>"', upper=True)
        if kind in ("integer", "number"):  # Gemma 4 numbers are JSON numbers: llguidance's JSON does the bounds
            keys = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
            num = {"type": kind, **{k: s[k] for k in keys if k in s}, "x-guidance": JSON_STYLE}
            return self.rule(f"%json {json.dumps(num)}")
        if kind == "boolean":
            return self.rule('"true" | "false"')
        if kind == "null":
            return self.rule('"null"')
        if kind == "array":
            return self.array(s)
        if kind == "object" or "properties" in s:
            props = s.get("properties")
            if not props and s.get("additionalProperties") is not False:
                return self.any()
            return self.rule(f'"{{" {self.members(s)} "}}"')
        return self.any()

    def any(self) -> str:
        self.uses_any = True
        return "g4_any"

    def array(self, s: dict) -> str:
        item = self.value(s.get("items"))
        lo, hi = int(s.get("minItems", 0)), s.get("maxItems")
        if hi is not None and int(hi) == 0:
            return self.rule('"[]"')
        more = "" if hi is not None and int(hi) == 1 else \
            f' ("," {item}){{{max(lo - 1, 0)},{int(hi) - 1 if hi is not None else ""}}}'  # llguidance refuses {0,0}
        body = f"{item}{more}" if lo > 0 else f"({item}{more})?"
        return self.rule(f'"[" {body} "]"')

    def members(self, s: dict) -> str:
        """`key:value,...` in the template's dictsort order; optional keys may be left out (commas stay right)."""
        from bolt_ros.engine.text.tool_calls import sorted_items
        required = set(s.get("required") or [])
        items = [(k, v) for k, v in sorted_items(s.get("properties") or {})]
        after: dict[bool, str | None] = {True: None, False: None}  # rule for the keys that follow, by "first"
        for key, schema in reversed(items):
            kv = f"{lark_literal(key + ':')} {self.value(schema)}"
            now: dict[bool, str | None] = {}
            for first in (True, False):
                seq = " ".join(x for x in ('"," ' if not first else "", kv, after[False] or "") if x)
                if key in required:
                    now[first] = self.rule(seq)
                elif after[first] is None:
                    now[first] = self.rule(f"({seq})?")
                else:
                    now[first] = self.rule(f"{seq} | {after[first]}")
            after = now
        return after[True] or ""


def gemma4_grammar(tools: list[dict], mode: str = "auto") -> str:
    if mode == "none":
        return words_grammar(G4_OPEN, bare_json=False)
    rules = _Gemma4Rules()
    calls = []
    for tool in tools:
        name = function_of(tool)["name"]
        calls.append(f'{lark_literal(f"call:{name}{{")} {rules.members(parameters_of(tool))} "}}"')
    top = "%llguidance {}\n"
    if mode in ("required", "calls"):  # from the first token: with thinking on, no thought before the calls
        top += f'start: "{G4_OPEN}" call ("{G4_OPEN}" call)*\n'
    else:
        top += f'start: (head call)* TEXT\nhead[lazy]: TEXT "{G4_OPEN}"\nTEXT: /(?s:.*)/ & {NO_JSON}\n'
    top += f'call: ({" | ".join(calls)}) "{G4_CLOSE}"\n'
    return top + "\n".join(rules.rules) + "\n" + (_G4_ANY if rules.uses_any else "")


# ---------------------------------------------------------------------------------------------- the tokenizer side

_LLTOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Vocab:
    """What llguidance's TokenizerWrapper reads: token byte strings (special ones behind 0xFF) and a text encoder."""

    def __init__(self, tok: Tokenizer, stop_ids: set[int]):
        self.tok = tok
        self.eos_token_id = tok.eos_id if tok.eos_id is not None else min(stop_ids)
        self.bos_token_id = tok.bos_id
        # Control, unused and stop tokens are special: grammar text can never produce them (a stop token is allowed
        # only where the grammar may end). USER_DEFINED ones (`<tool_call>`, Gemma 4's `<|"|>`) stay text, so a
        # marker matches whether the model writes its single token or spells it out, as the parsers read it.
        special = set(tok.control_ids) | set(stop_ids)
        special |= {i for i in range(tok.vocab_size) if tok.token_type(i) == UNUSED}
        self.special_token_ids = sorted(special)
        self.tokens = [b"\xff" + tok.token_bytes(i) if i in special else tok.token_bytes(i)
                       for i in range(tok.vocab_size)]

    def __call__(self, text):
        """Tokens for text the grammar forces (markup like `<tool_call>`): as the model writes it, with the single
        markup token (plain encoding spells it out, for prompt safety), but never a control token."""
        if not isinstance(text, str):
            raise TypeError("text only")  # makes TokenizerWrapper hand us str
        ids = self.tok.encode(text, parse_special=True)
        return self.tok.encode(text) if any(self.tok.is_control(i) for i in ids) else ids


def lltokenizer(tok: Tokenizer, stop_ids: set[int]):
    """llguidance's view of our tokenizer (built once per tokenizer and stop set: ~0.5 s for 49k tokens)."""
    import llguidance

    per_tok = _LLTOKENIZERS.setdefault(tok, {})
    key = tuple(sorted(i for i in stop_ids if 0 <= i < tok.vocab_size))
    if key not in per_tok:
        per_tok[key] = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocab(tok, set(key))),
                                              eos_token=list(key))
    return per_tok[key]


# ---------------------------------------------------------------------------------------------- the matcher side

class Constraint:
    """One generation's grammar state: which tokens may come next, what has been committed, and rollback."""

    def __init__(self, matcher, n_vocab: int, stop_ids: set[int]):
        self.matcher, self.n_vocab = matcher, n_vocab
        self.stop_ids = sorted(stop_ids)
        self.active = True  # False once the grammar is done (stopped) or broken: decoding goes on unconstrained
        self._consumed: list[bool] = []  # per sampled token: whether the matcher took it (for rollback)
        self._words = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
        self.n_checks = self.n_masks = self.n_repaired = 0
        self.check_s = self.mask_s = 0.0

    def allows(self, token: int) -> bool:
        t0 = time.perf_counter()
        ok = 0 <= token < self.n_vocab and self.matcher.validate_tokens([token]) == 1
        self.check_s, self.n_checks = self.check_s + time.perf_counter() - t0, self.n_checks + 1
        return ok

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """logits with every token the grammar forbids next set to -inf (rows past the vocabulary too)."""
        t0 = time.perf_counter()
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        if not self._words.any():  # nothing allowed (a broken grammar): let it stop rather than produce NaNs
            bits = self._words.view(np.uint32)
            for i in self.stop_ids:
                bits[i // 32] |= np.uint32(1 << (i % 32))
        n = min(self.n_vocab, logits.shape[-1])  # a head trimmed to the real vocabulary may be shorter
        forbidden = np.unpackbits(np.invert(self._words).view(np.uint8), count=n, bitorder="little")
        out = logits.clone()
        out[:n].masked_fill_(torch.from_numpy(forbidden.view(np.bool_)).to(out.device), float("-inf"))
        out[n:] = float("-inf")
        self.mask_s, self.n_masks = self.mask_s + time.perf_counter() - t0, self.n_masks + 1
        return out

    def forces_next(self) -> bool:
        """Whether the grammar forces the next token (JSON scaffolding); the words grammar never does."""
        return self.active and not self.matcher.is_stopped() and bool(self.matcher.compute_ff_tokens())

    def repair_drafts(self, drafts: list[int]) -> list[int]:
        """Drafts worth verifying: the prefix the grammar accepts, then the tokens it forces from there (JSON
        scaffolding like `", "arguments": {"`); drafts after the first invalid one could never be accepted."""
        if not self.active or not drafts or self.matcher.is_stopped():
            return drafts
        k = self.matcher.validate_tokens(drafts)
        if k == len(drafts):
            return drafts
        self.matcher.consume_tokens(drafts[:k])
        forced = self.matcher.compute_ff_tokens()
        self.matcher.rollback(k)
        self.n_repaired += 1
        return drafts[:k] + forced[: len(drafts) - k]

    def consume(self, token: int) -> None:
        took = False
        if self.active:
            if self.matcher.is_stopped():
                self.active = False  # the grammar ended (the stop token came): the rest is not ours to judge
            elif self.matcher.consume_token(token):
                took = True
            else:
                self.active = False
                warnings.warn(f"tool-call grammar rejected token {token}: {self.matcher.get_error()[:200]}; "
                              "decoding the rest of this reply unconstrained", RuntimeWarning, stacklevel=2)
        self._consumed.append(took)

    def rollback_to(self, n_tokens: int) -> None:
        """Forget the sampled tokens after the first n_tokens (the decoder dropped them)."""
        dropped = self._consumed[n_tokens:]
        del self._consumed[n_tokens:]
        if any(dropped):
            self.matcher.rollback(sum(dropped))
            self.active = not self.matcher.is_error()

    def stats(self) -> dict:
        return {"checks": self.n_checks, "masks": self.n_masks, "repaired_drafts": self.n_repaired,
                "check_us": round(1e6 * self.check_s / self.n_checks, 2) if self.n_checks else 0.0,
                "mask_us": round(1e6 * self.mask_s / self.n_masks, 2) if self.n_masks else 0.0,
                "total_ms": round(1e3 * (self.check_s + self.mask_s), 3)}


def make_constraint(tok: Tokenizer, grammar: str, stop_ids: set[int]) -> Constraint | None:
    """A matcher for one generation. Without llguidance, or with a grammar it refuses, decoding is unconstrained
    (the parsers still report bad calls as errors), with a warning: a tool schema must not take the robot down."""
    try:
        import llguidance
    except ImportError:
        warnings.warn("llguidance is not installed: tool calls are not schema checked", RuntimeWarning, stacklevel=2)
        return None
    stops = {i for i in stop_ids if 0 <= i < tok.vocab_size}
    lt = lltokenizer(tok, stops)
    matcher = llguidance.LLMatcher(lt, grammar, log_level=0)
    if matcher.is_error():
        warnings.warn(f"tool-call grammar refused by llguidance ({matcher.get_error()[:300]}); decoding "
                      "unconstrained", RuntimeWarning, stacklevel=2)
        return None
    return Constraint(matcher, tok.vocab_size, stops)
