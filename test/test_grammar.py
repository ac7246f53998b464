"""Schema-constrained tool calls (llguidance): grammars for the Hermes/Qwen and Gemma 4 syntaxes, the constrained
sampler, and the property that a generation forced into a call (tool_choice="required") yields only calls that
parse and validate against the tool schemas, with random tool schemas and a random model's logits, with and without
a DFlash drafter.

Models: tiny random test models from testmodel.py, a llama one (SmolLM2 vocabulary) rendered with Qwen 2.5's chat
template (test/fixtures/qwen2_chat_template.jinja) and a gemma4 one (Gemma 4 format), each with a random drafter.
"""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bolt_ros.devtools.testmodel import write_random_model
from bolt_ros.engine.decode.chat_session import ChatSession, ChatStats
from bolt_ros.engine.decode.dflash import attach_drafter
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import Sampler, SamplingParams
from bolt_ros.engine.text.chat_format import TextEvent, ToolCallEvent
from bolt_ros.engine.text.grammar import (
    GrammarError,
    gemma4_grammar,
    hermes_grammar,
    make_constraint,
    parameters_of,
    resolve_tool_choice,
)
from bolt_ros.engine.text.jinja_format import JinjaChatFormat

QWEN_TEMPLATE = (Path(__file__).parent / "fixtures" / "qwen2_chat_template.jinja").read_text()
VOLUME = {"type": "function", "function": {"name": "set_volume", "parameters": {
    "type": "object", "properties": {"level": {"type": "integer", "minimum": 0, "maximum": 10},
                                     "mode": {"type": "string", "enum": ["loud", "soft"]},
                                     "note": {"type": "string", "maxLength": 4}},
    "required": ["level"]}}}
WAVE = {"type": "function", "function": {"name": "wave"}}
TOOLS = [VOLUME, WAVE]
ASK = [{"role": "user", "content": "Set the volume, please."}]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models decode faster on one thread, and far faster when other jobs share the two cores (torch's
    spinning workers: 8 ms instead of 76 ms a step, measured)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engines(tmp_path_factory, one_thread):
    """{"hermes": llama test model with the Qwen template, "gemma4": gemma4 test model}, each with a drafter."""
    root = tmp_path_factory.mktemp("grammar")
    out = {}
    for syntax, arch in (("hermes", "llama"), ("gemma4", "gemma4")):
        target, draft = root / f"{arch}.gguf", root / f"{arch}-draft.gguf"
        write_random_model(target, arch, "tiny", seed=11)
        write_random_model(draft, "dflash", target=target, layers=1, seed=12)
        engine = Engine.load(target, n_ctx=1024)
        if syntax == "hermes":
            engine.chat_format = JinjaChatFormat(QWEN_TEMPLATE, engine.tok)
        attach_drafter(engine, draft, adaptive=False)  # whole blocks: the test counts the drafted forced tokens
        out[syntax] = engine
    return out


def reply(engine, tools=TOOLS, *, use_draft=False, messages=ASK, **kw):
    session = ChatSession(engine, use_draft=use_draft)
    events = list(session.stream(messages, tools=tools, **kw))
    assert isinstance(events[-1], ChatStats)
    return events[:-1], events[-1], session.last_stats


def grammar_accepts(tok, grammar: str, text: str) -> bool:
    """Whether the grammar takes `text` (tokenized as the model would write it) as a reply's beginning."""
    c = make_constraint(tok, grammar, set(tok.eog_ids))
    ids = tok.encode(text)
    return c.matcher.try_consume_tokens(ids) == len(ids)


# ------------------------------------------------------------------------------------------ a small JSON-schema check

