"""ROS-free assistant logic: sentence splitting, scene memory, history bounds, tool validation and mapping,
config <-> ROS parameters, and the tool loop driven by the scripted backend."""
from __future__ import annotations

import json
import threading

import pytest

from bolt_ros.assistant.backend import ToolCallRequest
from bolt_ros.assistant.config import (
    AssistantConfig,
    SceneMemoryConfig,
    from_ros_parameters,
    load_params_file,
    to_ros_parameters,
)
from bolt_ros.assistant.conversation import Conversation, SceneMemory
from bolt_ros.assistant.scripted import ScriptedBackend
from bolt_ros.assistant.sentences import SentenceSplitter
from bolt_ros.assistant.tool_loop import ToolLoop
from bolt_ros.assistant.tools import ToolError, ToolOutcome, ToolRegistry, ToolSpec
from bolt_ros.graph import package_file

MOVE_HEAD = ToolSpec.model_validate({
    "name": "move_head", "description": "look", "kind": "action", "target": "goto_pose",
    "type": "bolt_ros/action/GotoPose",
    "parameters": {"type": "object", "required": ["yaw"], "properties": {
        "yaw": {"type": "number", "minimum": -60, "maximum": 60},
        "duration": {"type": "number", "minimum": 0.3, "maximum": 4, "default": 1.0}}},
    "goal": {"target.head_yaw": {"arg": "yaw", "scale": 0.5}, "duration": {"arg": "duration"}, "interpolation": 1}})
PLAY = ToolSpec.model_validate({
    "name": "play_animation", "description": "animate", "kind": "action", "target": "play_animation",
    "type": "bolt_ros/action/PlayAnimation",
    "parameters": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}},
    "enum_from": {"parameter": "name"}, "goal": {"name": {"arg": "name"}}})


def test_sentences_are_released_as_soon_as_complete_and_not_at_decimals_or_abbreviations():
    s = SentenceSplitter()
    got = []
    text = "Hello there! It is 3.5 m away, e.g. near Dr. Who. Really?! \"Yes.\" A list\nok"
    released_at = {}
    for i, ch in enumerate(text):  # character by character, like a token stream
        for sentence in s.push(ch):
            got.append(sentence)
            released_at[sentence] = i
    assert released_at["Hello there!"] == text.index("!") + 1  # with the first character after the end mark
    assert got == ["Hello there!", "It is 3.5 m away, e.g. near Dr. Who.", "Really?!", '"Yes."', "A list"]
    assert s.flush() == ["ok"] and s.flush() == []


def test_scene_memory_dedups_ages_and_stays_bounded_under_a_caption_flood():
    mem = SceneMemory(SceneMemoryConfig(max_tokens=60, max_age_s=30.0, max_items=5))
    mem.add("A person is in front of you.", now=0.0)
    mem.add("a person is in front of you", now=10.0)  # same scene, new time: refreshed, not duplicated
    assert len(mem.items) == 1 and "just now" in mem.render(now=10.0)
    assert "5 s ago" in mem.render(now=15.0)
    for i in range(5000):  # flood: every caption different
        mem.add(f"caption number {i} with some extra words to take tokens", now=20.0 + i * 0.001)
    assert mem.tokens() <= 60 and len(mem.items) <= 5
    assert "4999" in mem.render(now=25.0)  # the newest survive
    assert mem.render(now=100.0) == ""    # and everything expires


def test_history_is_trimmed_by_whole_turns():
    conv = Conversation("sys", max_messages=5)
    for i in range(4):
        conv.commit([{"role": "user", "content": f"u{i}"},
                     {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},
                     {"role": "tool", "content": "{}"}, {"role": "assistant", "content": f"a{i}"}])
    assert len(conv.history) <= 5 and conv.history[0]["role"] == "user" and conv.history[0]["content"] == "u3"
    assert conv.messages()[0] == {"role": "system", "content": "sys"}


