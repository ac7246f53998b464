"""Whether the person's words so far read as a finished turn (issue 33, item 3).

A fixed silence is a poor judge: 400 ms cut off a person who pauses mid-sentence ("and then I ... went home") and
is 400 ms of waiting after every finished request. The segmenter (vad.py) now ends a turn after a shorter silence
(`end_of_turn_ms`, 352) only once the speculative ASR of that pause is in and its words read finished; words that
read unfinished wait up to `unfinished_end_ms` (1200) of silence for the person to go on. The ASR's time is on the
way to the transcript anyway, so a finished turn waits for nothing it did not wait for before.

Unfinished: a transcript whose last word seldom ends an English sentence (a conjunction, an article, a
preposition, a possessive, an auxiliary, a filler: "look to the", "and then I", "can you um"), whatever mark
whisper put after it (it writes a question cut at "of" as "What is the capital of?"); or one that ends in a comma,
a dash or an ellipsis.

An audio turn-end model was tried first: Smart Turn v3.2 (in pipecat-ai's wheel, 8 MB). On this project's test
voices (Piper, espeak-ng) it called 7 of 8 sentences cut mid-way "complete" (p 0.75-0.98), and 2 of 8 whole
sentences unfinished (0.02, 0.30): it was trained on people, and synthetic voices end every fragment with a
sentence's fall. What the robot can test it cannot trust, so the words decide.
"""
from __future__ import annotations

import re

# words a finished English sentence does not end on
OPEN_ENDINGS = frozenset("""
and or but because if when while than which who whose where then
a an the of to for with from by into onto at about
my your his her its our their
is are was were am could would should
i um uh er erm hmm
""".split())   # kept short: a word that often ends a sentence too ("that", "on", "so", "can") is left out
_OPEN_MARK = re.compile(r"""(,|;|:|-|–|—|\.\.\.|…)["'”’)\]]*$""")
_CLOSED_MARK = re.compile(r"""[?!]["'”’)\]]*$""")


def reads_unfinished(text: str) -> bool:
    """Whether a transcript reads as a turn the person has not finished (module doc)."""
    t = text.strip()
    words = re.findall(r"[a-z']+", t.lower())
    if not words:
        return False
    if words[-1] in OPEN_ENDINGS:   # whisper closes a cut question too: "What is the capital of?"
        return True
    return not _CLOSED_MARK.search(t) and bool(_OPEN_MARK.search(t))