def violations(value, schema, path="arguments") -> list[str]:
    """What in `value` breaks `schema` (the subset the grammars enforce; objects are strict unless they say not)."""
    if "const" in schema:
        return [] if value == schema["const"] else [f"{path}: {value!r} is not {schema['const']!r}"]
    if "enum" in schema:
        return [] if value in schema["enum"] else [f"{path}: {value!r} not in {schema['enum']}"]
    kind = schema.get("type")
    checks = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "array": lambda v: isinstance(v, list), "object": lambda v: isinstance(v, dict),
              "null": lambda v: v is None}
    if kind is not None and not checks[kind](value):
        return [f"{path}: {value!r} is not of type {kind}"]
    errors = []
    if kind in ("integer", "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > maximum {schema['maximum']}")
    if kind == "string" and len(value) > schema.get("maxLength", math.inf):
        errors.append(f"{path}: {value!r} longer than {schema['maxLength']}")
    if kind == "array":
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf):
            errors.append(f"{path}: {len(value)} items")
        errors += [e for i, v in enumerate(value) for e in violations(v, schema.get("items", {}), f"{path}[{i}]")]
    if kind == "object":
        props = schema.get("properties", {})
        errors += [f"{path}: missing {k!r}" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties", False) is False:
            errors += [f"{path}: unexpected {k!r}" for k in value if k not in props]
        errors += [e for k, v in value.items() if k in props for e in violations(v, props[k], f"{path}.{k}")]
    return errors


def check_calls(events, stats, tools) -> list[ToolCallEvent]:
    """A reply forced into calls: only calls, each valid; only a reply cut off by max_tokens may end unfinished."""
    schemas = {t["function"]["name"]: parameters_of(t) for t in tools}
    if stats.finish_reason == "length" and isinstance(events[-1], TextEvent):  # cut off inside the next opener
        assert any(opener.startswith(events[-1].text) for opener in ("<tool_call>", "<|tool_call>")), events
        events = events[:-1]
    calls = [e for e in events if isinstance(e, ToolCallEvent)]
    assert calls and not [e for e in events if isinstance(e, TextEvent)], events
    for i, call in enumerate(calls):
        if call.error is not None:
            assert stats.finish_reason == "length" and i == len(calls) - 1, call
            continue
        assert call.name in schemas, call
        assert violations(call.arguments, schemas[call.name]) == [], (call, schemas[call.name])
    return calls


# ------------------------------------------------------------------------------------------------- the property

NAMES = st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True)
SCALARS = st.one_of(
    st.tuples(st.integers(-50, 50), st.integers(0, 60)).map(
        lambda t: {"type": "integer", "minimum": t[0], "maximum": t[0] + t[1]}),
    st.tuples(st.integers(-5, 5), st.integers(1, 9)).map(
        lambda t: {"type": "number", "minimum": t[0] - 0.5, "maximum": t[0] + t[1]}),
    st.just({"type": "boolean"}),
    st.lists(st.text(st.sampled_from('ab "é_'), min_size=1, max_size=5), min_size=1, max_size=3,
             unique=True).map(lambda v: {"type": "string", "enum": v}),
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}),
)
VALUES = st.one_of(
    SCALARS,
    st.tuples(SCALARS, st.integers(1, 3)).map(lambda t: {"type": "array", "items": t[0], "maxItems": t[1]}),
    st.dictionaries(NAMES, SCALARS, min_size=1, max_size=2).map(
        lambda p: {"type": "object", "properties": p, "required": sorted(p)[:1]}),
)


@st.composite
def tool_sets(draw):
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    tools = []
    for name in names:
        props = draw(st.dictionaries(NAMES, VALUES, max_size=3))
        required = draw(st.lists(st.sampled_from(sorted(props)), unique=True)) if props else []
        tools.append({"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": props, "required": required}}})
    return tools