def test_tool_arguments_are_validated_with_clear_errors_and_mapped_to_goal_fields():
    reg = ToolRegistry([MOVE_HEAD, PLAY])
    tool, args = reg.resolve(ToolCallRequest("1", "move_head", {"yaw": 20}))
    assert args == {"yaw": 20.0, "duration": 1.0}
    assert tool.request_fields(args) == {"target.head_yaw": 10.0, "duration": 1.0, "interpolation": 1}
    cases = [(ToolCallRequest("2", "fly", {}), "unknown tool 'fly'; available tools: move_head, play_animation"),
             (ToolCallRequest("3", "move_head", {"yaw": 90}), "yaw: Input should be less than or equal to 60"),
             (ToolCallRequest("4", "move_head", {}), "yaw: Field required"),
             (ToolCallRequest("5", "move_head", {"yaw": 1, "speed": 2}), "speed: Extra inputs are not permitted"),
             (ToolCallRequest("6", "move_head", {"yaw": "left"}), "yaw: Input should be a valid number"),
             (ToolCallRequest("7", "", None, error="not JSON"), "could not parse the tool call: not JSON")]
    for call, msg in cases:
        with pytest.raises(ToolError, match=msg.replace("(", r"\(")):
            reg.resolve(call)
    # enums learned from the robot restrict names and show up in the schema the model gets
    play = reg.tools["play_animation"]
    assert reg.resolve(ToolCallRequest("8", "play_animation", {"name": "anything"}))[1] == {"name": "anything"}
    play.set_enum(["nod", "happy"], ["yes", "joy"])
    with pytest.raises(ToolError, match="name: Input should be 'nod' or 'happy'"):
        reg.resolve(ToolCallRequest("9", "play_animation", {"name": "fly"}))
    fn = next(t for t in reg.openai_tools() if t["function"]["name"] == "play_animation")["function"]
    assert fn["parameters"]["properties"]["name"]["enum"] == ["nod", "happy"] and "nod: yes" in fn["description"]


def test_clamp_mode_clamps_numbers_instead_of_refusing():
    spec = MOVE_HEAD.model_copy(update={"clamp": True})
    _, args = ToolRegistry([spec]).resolve(ToolCallRequest("1", "move_head", {"yaw": 500, "duration": 0.01}))
    assert args == {"yaw": 60.0, "duration": 0.3}


@pytest.mark.parametrize("bad, msg", [
    ({"kind": "service"}, "does not match kind"),
    ({"goal": {"x": {"arg": "nope"}}}, "unknown argument 'nope'"),
    ({"parameters": {"type": "object", "properties": {"p": {"type": "object"}}}}, "unsupported type 'object'"),
    ({"name": "bad name!"}, "String should match pattern"),
])
def test_bad_tool_declarations_are_refused(bad, msg):
    with pytest.raises(ValueError, match=msg):
        ToolSpec.model_validate({**MOVE_HEAD.model_dump(), **bad})


def test_config_file_maps_one_to_one_onto_ros_parameters():
    params = load_params_file(package_file("config/assistant.yaml"), "assistant_node")
    cfg = from_ros_parameters(params)
    flat = to_ros_parameters(cfg)
    assert set(flat) == set(params)  # every field is a parameter of the file and vice versa
    assert all(isinstance(v, bool | int | float | str) for v in flat.values())
    assert from_ros_parameters(flat) == cfg
    assert [t.name for t in cfg.tools] == ["play_animation", "look", "move_head", "list_animations"]
    assert set(to_ros_parameters(AssistantConfig())) == set(flat)
    with pytest.raises(ValueError, match="max_tool_rounds"):
        from_ros_parameters({**flat, "max_tool_rounds": -1})
    with pytest.raises(ValueError, match="Extra inputs"):
        from_ros_parameters({**flat, "backend.typo": 1})


def _loop(backend, tool_fn=None, rounds=3):
    events = []
    calls = []

    registry = ToolRegistry([MOVE_HEAD, PLAY])

    def call_tool(call, cancel):  # the ROS-free half of the router: resolve, then "run"
        calls.append(call)
        try:
            registry.resolve(call)
        except ToolError as e:
            return ToolOutcome(call.id, call.name, False, error=str(e))
        return tool_fn(call) if tool_fn else ToolOutcome(call.id, call.name, True, json.dumps({"done": call.name}))
    return ToolLoop(backend, call_tool, events.append, max_tool_rounds=rounds), events, calls


