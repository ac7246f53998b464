"""Act or talk decided before any words (bolt_ros/assistant/intent.py) on the real default chat model, greedy-free:
the option probabilities (engine.decode.choice) against constrained decoding computed by hand, the classifier with
make run's config on clear cases, "again" / "the other way" resolved from the robot's last move, and the tool loop
running the classifier's call without asking the model for one."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from bolt_ros.assistant.backend import TextDelta
from bolt_ros.assistant.config import IntentConfig, from_ros_parameters, load_params_file
from bolt_ros.assistant.conversation import Conversation, TurnRecord
from bolt_ros.assistant.intent import FURTHER, POINT_BACK, REPEAT, REVERSE, SEE, TALK, IntentClassifier, resolve_target
from bolt_ros.assistant.scripted import ScriptedBackend
from bolt_ros.assistant.tool_loop import ToolLoop
from bolt_ros.assistant.tools import ToolOutcome
from bolt_ros.engine.decode.choice import check_prefix_free, option_probabilities
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.default_models import resolve_model
from bolt_ros.graph import package_file
from bolt_ros.train.prompts import assistant_messages


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.load(resolve_model("default-chat"), n_ctx=2048)  # the classifier prompt: ~1300 tokens


@pytest.fixture(scope="module")
def tools() -> list[dict]:
    return assistant_messages("")[1]


@pytest.fixture(scope="module")
def classifier(engine) -> IntentClassifier:
    cfg = from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))
    return IntentClassifier(engine, cfg.intent)


def _by_hand(engine, prompt: list[int], options: list[list[int]]) -> list[float]:
    """Each option's probability under decoding constrained to the options: at each step the model's distribution
    renormalized over the tokens that continue some option with the same prefix; one full forward per option."""
    logp = []
    for opt in options:
        logits = engine.forward(engine.new_session(), prompt + opt, logits="all")  # [len, vocab]
        total = 0.0
        for t, tok in enumerate(opt):
            allowed = sorted({o[t] for o in options if len(o) > t and o[:t] == opt[:t]})
            lp = torch.log_softmax(logits[len(prompt) - 1 + t].float(), -1)
            total += float(lp[tok] - torch.logsumexp(lp[allowed], 0))
        logp.append(total)
    p = torch.softmax(torch.tensor(logp, dtype=torch.float64), 0)
    return p.tolist()


def test_option_probabilities_are_constrained_decoding(engine):
    tok = engine.tok
    prompt = tok.encode("Person: please turn to your left.\nRobot action:", add_bos=tok.add_bos)
    options = [tok.encode(s, add_bos=False) for s in (" head_left", " head_right", " head_center", " dance", " talk")]
    check_prefix_free(options)
    assert len({o[0] for o in options[:3]}) == 1, "the head options must share a first token (the trie's branch)"
    session = engine.new_session()
    got = option_probabilities(engine, session, prompt, options)
    want = _by_hand(engine, prompt, options)
    # the same model's logits for the same positions, run as one prompt plus 1-token steps against one full
    # sequence: fp32 accumulation order differs at most (~1e-6 relative in the logits), far below 1e-4 in p
    assert got == pytest.approx(want, abs=1e-4)
    assert abs(sum(got) - 1) < 1e-9
    assert session.tokens == prompt, "the session keeps the prompt (prefix reuse) but none of the options"
    # negative control: a walk that stopped at the shared first token could not tell the head options apart
    assert abs(got[0] - got[1]) > 1e-3, got


def test_options_must_be_prefix_free_and_cancel_returns_none(engine):
    with pytest.raises(ValueError, match="prefix-free"):
        check_prefix_free([[5, 6], [5]])
    cancel = threading.Event()
    cancel.set()
    assert option_probabilities(engine, engine.new_session(), [1, 2, 3], [[4], [5]], cancel=cancel) is None


def test_labels_are_the_parameterless_tools(classifier, tools):
    labels = classifier.labels_for(tools)
    assert "dance" in labels and "look_left" in labels and "list_animations" in labels
    assert "move_head" not in labels  # required arguments: not a label (the model's call, with intent off)
    assert labels[0] == TALK and labels[-5:] == [REPEAT, REVERSE, FURTHER, POINT_BACK, SEE]


@pytest.mark.parametrize(("utterance", "last", "label", "call"), [
    ("Please dance for me!", None, "dance", "dance"),
    ("Hello, nice to meet you!", None, TALK, None),
    ("What is the capital of France?", "look_left", TALK, None),
    ("Look to your left.", None, "look_left", "look_left"),
    ("Now the other way.", "look_left", REVERSE, "look_right"),
    ("That was great, one more time!", "dance", REPEAT, "dance"),
    ("One more time!", None, REPEAT, None),   # nothing to repeat: answered in words
])
def test_decisions_on_clear_cases(classifier, tools, utterance, last, label, call):
    d = classifier.decide(utterance, tools, last)
    assert d.label == label, (utterance, sorted(d.probs.items(), key=lambda x: -x[1])[:3])
    assert (d.call.name if d.call else None) == call
    assert d.call is None or d.call.arguments == {}


def test_a_correction_goes_where_it_names_not_the_other_way(classifier, tools):
    # "No, turn left." over the robot came back "No turn left." from the ASR, and the classifier scores look_right
    # highest for it (0.34; look_left 0.29, reverse 0.15): before resolve_target the head turned right (issue 36),
    # which is this loop's negative control
    for last in ("look_left", "look_right", None):
        d = classifier.decide("No turn left.", tools, last)
        assert d.call is not None and d.call.name == "look_left", (last, d.label, d.probs)
    opposite = {"look_left": "look_right", "look_right": "look_left", "look_up": "look_down", "look_down": "look_up"}
    assert resolve_target(REVERSE, "No, turn left.", "look_left", opposite) == "look_left"
    assert resolve_target("look_down", "No, look up!", None, opposite) == "look_up"
    # no direction named: reverse is still the other way, and a move is still itself
    assert resolve_target(REVERSE, "Now the other way.", "look_left", opposite) == "look_right"
    assert resolve_target("look_right", "Look over there.", None, opposite) == "look_right"
    # two directions named, or a move with no opposite: the classifier's choice stands
    assert resolve_target(REVERSE, "Left, then right.", "look_left", opposite) == "look_right"
    assert resolve_target("dance", "Dance to the left.", None, opposite) == "dance"
    assert resolve_target(REPEAT, "Again!", "nod", opposite) == "nod"


def test_examples_for_missing_tools_are_left_out_and_aliases_checked(engine, tools):
    cfg = IntentConfig(enabled=True, examples=[{"say": "Dance!", "do": "dance"}, {"say": "Hi", "do": "talk"}])
    c = IntentClassifier(engine, cfg)
    c.decide("Hi", [t for t in tools if t["function"]["name"] != "dance"])
    assert [m["content"] for m in c._main.prompt if m["role"] == "user"] == ["Hi"]
    bad = IntentClassifier(engine, IntentConfig(enabled=True, aliases={"nod": "sad_no", "sad": "sad"}))
    with pytest.raises(ValueError, match=r"intent\.aliases"):  # "sad" starts "sad_no": no way to tell them apart
        bad.decide("Hi", tools)


def _act(d) -> float:
    """The first classifier's mass on acting (every label but talk and see): what the pooling weighs."""
    return sum(v for k, v in d.probs.items() if k not in (TALK, SEE))


