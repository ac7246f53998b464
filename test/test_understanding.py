"""Issue 34, ROS-free parts and one real graph: the relative head move (from the measured pose, inside the limits, an
honest line at a limit), "a bit more" resolved from the words and the last move, the fact note, the caption answer,
and a refusal of small talk caught."""
from __future__ import annotations

import json
import math
import threading

import pytest
from conftest import wait_for
from test_assistant_fixtures import start

from bolt_ros.assistant.backend import ToolCallRequest
from bolt_ros.assistant.config import from_ros_parameters, load_params_file
from bolt_ros.assistant.conversation import Conversation, SceneMemory, TurnRecord
from bolt_ros.assistant.facts import FACTS_HEADER, FactNote, third_person
from bolt_ros.assistant.intent import further
from bolt_ros.assistant.relative import MOVED, TO_LIMIT, RelativeError, RelativeMove, plan_relative
from bolt_ros.assistant.reply_text import REFUSAL
from bolt_ros.assistant.scene import newest_caption, see_options
from bolt_ros.assistant.tools import AT_LIMIT, ToolError, ToolRegistry, failure_line
from bolt_ros.graph import package_file

LIMITS = {"head_yaw": (-1.1344, 1.1344), "head_pitch": (-0.6, 0.6)}
REL = RelativeMove(joints={"left": ("head_yaw", 1), "right": ("head_yaw", -1), "up": ("head_pitch", -1)},
                   steps={"bit": 0.15, "more": 0.3, "all": 0}, keep=["target.head_pitch", "target.antennas[2]"])


def _config():
    return from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))


def test_a_relative_step_goes_on_from_the_pose_and_stops_inside_the_limit():
    fields, how, words = plan_relative(REL, {"direction": "right", "amount": "bit"}, {"head_yaw": -0.6}, LIMITS)
    assert how == MOVED and fields["target.head_yaw"] == pytest.approx(-0.75) and words["amount"] == "bit"
    assert math.isnan(fields["target.head_pitch"]) and all(math.isnan(x) for x in fields["target.antennas"])
    fields, how, _ = plan_relative(REL, {"direction": "up"}, {"head_pitch": -0.3}, LIMITS)  # default: more
    assert how == TO_LIMIT and fields["target.head_pitch"] == pytest.approx(-0.55)  # 0.3 would pass the limit
    fields, how, _ = plan_relative(REL, {"direction": "up"}, {"head_pitch": 0.1}, LIMITS)
    assert how == MOVED and fields["target.head_pitch"] == pytest.approx(-0.2)
    fields, how, _ = plan_relative(REL, {"direction": "left", "amount": "all"}, {"head_yaw": 0.2}, LIMITS)
    assert how == TO_LIMIT and fields["target.head_yaw"] == pytest.approx(1.1344 - 0.05)
    with pytest.raises(RelativeError, match="already as far as it goes") as e:
        plan_relative(REL, {"direction": "left"}, {"head_yaw": 1.0844}, LIMITS)
    assert failure_line(str(e.value)) == AT_LIMIT
    with pytest.raises(RelativeError, match="not available"):
        plan_relative(REL, {"direction": "left"}, {}, LIMITS)


def test_move_head_takes_angles_or_a_direction_and_more_names_resolve_to_it():
    reg = ToolRegistry(_config().tools)
    name, args = reg.resolution("more_right", {"amount": "all"})
    assert name == "move_head" and args["direction"] == "right" and args["amount"] == "all"
    assert reg.resolution("move_head", {"yaw": 10, "pitch": 0})[0] == "move_head"
    with pytest.raises(ToolError, match="yaw: Field required"):
        reg.resolve(ToolCallRequest("1", "move_head", {}))
    offered = [t["function"]["name"] for t in reg.openai_tools()]
    assert "move_head" in offered and not any(n.startswith("more_") for n in offered)  # offer: false


@pytest.mark.parametrize(("words", "last", "want"), [
    ("A bit more to the right.", "look_right", ("more_right", {"amount": "bit"})),
    ("A little higher.", "look_up", ("more_up", {"amount": "bit"})),
    ("All the way to the left.", "look_left", ("more_left", {"amount": "all"})),
    ("Keep going.", "more_left", ("more_left", {"amount": "more"})),
    ("Okay, come back to me.", "more_left", (None, {})),  # no direction, no "more": not further
    ("And down.", "look_up", ("look_down", {})),       # another way than the last: a look, not further
    ("Further!", None, (None, {})),                     # nothing to go on from
    ("A bit more to the left.", None, ("look_left", {})),  # no head move before: a look that way
    ("Further!", "dance", (None, {})),
])
def test_further_takes_the_direction_from_the_words_or_the_last_head_move(words, last, want):
    assert further(words, last) == want


