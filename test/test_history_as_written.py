"""Calls the model wrote as bare JSON go back into its prompt as it wrote them (EmbeddedBackend._as_written), on the
real default chat model, greedy, through the real tool loop: the conversation `make run` had, where the fifth
request ("dance for me!") got words and no call once the earlier calls were re-rendered in the template's
`<tool_call>` tags, a form this model does not write."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from bolt_ros.assistant.config import BackendConfig
from bolt_ros.assistant.conversation import Conversation
from bolt_ros.assistant.embedded import EmbeddedBackend
from bolt_ros.assistant.tool_loop import ToolLoop
from bolt_ros.assistant.tools import ToolOutcome
from bolt_ros.engine.text.chat_format import ToolCallEvent
from bolt_ros.train.prompts import assistant_messages

TURNS = ["please nod", "look to your left", "hello, who are you?", "[a person waving at the robot]\nwhat do you see?",
         "dance for me!"]


@pytest.fixture(scope="module")
def backend() -> EmbeddedBackend:
    return EmbeddedBackend.from_config(BackendConfig(model_path="default-chat", temperature=0.0, seed=0,
                                                     max_tokens=48))


def _converse(backend) -> tuple[list[list[str]], Conversation]:
    messages, tools = assistant_messages("")

    def call_tool(call, cancel):
        return ToolOutcome(call.id, call.name, True, content=json.dumps({"status": "succeeded"}))

    loop = ToolLoop(backend, call_tool, lambda ev: None, max_tool_rounds=2)
    conv = Conversation(messages[0]["content"], max_messages=16)
    calls = []
    for utterance in TURNS:
        res = loop.run(conv, conv.user_message(utterance), tools, enable_thinking=False, cancel=threading.Event())
        assert res.error == "", res.error
        calls.append([c.name for c in res.tool_calls])
        conv.commit(res.messages)
    return calls, conv


def _p_call(backend, messages, tools) -> float:
    """The probability that the reply opens with a call (a bare `{"` or the `<tool_call>` tag), temperature 1."""
    engine = backend.engine
    ids = engine.tok.encode_segments(engine.chat_format.render(messages, tools=tools), add_bos=engine.tok.add_bos)
    p = torch.softmax(engine.prefill(engine.new_session(), ids).float(), -1)
    return float(p[engine.tok.token_id('{"')] + p[engine.tok.token_id("<tool_call>")])


def test_bare_calls_go_back_as_written(backend):
    calls, conv = _converse(backend)
    assert calls[0] == ["nod"] and calls[1] == ["look_left"] and calls[4] == ["dance"], calls
    rendered = "".join(s.text for s in backend.engine.chat_format.render(backend._as_written(conv.messages()),
                                                                         tools=None))
    assert '{"name": "nod", "arguments": {}}' in rendered and "<tool_call>" not in rendered
    # the fifth request again, after the first four turns: how likely a call is, as written and re-rendered
    _, tools = assistant_messages("")
    history = conv.messages()[: next(i for i, m in enumerate(conv.messages()) if m["content"] == TURNS[4])]
    ask = [*history, conv.user_message(TURNS[4])]
    as_written, tagged = _p_call(backend, backend._as_written(ask), tools), _p_call(backend, ask, tools)
    assert as_written > 0.6 and tagged < as_written - 0.2, (as_written, tagged)  # measured 0.85 and 0.09


def test_calls_written_in_tags_keep_the_templates_form(backend):
    tagged = backend._convert(ToolCallEvent(name="nod", arguments={},
                                            raw='<tool_call>\n{"name": "nod"}\n</tool_call>'))
    bare = backend._convert(ToolCallEvent(name="nod", arguments={}, raw=' {"name": "nod", "arguments": {}}\n'))

    def turn(call):
        return {"role": "assistant", "content": "",
                "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "nod", "arguments": {}}}]}

    messages = [{"role": "user", "content": "nod"}, turn(tagged), turn(bare)]
    out = backend._as_written(messages)
    assert out[1] == messages[1] and out[2] == {"role": "assistant", "content": '{"name": "nod", "arguments": {}}'}