def test_a_feeling_is_not_taken_for_a_request_and_a_request_still_acts(engine, classifier, tools):
    """The first classifier alone plays "sad" for a statement of feeling; pooled with the yes/no classifier (product
    of experts, no threshold) the turn is talk. A request with the same kind of words keeps its move, and a turn the
    first classifier already took for talk never asks the second."""
    cfg = classifier.cfg
    alone = IntentClassifier(engine, cfg.model_copy(update={"confirm_instructions": ""}))
    # a statement in a request's form (an order with no subject of its own: mention.py lets it through), so the
    # yes/no classifier is what turns it into talk
    feeling = "Feeling so sad and lonely today."
    assert alone.decide(feeling, tools).label == "sad"   # negative control: the first classifier's miss
    d = classifier.decide(feeling, tools)
    assert (d.label, d.call, d.vetoed) == (TALK, None, "sad")
    assert _act(d) * d.p_request <= d.probs[TALK] * (1 - d.p_request)   # the pooled rule, as documented
    for utterance, move in [("Can you shake your head to say no?", "shake_head"), ("Act sad, I dropped it.", "sad")]:
        d = classifier.decide(utterance, tools)
        assert d.call is not None and d.call.name == move and d.vetoed is None, (utterance, d.p_request)
        # "shake your head" is an idiom of the move (idioms.py), decided without the yes/no classifier: the pooled
        # rule would keep it as well
        yes = d.p_request if d.p_request is not None else classifier._confirm.probs(utterance)["yes"]
        assert _act(d) * yes > d.probs[TALK] * (1 - yes)
    assert classifier.decide("Hello, nice to meet you!", tools).p_request is None
    with pytest.raises(ValueError, match="yes or no"):
        IntentConfig(confirm_instructions="x", confirm_examples=[{"say": "Dance!", "do": "dance"}])