def test_tool_loop_runs_tools_and_feeds_results_back_to_the_model():
    backend = ScriptedBackend([{"match": "wave", "reply": [
        {"thought": "they want a wave"}, {"text": "Sure! Watch this. "},
        {"tool_call": {"name": "play_animation", "arguments": {"name": "happy"}}}],
        "after_tool": [{"text": "Done. That was fun!"}]}])
    loop, events, calls = _loop(backend)
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("please wave", "What you see: a person"), [PLAY.model_dump()],
                   enable_thinking=True, cancel=threading.Event())
    conv.commit(res.messages)
    assert [c.name for c in calls] == ["play_animation"] and calls[0].arguments == {"name": "happy"}
    assert [e.text for e in events if e.kind == "sentence"] == ["Sure!", "Watch this.", "Done.", "That was fun!"]
    assert [e.text for e in events if e.kind == "state"] == ["thinking", "speaking", "acting", "thinking",
                                                               "speaking", "idle"]
    assert "".join(e.text for e in events if e.kind == "thought") == "they want a wave"
    assert res.text == "Sure! Watch this. Done. That was fun!"
    second = backend.requests[1]["messages"]  # the model saw its call and the result
    assert second[-2]["tool_calls"][0]["function"] == {"name": "play_animation", "arguments": {"name": "happy"}}
    assert second[-1] == {"role": "tool", "tool_call_id": calls[0].id, "name": "play_animation",
                          "content": '{"done": "play_animation"}'}
    assert [m["role"] for m in conv.history] == ["user", "assistant", "tool", "assistant"]
    assert conv.history[0]["content"].startswith("[What you see: a person]\nplease wave")
    assert backend.requests[0]["enable_thinking"] is True


def test_tool_rounds_are_bounded_and_the_last_call_is_words_only():
    # a new call each time (a repeated one would end the turn: see the repeated-call test)
    backend = ScriptedBackend(lambda msgs: [{"tool_call": {"name": "move_head", "arguments": {"yaw": len(msgs)}}}])
    loop, _, calls = _loop(backend, rounds=2)
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("go"), [MOVE_HEAD.model_dump()], enable_thinking=False,
                   cancel=threading.Event())
    assert len(backend.requests) == 3 and [r["words_only"] for r in backend.requests] == [False, False, True]
    assert len(calls) == 2  # a call in the third, words-only reply is answered with an error, not executed
    assert res.tool_results[-1].error == "no more tool calls allowed in this turn"


def test_tool_errors_reach_the_model_as_tool_messages():
    backend = ScriptedBackend([{"match": ".", "reply": [{"tool_call_raw": "<call>oops"}],
                                "after_tool": [{"text": "Sorry."}]}])
    loop, _, _ = _loop(backend)
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("x"), [], enable_thinking=False, cancel=threading.Event())
    assert res.tool_results[0].error == "could not parse the tool call: not a JSON tool call: '<call>oops'"
    tool_msg = backend.requests[1]["messages"][-1]
    assert tool_msg["role"] == "tool" and "error" in json.loads(tool_msg["content"])


def test_cancel_stops_generation_between_tokens_and_the_fragment_is_not_spoken():
    """Event-driven: cancel when the 10th text delta is emitted (mid-fragment, after "One."); at most the delta
    already in flight follows, and the unfinished sentence is never spoken."""
    backend = ScriptedBackend([{"match": ".", "reply": [{"text": "One. " + "word " * 200}]}], token_delay_s=0.001)
    loop, events, _ = _loop(backend)
    cancel = threading.Event()
    at_cancel = []

    def emit(ev):
        events.append(ev)
        if ev.kind == "text" and sum(e.kind == "text" for e in events) == 10:
            cancel.set()
            at_cancel.append(len(events))

    loop.emit = emit
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("x"), [], enable_thinking=False, cancel=cancel)
    assert res.cancelled and at_cancel
    assert sum(e.kind == "text" for e in events[at_cancel[0]:]) <= 1  # stopped between tokens, not at the end
    assert [e.text for e in events if e.kind == "sentence"] == ["One."]
    # the history keeps what was spoken, not the interrupted fragment ("One. word word ...")
    assert res.messages[-1] == {"role": "assistant", "content": "One."} and res.text == "One."


def test_engine_failure_is_an_error_event_not_an_exception():
    def broken(_msgs):
        raise RuntimeError("model exploded")
    loop, events, _ = _loop(ScriptedBackend(broken))
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("x"), [], enable_thinking=False, cancel=threading.Event())
    assert res.error == "RuntimeError: model exploded" and events[-2].kind == "error"


