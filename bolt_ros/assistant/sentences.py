"""Split streamed reply text into whole sentences, each released the moment it is complete, for TTS.

A sentence ends at . ! ? … (and runs of them), optionally followed by closing quotes/brackets, when whitespace
follows; or at a newline. "3.5", "e.g." and "Dr." do not end sentences. The boundary needs the next character,
so a sentence is released when the text after it starts (or at flush(), when the reply ends).
"""
from __future__ import annotations

import re

_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e", "approx", "no", "fig"}
_END = re.compile(r"""[.!?…]+["'”’)\]]*(?=\s)|\n""")


class SentenceSplitter:
    def __init__(self, min_chars: int = 2):
        self.buf = ""
        self.min_chars = min_chars  # fragments shorter than this ("1." of a list) join the next sentence

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
        return out

    def flush(self) -> list[str]:
        rest, self.buf = self.buf.strip(), ""
        return [rest] if rest else []


def _is_abbreviation(before: str) -> bool:
    words = before.split()
    return bool(words) and words[-1].lower().rstrip(".") in _ABBREVIATIONS
