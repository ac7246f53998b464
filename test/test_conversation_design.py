"""How a multi-turn conversation reaches the model (ROS-free): the short memory instead of verbatim history, motions
that answer with a line of their own instead of a words round over their JSON, tool results in words, and the
bench's turn scoring (bench/conversation_scoring.py) with its negative controls."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

from bolt_ros.assistant.config import SceneMemoryConfig
from bolt_ros.assistant.conversation import MEMORY_HEADER, Conversation, SceneMemory, TurnRecord
from bolt_ros.assistant.scripted import ScriptedBackend
from bolt_ros.assistant.tool_loop import ToolLoop
from bolt_ros.assistant.tools import ToolOutcome, ToolRegistry, ToolSpec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from conversation_scoring import call_matches, is_claim, is_echo, is_meta, is_repeat, score_turn

LOOK = ToolSpec.model_validate({
    "name": "look", "description": "look", "kind": "action", "target": "goto_pose",
    "type": "bolt_ros/action/GotoPose",
    "parameters": {"type": "object", "required": ["direction"], "properties": {
        "direction": {"type": "string", "enum": ["left", "right", "center"]}}},
    "expand": {"parameter": "direction", "name": "look_{value}"},
    "goal": {"target.head_yaw": {"arg": "direction", "map": {"left": 0.6, "right": -0.6, "center": 0.0}}},
    "done": "you looked {direction}", "say": ["Looking {direction}.", "Okay, {direction} it is."]})
LIST = ToolSpec.model_validate({
    "name": "list_animations", "description": "list", "kind": "service", "target": "list_animations",
    "type": "bolt_ros/srv/ListAnimations", "result_text": "Your animations: {listing}."})


def _loop(backend, registry, ok=True):
    events = []

    def call_tool(call, cancel):  # the router's ROS-free half: resolve, "run", word the outcome
        tool, args = registry.resolve(call)
        if not ok:
            return ToolOutcome(call.id, call.name, False, error="goto_pose goal aborted: robot busy")
        result = {"names": ["nod", "shake_head"], "descriptions": ["Nod yes.", ""]}
        return ToolOutcome(call.id, call.name, True, json.dumps({"result": result}), done=tool.done_text(args),
                           say=tool.say_lines(args, result), text=tool.result_for_model(result))
    return ToolLoop(backend, call_tool, events.append), events


def _look_backend():
    return ScriptedBackend([{"match": "left", "reply": [{"tool_call": {"name": "look_left", "arguments": {}}}],
                             "after_tool": [{"text": "The tool was successfully executed."}]}])


def test_a_motion_answers_with_its_own_line_and_no_words_round():
    backend, registry = _look_backend(), ToolRegistry([LOOK])
    loop, events = _loop(backend, registry)
    conv = Conversation("sys", history="memory")
    res = loop.run(conv, conv.user_message("look left"), registry.openai_tools(), enable_thinking=False,
                   cancel=threading.Event())
    assert [e.text for e in events if e.kind == "sentence"] == ["Looking left."]  # spoken (TTS), not just text
    assert len(backend.requests) == 1  # the model was not asked to talk about the result
    assert res.spoken == ["Looking left."] and res.text == "Looking left."
    assert [r.done for r in res.tool_results] == ["you looked left"]
    # the next time, a line not said in the recent turns
    conv.commit(res.messages, TurnRecord("look left", res.text, ["you looked left"]))
    res2 = loop.run(conv, conv.user_message("look left again"), registry.openai_tools(), enable_thinking=False,
                    cancel=threading.Event())
    assert res2.spoken == ["Okay, left it is."]


def test_a_failed_motion_gets_a_words_round_over_the_error():
    backend, registry = _look_backend(), ToolRegistry([LOOK])
    loop, _ = _loop(backend, registry, ok=False)
    conv = Conversation("sys", history="memory")
    res = loop.run(conv, conv.user_message("look left"), registry.openai_tools(), enable_thinking=False,
                   cancel=threading.Event())
    assert len(backend.requests) == 2  # negative control: without `say` success the model words the outcome
    assert json.loads(backend.requests[1]["messages"][-1]["content"]) == {"error": "goto_pose goal aborted: robot busy"}
    assert not res.tool_results[0].ok


def _what_can_you_do(spec: ToolSpec, model_words: str):
    """One "what can you do?" turn where the model calls list_animations and, if asked again, says model_words."""
    backend = ScriptedBackend([{"match": "can you do", "reply": [{"tool_call": {"name": "list_animations",
                                                                               "arguments": {}}}],
                                "after_tool": [{"text": model_words}]}])
    registry = ToolRegistry([spec])
    loop, _ = _loop(backend, registry)
    conv = Conversation("sys", history="memory")
    res = loop.run(conv, conv.user_message("what can you do?"), registry.openai_tools(), enable_thinking=False,
                   cancel=threading.Event())
    return res, backend, registry


def test_a_tool_without_lines_is_read_back_in_words():
    res, backend, _ = _what_can_you_do(LIST, "I can nod.")
    assert backend.requests[1]["messages"][-1]["content"] == "Your animations: nod (Nod yes); shake head."
    assert res.text == "I can nod."


def test_a_list_is_read_out_from_the_result_not_left_to_the_model():
    """list_animations as make run configures it: its `say` lines name the result's fields, so "what can you do?"
    is answered from the robot's own list and the model is not asked to word it (it said nothing, or talked of
    "the tools provided"). Negative control: the same tool without `say` above is worded by the model."""
    spoken_list = LIST.model_copy(update={"say": ["I know these moves: {names}. Just ask!"]})
    res, backend, registry = _what_can_you_do(spoken_list, "Yes, you can move your head using the tools provided.")
    assert res.spoken == ["I know these moves: nod and shake head. Just ask!"] and len(backend.requests) == 1
    tool = registry.tools["list_animations"]
    three = tool.say_lines({}, {"names": ["nod", "wake_up", "dance"], "descriptions": ["", "", ""]})
    assert three == ["I know these moves: nod, wake up and dance. Just ask!"]


def test_memory_mode_shows_a_short_memory_not_the_earlier_messages():
    conv = Conversation("sys", history="memory", memory_turns=2)
    conv.commit([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! I'm Bolt."}],
                TurnRecord("hi", "Hello! I'm Bolt.", []))
    conv.commit([{"role": "user", "content": "dance"}], TurnRecord("dance", "Ta-da!", ["you played your dance "
                                                                                       "animation"]))
    conv.commit([{"role": "user", "content": "look left"}], TurnRecord("look left", "Looking left.",
                                                                       ["you looked left"]))
    msg = conv.user_message("one more time", "What you see: a cat")
    assert msg["content"] == "[What you see: a cat]\none more time"
    memory = (f'{MEMORY_HEADER}\n'
              '- They said "dance"; you played your dance animation.\n'
              '- They said "look left"; you looked left.')
    # no verbatim history, but the last turn as it was when it acted
    assert conv.messages([msg]) == [{"role": "system", "content": "sys"}, {"role": "system", "content": memory},
                                    msg]
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "look_right", "arguments": {}}}]}
    acted = [{"role": "user", "content": "look right"}, call,
             {"role": "tool", "tool_call_id": "c1", "name": "look_right", "content": "You looked right."},
             {"role": "assistant", "content": "Looking right."}]
    conv.commit(acted, TurnRecord("look right", "Looking right.", ["you looked right"]))
    assert "look right" in conv.messages([msg])[1]["content"]  # off (the default): in the memory, no messages
    conv.keep_last_call = True
    shown = conv.messages([msg])
    assert shown[2:] == [*acted[:3], msg] and "look right" not in shown[1]["content"]  # not its spoken line
    # verbatim mode, the negative control: the earlier messages are there, no memory
    conv.history_mode = "verbatim"
    assert conv.messages([msg]) == [{"role": "system", "content": "sys"}, *conv.history, msg]


def test_scoring_flags_what_a_person_notices():
    assert is_claim("Sure, I can dance for you!") and is_claim("I'm looking to your left!") and is_claim("I nodded.")
    assert is_claim("Looking right.") and not is_claim("Looking forward to it!")
    assert not is_claim("I am looking forward to it.") and not is_claim("I like dancing.")
    # an age is not a motion (the scripted set's "I'm turning thirty."); a turn of the head still is
    assert not is_claim("I'm turning thirty next week!") and not is_claim("I turned 40 in May.")
    assert is_claim("I'm turning left now.") and is_claim("I'm turning to the window.")
    # the person's statement taken as the robot's own in a later sentence is an echo
    assert is_echo("Oh, that's exciting! I'm turning thirty, which is a big step.", "I'm turning thirty.")
    assert not is_echo("Oh, that's exciting! Happy early birthday!", "I'm turning thirty.")
    assert is_meta("The tool is successfully executed, and the robot performed the dance.")
    assert is_meta('Sure, here\'s how you might respond: - "Hey Marco, I\'m throwing a party!"')
    assert not is_meta("Here's a fun fact: octopuses have three hearts.")
    assert is_meta("According to the conversation, there are 7 days in a week.")
    assert not is_meta("Paris is the capital of France.")
    assert is_echo("Nod if you agree.", "Nod if you agree.")
    assert is_echo("Look to your left! How can I assist you today?", "Look to your left.")
    assert not is_echo("Hello! I'm Bolt.", "Hi there! Who are you?") and not is_echo("Good morning!", "Good morning!")
    assert is_repeat("Hello! I'm Bolt, your robot friend.", ["Hi.", "Hello! I'm Bolt, your robot friend!"])
    assert not is_repeat("Looking left.", ["Looking right."])
    turn = {"say": "Can you dance?", "expect": {"tool": "play_animation", "args": {"name": "dance"}}}
    good = score_turn(turn, "Ta-da!", [("play_animation", {"name": "dance", "speed": 1.0})], True, [])
    assert good.right
    bad = score_turn(turn, "Sure, I can dance for you!", [], False, [])  # words, no call: two failures
    assert not bad.right and bad.claim and not bad.call_ok
    assert call_matches([None, {"tool": "list_animations"}], []) and not call_matches("none", [None])
    q = {"say": "Capital of France?", "expect": "none", "answer": ["paris"]}
    assert score_turn(q, "It is Paris.", [], False, []).right and not score_turn(q, "Lyon.", [], False, []).right


def test_the_scene_block_is_never_read_out():
    """In a typed make run, "Do it again!" was answered with the scene block as written in the user message."""
    scene = SceneMemory(SceneMemoryConfig())
    scene.add("A person is in front of you, waving.", now=0.0)
    scene.add("A red ball rolls past.", now=8.0)
    block = scene.render(now=10.0)
    conv = Conversation("sys", history="memory")
    backend = ScriptedBackend([{"match": "again", "reply": [{"text": f"[{block}]"}]},
                               {"match": "only the", "reply": [{"text": block.split("\n")[-1] + " Fun."}]},
                               {"match": "what did", "reply": [{"text": 'They said "Look to your left." Okay.'}]},
                               {"match": "see", "reply": [{"text": "A person is in front of me, waving. Hello!"}]}])
    loop, _ = _loop(backend, ToolRegistry([LOOK]))
    for said in ("Do it again!", "only the last line"):
        res = loop.run(conv, conv.user_message(said, block), [], enable_thinking=False, cancel=threading.Event())
        assert res.spoken == [] and res.stopped == "prompt read out", (said, res.spoken)
    # the memory note's pattern with words of its own ('They said "Look to your left."' in a typed make run)
    conv.commit([], TurnRecord("Turn your head to the left.", "", ["you looked left"]))
    res = loop.run(conv, conv.user_message("what did I say?", block), [], enable_thinking=False,
                   cancel=threading.Event())
    assert res.spoken == [] and res.stopped == "prompt read out", res.spoken
    # negative control: telling what it sees in its own words (even the caption's words) is speech
    res = loop.run(conv, conv.user_message("what do you see?", block), [], enable_thinking=False,
                   cancel=threading.Event())
    assert res.spoken == ["A person is in front of me, waving.", "Hello!"]


def test_a_framing_by_the_conversation_is_not_spoken():
    """The 0.5B model frames answers by the memory note ("Based on the conversation, my favourite colour is green."):
    the answer is spoken without the framing, and the history keeps what was said."""
    conv = Conversation("sys", history="memory")
    backend = ScriptedBackend([
        {"match": "colour", "reply": [{"text": "Based on the conversation, my favourite colour is green. And you?"}]},
        {"match": "week", "reply": [{"text": "According to our conversation, there are 7 days in a week."}]},
        {"match": "talk", "reply": [{"text": "We talk based on the conversation, so far."}]}])
    loop, _ = _loop(backend, ToolRegistry([LOOK]))
    res = loop.run(conv, conv.user_message("What's your favourite colour?"), [], enable_thinking=False,
                   cancel=threading.Event())
    assert res.spoken == ["My favourite colour is green.", "And you?"] and res.text == " ".join(res.spoken)
    assert res.messages[-1]["content"] == res.text
    res = loop.run(conv, conv.user_message("How many days are in a week?"), [], enable_thinking=False,
                   cancel=threading.Event())
    assert res.spoken == ["There are 7 days in a week."]
    # negative control: the words elsewhere in a sentence are the model's own
    res = loop.run(conv, conv.user_message("what do we talk about?"), [], enable_thinking=False,
                   cancel=threading.Event())
    assert res.spoken == ["We talk based on the conversation, so far."]


def test_the_robot_never_addresses_the_person_by_its_own_name():
    """The 0.5B model greets people by the robot's name ("Goodnight, Bolt!" in a typed make run): the vocative goes,
    the history keeps what was said; the name said of itself stays. Negative control: without own_name it stays."""
    replies = {"night": "Goodnight, Bolt! Have a great day.", "puppy": "Hello Bolt, I'm glad you got a puppy.",
               "name": "My name is Bolt. I am a robot, Bolt."}
    backend = ScriptedBackend([{"match": k, "reply": [{"text": v}]} for k, v in replies.items()])
    loop, _ = _loop(backend, ToolRegistry([LOOK]))
    loop.own_name = "Bolt"
    conv = Conversation("sys", history="memory")

    def turn(text):
        return loop.run(conv, conv.user_message(text), [], enable_thinking=False, cancel=threading.Event())
    res = turn("good night")
    assert res.spoken == ["Goodnight!", "Have a great day."]
    assert res.messages[-1]["content"] == "Goodnight! Have a great day."
    assert turn("I got a puppy").spoken == ["Hello, I'm glad you got a puppy."]
    assert turn("your name?").spoken == ["My name is Bolt.", "I am a robot."]
    loop.own_name = ""
    assert turn("good night").spoken[0] == "Goodnight, Bolt!"


def test_the_memory_note_is_never_read_out():
    conv = Conversation("sys", history="memory")
    conv.commit([], TurnRecord("Hi there! Who are you?", "I am Bolt.", []))
    copied = conv.memory().replace("\n", " ")  # as the model copied it in a typed make run
    backend = ScriptedBackend([{"match": "other way", "reply": [{"text": f"{copied} And more."}]},
                               {"match": "weather", "reply": [{"text": "It is sunny and warm here today. Nice."}]}])
    loop, _ = _loop(backend, ToolRegistry([LOOK]))
    res = loop.run(conv, conv.user_message("now the other way"), [], enable_thinking=False, cancel=threading.Event())
    assert res.spoken == [] and res.stopped == "prompt read out"
    # negative control: a reply of its own is spoken
    res = loop.run(conv, conv.user_message("how is the weather?"), [], enable_thinking=False, cancel=threading.Event())
    assert res.spoken == ["It is sunny and warm here today.", "Nice."]
    # with a line for it (make run's config), a turn held back entirely says so rather than staying silent, even
    # when the memory quotes that line from an earlier turn
    loop.at_a_loss = ["Sorry, could you say it another way?", "Hmm, say that again?"]
    conv.commit([], TurnRecord("hm?", loop.at_a_loss[0], []))
    res = loop.run(conv, conv.user_message("now the other way"), [], enable_thinking=False, cancel=threading.Event())
    assert res.spoken == [loop.at_a_loss[1]] and res.text == loop.at_a_loss[1]   # not the line said last turn
    assert res.stats["at_a_loss"] == "prompt read out"


def test_the_person_s_name_is_never_the_robot_s_and_a_header_of_the_memory_is_not_spoken():
    """Held out 3 (2026-12-05): told "Hey Bolt, my name is Marco.", the 0.5B model answered "Hello! I'm Marco, a
    friendly robot ..."; another turn spoke "The old conversation:" (the memory announced). Both are held back;
    negative controls: the name said to the person, and a sentence about a conversation, are spoken."""
    backend = ScriptedBackend([  # matched against the whole prompt (the memory too): the newest words first
        {"match": "Nina", "reply": [{"text": "Nice to meet you, Nina! I'm Bolt."}]},
        {"match": "chat", "reply": [{"text": "What a nice conversation: thank you."}]},
        {"match": "party", "reply": [{"text": "The old conversation:"}]},
        {"match": "Marco", "reply": [{"text": "Hello! I'm Marco, a friendly robot."}]}])
    loop, _ = _loop(backend, ToolRegistry([LOOK]))
    conv = Conversation("sys", history="memory")

    def turn(said):
        return loop.run(conv, conv.user_message(said), [], enable_thinking=False, cancel=threading.Event(),
                        utterance=said)
    assert turn("Hey Bolt, my name is Marco.").spoken == ["Hello!"]       # cut at the name taken
    assert turn("I'm throwing a party.").spoken == []
    assert turn("Hi, I'm Nina.").spoken == ["Nice to meet you, Nina!", "I'm Bolt."]
    assert turn("Nice chat.").spoken == ["What a nice conversation: thank you."]
    assert is_meta("The old conversation:") and not is_meta("What a nice conversation: thank you.")


def test_the_persona_read_out_in_the_third_person_is_not_spoken():
    """The scripted set and held out 4 (2026-12-05): to "It's my birthday today!" the 0.5B model said "Bolt, a friendly
    robot with a head that turns and tilts, two antennas, ..." (its system prompt read out). The robot speaks of
    itself as "I": its own name opening a description of it is held back. Negative controls: the robot's name
    said in the first person, and another name's description, are spoken."""
    from bolt_ros.assistant.reply_text import read_out
    assert read_out("Bolt, a friendly robot with a head that turns and tilts.", set(), "Bolt")
    assert read_out("Bolt is a small friendly robot.", set(), "Bolt")
    assert not read_out("I'm Bolt, a small friendly robot.", set(), "Bolt")
    assert not read_out("Max is a lovely name for a dog.", set(), "Bolt")
    assert not read_out("Bolt is a small friendly robot.", set(), "")   # no name configured: nothing to tell
    backend = ScriptedBackend([{"match": "birthday", "reply": [
        {"text": "Bolt, a friendly robot with a head that turns and tilts, says hi. Happy birthday!"}]}])
    loop, _ = _loop(backend, ToolRegistry([LOOK]))
    loop.own_name = "Bolt"
    conv = Conversation("You are Bolt, a small friendly robot.", history="memory")
    res = loop.run(conv, conv.user_message("It's my birthday today!"), [], enable_thinking=False,
                   cancel=threading.Event())
    assert res.stopped == "prompt read out" and not any(s.startswith("Bolt") for s in res.spoken), res.spoken