def test_a_looping_reply_stops_at_the_first_repeated_sentence_and_the_model_call_is_closed():
    loop_text = "I can see it. " * 40
    closed = []

    class Watched(ScriptedBackend):
        def stream_chat(self, *a, **kw):
            try:
                yield from super().stream_chat(*a, **kw)
            finally:
                closed.append(True)

    backend = Watched([{"match": ".", "reply": [{"text": "Hello there! " + loop_text}]}])
    loop, events, _ = _loop(backend)
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("what do you see?"), [], enable_thinking=False, cancel=threading.Event())
    assert [e.text for e in events if e.kind == "sentence"] == ["Hello there!", "I can see it."]
    assert res.stopped == "repetition" and res.stats["stopped"] == "repetition" and closed
    assert sum(e.kind == "text" for e in events) < 20  # cut off, not streamed to the end (~120 deltas)
    assert res.messages[-1] == {"role": "assistant", "content": "Hello there! I can see it."}  # history: what was said


def test_max_sentences_ends_the_turn_and_no_tool_round_follows():
    backend = ScriptedBackend([{"match": ".", "reply": [{"text": "One. Two. Three. Four. Five."}]}])
    loop, events, _ = _loop(backend)
    loop.max_sentences = 3
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("count"), [], enable_thinking=False, cancel=threading.Event())
    assert [e.text for e in events if e.kind == "sentence"] == ["One.", "Two.", "Three."]
    assert res.stopped == "max_sentences" and res.text == "One. Two. Three."
    # negative control: without the limit the whole reply is spoken
    loop2, events2, _ = _loop(ScriptedBackend([{"match": ".", "reply": [{"text": "One. Two. Three. Four. Five."}]}]))
    loop2.run(conv, conv.user_message("count"), [], enable_thinking=False, cancel=threading.Event())
    assert len([e for e in events2 if e.kind == "sentence"]) == 5


def test_product_look_tool_maps_directions_to_head_angles():
    cfg = from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))
    reg = ToolRegistry(cfg.tools)
    look = reg.tools["look"]
    for direction, yaw, pitch in (("left", 0.6, 0.0), ("right", -0.6, 0.0), ("up", 0.0, -0.35),
                                  ("down", 0.0, 0.35), ("center", 0.0, 0.0)):
        tool, args = reg.resolve(ToolCallRequest("c", "look", {"direction": direction}))
        fields = tool.request_fields(args)
        assert fields["target.head_yaw"] == yaw and fields["target.head_pitch"] == pitch, direction
    with pytest.raises(ToolError, match="direction: Input should be 'left'"):
        look.validate({"direction": "backwards"})
    with pytest.raises(ValueError, match="every value the map covers"):
        ToolSpec.model_validate({**look.spec.model_dump(), "goal": {"target.head_yaw": {
            "arg": "direction", "map": {"left": 0.6}}}})


def test_an_animation_name_called_as_a_tool_plays_that_animation():
    reg = ToolRegistry([MOVE_HEAD, PLAY])
    with pytest.raises(ToolError, match="unknown tool 'dance'"):  # before the robot told us its animations
        reg.resolve(ToolCallRequest("c", "dance", {}))
    reg.tools["play_animation"].set_enum(["dance", "nod"])
    tool, args = reg.resolve(ToolCallRequest("c", "dance", {}))
    assert tool.spec.name == "play_animation" and args == {"name": "dance"}
    with pytest.raises(ToolError, match="invalid arguments"):  # other arguments still meet the schema
        reg.resolve(ToolCallRequest("c", "nod", {"height": 3}))
    with pytest.raises(ToolError, match="unknown tool 'fly'"):
        reg.resolve(ToolCallRequest("c", "fly", {}))


def test_device_is_a_config_field_a_launch_argument_and_resolves_clearly():
    import torch

    from bolt_ros.engine.device import resolve_device
    from bolt_ros.graph import describe_graph, parse_arguments

    procs = describe_graph(parse_arguments({"device": "cuda:1"}))
    assert procs[0].parameters["backend.device"] == "cuda:1"  # launch argument -> the assistant's ROS parameter
    assert describe_graph(parse_arguments({}))[0].parameters["backend.device"] == "auto"
    with pytest.raises(ValueError, match=r"backend\.device"):
        from_ros_parameters({"backend.device": "tpu"})
    assert resolve_device("auto") == torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device available"):
            resolve_device("cuda")


