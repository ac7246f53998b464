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

from bolt_ros.assistant.mention import is_question
from bolt_ros.assistant.reply_text import sentences

FACTS_HEADER = "Notes on the person you are talking to (not on you):"
MAX_TOLD_CHARS = 600  # a turn longer than 20 s of speech (~350 characters) by far: a pasted page, not about them
_FIRST_PERSON = re.compile(r"\b(i|i'm|i’m|im|i've|i'll|i'd|my|me|mine|myself|we|we're|our|us)\b", re.IGNORECASE)
# "I'm Tom", "my name is Tom", "call me Tom", "this is Tom": a capitalized word right after (ASR and typing both
# capitalize names); "I'm Happy" from a sloppy typist would be taken for a name too, which the note then only repeats
_NAME = re.compile(r"\b(?i:i'm|i’m|i am|my name is|my name's|call me|this is)\s+([A-Z][a-z]+)\b")
# "Hi Bolt, it's Amara.": "it's" gives a name only in a greeting (held out 4 found it missing: "Who am I?" then fell
# to the caption); "It's Friday" alone is no introduction
_GREETING_NAME = re.compile(r"^\W*(?i:hi|hello|hey|hiya)\b[^.!?]*?\b(?i:it's|it’s|it is)\s+([A-Z][a-z]+)\b")
_ASKS_NAME = re.compile(r"\b(what(?:'s| is| was) my name|who am i|my name again|remember my name|know my name)\b",
                        re.IGNORECASE)
_NOT_NAMES = {"Bolt", "Sorry", "So", "Just", "Not", "Really", "Very", "Back", "Here", "Fine", "Good", "Okay", "Ok",
              "Me", "Time", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "January",
              "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
              "December", "Morning", "Today", "Tonight"}
_SWAP = [(r"\bi am\b", "they are"), (r"\bi was\b", "they were"), (r"\bi['’]m\b", "they are"), (r"\bim\b", "they are"),
         (r"\bi['’]ve\b", "they have"), (r"\bi['’]ll\b", "they will"), (r"\bi['’]d\b", "they would"),
         (r"\bwe['’]re\b", "they are"), (r"\bmyself\b", "themselves"), (r"\bmine\b", "theirs"), (r"\bmy\b", "their"),
         (r"\bme\b", "them"), (r"\bour\b", "their"), (r"\bus\b", "them"), (r"\bi\b", "they"), (r"\bwe\b", "they")]


_TO_YOU = [(r"\bi am\b", "you are"), (r"\bi was\b", "you were"), (r"\bi['’]m\b", "you're"), (r"\bim\b", "you're"),
           (r"\bi['’]ve\b", "you've"), (r"\bi['’]ll\b", "you'll"), (r"\bi['’]d\b", "you'd"),
           (r"\bwe['’]re\b", "you're"),
           (r"\bmyself\b", "yourself"), (r"\bmine\b", "yours"), (r"\bmy\b", "your"), (r"\bme\b", "you"),
           (r"\bour\b", "your"), (r"\bus\b", "you"), (r"\bi\b", "you"), (r"\bwe\b", "you")]
