"""What the person told about themselves, kept as a short note beside the rolling memory (issue 34).

The rolling memory holds the last `memory_turns` turns; a name given at the start is gone from it by the time it is
asked back, and even within it the 0.5B model answered "What's my name, do you remember?" with its own ("My name is
Bolt.") or "And who am I?" with "I'm Bolt, a friendly robot ...". So the person's statements about themselves (a
sentence with I / my / we, not a question, in a turn that asked for no move) are kept, turned into the third person
("I'm going to the beach on Saturday." -> "They are going to the beach on Saturday."), and a name they give ("I'm
Tom", "my name is Tom", "call me Tom") becomes "The person you are talking with is called Tom." The note shows the
newest `max_facts` statements and every name; it goes to the words model as a system message of its own (FACTS_HEADER),
which the loop does not count as a note that must never be read out (answering it back is its purpose).
"""
from __future__ import annotations

import re

from bolt_ros.assistant.reply_text import sentences

FACTS_HEADER = "Notes on the person you are talking to (not on you):"
_FIRST_PERSON = re.compile(r"\b(i|i'm|i’m|im|i've|i'll|i'd|my|me|mine|myself|we|we're|our|us)\b", re.IGNORECASE)
# "I'm Tom", "my name is Tom", "call me Tom", "this is Tom": a capitalized word right after (ASR and typing both
# capitalize names); "I'm Happy" from a sloppy typist would be taken for a name too, which the note then only repeats
_NAME = re.compile(r"\b(?i:i'm|i’m|i am|my name is|my name's|call me|this is)\s+([A-Z][a-z]+)\b")
_ASKS_NAME = re.compile(r"\b(what(?:'s| is| was) my name|who am i|my name again|remember my name|know my name)\b",
                        re.IGNORECASE)
_NOT_NAMES = {"Bolt", "Sorry", "So", "Just", "Not", "Really", "Very", "Back", "Here", "Fine", "Good", "Okay", "Ok"}
_SWAP = [(r"\bi am\b", "they are"), (r"\bi was\b", "they were"), (r"\bi['’]m\b", "they are"), (r"\bim\b", "they are"),
         (r"\bi['’]ve\b", "they have"), (r"\bi['’]ll\b", "they will"), (r"\bi['’]d\b", "they would"),
         (r"\bwe['’]re\b", "they are"), (r"\bmyself\b", "themselves"), (r"\bmine\b", "theirs"), (r"\bmy\b", "their"),
         (r"\bme\b", "them"), (r"\bour\b", "their"), (r"\bus\b", "them"), (r"\bi\b", "they"), (r"\bwe\b", "they")]


def third_person(sentence: str) -> str:
    """"I'm going to the beach with my sister." -> "They are going to the beach with their sister."."""
    out = sentence
    for pattern, repl in _SWAP:
        out = re.sub(pattern, repl, out, flags=re.IGNORECASE)
    return out[:1].upper() + out[1:]


class FactNote:
    def __init__(self, max_facts: int = 6):
        self.max_facts = max_facts
        self.names: list[str] = []
        self.facts: list[str] = []

    def add(self, said: str) -> None:
        """Keep what these words tell about the person (call it with a turn that asked for no move)."""
        for s in sentences(said):
            name = _NAME.search(s)
            if name and name[1] not in _NOT_NAMES:
                self.names = [name[1]]  # the newest: one person talks in a conversation
                continue
            if s.rstrip().endswith("?"):
                continue
            if _FIRST_PERSON.search(s) or re.search(r"\b(his|her|its|their) name is\b", s, re.IGNORECASE):
                fact = third_person(s.strip())
                self.facts = [*[f for f in self.facts if f != fact][-(self.max_facts - 1):], fact]

    def name_answer(self, utterance: str) -> str:
        """"What's my name?" / "Who am I?" answered from the note ("You're Tom."); "" when not asked or not known:
        told the name, the 0.5B model still answered "I am Priya, a small friendly robot ..." (first person)."""
        if not self.names or not _ASKS_NAME.search(utterance):
            return ""
        return f"You're {self.names[-1]}."

    def render(self) -> str:
        lines = [f"- Their name is {n}." for n in self.names]
        lines += [f"- {f}" for f in self.facts]
        return FACTS_HEADER + "\n" + "\n".join(lines) if lines else ""