def test_the_loop_runs_the_classifier_call_and_asks_the_model_only_for_words(classifier, tools):
    backend = ScriptedBackend([{"match": ".*", "reply": [{"text": "Paris is the capital."}]}])
    ran = []

    def call_tool(call, cancel):
        ran.append((call.name, call.arguments))
        return ToolOutcome(call.id, call.name, True, content=json.dumps({"status": "succeeded"}),
                           say=["Here you go!"])

    events = []
    loop = ToolLoop(backend, call_tool, events.append, intent=classifier)
    conv = Conversation("You are Bolt.", history="memory")
    for utterance in ("Please dance for me!", "What is the capital of France?", "Again, please!"):
        res = loop.run(conv, conv.user_message(utterance), tools, enable_thinking=False, cancel=threading.Event(),
                       utterance=utterance)
        assert not res.error
        conv.commit(res.messages, TurnRecord(utterance, res.text, [], [c.name for c in res.tool_calls]))
    assert ran == [("dance", {}), ("dance", {})]      # the second dance: "again" after the first
    assert len(backend.requests) == 1                 # the model was asked once, for the question's words
    req = backend.requests[0]
    assert req["words_only"] is True
    sentences = [e.text for e in events if e.kind == "sentence"]
    assert sentences[1] == "Paris is the capital." and "Here you go!" in sentences[0]
    assert not any(isinstance(e, TextDelta) for e in events)


def test_a_reply_that_parrots_is_sampled_anew(classifier, tools):
    """The person's words given back ("Let's play a game!" -> "Sure, let's play a game!") or a recent reply copied
    from the memory note ("Goodbye! How about you?" to three turns in bench_conversation): the reply is cut there
    and, when nothing was said yet, the model is asked again (a new sample), not left silent."""
    replies = iter(["Sure, let's play a game! What game?", "Okay! Which game do you like?",
                    "Goodbye! How about you?", "I'm glad you smiled."])
    backend = ScriptedBackend(lambda messages: [{"text": next(replies)}])
    loop = ToolLoop(backend, lambda call, cancel: None, lambda ev: None, intent=classifier)
    conv = Conversation("You are Bolt.", history="memory")
    res = loop.run(conv, conv.user_message("Let's play a game!"), tools, enable_thinking=False,
                   cancel=threading.Event(), utterance="Let's play a game!")
    assert res.spoken == ["Okay!", "Which game do you like?"] and len(backend.requests) == 2
    conv.commit(res.messages, TurnRecord("Let's play a game!", "Goodbye! How about you?", []))
    res = loop.run(conv, conv.user_message("Haha, that made me smile."), tools, enable_thinking=False,
                   cancel=threading.Event(), utterance="Haha, that made me smile.")
    assert res.spoken == ["I'm glad you smiled."] and len(backend.requests) == 4
    # the echo as the second sentence: what came before it stays the reply
    replies = iter(["Sure! Let's play a game!"])
    res = loop.run(conv, conv.user_message("Let's play a game!"), tools, enable_thinking=False,
                   cancel=threading.Event(), utterance="Let's play a game!")
    assert res.spoken == ["Sure!"] and res.stopped == "parroted" and len(backend.requests) == 5
    # negative control: words of its own, and a short stock line said before ("Okay!"), are spoken at once
    replies = iter(["Okay! I love games."])
    res = loop.run(conv, conv.user_message("Do you like games?"), tools, enable_thinking=False,
                   cancel=threading.Event(), utterance="Do you like games?")
    assert res.spoken == ["Okay!", "I love games."] and len(backend.requests) == 6