# a question's words that say nothing of what it is about ("where am I going on Saturday?" is about going, Saturday)
_ASKING = set("""what whats when where who whom whose why how which is are was were am do does did will would can could
should my me i we our us you your yours the a an to of on in at for with again remember know tell called name
that this it its and or so then now please still ever about there think feel like want look doing really
today""".split())
_OF_THEIRS = re.compile(r"\b(?:his|her|its|their) name is\b", re.IGNORECASE)


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", re.sub(r"['’]s\b", "", text.lower())) if len(w) > 2} - _ASKING


def _same_word(a: str, b: str) -> bool:
    """"party" / "parties", "beach" / "beaches": the same first four letters (a short word must match whole)."""
    return a == b or (min(len(a), len(b)) >= 4 and a[:4] == b[:4])


def second_person(sentence: str) -> str:
    """"I'm going to the beach with my sister." -> "you're going to the beach with your sister." (said back)."""
    out = sentence
    for pattern, repl in _TO_YOU:
        out = re.sub(pattern, repl, out, flags=re.IGNORECASE)
    return out[:1].lower() + out[1:]


def third_person(sentence: str) -> str:
    """"I'm going to the beach with my sister." -> "They are going to the beach with their sister."."""
    out = sentence
    for pattern, repl in _SWAP:
        out = re.sub(pattern, repl, out, flags=re.IGNORECASE)
    return out[:1].upper() + out[1:]


def given_names(sentence: str) -> list[str]:
    """The names a person gives for themselves in these words ("my name is Marco", "Hi Bolt, it's Amara")."""
    found = [m[1] for m in _NAME.finditer(sentence)] + [m[1] for m in _GREETING_NAME.finditer(sentence)]
    return [n for n in found if n not in _NOT_NAMES]


def asks_name(utterance: str) -> bool:
    """"What's my name?", "Who am I, by the way?": a question about the person, never answered from a caption."""
    return bool(_ASKS_NAME.search(utterance))


def person_names(utterance: str, known: list[str]) -> set[str]:
    """The person's names: those told before and one given in these words ("Hey Bolt, my name is Marco.")."""
    return set(given_names(utterance)) | set(known)


def takes_their_name(sentence: str, names: set[str]) -> bool:
    """The robot says the person's name as its own ("Hello! I'm Marco, a friendly robot ...": held out 3, the 0.5B
    model told "Hey Bolt, my name is Marco.")."""
    return any(re.search(rf"\b(?:i'm|i’m|i am|my name is|my name's|call me)\s+{re.escape(n)}\b", sentence,
                         re.IGNORECASE) for n in names)


class FactNote:
    def __init__(self, max_facts: int = 6):
        self.max_facts = max_facts
        self.names: list[str] = []
        self.facts: list[str] = []
        self.told: list[str] = []  # the same facts as the person said them (first person): recall() says them back

    def add(self, said: str) -> None:
        """Keep what these words tell about the person (call it with a turn that asked for no move)."""
        if len(said) > MAX_TOLD_CHARS:
            return
        for s in sentences(said):
            names = given_names(s)
            if names:
                self.names = [names[0]]  # the newest: one person talks in a conversation
                continue
            if s.rstrip().endswith("?"):
                continue
            if _FIRST_PERSON.search(s) or _OF_THEIRS.search(s):
                fact, told = third_person(s.strip()), s.strip()
                keep = [i for i, f in enumerate(self.facts) if f != fact][-(self.max_facts - 1):]
                self.facts = [*[self.facts[i] for i in keep], fact]
                self.told = [*[self.told[i] for i in keep], told]

    def name_answer(self, utterance: str) -> str:
        """"What's my name?" / "Who am I?" answered from the note ("You're Tom."); "" when not asked or not known:
        told the name, the 0.5B model still answered "I am Priya, a small friendly robot ..." (first person)."""
        if not self.names or not asks_name(utterance):
            return ""
        return f"You're {self.names[-1]}."

    def answer(self, utterance: str) -> str:
        """The robot's own answer to a question about what the person told: their name (name_answer), or the newest
        fact that shares a word with the question ("Where am I going on Saturday?" -> "You told me you're going to
        the beach on Saturday."); "" when it is no such question or nothing told matches. The 0.5B model shown the
        fact note answered such questions with the person's own words in the first person ("I'm going to the beach
        on Saturday.", held back as the memory read out) or wove the note into unrelated small talk."""
        name = self.name_answer(utterance)
        if name or not is_question(utterance) or not _FIRST_PERSON.search(utterance):
            return name
        asked = _words(utterance)
        best = max(range(len(self.told)), default=None,
                   key=lambda i: (sum(any(_same_word(a, w) for w in _words(self.told[i])) for a in asked), i))
        if best is None or not any(any(_same_word(a, w) for w in _words(self.told[best])) for a in asked):
            return ""
        said = second_person(self.told[best]).rstrip(".!")
        if best + 1 < len(self.told) and _OF_THEIRS.search(self.told[best + 1]):
            # "Her name is Biscuit." told right after "I adopted a dog yesterday.": "what's my dog called?" finds
            # the dog, and the name is the next thing they said
            said = f"{said}, and {self.told[best + 1][:1].lower()}{self.told[best + 1][1:].rstrip('.!')}"
        return f"You told me {said}."

    def render(self) -> str:
        lines = [f"- Their name is {n}." for n in self.names]
        lines += [f"- {f}" for f in self.facts]
        return FACTS_HEADER + "\n" + "\n".join(lines) if lines else ""