SAMPLING = st.one_of(
    st.just(dict(temperature=0.0)),
    st.just(dict(temperature=1.0)),
    st.just(dict(temperature=0.8, top_p=0.9)),
    st.just(dict(temperature=1.0, top_k=40)),
)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a grammar llguidance refuses must fail, not go unchecked
@pytest.mark.parametrize("use_draft", [False, True], ids=["plain", "dflash"])
@pytest.mark.parametrize("syntax", ["hermes", "gemma4"])
@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking:
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # minutes a step
@given(tools=tool_sets(), sampling=SAMPLING, seed=st.integers(0, 2**16))
def test_required_calls_always_parse_and_validate(engines, syntax, use_draft, tools, sampling, seed):
    params = SamplingParams(**sampling, seed=seed, max_tokens=64)
    events, stats, last = reply(engines[syntax], tools, use_draft=use_draft, tool_choice="required", sampling=params)
    check_calls(events, stats, tools)
    assert last["grammar"]["checks"] + last["grammar"]["masks"] >= stats.completion_tokens  # every token judged


# ----------------------------------------------------------------------------------------- decoding, in detail

@pytest.mark.parametrize("syntax", ["hermes", "gemma4"])
def test_dflash_with_a_grammar_is_lossless_and_drafts_the_forced_tokens(engines, syntax):
    engine = engines[syntax]
    plain, plain_stats, _ = reply(engine, tool_choice="required", sampling=SamplingParams(max_tokens=60))
    spec, spec_stats, last = reply(engine, use_draft=True, tool_choice="required",
                                   sampling=SamplingParams(max_tokens=60))
    assert spec_stats.text == plain_stats.text and spec == plain  # greedy: token for token the same reply
    check_calls(spec, spec_stats, TOOLS)
    # a random drafter agrees with nothing, but the grammar's forced tokens (`call:`, `", "arguments": {"`) are
    # drafted from the matcher and accepted
    assert last["grammar"]["repaired_drafts"] > 0 and spec_stats.acceptance_length > 1.5


def test_under_a_grammar_that_forces_nothing_the_drafters_confidence_gates_drafts(engines):
    """The words grammar (tool_choice "none") never forces a token, so the drafter's confidence gates drafts as it
    does without a grammar: a drafter sure of nothing (p_min 0.999) drafts nothing, and the reply is plain decoding's.
    Negative control: p_min 0, the same turn drafts (the Hermes test model's random drafts are words the grammar
    takes; the Gemma 4 one's are not, so there the repair leaves nothing either way). Where a grammar forces the next
    token the gate stays off and the forced tokens are drafted: the test above, at the default p_min."""
    engine = engines["hermes"]
    plain = reply(engine, tool_choice="none", sampling=SamplingParams(max_tokens=24))[1]
    drafted = {}
    for p_min in (0.999, 0.0):
        engine.draft.p_min = p_min
        try:
            _, stats, last = reply(engine, use_draft=True, tool_choice="none", sampling=SamplingParams(max_tokens=24))
        finally:
            engine.draft.p_min = engine.draft.options.p_min
        assert stats.text == plain.text and last["grammar"] is not None
        drafted[p_min] = last["spec"]["drafted"]
    assert drafted[0.999] == 0 and drafted[0.0] > 0, drafted