def test_a_backend_without_an_engine_leaves_the_choice_to_the_model(engine):
    """`make run ARGS="backend:=scripted"` and a server backend keep working with make run's config: the model (or
    script) decides, as with the classifier off; the embedded backend's engine is shared, not loaded again."""
    assert IntentClassifier.create(IntentConfig(enabled=True), ScriptedBackend([])) is None
    assert IntentClassifier.create(IntentConfig(enabled=False), object()) is None
    holder = type("Embedded", (), {"engine": engine})()
    assert IntentClassifier.create(IntentConfig(enabled=True), holder).engine is engine


def _turn(loop: ToolLoop, conv: Conversation, scene: str, tools: list[dict], utterance: str):
    """One decided turn through the loop with this scene block, committed as the node commits it."""
    res = loop.run(conv, conv.user_message(utterance, scene), tools, enable_thinking=False, cancel=threading.Event(),
                   utterance=utterance)
    conv.commit(res.messages, TurnRecord(utterance, res.text, [], [c.name for c in res.tool_calls]))
    return res


def test_the_scene_and_the_name_are_answered_by_the_robot_and_a_refusal_is_sampled_anew(classifier, tools):
    """Issue 34 through the loop: "who is there?" says the newest caption, "what's my name?" the name told (never a
    caption), and a model reply that refuses small talk is held back for a new sample."""
    backend = ScriptedBackend([{"match": "spilled", "reply": [{"text": "I'm sorry, but I can't assist with that."}]},
                               {"match": ".*", "reply": [{"text": "Nice to meet you!"}]}])
    events = []
    loop = ToolLoop(backend, lambda c, _e: ToolOutcome(c.id, c.name, True), events.append, intent=classifier,
                    at_a_loss=["Sorry, say that again?"])
    conv = Conversation("You are Bolt.", history="memory")
    scene = "What you see (newest last):\n- 5 s ago: a man at the door\n- just now: a grey cat on the chair"

    def turn(utterance):
        return _turn(loop, conv, scene, tools, utterance)

    assert turn("Hi, I'm Tom.").text == "Nice to meet you!"
    assert turn("Who is in the room?").text == "Right now, a grey cat on the chair."
    assert turn("What's my name?").text == "You're Tom."
    n = len(backend.requests)
    res = turn("Oops, I spilled my tea.")
    assert len(backend.requests) == n + 3 and res.text == "Sorry, say that again?"  # two new samples, then at a loss
    assert not any("assist" in e.text for e in events if e.kind == "sentence")


def test_a_move_word_in_a_statement_or_a_question_about_others_moves_nothing(classifier, tools):
    """Issue 34: the sentence's form tells a mention from a request (mention.py). Our own sentences. Negative
    control: for "He looked so surprised." the two classifiers pooled would act (surprised 0.96, yes 0.40); the
    form vetoes it. Requests of every form next to them still act."""
    said = "He looked so surprised."
    d = classifier.decide(said, tools)
    yes = classifier._confirm.probs(said)["yes"]
    assert _act(d) * yes > d.probs[TALK] * (1 - yes)     # the classifiers alone: a move
    assert (d.label, d.call, d.vetoed) == (TALK, None, "surprised")
    for u in ["My uncle shook his head at the waiter.", "She danced all night at the party.",
              "Why do horses nod their heads when they walk?", "I'm turning the big four-oh next week.",
              "I felt so sad yesterday."]:
        d = classifier.decide(u, tools)
        assert d.call is None, (u, d.label, d.vetoed)
    for u, move in [("Dance for me!", "dance"), ("I want you to nod.", "nod"), ("Okay, shake your head.", "shake_head"),
                    ("Can you look surprised?", "surprised"), ("No, turn left.", "look_left")]:
        d = classifier.decide(u, tools)
        assert d.call is not None and d.call.name == move, (u, d.label, d.probs)


