"""Split streamed reply text into whole sentences, each released the moment it is complete, for TTS.

A sentence ends at . ! ? … (and runs of them), optionally followed by closing quotes/brackets, when whitespace
follows; or at a newline. "3.5", "e.g." and "Dr." do not end sentences. The boundary needs the next character,
so a sentence is released when the text after it starts (or at flush(), when the reply ends).

The first clause (issue 33): with `first_clause` words (4), a reply's first unit is released before its sentence
is complete, so the synthesizer starts while the model still writes: at a comma, semicolon, colon or dash after
at least that many words ("Paris is the capital of France, | and ..."; once the next word is there, and not when
it ends the sentence or is capitalized: "Thank you for asking, Bolt!" stays whole), or, with no such mark, after
`clause_max_words` (8) words at a phrase boundary: before a conjunction, never after an article, a preposition or
an auxiliary ("the capital of | France" would fall in pitch where the phrase goes on). The rest of that sentence
is released as the next unit. Only the first unit of a reply: later ones are whole sentences.
"""
from __future__ import annotations

import re

_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "approx", "no", "fig"}
_END = re.compile(r"""[.!?…]+["'”’)\]]*(?=\s)|\n""")
_CLAUSE_MARK = re.compile(r"""[,;:]["'”’)\]]*(?=\s)|\s[-–—](?=\s)""")
_SENTENCE_END = re.compile(r"""[.!?…]+["'”’)\]]*$""")
# a phrase goes on after these: a first unit never ends on one
_OPEN_WORDS = {"a", "an", "the", "of", "to", "in", "on", "at", "for", "with", "from", "by", "about", "into", "and",
               "or", "but", "my", "your", "his", "her", "its", "our", "their", "this", "that", "these", "those", "is",
               "are", "was", "were", "be", "am", "can", "could", "will", "would", "should", "do", "does", "did",
               "have", "has", "had", "not", "very", "so", "as", "than", "i", "you", "we", "they", "it", "he", "she"}
# a new phrase starts with these: the best place to end a first unit that has no comma
_PHRASE_STARTS = {"and", "but", "or", "so", "because", "which", "who", "when", "while", "if", "since", "though",
                  "although", "where", "then", "that"}
# "and" / "or" join words as often as clauses ("a beautiful and mysterious place"): a first unit ends before one only
# when a clause follows it, i.e. the word after it opens one
_JOINERS = {"and", "or"}
_CLAUSE_OPENERS = {"i", "you", "we", "they", "he", "she", "it", "there", "then", "the", "a", "an", "my", "your",
                   "his", "her", "its", "our", "their", "this", "that", "these", "those", "i'm", "it's", "that's",
                   "there's", "we're", "you're", "they're", "i'll", "i've"}
_I = {"i", "i'm", "i'll", "i've", "i'd"}
_CLAUSE_HARD_MAX = 14          # words: a first unit with no good boundary by then waits for its sentence


class SentenceSplitter:
    def __init__(self, min_chars: int = 2, *, first_clause: int = 0, clause_max_words: int = 8):
        self.buf = ""
        self.min_chars = min_chars  # fragments shorter than this ("1." of a list) join the next sentence
        self.first_clause = first_clause        # words before a clause mark (0: whole sentences only)
        self.clause_max_words = clause_max_words
        self._released = 0

    def push(self, text: str) -> list[str]:
        self.buf += text
        out: list[str] = []
        start = 0
        for m in _END.finditer(self.buf):
            if m.group() != "\n" and _is_abbreviation(self.buf[start:m.start()]):
                continue
            sentence = self.buf[start:m.end()].strip()
            if len(sentence) >= self.min_chars:
                out.append(sentence)
                start = m.end()
        self.buf = self.buf[start:]
        if not out and not self._released and self.first_clause:
            out = self._clause()
        self._released += len(out)
        return out

    def flush(self) -> list[str]:
        rest, self.buf = self.buf.strip(), ""
        return [rest] if rest else []

    def _clause(self) -> list[str]:
        """The reply's first unit before its sentence is done, if the text so far has one (module doc)."""
        end = None
        for m in _CLAUSE_MARK.finditer(self.buf):
            if len(self.buf[:m.start()].split()) < self.first_clause:
                continue
            nxt = re.match(r"\s*(\S+)\s", self.buf[m.end():])
            if nxt is None:
                return []   # the word after the mark decides: wait for it
            word = nxt.group(1)
            # not when the sentence ends with that word ("..., Bolt!": said whole, a name the person is addressed
            # by can be taken out of it, reply_text.unaddress) nor before a capitalized word (a name: "..., Anna, ...")
            if _SENTENCE_END.search(word) or (word[:1].isupper() and _bare(word) not in _I):
                continue
            end = m.end()
            break
        if end is None:
            end = self._phrase_break()
        if end is None:
            return []
        clause, self.buf = self.buf[:end].strip(), self.buf[end:]
        return [clause]

    def _phrase_break(self) -> int | None:
        """Where the first `clause_max_words` or more words end at a phrase boundary; None when there is none yet.
        Only complete words count: the last word of the buffer may still grow."""
        spans = [m.span() for m in re.finditer(r"\S+", self.buf)]
        if not self.buf[-1:].isspace():
            spans = spans[:-1]
        words = [_bare(self.buf[a:b]) for a, b in spans]
        lo = max(self.first_clause, self.clause_max_words - 3)
        # a conjunction starting word i (lo <= i): end before it
        for i in range(lo, len(words)):
            if words[i] in _JOINERS and (i + 1 >= len(words) or words[i + 1] not in _CLAUSE_OPENERS):
                continue   # "beautiful and | mysterious": words joined, not a clause (or the next word not in yet)
            if words[i] in _PHRASE_STARTS and words[i - 1] not in _OPEN_WORDS:
                return spans[i - 1][1]
        for i in range(self.clause_max_words, min(len(words), _CLAUSE_HARD_MAX) + 1):
            if words[i - 1] not in _OPEN_WORDS and "'" not in words[i - 1]:
                return spans[i - 1][1]
        return None


def is_clause(unit: str) -> bool:
    """Whether a released unit is a first clause (it does not end a sentence)."""
    return not _SENTENCE_END.search(unit.strip())


def sentence_count(units: list[str]) -> int:
    """Spoken units counted as sentences: a first clause and the rest of its sentence count once."""
    return sum(1 for u in units if not is_clause(u))


def _bare(word: str) -> str:
    return word.lower().strip(""".,;:!?"'”’()[]""")


def _is_abbreviation(before: str) -> bool:
    words = before.split()
    return bool(words) and words[-1].lower().rstrip(".") in _ABBREVIATIONS
