"""A move word in a statement or in a question about something else is a mention, not a request (issue 34).

The intent classifiers read words, not sentence form: "She shook her head at her food." scored shake_head 0.52 and
the yes/no classifier still said yes (0.53); "I'm turning thirty." turned the head left (look_left 0.26, yes 0.54);
a sentence about the examiner looking sad played `sad` at 0.97. What tells a mention from a request here is the
sentence's form, which a rule reads reliably: a request to the robot is an imperative ("Dance!", "Look up."), a
question to it ("Can you nod?", "Would you dance with us?"), a suggestion ("Let's dance!", "Time for bed.") or a wish
aimed at it ("I want you to dance", "I'd love to see you nod"). A sentence whose every clause opens with a subject
of its own (I, she, my brother, the examiner, it's, everyone; not "a": "A bit more to the right." asks) and that
aims no wish at the robot states something; a question with no "you" in it ("Why do people nod?") asks about the
world. A turn is a mention when each of its sentences is one of those two. Only a move is vetoed by it: a mention
is answered in words.
"""
from __future__ import annotations

import re

from bolt_ros.assistant.reply_text import sentences

# openers that carry no mood of their own ("Okay, ...", "Ha, ...", "Wait, ..."), stripped before the subject is read;
# a clause of a farewell or thanks alone ("I have to go now, bye.") neither states nor asks
_OPENERS = re.compile(r"^(?:(?:ok(?:ay)?|alright|all right|well|so|oh|ooh|wow|ha(?:ha)*|hey|hmm|ugh|yes|yeah|no|nope"
                      r"|hi|hello|great|perfect|wait|cool|nice|guess what|and then|and|but|also|then|phew|oops|aw+"
                      r"|bolt|see you(?: later| soon| tomorrow| there)?|bye(?: bye)?|goodbye|good ?night|take care"
                      r"|thanks|thank you)"
                      r"\b[\s,!.]*)+", re.IGNORECASE)
# a statement's own subject opening the sentence ("I", "She", "My brother", "The examiner", "It's", "Everyone")
_SUBJECT = re.compile(r"^(?:i|i'm|i’m|im|i've|i'll|i was|we|we're|we've|we were|he|he's|she|she's|they|they're|it"
                      r"|it's|it’s|its|there's|there|my|his|her|our|their|the|everyone|everybody|nobody|people"
                      r"|someone|somebody|this|that's|that was|last|yesterday|today)\b", re.IGNORECASE)
# a wish or suggestion aimed at the robot inside such a sentence: still a request
_AT_ROBOT = re.compile(r"\b(?:want|like|love|need|ask|asking|wish|would like|'d like|'d love)\s+(?:you|to see you)\b"
                       r"|\bwanna see you\b|\b(?:your turn|time (?:to|for))\b|\byou (?:should|could|can|must)\b",
                       re.IGNORECASE)
# a question by its mark, or by its opening where an ASR or a typist left the mark off
QUESTION = re.compile(r"\?\s*$|^\W*(?:what|who|which|where|when|why|how|is|are|can|could|do|does|remember)\b",
                      re.IGNORECASE)
_TO_ROBOT = re.compile(r"\b(?:you|your|yourself|we|us|let's|let us)\b", re.IGNORECASE)


def _is_mention(sentence: str) -> bool:
    s = sentence.strip()
    if s.endswith("?"):
        return not _TO_ROBOT.search(s)
    if _AT_ROBOT.search(s):
        return False
    # each clause states ("That was great, one more time!" is a request in its second clause); a clause of openers
    # alone ("Hi Bolt, ...") says nothing either way
    clauses = [c for c in (_OPENERS.sub("", c.strip()).strip() for c in re.split(r"[,;:]| - ", s)) if c]
    return bool(clauses) and all(_SUBJECT.match(c) for c in clauses)


def without_openers(utterance: str) -> str:
    """The utterance less its opening interjections ("No, turn left." -> "turn left."); itself if nothing is left."""
    return _OPENERS.sub("", utterance.strip()).strip() or utterance


def is_question(utterance: str) -> bool:
    return bool(QUESTION.search(utterance.strip()))


def is_mention(utterance: str) -> bool:
    """Whether every sentence of the utterance states something or asks about something other than the robot:
    a move word in it is not asked for."""
    parts = [s for s in sentences(utterance) if s.strip()]
    return bool(parts) and all(_is_mention(s) for s in parts)
