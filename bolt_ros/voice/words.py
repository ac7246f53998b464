"""Words of a transcript, and the word-level edit distance between what was said and what was heard: the measure of
the voice tests and benchmarks (bench/bench_asr_vocabulary.py)."""
from __future__ import annotations

import re


def words(text: str) -> list[str]:
    """Lower-case words, punctuation dropped ("Good night, Bolt." -> good, night, bolt)."""
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(said: str, heard: str) -> int:
    """Substitutions, insertions and deletions that turn the words said into the words heard."""
    a, b = words(said), words(heard)
    d = list(range(len(b) + 1))
    for i, wa in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, wb in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (wa != wb))
    return d[-1]
