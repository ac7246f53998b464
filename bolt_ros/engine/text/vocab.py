"""A tokenizer's vocabulary: id <-> text, compact enough for 262k-token vocabularies.

A `dict[str, int]` over Gemma's vocabulary costs ~36 MiB (the str objects, an int object per id and the table);
this costs ~9 MiB: the texts stay in one UTF-8 blob (`StringArray`) and lookups go through a bucketed hash index
in flat arrays. A lookup is a few array reads, and a text is decoded only when its hash matches.
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from bolt_ros.engine.gguf.reader import GGUFError, StringArray


class Vocab:
    __slots__ = ("_first", "_hash", "_id", "_mask", "_raw", "texts")

    def __init__(self, texts: StringArray | Sequence[str]):
        self.texts = texts if isinstance(texts, StringArray) else StringArray.from_strings(texts)
        self._raw = self.texts.raw
        n = len(self.texts)
        hashes = np.fromiter(map(hash, self.texts), np.int64, n)  # str hashes: a lookup key is hashed as is
        n_buckets = 1 << max(n - 1, 1).bit_length()  # ~1 entry per bucket
        bucket = hashes & (n_buckets - 1)
        order = np.argsort(bucket, kind="stable")  # ids grouped by bucket: [first[b], first[b + 1])
        self._mask = n_buckets - 1
        self._first = array("q", np.searchsorted(bucket[order], np.arange(n_buckets + 1)).astype(np.int64).tobytes())
        self._hash = array("q", hashes[order].tobytes())
        self._id = array("q", order.astype(np.int64).tobytes())
        self._check_unique(hashes)

    def _check_unique(self, hashes: np.ndarray) -> None:
        order = np.argsort(hashes, kind="stable")
        same = np.flatnonzero(hashes[order[1:]] == hashes[order[:-1]])
        for k in same.tolist():  # equal hashes are rare; equal texts are a broken file (llama.cpp refuses them)
            a, b = int(order[k]), int(order[k + 1])
            if self.texts[a] == self.texts[b]:
                raise GGUFError(f"duplicate token in tokenizer.ggml.tokens: {self.texts[b]!r} (ids {a} and {b})")

    def __len__(self) -> int:
        return len(self.texts)

    def get(self, text: str, default: int | None = None) -> int | None:
        """The id of this exact text, or `default`. (The tokenizers' inner loop: kept to a few array reads.)"""
        h = hash(text)
        b = h & self._mask
        j, end = self._first[b], self._first[b + 1]
        while j < end:
            if self._hash[j] == h:
                i = self._id[j]
                if str(self._raw(i), "utf-8", "surrogateescape") == text:  # never raises, unlike encode()
                    return i
            j += 1
        return default

    def __contains__(self, text: str) -> bool:
        return self.get(text) is not None

    def __getitem__(self, text: str) -> int:
        i = self.get(text)
        if i is None:
            raise KeyError(text)
        return i

    def text(self, id: int) -> str:
        return self.texts[id]
