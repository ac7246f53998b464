"""How bench/bench_conversation.py scores one turn of a scripted conversation (ROS-free, unit-tested).

A turn is right when it made the expected call (tool and arguments, after the router's resolution) or rightly none,
its reply has the expected answer (where the script gives one), and the reply shows none of the failures a person
notices in a companion robot:
- claim: it says it did, does or will do a motion that no call in this turn did ("Sure, I can dance for you!");
- meta: it talks about tools, functions, JSON, "the robot" in the third person, or the prompt itself ("Based on the
  conversation, ...", a memory note copied out);
- echo: it repeats the person's words back;
- repeat: it repeats a reply of an earlier turn of the same conversation;
- refusal: it refuses small talk ("I'm sorry, but I can't assist with that request.", issue 34).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import SequenceMatcher

# a motion word in any inflection ("looking forward to" is not a motion)
# an age is not a motion ("I'm turning thirty", "turned 40")
_AGE = (r"(?!\s+(\d|the big|a year|(twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|one|two|three|four|five|six"
        r"|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen"
        r"|a hundred)\b))")
MOTION = (r"(danc(e|es|ed|ing)|nod(s|ded|ding)?|look(s|ed|ing)?(?!\s+forward)|turn(s|ed|ing)?" + _AGE
          + r"|shak(e|es|ing)|shook"
          r"|wav(e|es|ed|ing)|spin(s|ning)?|spun|mov(e|es|ed|ing)|tilt(s|ed|ing)?|wiggl(e|es|ed|ing)"
          r"|glanc(e|es|ed|ing))\b")
_CLAIMS = [
    rf"\b(i'?m|i am)\s+(now\s+|going to\s+|gonna\s+)?{MOTION}",
    rf"\bi('?ll| will| can| shall)\s+(now\s+|happily\s+|gladly\s+|certainly\s+)?{MOTION}",
    rf"\bi\s+(just\s+|have\s+|'ve\s+)?{MOTION}",
    rf"\blet me\s+{MOTION}",
    r"\b(here i go|there you go|here you go|watch (me|this))\b",
    rf"^\s*(ok(ay)?|sure|alright|right)[,!. ]+\s*{MOTION}",
    r"^\s*(looking|turning|nodding|dancing|shaking|waving|spinning)\b(?!\s+forward)",  # "Looking right." (no call)
]
CLAIM = re.compile("|".join(f"(?:{p})" for p in _CLAIMS), re.IGNORECASE)
META = re.compile(r"\b(tools?|functions?|json|api|arguments?|parameters?|executed|successfully called)\b"
                  r"|\bthe robot\b|\bthe (animation|tool) (is|was|has)\b"
                  # the prompt's own scaffolding read out: "Based on the conversation, ...", a copied memory note
                  r"|\b(based on|according to|in) (the|this|our) conversation\b|\bthey said\b|\boldest first\b"
                  # a reply drafted for someone else to say ("Sure, here's how you might respond: ...")
                  r"|\bhere('s| is) how you (might|could|can) (respond|reply)\b"
                  # the memory announced as a header ("The old conversation:")
                  r"|(^|[.!?]\s+)((the|our|this|my|old|earlier|previous)\s+)*conversation\s*:",
                  re.IGNORECASE)


REFUSAL = re.compile(r"\b(can ?not|can't|can’t|unable to|not able to)\s+(assist|help)(\s+you)?\s+with\s+"
                     r"(that|this|your)|\bi (didn't|did not|don't|do not) understand your\b"
                     r"|\bwhat do you need (assistance|help) with\b", re.IGNORECASE)


def is_refusal(reply: str) -> bool:
    return bool(REFUSAL.search(reply))


def norm(text: str) -> str:
    return " ".join("".join(c for c in text.lower() if c.isalnum() or c.isspace()).split())


def is_claim(reply: str) -> bool:
    return bool(CLAIM.search(reply))


def is_meta(reply: str) -> bool:
    return bool(META.search(reply))


def is_echo(reply: str, utterance: str) -> bool:
    """The reply is the person's words again (whole, or with a stock phrase added). A greeting of one or two words
    returned ("Good morning!" -> "Good morning!") is how people answer one, not an echo."""
    r, u = norm(reply), norm(utterance)
    if not r or len(u.split()) < 3:
        return False
    if r == u or (len(u.split()) >= 2 and r.startswith(u)):
        return True
    # a later sentence that opens with the person's words: their statement taken as the robot's own ("Oh, that's
    # exciting! I'm turning thirty, which is a big step.")
    if any(norm(s).startswith(u) for s in re.split(r"(?<=[.!?])\s+", reply)[1:]):
        return True
    return SequenceMatcher(None, r, u).ratio() >= 0.8


def is_repeat(reply: str, earlier: list[str]) -> bool:
    r = norm(reply)
    return bool(r) and any(e and (r == e or SequenceMatcher(None, r, e).ratio() >= 0.9) for e in map(norm, earlier))


@dataclass
class TurnScore:
    call_ok: bool
    answer_ok: bool = True
    claim: bool = False
    meta: bool = False
    echo: bool = False
    repeat: bool = False
    refusal: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def right(self) -> bool:
        return self.call_ok and self.answer_ok and not (self.claim or self.meta or self.echo or self.repeat
                                                        or self.refusal)


def expected_calls(expect) -> list[tuple[str, dict] | None]:
    """The script's `expect` as a list of acceptable outcomes (None = no call)."""
    items = expect if isinstance(expect, list) else [expect]
    return [None if e in (None, "none") else (e["tool"], e.get("args") or {}) for e in items]


def call_matches(expect, calls: list[tuple[str, dict] | None]) -> bool:
    """`calls`: the turn's resolved calls (None for one the router refused), in order; the first one counts."""
    for want in expected_calls(expect):
        if want is None and not calls:
            return True
        if want is not None and calls and calls[0] is not None:
            name, args = calls[0]
            if name == want[0] and all(args.get(k) == v for k, v in want[1].items()):
                return True
    return False


def score_turn(turn: dict, reply: str, calls: list[tuple[str, dict] | None], moved: bool,
               earlier_replies: list[str]) -> TurnScore:
    """One turn. `moved`: a motion call of this turn succeeded (a claim is then true, not a claim)."""
    s = TurnScore(call_ok=call_matches(turn.get("expect"), calls))
    if turn.get("answer"):
        s.answer_ok = any(w.lower() in reply.lower() for w in turn["answer"])
    s.claim = not moved and is_claim(reply)
    s.meta = is_meta(reply)
    s.echo = is_echo(reply, turn["say"])
    s.repeat = is_repeat(reply, earlier_replies)
    s.refusal = is_refusal(reply)
    return s
