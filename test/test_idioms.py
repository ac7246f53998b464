"""Idioms and indirect requests, ability questions and a yes to an offer (bolt_ros/assistant/idioms.py): the rules
alone (no model), then through the real classifier and the tool loop. Our own sentences, not the benchmark's; every
rule has its negative control (the same phrase as a mention, talked about, negated, said of the speaker)."""
from __future__ import annotations

import threading

import pytest

from bolt_ros.assistant.config import from_ros_parameters, load_params_file
from bolt_ros.assistant.conversation import Conversation, TurnRecord
from bolt_ros.assistant.idioms import IDIOMS, ability_move, idiom_move, is_yes, knows_how
from bolt_ros.assistant.intent import TALK, IntentClassifier
from bolt_ros.assistant.mention import is_mention
from bolt_ros.assistant.scripted import ScriptedBackend
from bolt_ros.assistant.tool_loop import ToolLoop
from bolt_ros.assistant.tools import ToolOutcome
from bolt_ros.graph import package_file

MOVES = {"nod", "shake_head", "look_around", "happy", "sad", "curious", "surprised", "wake_up", "sleep", "dance"}


def test_every_animation_of_the_robot_has_idioms():
    import yaml
    robot = yaml.safe_load(open(package_file("config/robot.yaml")))
    names = {a["name"] for a in robot["animations"]}
    assert names == set(IDIOMS) and all(len(v) >= 5 for v in IDIOMS.values())


@pytest.mark.parametrize(("said", "move"), [
    ("Hit the sack, you've earned it.", "sleep"), ("Lights out, little buddy.", "sleep"),
    ("Okay, off to dreamland with you.", "sleep"), ("Time for bed, robot!", "sleep"),
    ("Wakey wakey, eggs and bakey!", "wake_up"), ("Up and at 'em!", "wake_up"), ("Rise and shine!", "wake_up"),
    ("Come on, bust a move!", "dance"), ("Shake a leg, Bolt!", "dance"), ("Let's boogie tonight!", "dance"),
    ("Will you cut a rug with me?", "dance"), ("Give me a nod if you're ready.", "nod"),
    ("Turn that frown upside down!", "happy"), ("Show me your puppy dog eyes.", "sad"),
    ("Scratch your head like you're stumped.", "curious"), ("Do a double take!", "surprised"),
    ("I want you to bust a move.", "dance"),            # a wish aimed at the robot, though it opens with "I"
])
def test_an_idiom_that_asks_plays_its_animation(said, move):
    assert idiom_move(said, MOVES) == move and not is_mention(said)


@pytest.mark.parametrize("said", [
    "My grandpa always says rise and shine.",           # a mention: told, the caller vetoes it (mention.py)
    "She cut a rug at the wedding.",
])
def test_an_idiom_in_a_mention_is_a_mention(said):
    assert is_mention(said)


@pytest.mark.parametrize("said", [
    "What does 'hit the sack' mean?", "Where does the phrase cut a rug come from?",  # about the phrase
    "Don't bust a move yet!", "No need to hit the hay, it's early.",                 # negated
    "I'm going to hit the hay.", "I think it's time for bed.",                       # the speaker's own bedtime
    "Why do you shake your head so much?",                                            # asks about, not for
    "Read me a bedtime story.", "Good night, sweet dreams!", "Tilt your head up toward the ceiling.",
])
def test_an_idiom_that_does_not_ask_moves_nothing(said):
    assert idiom_move(said, MOVES) is None


def test_an_idiom_for_an_animation_the_robot_lacks_is_not_used():
    assert idiom_move("Bust a move!", {"nod"}) is None


def test_ability_questions_and_yes():
    assert ability_move("Do you know how to dance?", MOVES) == "dance"
    assert ability_move("Are you any good at nodding?", MOVES) == "nod"
    assert ability_move("Can you cut a rug?", MOVES) == "dance"
    assert ability_move("Can you tell me a joke?", MOVES) is None
    assert ability_move("My sister knows how to dance.", MOVES) is None
    assert knows_how("Do you know how to shake your head?") and not knows_how("Can you cut a rug?")
    assert is_yes("Yes please!") and is_yes("Sure, go ahead.") and is_yes("Okay, show me!")
    assert not is_yes("No thanks.") and not is_yes("Yes, but not now.") and not is_yes("Tell me a joke.")