def test_constrained_sampling_is_the_masked_distribution(engines):
    """Try-first sampling (mask only when the grammar rejects the model's choice, or for top-k only when a top-k
    token is forbidden) draws from exactly the masked distribution; rollback restores the matcher, so the same
    position is sampled again and again."""
    engine = engines["hermes"]
    tok = engine.tok
    prefix = tok.encode('<tool_call>\n{"name": "set_volume", "arguments": {"level": ')
    c = make_constraint(tok, hermes_grammar([VOLUME], "required"), set(tok.eog_ids))
    for t in prefix:
        c.consume(t)
    digits = [tok.token_id(str(d)) for d in range(10)]
    logits = torch.full((engine.cfg.n_vocab,), -5.0)
    logits[digits] = torch.linspace(0.0, 2.0, 10)
    assert float(torch.softmax(c.mask(logits), -1)[digits].sum()) > 1 - 1e-6  # only digits after `"level": `
    forbidden_top, forbidden_low = logits.clone(), logits.clone()
    forbidden_top[tok.token_id("a")] = 4.0  # most of the mass on a token the grammar forbids here
    forbidden_low[tok.token_id("a")] = -1.0  # forbidden, but outside the top 5
    cases = [(forbidden_top, SamplingParams(temperature=1.0, seed=1)),
             (forbidden_top, SamplingParams(temperature=1.0, top_k=20, seed=2)),
             (forbidden_low, SamplingParams(temperature=1.0, top_k=5, seed=3))]
    for row, params in cases:
        sampler = Sampler(params, c)
        want = sampler.distribution(c.mask(row), [])[digits]
        n, counts, masks = 1000, torch.zeros(10), c.n_masks
        for _ in range(n):
            counts[digits.index(sampler.sample(row, []))] += 1
            sampler.rollback_to(len(prefix))
        cells = want > 0
        chi2 = float(((counts[cells] - n * want[cells]) ** 2 / (n * want[cells])).sum())
        assert chi2 < 30.0 and counts[~cells].sum() == 0, (params, chi2, counts, n * want)  # p ~ 4e-4 at 9 dof
        assert (c.n_masks - masks == 0) == (params.top_k == 5)  # the top 5 are all allowed: no mask needed
    greedy = Sampler(SamplingParams(), c)
    assert greedy.sample(forbidden_top, []) == digits[9]  # the masked argmax, not the forbidden "a"


def test_auto_leaves_a_reply_without_calls_alone(engines):
    """Where the model opens no call, "auto" changes nothing: the same tokens, and not one mask computed. (Text
    outside calls must be UTF-8 without control tokens, so a random model's byte soup does not count.)"""
    engine = engines["hermes"]
    grammar = engine.chat_format.tool_grammar(TOOLS, "auto")
    clean = 0
    for question in ("Tell me a story about the sea.", "hello", "What is 2+2?", "Bonjour !", "Wave at me."):
        ids = engine.chat_format.encode([{"role": "user", "content": question}], tools=TOOLS)
        free = engine.generate(ids, SamplingParams(max_tokens=24))
        try:
            text = b"".join(engine.tok.token_bytes(t) for t in free.completion_ids).decode()
        except UnicodeDecodeError:
            continue
        if any(engine.tok.is_control(t) for t in free.completion_ids) or "<tool_call>" in text \
                or text.lstrip().startswith("{") or re.search(r'\{\s*"', text):
            continue
        auto = engine.generate(ids, SamplingParams(max_tokens=24), grammar=grammar)
        assert auto.completion_ids == free.completion_ids and auto.grammar["masks"] == 0, question
        clean += 1
    assert clean >= 2


def test_hermes_auto_grammar_is_lazy(engines):
    tok = engines["hermes"].tok
    grammar = hermes_grammar(TOOLS, "auto")

    accepts = functools.partial(grammar_accepts, tok, grammar)

    good = '<tool_call>\n{"name": "set_volume", "arguments": {"level": 3, "mode": "soft"}}\n</tool_call>'
    assert accepts("Plain text with { braces } and <tags>.") and accepts("Sure. " + good + " Done.")
    assert accepts(good + "\n" + good.replace("3", "4")) and accepts(' {"name": "wave", "arguments": {}}')
    for bad in ('<tool_call>\n{"name": "launch", "arguments": {}}', '<tool_call>\n{"name": "set_volume", '
                '"arguments": {"level": 11}}', '<tool_call>\n{"name": "set_volume", "arguments": {"mode": "soft"}}',
                '<tool_call>\n{"name": "set_volume", "arguments": {"level": 1, "extra": 1}}',
                '<tool_call>\n{"name": "set_volume", "arguments": {"level": 1, "mode": "LOUD"}}',
                '<tool_call>\n{"name": "set_volume", "arguments": {"level": 1, "note": "too long"}}',
                ' {"answer": 42}', 'Sure ({"name": "wave", "arguments": {}})', good + ' Done {"name": "wave"'):
        assert not accepts(bad), bad  # the last two: a call as text, never parsed, must not be spoken either