def test_expanded_tools_are_offered_by_name_and_resolve_to_their_tool():
    cfg = from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))
    reg = ToolRegistry(cfg.tools)
    names = [t["function"]["name"] for t in reg.openai_tools()]
    assert "look_left" in names and "look" not in names and "play_animation" in names  # enum not known yet
    reg.tools["play_animation"].set_enum(["dance", "nod", "look"], ["A short dance.", "Nod twice.", ""])
    offered = {t["function"]["name"]: t["function"] for t in reg.openai_tools()}
    assert {"dance", "nod", "look_up", "move_head", "list_animations"} <= set(offered)
    assert "play_animation" not in offered and offered["dance"]["description"] == "A short dance."
    assert offered["look_up"]["parameters"] == {"type": "object", "properties": {}}
    # "look" collides with the look tool: that animation stays reachable through play_animation only
    assert offered.get("look", {}).get("description") != ""
    for name, tool, args in (("dance", "play_animation", {"name": "dance", "speed": 1.0}),  # defaults filled
                             ("look_left", "look", {"direction": "left"}),
                             ("look_center", "look", {"direction": "center"})):
        t, a = reg.resolve(ToolCallRequest("c", name, {}))
        assert (t.spec.name, a) == (tool, args)
    with pytest.raises(ToolError, match="invalid arguments"):
        reg.resolve(ToolCallRequest("c", "look_left", {"speed": 2}))
    with pytest.raises(ValueError, match="string enum"):
        ToolSpec.model_validate({**MOVE_HEAD.model_dump(), "expand": {"parameter": "yaw"}})


def test_a_repeated_call_ends_the_turn_and_a_call_written_as_text_is_not_spoken():
    dance = {"tool_call": {"name": "play_animation", "arguments": {"name": "dance"}}}
    backend = ScriptedBackend([{"match": "dance", "reply": [dance], "after_tool": [dance]}])
    loop, events, calls = _loop(backend)
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("dance for me"), [PLAY.model_dump()], enable_thinking=False,
                   cancel=threading.Event())
    # the repeat is not run; the model is asked once more, for words only (this script repeats itself even then)
    assert [c.name for c in calls] == ["play_animation"] and res.stopped == "repeated tool call"
    assert [r["words_only"] for r in backend.requests] == [False, False, True]
    assert [e.kind for e in events].count("tool_call") == 1
    # negative control: a different call after the result does run
    nod = {"tool_call": {"name": "play_animation", "arguments": {"name": "nod"}}}
    loop2, _, calls2 = _loop(ScriptedBackend([{"match": "dance", "reply": [dance], "after_tool": [nod]}]), rounds=2)
    loop2.run(conv, conv.user_message("dance for me"), [PLAY.model_dump()], enable_thinking=False,
              cancel=threading.Event())
    assert [c.arguments["name"] for c in calls2] == ["dance", "nod"]
    # a model that answers the words-only request in words ends the turn speaking
    n = iter(range(10))
    backend4 = ScriptedBackend(lambda msgs: [dance] if next(n) < 2 else [{"text": "I danced."}])
    loop4, _, calls4 = _loop(backend4)
    res4 = loop4.run(conv, conv.user_message("dance for me"), [PLAY.model_dump()], enable_thinking=False,
                     cancel=threading.Event())
    assert len(calls4) == 1 and res4.spoken == ["I danced."] and not res4.stopped
    # the last round offers no tools; a model that still writes a call as text is not spoken
    as_text = [{"match": ".", "reply": [{"text": '{"name": "dance", "arguments": {}}'}]}]
    loop3, events3, _ = _loop(ScriptedBackend(as_text))
    res3 = loop3.run(conv, conv.user_message("x"), [], enable_thinking=False, cancel=threading.Event())
    assert [e for e in events3 if e.kind == "sentence"] == [] and res3.stopped == "tool call as text"
    # inside words too (what sampled Qwen 0.5B said after a nod), and it stops the reply there; braces are words
    for said, spoken in (('I nodded. ({"name": "nod", "arguments": {}}) Bye.', ["I nodded."]),
                         ("I nodded {happily}. Bye.", ["I nodded {happily}.", "Bye."])):
        loop5, _, _ = _loop(ScriptedBackend([{"match": ".", "reply": [{"text": said}]}]))
        res5 = loop5.run(conv, conv.user_message("x"), [], enable_thinking=False, cancel=threading.Event())
        assert res5.spoken == spoken and (res5.stopped == "tool call as text") == (len(spoken) == 1), said