@pytest.fixture(scope="module")
def classifier():
    from bolt_ros.engine.decode.generate import Engine
    from bolt_ros.engine.default_models import resolve_model
    cfg = from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))
    return IntentClassifier(Engine.load(resolve_model("default-chat"), n_ctx=2048), cfg.intent)


@pytest.fixture(scope="module")
def tools():
    from bolt_ros.train.prompts import assistant_messages
    return assistant_messages("")[1]


def test_the_classifier_plays_an_idiom_and_a_mention_of_it_moves_nothing(classifier, tools):
    """Negative control: the classifiers alone took "Rise and shine, little robot!" for something other than
    wake_up (a look up, the "rise"); the rule plays wake_up; the same phrase quoted of someone moves nothing."""
    said = "Rise and shine, little robot!"
    probs = classifier._build(tools).probs(said)
    assert max(probs, key=probs.get) != "wake_up"
    d = classifier.decide(said, tools)
    assert d.idiom and d.call is not None and d.call.name == "wake_up"
    for u in ["My grandpa always says rise and shine.", "My aunt says it's time to hit the hay at nine."]:
        d = classifier.decide(u, tools)
        assert d.call is None, (u, d.label)


def test_an_ability_question_gets_an_offer_and_a_yes_plays_the_move(classifier, tools):
    """"Do you know how to dance?" left to words: the robot's offer, not the words model's "Yes, I can dance."
    (the scripted backend says exactly that: the negative control is that it is never spoken); "Yes please!" then
    dances, and a later "Yes." with no offer before it is words again."""
    backend = ScriptedBackend([{"match": ".*", "reply": [{"text": "Yes, I can dance."}]}])
    calls = []

    def call_tool(c, _e):
        calls.append(c.name)
        return ToolOutcome(c.id, c.name, True, say=["Here you go!"])
    loop = ToolLoop(backend, call_tool, lambda e: None, intent=classifier)
    conv = Conversation("You are Bolt.", history="memory")

    def turn(utterance):
        res = loop.run(conv, conv.user_message(utterance), tools, enable_thinking=False, cancel=threading.Event(),
                       utterance=utterance)
        conv.commit(res.messages, TurnRecord(utterance, res.text, [], [c.name for c in res.tool_calls]))
        return res

    d = classifier.decide("Do you know how to dance?", tools)
    assert d.call is None and d.label == TALK and d.offer == "dance"  # the classifier leaves it to words (0.96)
    res = turn("Do you know how to dance?")
    assert "show you" in res.text or "Want to see" in res.text
    assert "can dance" not in res.text and not calls
    turn("Yes please!")
    assert calls == ["dance"], calls
    calls.clear()
    res = turn("Yes.")  # no offer before it: nothing to play
    assert not calls


def test_a_reply_drafted_for_someone_else_is_held_back_and_drawn_anew(classifier, tools):
    """"Sure, here's how you might respond: ..." (the 0.5B model, held out 3) is never spoken: two new draws, then
    the line for a statement. Negative control: the same backend's plain reply to another statement is spoken."""
    backend = ScriptedBackend([
        {"match": "party", "reply": [{"text": "Sure, here's how you might respond: - Hey, I'm throwing a party!"}]},
        {"match": ".*", "reply": [{"text": "That sounds lovely."}]}])
    spoken = []
    loop = ToolLoop(backend, lambda c, _e: ToolOutcome(c.id, c.name, True), lambda e: e.kind == "sentence"
                    and spoken.append(e.text), intent=classifier, at_a_loss=["Sorry?"],
                    at_a_loss_told=["Mm-hm, I'm listening."])
    conv = Conversation("You are Bolt.", history="memory")
    res = loop.run(conv, conv.user_message("I'm throwing a party on Friday."), tools, enable_thinking=False,
                   cancel=threading.Event(), utterance="I'm throwing a party on Friday.")
    assert len(backend.requests) == 3 and res.text == "Mm-hm, I'm listening." and spoken == [res.text]
    res = loop.run(conv, conv.user_message("I baked bread today."), tools, enable_thinking=False,
                   cancel=threading.Event(), utterance="I baked bread today.")
    assert res.text == "That sounds lovely."
