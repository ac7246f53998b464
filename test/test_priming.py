"""The speculative start and ready-means-ready (issue 33, items 2 and 5), on the default chat model: the intent
decision made on the speculative words is the turn's when the final words are the same (and not otherwise); the
speculative prefill leaves the turn only the reply to run; priming gives way to a turn; and the node says when it
is ready and counts its speculative hits, in a real rclpy graph."""
from __future__ import annotations

import threading
import time

import pytest
from conftest import wait_for
from test_assistant_fixtures import start

from bolt_ros.assistant.config import from_ros_parameters, load_params_file
from bolt_ros.assistant.conversation import Conversation
from bolt_ros.assistant.embedded import EmbeddedBackend
from bolt_ros.assistant.intent import TALK, IntentClassifier
from bolt_ros.assistant.priming import Primer, SpeculativeIntent
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.engine.default_models import resolve_model
from bolt_ros.graph import package_file
from bolt_ros.train.prompts import assistant_messages


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(resolve_model("default-chat"), n_ctx=2048)


@pytest.fixture(scope="module")
def tools() -> list[dict]:
    return assistant_messages("")[1]


def _log(level: str, text: str) -> None:
    pass


def test_a_speculative_decision_is_the_turns_for_the_same_words_only(engine, tools):
    cfg = from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))
    spec = SpeculativeIntent(IntentClassifier(engine, cfg.intent))
    d = spec.speculate("Please look to your left.", tools, None)
    assert d.call is not None and d.call.name == "look_left", d
    assert spec.decide("please look to your left", tools, None) is d and spec.reused == 1   # same words: kept
    # other words: the kept decision is dropped, the classifier decides anew
    spec.speculate("Please look to your left.", tools, None)
    other = spec.decide("What is your name?", tools, None)
    assert other is not d and other.label == TALK and spec.reused == 1
    # ... and so is one made before the robot's last move changed (repeat / reverse read it)
    spec.speculate("Do that again.", tools, None)
    assert spec.decide("Do that again.", tools, "nod") is not None and spec.reused == 1


def _prefilled(backend, conv, words: str) -> int:
    stats = [ev for ev in backend.stream_chat(conv.messages([conv.user_message(words)]), [], enable_thinking=False,
                                              cancel=threading.Event()) if type(ev).__name__ == "Finished"]
    return stats[-1].stats["prefill_tokens"]


def test_the_speculative_prefill_leaves_the_turn_only_its_reply(engine):
    backend = EmbeddedBackend(engine, SamplingParams(temperature=0.0, max_tokens=2), tool_choice="none")
    primer = Primer(backend, None, prefill=True, log=_log)
    conv, closing = Conversation("You are Bolt, a small robot. Answer in one short sentence."), threading.Event()
    words = "What is the capital of France, and how many people live there?"
    primer.speculate(words, lambda u: conv.messages([conv.user_message(u)]), [], None, closing)
    hit = _prefilled(backend, conv, words)
    assert hit <= 4, hit    # the assistant's header: the message was in the cache
    # negative control: speculated on other words, the turn runs the person's message itself
    primer.speculate("Tell me a joke about cats.", lambda u: conv.messages([conv.user_message(u)]), [], None, closing)
    miss = _prefilled(backend, conv, words)
    assert miss >= hit + 10, (hit, miss)


def test_speculative_words_that_come_after_their_own_turn_are_left_alone(engine):
    """The speculative words and the final transcript race on two topics: words whose turn already came are
    stale, and working on them would only take the worker and the cache from the next priming."""
    backend = EmbeddedBackend(engine, SamplingParams(temperature=0.0, max_tokens=2), tool_choice="none")
    primer = Primer(backend, None, prefill=True, log=_log)
    conv, closing = Conversation("You are Bolt, a small robot. Answer in one short sentence."), threading.Event()
    messages = lambda u: conv.messages([conv.user_message(u)])   # noqa: E731
    primer.interrupt("What is the capital of France?")          # the turn came first
    primer.speculate("what is the capital of france", messages, [], None, closing)
    assert primer.counts == {**primer.counts, "stale": 1, "speculative": 0}
    # negative control: other words than the last turn's are worked on
    primer.speculate("Tell me a joke about cats.", messages, [], None, closing)
    assert primer.counts["stale"] == 1 and primer.counts["speculative"] == 1


def test_priming_gives_way_to_a_turn_and_runs_again_after_it(engine):
    backend = EmbeddedBackend(engine, SamplingParams(temperature=0.0, max_tokens=2), tool_choice="none")
    primer = Primer(backend, None, prefill=True, log=_log)
    history = [m for i in range(12) for m in ({"role": "user", "content": f"Tell me fact number {i} about the sea."},
                                              {"role": "assistant", "content": "The sea covers most of the Earth, "
                                               f"and fact {i} is that it is salty and deep in many places."})]
    messages = [{"role": "system", "content": "You are Bolt."}, *history]
    result, closing = [], threading.Event()
    worker = threading.Thread(target=lambda: result.append(primer.prime(messages, [], closing)))
    worker.start()
    time.sleep(0.3)
    primer.interrupt("Hello!")     # a turn comes: priming stops between its chunks
    worker.join(timeout=30)
    assert result == [False] and primer.counts["prime_interrupted"] == 1 and not primer.ready.is_set()
    assert primer.prime(messages, [], closing) and primer.mark_ready() and not primer.mark_ready()