@pytest.mark.parametrize(("utterance", "last", "call", "args"), [
    ("Go all the way up.", None, "more_up", {"amount": "all"}),         # from anywhere: to the limit
    ("Look straight ahead again.", "look_left", "look_center", {}),     # not the last look once more
    ("Take a look around the garden.", None, "look_around", {}),        # an order to look, not a view question
    ("Look back at me.", "look_up", "look_center", {}),
])
def test_the_words_form_settles_what_the_label_leaves_open(classifier, tools, utterance, last, call, args):
    d = classifier.decide(utterance, tools, last)
    assert d.call is not None and (d.call.name, d.call.arguments) == (call, args), (d.label, d.probs)


def test_a_view_question_stays_a_question(classifier, tools):
    """Negative control of the look-around rule: a question about the view is answered from the caption."""
    assert classifier.decide("What can you see around the room?", tools).label == SEE


def test_asked_to_look_some_way_or_an_order_that_names_a_move_plays_it(classifier, tools):
    """"Can you look sleepy for me?" scored answer 0.78 (sleep 0.13) and "Wake up, I want to ask you something."
    answer 0.73: the words' form asks for the move (intent.looks, _named_order). Our own sentences; negative
    controls: the same words told of someone else, or said of the robot, move nothing."""
    from bolt_ros.assistant.intent import _look_like, _named_order
    looks = classifier.cfg.looks
    assert _look_like("Could you look a bit tired?", looks) == "sleep"
    assert _look_like("Look surprised if you didn't know that.", looks) == "surprised"
    assert _look_like("Show me how curious you can be.", looks) == "curious"
    assert _look_like("You look happy today.", looks) is None and _look_like("Do I look tired?", looks) is None
    probs = {n: 0.0 for n in classifier.labels_for(tools)}
    assert _named_order("Nod if you agree with me, it's a long story.", probs) == "nod"
    assert _named_order("Shake your head when I'm wrong, okay?", probs) == "shake_head"
    assert _named_order("My head hurts, shake it off.", probs) is None   # not an order that opens with the move
    for u, move in [("Could you look a bit tired?", "sleep"), ("Wake up, the guests are here.", "wake_up")]:
        d = classifier.decide(u, tools)
        assert d.call is not None and d.call.name == move, (u, d.label, d.probs)
    for u in ["My brother looked so tired after work.", "You look happy today."]:
        assert classifier.decide(u, tools).call is None, u


def test_a_question_of_who_or_what_is_there_is_a_view_question(classifier, tools):
    """Answered from the newest caption (scene.py), not guessed by the words model ("Yes, there are people nearby.").
    Negative control: a question about the person's own needs is not about the view."""
    for u in ["Is anybody at the door?", "Hey, is there something on the shelf?"]:
        assert classifier.decide(u, tools).label == SEE, u
    assert classifier.decide("Is there anything else I can do for you?", tools).label != SEE