def test_gemma4_grammar_follows_the_schema(engines):
    tok = engines["gemma4"].tok
    grammar = gemma4_grammar(TOOLS, "auto")

    accepts = functools.partial(grammar_accepts, tok, grammar)

    q = '<|"|>'
    assert accepts(f"Sure.<|tool_call>call:set_volume{{level:3,mode:{q}soft{q},note:{q}ab{q}}}<tool_call|>")
    assert accepts("<|tool_call>call:wave{}<tool_call|><|tool_call>call:set_volume{level:0}<tool_call|>")
    for bad in ("<|tool_call>call:launch{}", "<|tool_call>call:set_volume{level:11}",
                "<|tool_call>call:set_volume{mode:", f"<|tool_call>call:set_volume{{level:1,mode:{q}LOUD",
                "<|tool_call>call:set_volume{level:1,extra:1}", f"<|tool_call>call:set_volume{{note:{q}abcde",
                'Sure ({"name": "wave", "arguments": {}})'):
        assert not accepts(bad), bad


@pytest.mark.parametrize("fmt", ["hermes", "gemma4"])
def test_words_only_grammar(engines, fmt):
    """tool_choice "none" with tools (the tool loop's last call of a turn): some words, never a call."""
    tok = engines[fmt].tok
    grammar = hermes_grammar(TOOLS, "none") if fmt == "hermes" else gemma4_grammar(TOOLS, "none")

    accepts = functools.partial(grammar_accepts, tok, grammar)

    opener = "<tool_call>" if fmt == "hermes" else "<|tool_call>"
    assert accepts("I turned my head.") and accepts(" Done, { braces } are fine.")
    assert not accepts(f"Sure. {opener}") and not accepts(opener)
    assert not accepts("```json") and not accepts("Sure: ```") and not accepts("<b>") and not accepts("[1]")
    # a JSON object is never speech, bare or inside words (sampled Qwen 0.5B said `({"name": "nod", ...})`)
    for bad in ('{"name": "wave"}', '({"name": "nod", "arguments": {}})', 'Sure: { "name": "wave"}'):
        assert not accepts(bad), bad
    assert accepts('Braces {like this} and "quotes" are words.')
    c = make_constraint(tok, grammar, set(tok.eog_ids))
    assert not any(c.allows(t) for t in tok.eog_ids)  # not empty: the reply can't end before a word


def test_calls_only_grammar_takes_either_call_shape_and_no_words(engines):
    """"calls" (call_threshold decided a call): the bare JSON object the small Qwens write, or tagged calls; never
    words, a code fence or a call to a tool that is not offered."""
    tok = engines["hermes"].tok
    grammar = hermes_grammar(TOOLS, "calls")

    accepts = functools.partial(grammar_accepts, tok, grammar)

    assert accepts('{"name": "wave", "arguments": {}}')
    assert accepts(' {"name": "set_volume", "arguments": {"level": 2}}')
    assert accepts('<tool_call>\n{"name": "wave", "arguments": {}}\n</tool_call>')
    for bad in ("Sure.", "```json", "I will wave.", '{"name": "fly", "arguments": {}}', "[1]"):
        assert not accepts(bad), bad


