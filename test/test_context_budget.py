"""A conversation that talks past the context window on the real engine (SmolLM2, n_ctx 384): the oldest turns are
dropped so every prompt fits with room for the reply; without the budget the same history fails the turn."""
from __future__ import annotations

import threading

import pytest

from bolt_ros.assistant.config import BackendConfig
from bolt_ros.assistant.conversation import Conversation, TurnRecord
from bolt_ros.assistant.embedded import EmbeddedBackend
from bolt_ros.assistant.tool_loop import ToolLoop

N_CTX, MAX_TOKENS = 384, 24
STORY = ("My robot friend, let me tell you about my day: I walked along the river, watched the boats and the ducks, "
         "bought bread at the bakery on the corner and then read a book about the history of clocks. ")


@pytest.fixture(scope="module")
def backend() -> EmbeddedBackend:
    return EmbeddedBackend.from_config(BackendConfig(model_path="smollm2", n_ctx=N_CTX, max_tokens=MAX_TOKENS,
                                                     temperature=0.0, seed=0))


def test_talking_past_the_window_drops_the_oldest_turns(backend):
    loop = ToolLoop(backend, lambda call, cancel: None, lambda ev: None, max_tool_rounds=0)
    conv = Conversation("You are a friendly robot. Answer in one short sentence.", max_messages=100)
    budget = backend.context_budget
    assert budget == N_CTX - MAX_TOKENS - 1
    dropped = False
    for i in range(7):
        before = len(conv.history)
        res = loop.run(conv, conv.user_message(f"({i}) {STORY}"), [], enable_thinking=False,
                       cancel=threading.Event())
        assert res.error == "" and res.text, f"turn {i}: {res.error}"
        assert res.stats["prompt_tokens"] <= budget, (i, res.stats["prompt_tokens"])
        dropped |= len(conv.history) < before  # a turn left the window
        conv.commit(res.messages)
    assert dropped and conv.history[0]["content"].startswith("(") and not conv.history[0]["content"].startswith("(0)")
    # negative control: the whole history no longer fits, so without the budget the turn would fail
    conv.history = [*conv.history, {"role": "user", "content": STORY * 3}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(ValueError, match="does not fit"):
        list(backend.stream_chat(conv.messages([conv.user_message(STORY)]), [], enable_thinking=False,
                                 cancel=threading.Event()))


def test_words_alone_longer_than_the_context_are_answered_and_the_conversation_goes_on(backend):
    """A person's words that cannot fit the context even alone (a pasted page) get the loop's spoken line, not an
    error; the turn after is answered as usual, and the page never becomes a fact about the person. Negative control:
    the engine itself refuses that prompt with its typed error (which the loop used to report as a failed turn)."""
    from bolt_ros.engine.errors import PromptTooLong
    events = []
    loop = ToolLoop(backend, lambda call, cancel: None, events.append, max_tool_rounds=0)
    conv = Conversation("You are a friendly robot. Answer in one short sentence.", history="memory")
    page = STORY * 12
    with pytest.raises(PromptTooLong) as e:
        list(backend.stream_chat(conv.messages([conv.user_message(page)]), [], enable_thinking=False,
                                 cancel=threading.Event()))
    assert e.value.n_tokens > N_CTX and e.value.n_ctx == N_CTX
    res = loop.run(conv, conv.user_message(page), [], enable_thinking=False, cancel=threading.Event())
    assert res.error == "" and res.text == ToolLoop.too_long[0] and res.stats["too_long_tokens"] > N_CTX
    assert [ev.text for ev in events if ev.kind == "sentence"] == [ToolLoop.too_long[0]]
    assert not [ev for ev in events if ev.kind == "error"]
    conv.commit(res.messages, TurnRecord(page, res.text, []))   # as the node commits a turn: its facts too
    assert conv.facts.facts == []  # a page is not a fact about the person
    res = loop.run(conv, conv.user_message("Hello, how are you?"), [], enable_thinking=False,
                   cancel=threading.Event())
    assert res.error == "" and res.text and res.text != ToolLoop.too_long[0]