def test_the_fourth_held_out_sets_kinds_of_fault(classifier, tools, monkeypatch):
    """Four general faults a fourth held-out set showed on every seed (docs/conversation.md), here in our own words,
    each with its negative control (the rule taken out, the old decision back):
    - an order to move the head a way, asked ("Can you tilt your head up like ...?"), was talk: the sentence's tail
      outweighed its order;
    - a look back "on me" was the last look once more (only "at me" / "to me" meant the centre);
    - "take a peek around" was a question about the view (only "look around" was an order to look);
    - "Who am I, by the way?" was answered with a caption when no name was known (the view label)."""
    import re

    import bolt_ros.assistant.intent as intent
    cases = [("Will you tilt your head to the left like a curious puppy?", None, "look_left", "_HEAD_ORDER",
              re.compile(r"(?!)")),
             ("Focus on me again.", "look_left", "look_center", "_CENTER",
              re.compile(r"\b(straight ahead|ahead|center|centre|front|forward|at me|to me)\b", re.IGNORECASE)),
             ("Take a quick peek around the garden.", None, "look_around", "_LOOK_ORDER",
              re.compile(intent._LEAD + r"(?:(?:have|take) a (?:quick |good )?)?look\b", re.IGNORECASE))]
    for utterance, last, move, rule, old in cases:
        d = classifier.decide(utterance, tools, last)
        assert d.call is not None and d.call.name == move, (utterance, d.label, d.probs)
        with monkeypatch.context() as m:
            m.setattr(intent, rule, old)
            d = classifier.decide(utterance, tools, last)
            assert d.call is None or d.call.name != move, (utterance, rule)
    assert classifier.decide("Can you lower your head like you're ashamed of yourself?", tools).label == "look_down"
    for u in ["My cat tilts her head up when I call her.", "Why do you turn your head left so often?"]:
        assert classifier.decide(u, tools).call is None, u
    assert classifier.decide("And who am I, then?", tools).label == TALK
    monkeypatch.setattr(intent, "asks_name", lambda _u: False)
    assert classifier.decide("And who am I, then?", tools).label == SEE


def test_a_name_given_in_a_greeting_is_kept():
    """"Hi Bolt, it's Amara." gives a name; "It's Friday today." and a weekday after a greeting do not."""
    from bolt_ros.assistant.facts import FactNote
    for said, names in [("Hey there, it's Jonas.", ["Jonas"]), ("Hello Bolt, it is Maria here.", ["Maria"]),
                        ("It's Friday today.", []), ("Hi, it's Monday already!", []), ("My name is Lena.", ["Lena"])]:
        note = FactNote()
        note.add(said)
        assert note.names == names, said


def test_a_question_about_her_right_after_the_view_is_answered_from_the_view(classifier, tools, monkeypatch):
    """"Who's in the kitchen?" -> the caption; "What is she doing?" -> the caption again (in another of its lines), not
    the words model (which answered from its own system prompt, "She is turning and tilting her head."). Negative
    controls: the same question after talk about someone the person knows goes to the words model; a request that
    names her still moves."""
    backend = ScriptedBackend([{"match": "hospital", "reply": [{"text": "That sounds like important work."}]},
                               {"match": ".*", "reply": [{"text": "Probably busy at work."}]}])
    loop = ToolLoop(backend, lambda c, _e: ToolOutcome(c.id, c.name, True), lambda _e: None, intent=classifier)
    conv = Conversation("You are Bolt.", history="memory")
    scene = "What you see (newest last):\n- just now: a woman in a green apron is watering the plants"

    def turn(utterance):
        return _turn(loop, conv, scene, tools, utterance)

    assert turn("Who is in the room?").text == "Right now, a woman in a green apron is watering the plants."
    assert turn("What is she wearing?").text == ("From here I can see this: a woman in a green apron is watering the "
                                                 "plants.")
    assert turn("My aunt works at the hospital.").tool_calls == []
    assert turn("What is she doing today?").text == "Probably busy at work."   # about the aunt: words
    assert turn("Who is in the room?").text.endswith("watering the plants.")
    res = turn("Can you look to the left at her?")
    assert [c.name for c in res.tool_calls] == ["look_left"], res.text
    import bolt_ros.assistant.tool_loop as tool_loop
    monkeypatch.setattr(tool_loop, "follows_view", lambda *_a: False)  # the rule out: the classifier left it to words
    assert turn("Who is in the room?").text.endswith("watering the plants.")
    assert "apron" not in turn("What is she wearing?").text