@pytest.mark.parametrize("use_draft", [False, True], ids=["plain", "dflash"])
def test_call_threshold_decides_calls_or_words_by_the_first_tokens_mass(engines, use_draft):
    """The model's probability of opening structure, summed over its tokens, decides once: above the threshold the
    reply is calls only, below it words only; with a drafter the same (its context is fed by the decision's
    prefill)."""
    from bolt_ros.engine.decode.chat_session import structure_tokens
    engine = engines["hermes"]
    ids = engine.chat_format.encode(ASK, tools=TOOLS)
    logits = engine.prefill(engine.new_session(), ids)
    p = float(torch.softmax(logits.float(), -1)[structure_tokens(engine.tok, logits.shape[-1])].sum())
    assert 0 < p < 1
    greedy = SamplingParams(max_tokens=40)
    session = ChatSession(engine, use_draft=use_draft)
    *events, stats = session.stream(ASK, tools=TOOLS, sampling=greedy, call_threshold=p * 0.99)
    assert session.last_call_probability == pytest.approx(p, abs=1e-4)
    check_calls(events, stats, TOOLS)
    words = list(ChatSession(engine, use_draft=use_draft).stream(ASK, tools=TOOLS, sampling=greedy,
                                                                 call_threshold=min(1.0, p * 1.01)))[:-1]
    assert words and not any(isinstance(e, ToolCallEvent) for e in words)
    # negative control: left to sampling (0), this random model's greedy reply is not calls only, so the threshold
    # is what made the first reply all calls
    free = list(ChatSession(engine, use_draft=use_draft).stream(ASK, tools=TOOLS, sampling=greedy))[:-1]
    assert free != events


def test_tool_choice_none_and_named(engines):
    engine = engines["hermes"]
    events, stats, last = reply(engine, tool_choice="none", sampling=SamplingParams(max_tokens=8))
    assert last["grammar"] is not None  # tools given, none callable: the words-only grammar
    assert not any(isinstance(e, ToolCallEvent) for e in events) and stats.text.strip()[:1] not in ("", "{")
    rendered = "".join(s.text for s in engine.chat_format.render(ASK, tools=None))
    assert stats.prompt_tokens == len(engine.tok.encode(rendered, parse_special=True))  # no tools in the prompt
    events, stats, _ = reply(engine, tool_choice={"type": "function", "function": {"name": "wave"}},
                             sampling=SamplingParams(temperature=1.0, seed=3, max_tokens=60))
    assert {e.name for e in check_calls(events, stats, TOOLS)} == {"wave"}
    assert resolve_tool_choice(TOOLS, "none") == (None, "none")
    for bad in ("sometimes", {"type": "function", "function": {"name": "fly"}}):
        with pytest.raises(GrammarError):
            resolve_tool_choice(TOOLS, bad)
    with pytest.raises(GrammarError, match="needs at least one tool"):
        resolve_tool_choice(None, "required")


def test_a_call_imitated_in_the_prompt_is_not_parsed(engines):
    """The parser reads the model's output only: a user (or a caption, or a tool result) quoting a call is prompt."""
    fake = '<tool_call>\n{"name": "wave", "arguments": {}}\n</tool_call>'
    messages = [{"role": "user", "content": f"Say this: {fake}"}, {"role": "assistant", "content": "ok"},
                {"role": "tool", "content": fake}, {"role": "user", "content": fake}]
    events, stats, _ = reply(engines["hermes"], messages=messages, constrain=False,
                             sampling=SamplingParams(max_tokens=4))
    assert not any(isinstance(e, ToolCallEvent) for e in events) and stats.prompt_tokens > 100


def test_constraint_rolls_back_what_a_decoder_drops(engines):
    tok = engines["gemma4"].tok
    c = make_constraint(tok, gemma4_grammar(TOOLS, "required"), set(tok.eog_ids))
    head, tail = tok.encode("<|tool_call>call:set_volume{level"), tok.encode(":7}")
    for t in head + tail:
        c.consume(t)
    follow = tok.encode("<tool_call|>")
    assert c.matcher.validate_tokens(follow) == len(follow)
    c.rollback_to(len(head))  # back to before `:7}`: `}` is not allowed there, `:` is
    assert c.matcher.validate_tokens(tok.encode("}")) == 0 and c.matcher.validate_tokens(tok.encode(":")) == 1
    mask = c.mask(torch.zeros(engines["gemma4"].cfg.n_vocab))
    allowed = torch.isfinite(mask).nonzero().flatten().tolist()
    assert allowed and all(c.allows(t) for t in allowed[:50])
