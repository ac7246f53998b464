"""The first clause to TTS (issue 33, item 4): a reply's first unit goes to the synthesizer before its sentence is
complete, at a comma after >= 4 words or after ~8 words at a phrase boundary; the rest of the reply is whole
sentences; max_sentences still counts sentences; and the clauses, rendered apart by Piper, are heard back as the
sentence is (prosody good enough that the words survive)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from bolt_ros.assistant.conversation import Conversation
from bolt_ros.assistant.scripted import ScriptedBackend
from bolt_ros.assistant.sentences import SentenceSplitter, is_clause, sentence_count
from bolt_ros.assistant.tool_loop import ToolLoop


def split(text: str, first_clause: int = 4, step: int = 3) -> list[str]:
    s = SentenceSplitter(first_clause=first_clause)
    out = []
    for i in range(0, len(text), step):   # a few characters at a time, like a token stream
        out += s.push(text[i:i + step])
    return out + s.flush()


def test_the_first_unit_is_a_clause_at_a_comma_after_four_words_and_the_rest_are_sentences():
    text = "The capital of France is Paris, a city of art and food. It is lovely in spring, they say."
    assert split(text) == ["The capital of France is Paris,", "a city of art and food.",
                           "It is lovely in spring, they say."]
    # a comma after fewer words is no clause: "Sure," waits for its sentence
    assert split("Sure, I can do that. Anything else?") == ["Sure, I can do that.", "Anything else?"]
    # negative control: first_clause 0 is whole sentences, as before issue 33
    assert split(text, first_clause=0) == ["The capital of France is Paris, a city of art and food.",
                                           "It is lovely in spring, they say."]


def test_without_a_comma_the_first_unit_ends_near_eight_words_never_after_an_open_word():
    units = split("I am a small robot that can move my head and dance when you ask me to.")
    assert units[0] == "I am a small robot" and " ".join(units) == (
        "I am a small robot that can move my head and dance when you ask me to.")
    units = split("I am going to tell you about the history of the big red barn today.")
    assert len(units) == 2 and units[0].split()[-1] not in {"the", "of", "to", "about", "a"}, units
    assert 8 <= len(units[0].split()) <= 14, units
    # a short sentence is one unit
    assert split("Two plus two is four.") == ["Two plus two is four."]


def test_and_or_end_a_first_unit_only_before_a_clause():
    # a spoken make run said "The moon is a beautiful" | "and mysterious planet ...": the cut fell between two
    # adjectives "and" joined
    units = split("The moon is a beautiful and mysterious place that shines in the night sky.")
    assert units[0] != "The moon is a beautiful" and not units[0].endswith(("beautiful", "and")), units
    assert " ".join(units) == "The moon is a beautiful and mysterious place that shines in the night sky."
    # negative control: before "and" that opens a clause the unit still ends there
    assert split("My friend likes the quiet sea and I love the high mountains.")[0] == (
        "My friend likes the quiet sea")


def test_the_clause_is_released_before_the_sentence_is_complete():
    s = SentenceSplitter(first_clause=4)
    text = "Paris is the capital of France, and a lovely city."
    released_at = None
    for i, ch in enumerate(text):
        if s.push(ch):
            released_at = i
            break
    assert released_at is not None and released_at < text.index("lovely"), released_at


def test_a_turn_speaks_its_clause_first_and_max_sentences_counts_sentences():
    reply = "The capital of France is Paris, a city of art. It is big. It is old. It is far."
    events = []
    loop = ToolLoop(ScriptedBackend([{"match": ".", "reply": [{"text": reply}]}]), lambda c, x: None, events.append,
                    max_sentences=3)
    loop.first_clause = 4
    conv = Conversation("sys")
    res = loop.run(conv, conv.user_message("tell me about Paris"), [], enable_thinking=False,
                   cancel=threading.Event())
    said = [e.text for e in events if e.kind == "sentence"]
    assert said == ["The capital of France is Paris,", "a city of art.", "It is big.", "It is old."], said
    assert is_clause(said[0]) and sentence_count(said) == 3 and res.stopped == "max_sentences"
    # negative control: without first_clause the same turn speaks whole sentences
    events.clear()
    loop.first_clause = 0
    loop.run(conv, conv.user_message("tell me about Paris"), [], enable_thinking=False, cancel=threading.Event())
    assert next(e.text for e in events if e.kind == "sentence") == "The capital of France is Paris, a city of art."


SENTENCES = ["The capital of France is Paris, a city known for its art and food.",
             "I can look around the room and dance for you when you ask me to.",
             "Two plus two is four, and four plus four is eight."]


@pytest.mark.parametrize("sentence", SENTENCES)
def test_clauses_rendered_apart_are_heard_as_the_sentence_is(sentence):
    pytest.importorskip("faster_whisper", reason="the voice stack: bash scripts/setup_voice.sh")
    from bolt_ros.voice.asr import Transcriber
    from bolt_ros.voice.audio import resample, to_float
    from bolt_ros.voice.config import AsrConfig
    from bolt_ros.voice.tts import PiperTts
    from bolt_ros.voice.words import word_errors
    tts, asr = _models(PiperTts, Transcriber, AsrConfig)
    units = split(sentence)
    assert len(units) == 2, units

    def render(parts):   # the synthesizer plays its units back to back
        return np.concatenate([resample(to_float(p), p.rate) for p in map(tts.synthesize, parts)])

    whole, apart = asr.transcribe(render([sentence]), prompt=False), asr.transcribe(render(units), prompt=False)
    assert word_errors(sentence, apart) <= word_errors(sentence, whole) + 1, (whole, apart)
    # negative control: the measure tells a different sentence apart
    assert word_errors(SENTENCES[(SENTENCES.index(sentence) + 1) % 3], apart) > 3


_cache: dict = {}


def _models(tts_cls, asr_cls, asr_cfg):
    if not _cache:
        _cache["tts"], _cache["asr"] = tts_cls(still=True), asr_cls(asr_cfg())
    return _cache["tts"], _cache["asr"]


def test_a_short_line_said_again_plays_its_kept_audio(ros):
    """A move's line comes back turn after turn: the synthesizer keeps short lines' audio and plays it at once."""
    pytest.importorskip("piper", reason="the voice stack: bash scripts/setup_voice.sh")
    from bolt_ros.msg import AudioChunk
    from conftest import wait_for
    from std_msgs.msg import String

    from bolt_ros.nodes.speech_synthesizer import SpeechSynthesizer
    from bolt_ros.voice.tts import PiperTts
    synth = ros.add(SpeechSynthesizer(tts=PiperTts(), context=ros.context))
    probe = ros.node("tts_cache_probe")
    played: list[bytes] = []
    probe.create_subscription(AudioChunk, "audio/out", lambda m: played.append(bytes(m.data)), 500)
    say = probe.create_publisher(String, "tts/say", 10)
    wait_for(lambda: say.get_subscription_count() and synth.count_subscribers("audio/out"), what="connections")

    def spoken(text: str) -> bytes:
        n, done = len(played), synth.counts["played"] + 1
        say.publish(String(data=text))
        wait_for(lambda: synth.counts["played"] >= done, timeout=20, what=f"{text!r} played")
        time.sleep(0.2)   # the last blocks' messages
        return b"".join(played[n:])

    short, long = "Looking left.", "The capital of France is Paris, a city known for its art."
    first, again = spoken(short), spoken(short)
    assert synth.counts["cached"] == 1 and again == first
    # negative control: a long line is synthesized anew, and Piper renders it differently each time
    assert spoken(long) != spoken(long) and synth.counts["cached"] == 1


def test_a_clause_is_not_cut_before_a_name_so_the_robot_never_calls_the_person_by_its_own():
    """'"Thank you for asking, Bolt!"' cut at its comma left 'Bolt!' as a unit of its own, which reply_text.unaddress
    (it takes ', Bolt' out) could not see: the robot said its own name to the person (a spoken make run)."""
    assert split('"Thank you for asking, Bolt!" I am glad.') == ['"Thank you for asking, Bolt!"', "I am glad."]
    assert split("Thanks for coming today, Anna, it was lovely.")[0] == "Thanks for coming today, Anna,"
    events = []
    loop = ToolLoop(ScriptedBackend([{"match": ".", "reply": [{"text": '"Thank you for asking, Bolt!" I am glad.'}]}]),
                    lambda c, x: None, events.append, own_name="Bolt")
    loop.first_clause = 4
    conv = Conversation("sys")
    loop.run(conv, conv.user_message("thanks"), [], enable_thinking=False, cancel=threading.Event())
    said = [e.text for e in events if e.kind == "sentence"]
    assert said and not any("Bolt" in s for s in said), said
    # the clause still comes before a lower-case word or "I"
    assert split("I think that is great, I really do like it.") == ["I think that is great,", "I really do like it."]
