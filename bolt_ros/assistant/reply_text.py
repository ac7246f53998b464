"""What a model's spoken sentence is checked against: text helpers of the tool loop (bolt_ros/assistant/tool_loop.py).

Normalized words, the prompt's note read out (runs of words shared with it), a call written as text, an answer framed
by the conversation, and the sentences of earlier replies (what a reply must not parrot).
"""
from __future__ import annotations

import re

from bolt_ros.assistant.sentences import SentenceSplitter

PROMPT_ECHO_WORDS = 6  # a run of this many words of the memory note in a sentence: the note read out


def ngrams(text: str, n: int = PROMPT_ECHO_WORDS) -> set[tuple[str, ...]]:
    words = norm(text).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def read_out(sentence: str, memory: set[tuple[str, ...]], own_name: str) -> bool:
    """The prompt read out: a run of PROMPT_ECHO_WORDS words of the memory note (`memory`: its ngrams), or the system
    prompt's persona in the third person ("Bolt is a friendly robot with a head that turns and tilts, ...", "Bolt, a
    friendly robot ...": the 0.5B model's reply to "It's my birthday today!" and to "My niece is sleeping over
    tonight.", 2 of 627 turns over the scripted set and held out 3 and 4, 2026-12-05). The robot speaks of itself as
    "I", so its own name opening a description of it is never speech."""
    if ngrams(sentence) & memory:
        return True
    return bool(own_name) and re.match(rf"^\W*{re.escape(own_name)}(?:,\s+an?\b|\s+(?:is|has)\b)", sentence,
                                       re.IGNORECASE) is not None


# a call opener, a code fence, a leading `{` or a JSON object anywhere (`({"name": "nod", ...})`), never braces
# around words: the grammar keeps embedded models from these, an OpenAI-compatible server's model may still write them
CALL_AS_TEXT = re.compile(r'^\s*\{|<tool_call>|<\|tool_call>|```|\{\s*"')


# "Based on the conversation, my favourite colour is green.": the 0.5B model frames answers by the prompt's memory
# note (14 of 252 turns in bench_conversation, 2026-12-03); the framing is said by nobody, the rest is the answer
FRAMING = re.compile(r"^\s*(?:based on|according to|from|given) (?:the|this|our|your) (?:conversation|information"
                     r"|context|memory|messages?|earlier turns)(?: so far| above| provided)?"
                     # "Based on the information provided in the conversation, I am 46." (scripted set, 2026-12-05)
                     r"(?: in (?:the|this|our) conversation)?\s*,\s*", re.IGNORECASE)


def unframe(sentence: str) -> str:
    """The sentence without a leading "Based on the conversation, " (capitalized again)."""
    m = FRAMING.match(sentence)
    if not m:
        return sentence
    rest = sentence[m.end():]
    return rest[:1].upper() + rest[1:]


# "I'm sorry, but I can't assist with that request." was the 0.5B model's answer to a person telling of a small mishap
# (2 of 3 seeds, issue 34): small talk is never refused, such a sentence is held back and the turn answered anew
REFUSAL = re.compile(r"\b(?:can ?not|can't|can’t|unable to|not able to|won't be able to)\s+(?:assist|help)"
                     r"(?:\s+you)?\s+with\s+(?:that|this|your)|\bi (?:didn't|did not|don't|do not) understand your"
                     r"|\bwhat do you need (?:assistance|help) with\b"
                     # its opening alone: the first clause of a reply is spoken before its sentence ends (issue 33),
                     # and "I'm sorry, but I am not able to | assist with that request." came in two parts
                     r"|^\s*(?:i'?m |i am )?sorry,? but (?:i|as an?)\b", re.IGNORECASE)


# "Sure, here's how you might respond: - "Hey Marco, ..."": the 0.5B model writing a reply for someone else to say
# (held out 3, 1 of 189 turns, issue 34's third round), the person's own words in it: held back, the turn drawn anew
DRAFTED = re.compile(r"\bhere(?:'s| is| are)\s+(?:how you (?:might|could|can|should) (?:respond|reply|answer|say)"
                     r"|(?:a|one|some) (?:possible |sample |suggested |good )?(?:responses?|repl(?:y|ies)|answers?))"
                     r"|\byou (?:might|could|can) (?:respond|reply) with\b", re.IGNORECASE)


_GREETING = r"(?:hello|hi|hey|good ?night|good morning|good evening|thanks|thank you|bye|goodbye)"


def unaddress(sentence: str, own_name: str) -> str:
    """The sentence without the robot's own name used to address the person ("Goodnight, Bolt!" -> "Goodnight!",
    "Hello Bolt, ..." -> "Hello, ..."): the 0.5B model greets people by the name its prompt gives the robot (3 of 14
    turns of a typed make run, 2026-12-03). The name said of itself ("My name is Bolt.") stays."""
    if not own_name:
        return sentence
    name = re.escape(own_name)
    out = re.sub(rf",\s*{name}\b(?=\s*[!.?,;])", "", sentence)
    return re.sub(rf"\b({_GREETING})\s+{name}\b", r"\1", out, flags=re.IGNORECASE)


def said_before(replies: list[str]) -> set[str]:
    """Every sentence of these replies and every opening of each ("goodbye", "goodbye how about you"), normalized."""
    out = set()
    for r in replies:
        ss = [norm(x) for x in sentences(r)]
        out.update(ss)
        out.update(" ".join(ss[:i]) for i in range(2, len(ss) + 1))
    return out


def sentences(text: str) -> list[str]:
    splitter = SentenceSplitter()
    return splitter.push(text) + splitter.flush()


def norm(sentence: str) -> str:
    return " ".join("".join(c for c in sentence.lower() if c.isalnum() or c.isspace()).split())