SCRIPT = [{"match": "left", "reply": [{"text": "Looking left."}]}, {"match": ".", "reply": [{"text": "Hi."}]}]


def test_the_node_says_it_is_ready_and_counts_speculative_hits(ros):
    from std_msgs.msg import String
    assistant, backend, probe = start(ros, SCRIPT)
    # the scripted backend has nothing to prime: ready once the robot's tools are known (the event may go out before
    # the probe is connected; the console test reads it)
    wait_for(lambda: assistant.primer.ready.is_set(), timeout=10, what="ready")
    pub = probe.node.create_publisher(String, "speech/speculative", 10)
    wait_for(lambda: pub.get_subscription_count() > 0, what="the assistant on speech/speculative")
    pub.publish(String(data="Please look left."))
    wait_for(lambda: assistant.primer.counts["speculative"] == 1, what="the speculative start")
    probe.say("Please look left.")
    wait_for(lambda: "Looking left." in probe.spoken(), timeout=10, what="the turn")
    assert assistant.primer.counts["hits"] == 1 and assistant.primer.counts["misses"] == 0
    # other final words: a miss, and the turn answers them
    pub.publish(String(data="Please look."))
    wait_for(lambda: assistant.primer.counts["speculative"] == 2, what="the second speculative start")
    probe.say("Hello there.")
    wait_for(lambda: "Hi." in probe.spoken(), timeout=10, what="the second turn")
    assert assistant.primer.counts["hits"] == 1 and assistant.primer.counts["misses"] == 1
    assert len(backend.requests) == 2   # speculation asked the scripted model nothing


def test_the_console_says_when_the_robot_is_ready(ros):
    import io

    from bolt_ros.msg import AssistantEvent

    from bolt_ros.console import Console
    out = io.StringIO()
    console = ros.add(Console(out=out, context=ros.context))
    console._on_event(AssistantEvent(type=AssistantEvent.STATE, state=AssistantEvent.STATE_THINKING))
    console._on_event(AssistantEvent(type=AssistantEvent.STATE, state="ready"))
    lines = out.getvalue().splitlines()
    assert lines == ["[thinking...]", "[ready: the robot answers at full speed now]"], lines
    # ready is no turn state: the next turn's thinking is shown again after an idle
    console._on_event(AssistantEvent(type=AssistantEvent.STATE, state=AssistantEvent.STATE_IDLE))
    console._on_event(AssistantEvent(type=AssistantEvent.STATE, state=AssistantEvent.STATE_THINKING))
    assert out.getvalue().splitlines()[-1] == "[thinking...]"


def test_each_speculation_is_counted_once_as_a_hit_or_a_miss():
    """A turn that comes while its speculation still runs claims it once: the next turn's other words are no miss."""
    started, release = threading.Event(), threading.Event()

    class SlowPrime:   # a backend whose prefill takes until the test lets it go (a real one takes ~0.1-1 s)
        def prime(self, messages, tools, cancel=None):
            started.set()
            release.wait(5)
            return 0

    primer = Primer(SlowPrime(), None, prefill=True, log=_log)
    worker = threading.Thread(target=primer.speculate, args=("Hello there.", lambda u: [], [], None,
                                                              threading.Event()))
    worker.start()
    started.wait(5)
    primer.interrupt("Hello there.")   # the final words come while the speculative prefill runs: not cancelled
    release.set()
    worker.join(5)
    primer.claim("Hello there.")       # the worker starts that turn: a hit
    primer.interrupt("What is your name?")   # the next turn, with no speculation of its own: nothing to count
    primer.claim("What is your name?")
    assert primer.counts["hits"] == 1 and primer.counts["misses"] == 0, primer.counts


def test_the_node_logs_a_core_s_lines_of_any_severity_at_debug_level(ros):
    """The Primer logs info and debug lines through one callable. rclpy binds a call site to its first severity,
    so `getattr(logger, level)(text)` on one line raised at debug level and killed the assistant's worker."""
    import rclpy.logging

    from bolt_ros.nodes.common import core_log
    node = ros.node("log_severity_probe")
    rclpy.logging.set_logger_level(node.get_logger().name, rclpy.logging.LoggingSeverity.DEBUG)
    log = core_log(node)   # what the assistant node hands its Primer, on a real rclpy node
    for level in ("info", "debug", "warning", "debug", "info", "error"):
        log(level, f"a {level} line")

    def one_line(level: str, text: str) -> None:   # negative control: the old adapter
        getattr(node.get_logger(), level)(text)
    one_line("info", "first")
    with pytest.raises(ValueError, match="severity cannot be changed"):
        one_line("debug", "second")