def test_the_fact_note_keeps_the_name_and_what_they_told_in_the_third_person():
    note = FactNote(max_facts=3)
    for said in ["Hello there! I'm Tom.", "My sister has a parrot.", "Do you like parrots?", "He talks a lot.",
                 "We are moving to Oslo in May.", "I'm so tired.", "Her name is Kiwi."]:
        note.add(said)
    text = note.render()
    assert text.startswith(FACTS_HEADER) and "Their name is Tom." in text
    assert "They are moving to Oslo in May." in text and "Her name is Kiwi." in text
    assert "parrots?" not in text and "He talks" not in text  # questions and others' doings are not kept
    assert "sister" not in text  # the oldest fact went (max_facts 3)
    assert third_person("I'm sure my dog likes me.") == "They are sure their dog likes them."
    assert note.name_answer("What's my name, do you remember?") == "You're Tom."
    assert note.name_answer("And who am I?") == "You're Tom." and note.name_answer("What's your name?") == ""
    assert FactNote().name_answer("Who am I?") == ""  # no name told: the model answers


def test_the_conversation_shows_the_fact_note_and_keeps_it_past_the_memory():
    conv = Conversation("sys", history="memory", memory_turns=2)
    conv.commit([], TurnRecord("Hi, I'm Priya.", "Hello Priya!", []))
    conv.commit([], TurnRecord("Dance!", "Here you go!", ["you danced"], ["dance"]))
    for i in range(3):
        conv.commit([], TurnRecord(f"What is {i} plus {i}?", str(2 * i), []))
    msgs = conv.messages()
    facts = [m["content"] for m in msgs if m["role"] == "system" and m["content"].startswith(FACTS_HEADER)]
    assert facts and "name is Priya" in facts[0] and "Dance" not in facts[0]
    assert not any("Priya" in m["content"] for m in msgs if m["content"].startswith("Earlier"))  # memory: 2 turns


def test_the_newest_caption_is_what_a_scene_question_is_answered_with():
    from bolt_ros.assistant.config import SceneMemoryConfig

    scene = SceneMemory(SceneMemoryConfig())
    scene.add("a man in a blue raincoat is standing in the doorway", now=0.0)
    scene.add("A small grey cat is sitting on the chair.", now=1.0)
    msg = Conversation("sys").user_message("Is anyone else around?", scene.render(now=2.0))
    assert newest_caption(msg["content"]) == "A small grey cat is sitting on the chair"
    assert see_options(newest_caption(msg["content"]))[0] == "Right now, a small grey cat is sitting on the chair."
    assert newest_caption(Conversation("sys").user_message("Who is there?")["content"]) == ""


@pytest.mark.parametrize(("reply", "refuses"), [
    ("I'm sorry, but I can't assist with that request.", True),
    ("Sorry, but I can't assist with that.", True),
    ("Sorry, I didn't understand your message.", True),
    ("I'm sorry, but I am not able to", True),   # a first clause, released before its sentence ended
    ("Hi Priya! How can I assist you today?", False),
    ("Oh no, I hope the shirt comes clean!", False),
    ("I can't help feeling happy for you.", False),
])
def test_a_refusal_is_recognized(reply, refuses):
    assert bool(REFUSAL.search(reply)) == refuses


def test_a_bit_more_moves_on_from_the_pose_on_the_simulated_robot_and_stops_at_the_limit(ros):
    assistant, _, probe = start(ros, [])
    wait_for(lambda: "head_yaw" in assistant.router.positions, 10)

    def call(name, args):
        return assistant.router.call(ToolCallRequest("t", name, args), threading.Event())

    assert call("look_right", {}).ok
    wait_for(lambda: abs(assistant.router.positions["head_yaw"] + 0.6) < 0.01, 5)
    out = call("more_right", {"amount": "bit"})
    assert out.ok, out.error
    assert json.loads(out.content)["result"]["reached"]["head_yaw"] == pytest.approx(-0.75, abs=0.01)
    assert out.say and "right" in out.say[0] and out.done == "you turned your head further right"
    wait_for(lambda: abs(assistant.router.positions["head_yaw"] + 0.75) < 0.01, 5)
    out = call("more_right", {"amount": "all"})
    assert out.ok and json.loads(out.content)["result"]["reached"]["head_yaw"] == pytest.approx(-1.0844, abs=0.01)
    assert "as far" in out.say[0]
    wait_for(lambda: abs(assistant.router.positions["head_yaw"] + 1.0844) < 0.01, 5)
    out = call("more_right", {})
    assert not out.ok and out.say == [AT_LIMIT]  # nothing sent: already at the limit
    assert abs(probe.head_yaw() + 1.0844) < 0.02
