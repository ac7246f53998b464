"""(Over 400 lines on purpose: the special-token partition, SPM, BPE and the streaming decoder share one vocabulary
view and one set of token-type rules, and must change together to keep ids equal to llama.cpp's.)

Tokenizers built from GGUF metadata alone: SentencePiece-with-scores (`llama`), GPT-2 byte-level BPE (`gpt2`, with
the GPT-2, digits+GPT-2 (SmolLM) and Qwen2 pre-tokenizers) and Gemma 4's SentencePiece-style BPE (`gemma4`).

Both follow llama.cpp's `llama-vocab.cpp` so that ids match it exactly:

1. Special-token partition: the text is split at every occurrence of a special token, longest token text first.
   CONTROL and UNKNOWN tokens take part only with `parse_special=True`; USER_DEFINED tokens (Gemma's "\\n",
   whitespace runs, HTML tags) always do, as in llama.cpp and HF tokenizers.
2. Each remaining text fragment goes through the model's algorithm:
   - SPM: spaces become U+2581, then adjacent symbols are merged greedily by the score of the merged token
     (highest first, leftmost on ties); symbols that are not tokens fall back to <0xNN> byte tokens.
   - BPE: a pre-tokenizer regex splits the text into words (per `tokenizer.ggml.pre`), each word's UTF-8 bytes are
     mapped to printable characters (GPT-2's byte-to-unicode table) and merged by merge rank.
   - Gemma 4 BPE: spaces become U+2581, the text is split only at newline runs, characters (raw UTF-8) are merged by
     rank and leftovers fall back to <0xNN> byte tokens. (Rules from llama.cpp; no Gemma 4 GGUF fixture yet.)

Prompt-injection safety: a CONTROL token, or a markup-shaped USER_DEFINED one (tool-call tags: `_structural`), is never
produced from text encoded with `parse_special=False`, not even
by merging (CONTROL tokens are left out of the plain-text vocabulary; llama.cpp's merges could in principle reach
one, but for no control token of either real vocabulary do they). Chat formats mark only their own template text as
trusted (`Segment.trusted`); message contents are encoded as plain text.
"""
from __future__ import annotations

import bisect
import codecs
import heapq
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

import numpy as np

from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile, StringArray
from bolt_ros.engine.text.vocab import Vocab

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPACE_ESCAPE = "\u2581"  # SentencePiece's visible space

# Token texts llama.cpp treats as end-of-generation (llama-vocab.cpp, special_eog_ids), besides the eos/eot/eom ids.
_EOG_NAMES = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    # FIM pad / repo / file-separator tokens, which llama.cpp also stops on
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", "<|file_sep|>",
})
# Other "control-looking" texts (FIM markers) whose type llama.cpp forces to CONTROL, like every EOG text above.
_CONTROL_NAMES = _EOG_NAMES | {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
    "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
    "<|code_suffix|>", "<|suffix|>", "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
    "▁<MID>", "<|code_middle|>", "<|middle|>",
}

# Unicode White_Space, exactly llama.cpp's unicode_set_whitespace (Python's str.isspace adds U+001C..U+001F).
_WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
               + "\u2028\u2029\u202f\u205f\u3000")


@dataclass(frozen=True)
class Segment:
    """A piece of a rendered prompt. Never concatenate untrusted text into a trusted segment."""
    text: str
    trusted: bool  # True: may contain control-token text (parsed as special); False: plain text only


# ---------------------------------------------------------------------------------------------------------------------
# GPT-2 pre-tokenizer regexes (Python `re` lacks \p{..}, so letter/number classes are built from unicodedata)
# ---------------------------------------------------------------------------------------------------------------------

# No letters or numbers lie above the CJK extension planes (the rest is tags, variation selectors, private use), so
# the class scan stops there: a 5x shorter scan keeps building a BPE tokenizer well under a second.
_LAST_ALNUM = 0x323AF


def _class_ranges(pred) -> str:
    """A regex character-class body (no brackets) for every code point where pred(category) holds."""
    parts, start = [], None
    for cp in range(_LAST_ALNUM + 2):
        inside = cp <= _LAST_ALNUM and pred(unicodedata.category(chr(cp)))
        if inside and start is None:
            start = cp
        elif not inside and start is not None:
            lo, hi = re.escape(chr(start)), re.escape(chr(cp - 1))
            parts.append(lo if start == cp - 1 else f"{lo}-{hi}")
            start = None
    return "".join(parts)


@lru_cache(maxsize=1)
def _unicode_classes() -> tuple[str, str, str]:
    letters = _class_ranges(lambda c: c[0] == "L")
    numbers = _class_ranges(lambda c: c[0] == "N")
    spaces = "".join(re.escape(c) for c in _WHITESPACE)
    return letters, numbers, spaces


@cache
def _pre_regexes(kind: str) -> tuple[re.Pattern, ...]:
    L, N, S = _unicode_classes()
    # llama.cpp's custom GPT-2 splitter, i.e.
    #   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    gpt2 = re.compile(rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{L}]+| ?[{N}]+| ?[^{S}{L}{N}]+|[{S}]+(?![^{S}])|[{S}]+")
    if kind == "gpt2":
        return (gpt2,)
    if kind == "digits+gpt2":  # every digit is its own word first (\p{N}), then GPT-2 on the rest
        return re.compile(rf"[{N}]"), gpt2
    if kind == "qwen2":
        # llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 list: tokenizer.json's llama3-style regex with single digits,
        #   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+
        #   |\s+(?!\S)|\s+
        # with (?i:...) spelled as ASCII case pairs, as llama.cpp does ('[sS] etc.: no Unicode case folding, so
        # "'\u017fx" is one word here, not "'\u017f" + "x"). llama.cpp has no hand-written splitter for it: its
        # std::regex runs over text where each non-ASCII code point stands for its class (letter, number,
        # whitespace, other), which is what these classes, built from the same categories, give.
        return (re.compile(
            rf"'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]|[^\r\n{L}{N}]?[{L}]+|[{N}]"
            rf"| ?[^{S}{L}{N}]+[\r\n]*|[{S}]*[\r\n]+|[{S}]+(?![^{S}])|[{S}]+"),)
    raise ValueError(kind)


# tokenizer.ggml.pre -> pre-tokenizer (the llama.cpp names whose regex lists we implement)
_NEWLINE_SPLIT = re.compile(r"[^\n]+|\n+")  # Gemma 4's only pre-split ("[^\n]+|[\n]+")

_BPE_PRE = {
    **dict.fromkeys(("gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion", "granite-docling"), "gpt2"),
    **dict.fromkeys(("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva", "mellum2"),
                    "digits+gpt2"),
    # llama.cpp's QWEN2 pre-type names, and stablelm2, whose regex list is the same
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "stablelm2"), "qwen2"),
}


def _split(text: str, regexes: Sequence[re.Pattern]) -> list[str]:
    """Apply the regexes in turn like llama.cpp's unicode_regex_split: matches and the gaps between them are words."""
    words = [text]
    for rx in regexes:
        out = []
        for w in words:
            pos = 0
            for m in rx.finditer(w):
                if m.start() > pos:
                    out.append(w[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(w):
                out.append(w[pos:])
        words = out
    return words


def _merge(symbols: list[str], priority) -> list[str]:
    """Greedy pair merging shared by SPM and BPE (llama.cpp's work queue): repeatedly join the adjacent pair with the
    smallest priority(left, right) (None: not mergeable), leftmost first on ties; returns the final symbols."""
    n = len(symbols)
    if n < 2:
        return symbols
    prev = list(range(-1, n - 1))
    nxt = [*range(1, n), -1]
    heap = []  # (priority, left index, right index, joined length); stale entries are skipped when popped
    for i in range(n - 1):
        p = priority(symbols[i], symbols[i + 1])
        if p is not None:
            heap.append((p, i, i + 1, len(symbols[i]) + len(symbols[i + 1])))
    heapq.heapify(heap)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        a, b = symbols[left], symbols[right]
        if not a or not b or len(a) + len(b) != size:
            continue  # one side was merged since this pair was queued (symbols only grow)
        merged = a + b
        symbols[left], symbols[right] = merged, ""
        r = nxt[left] = nxt[right]
        if r >= 0:
            prev[r] = left
        for lo, hi in ((prev[left], left), (left, r)):
            if lo >= 0 and hi >= 0:
                p = priority(symbols[lo], symbols[hi])
                if p is not None:
                    heapq.heappush(heap, (p, lo, hi, len(symbols[lo]) + len(symbols[hi])))
    return [sym for sym in symbols if sym]


@lru_cache(maxsize=1)
def _byte_to_unicode() -> tuple[str, ...]:
    """GPT-2's reversible map from each byte to a printable character."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return tuple(table[b] for b in range(256))


_MARKUP = re.compile(r"<[^\s<>]{1,48}>")


def _structural(text: str) -> bool:
    """A USER_DEFINED token that can carry structure: markup-shaped (`<tool_call>`, `</tool_call>`, Gemma 4's
    `<|tool_call>`, `<|"|>`, `<|channel>`, HTML tags). Converters type tool-call tags USER_DEFINED (llama.cpp's for
    Gemma 4 and Qwen do), and llama.cpp matches USER_DEFINED tokens even in untrusted text: a user who types
    `<tool_call>` would hand the model the real token. So they match only in trusted (template) text, whatever the
    typing; a user's "<b>" is spelled out. USER_DEFINED whitespace runs and newlines (Gemma's) carry no structure and
    still match anywhere, as in llama.cpp, so ordinary text tokenizes as the model was trained."""
    return _MARKUP.fullmatch(text) is not None


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------------------------------

class Tokenizer:
    """SPM or BPE tokenizer with llama.cpp-identical ids. Build with `from_gguf`."""

    def __init__(self, *, model: str, tokens: Sequence[str], token_types: Sequence[int], scores: Sequence[float] | None,
                 merges: list[str] | None, pre: str | None, bos_id: int | None, eos_id: int | None,
                 unk_id: int | None = None, eot_id: int | None = None, eom_id: int | None = None,
                 add_bos: bool = False, add_eos: bool = False, add_space_prefix: bool = False):
        n = len(tokens)
        if n == 0:
            raise GGUFError("tokenizer.ggml.tokens is empty")
        if not isinstance(tokens, StringArray):
            tokens = StringArray.from_strings(tokens)
        if (tokens.byte_lengths() == 0).any():  # llama.cpp renames empty tokens so they cannot collide
            tokens = StringArray.from_strings(t or f"[EMPTY_{i}]" for i, t in enumerate(tokens))
        if len(token_types) != n:
            raise GGUFError(f"tokenizer.ggml.token_type has {len(token_types)} entries for {n} tokens")
        for key, tid in (("bos", bos_id), ("eos", eos_id), ("unknown", unk_id), ("eot", eot_id), ("eom", eom_id)):
            if tid is not None and not 0 <= tid < n:
                raise GGUFError(f"tokenizer.ggml.{key}_token_id = {tid} is outside the vocabulary of {n} tokens")
        if add_bos and bos_id is None:
            raise GGUFError("tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is missing")

        self.model = model
        self.pre = pre
        self.vocab_size = n
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        self._bytes_cache: dict[int, bytes] = {}
        self._vocab = Vocab(tokens)  # refuses duplicate texts, as llama.cpp does
        types = np.array(token_types, dtype=np.int32)
        self.eog_ids: set[int] = self._eog_and_fix_types(types, (eos_id, eot_id, eom_id))
        self._types = types

        control = np.flatnonzero(np.isin(types, (CONTROL, UNKNOWN))).tolist()
        self._control = frozenset(control)
        self.control_ids: frozenset[int] = self._control  # CONTROL and UNKNOWN tokens: never produced from plain text
        special = np.flatnonzero(np.isin(types, (CONTROL, UNKNOWN, USER_DEFINED))).tolist()
        special.sort(key=lambda i: (-len(tokens[i].encode()), i))  # llama.cpp: longest (in bytes) first
        user_defined = [i for i in special if types[i] == USER_DEFINED]
        # structural USER_DEFINED tokens match only in trusted text, like CONTROL ones (see _structural)
        self.structural_ids: frozenset[int] = frozenset(
            i for i in user_defined if _structural(tokens[i]))
        self._trusted_only = self._control | self.structural_ids
        self._specials_all = [(tokens[i], i) for i in special]
        self._specials_plain = [(tokens[i], i) for i in special if i not in self._trusted_only]

        unknown_byte = unk_id if model == "llama" else None  # SPM falls back to <unk>, BPE drops the byte
        self._byte_ids = [self._vocab.get(f"<0x{b:02X}>", unknown_byte) for b in range(256)]
        if model == "llama":
            self._init_spm(scores, control)
        elif model in ("gpt2", "gemma4"):
            self._init_bpe(model, merges, pre)
        else:
            raise GGUFError(f"unsupported tokenizer.ggml.model {model!r} (supported: 'llama' (SPM), 'gpt2' and "
                            "'gemma4' (BPE))")

    def _init_spm(self, scores, control: list[int]) -> None:
        if scores is None or len(scores) != self.vocab_size:
            raise GGUFError("tokenizer.ggml.scores is missing or does not match tokenizer.ggml.tokens")
        # merge scores by id (CONTROL/UNKNOWN tokens are never merge results: prompt-injection safety, checked in
        # _encode_spm). A float32 view of the GGUF's own array, not a second 262k-entry dict (13 MiB).
        self._scores = memoryview(np.ascontiguousarray(scores, dtype=np.float32))

    def _init_bpe(self, model: str, merges, pre: str | None) -> None:
        if merges is None:
            raise GGUFError(f"tokenizer.ggml.merges is missing for a {model} tokenizer")
        if model == "gemma4":  # SentencePiece-style BPE: spaces as U+2581, raw UTF-8, split only at newlines
            self._regexes, self._byte_encode, self._escape_spaces = (_NEWLINE_SPLIT,), False, True
        else:
            kind = _BPE_PRE.get(pre or "gpt2")
            if kind is None:
                raise GGUFError(f"unsupported tokenizer.ggml.pre {pre!r} (supported: {sorted(_BPE_PRE)})")
            self._regexes, self._byte_encode, self._escape_spaces = _pre_regexes(kind), True, False
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, m in enumerate(merges):
            cut = m.find(" ", 1)  # llama.cpp: the first space after the first character
            if cut < 0:
                raise GGUFError(f"tokenizer.ggml.merges[{rank}] = {m!r} is not 'left right'")
            self._ranks.setdefault((m[:cut], m[cut + 1:]), rank)
        self._b2u = _byte_to_unicode()
        self._u2b = {c: b for b, c in enumerate(self._b2u)}
        self._word_cache: dict[str, list[int]] = {}

    def _eog_and_fix_types(self, types: np.ndarray, eog_ids: Iterable[int | None]) -> set[int]:
        """llama.cpp's end-of-generation set, and its type overrides: EOG/FIM texts become CONTROL (so Gemma 3's
        USER_DEFINED "</s>" is a control token and an EOG token there too), except the Gemma 4 case below."""
        vocab = self._vocab
        for name in _CONTROL_NAMES:
            i = vocab.get(name)
            if i is not None:
                types[i] = CONTROL
        eog = {t for t in eog_ids if t is not None} | {vocab[t] for t in _EOG_NAMES if t in vocab}
        if "<|tool_response>" in vocab and "</s>" in vocab:  # Gemma 4: </s> is text, not an end of generation
            eog.discard(vocab["</s>"])
            types[vocab["</s>"]] = NORMAL
        harmony = (("<|return|>", "<|call|>", "<|end|>"), ("<|calls|>", "<|flush|>", "<|end|>"))
        if any(all(t in vocab for t in names) for names in harmony):
            eog.discard(vocab["<|end|>"])  # harmony-style vocabularies: <|end|> ends a message, not the generation
            types[vocab["<|end|>"]] = USER_DEFINED
        return eog

    # -- construction ------------------------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, gf: GGUFFile) -> Tokenizer:
        try:
            return cls.from_metadata(gf.metadata)
        except GGUFError as e:  # from_metadata knows keys, not files: name the file
            if gf.path.name in str(e):
                raise
            raise GGUFError(f"{gf.path.name}: {e}") from None

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> Tokenizer:
        def get(key, default=None):
            return md.get(f"tokenizer.ggml.{key}", default)

        def opt_id(key):
            v = get(key)
            return None if v is None else int(v)

        tokens = get("tokens")
        if not isinstance(tokens, StringArray | list):
            raise GGUFError("tokenizer.ggml.tokens is missing or not a string array")
        model = get("model")
        if model is None:
            raise GGUFError("tokenizer.ggml.model is missing")
        types = get("token_type")
        if types is None:
            types = [NORMAL] * len(tokens)
        return cls(
            model=model, tokens=tokens, token_types=types, scores=get("scores"), merges=get("merges"),
            pre=get("pre"), bos_id=opt_id("bos_token_id"), eos_id=opt_id("eos_token_id"),
            unk_id=opt_id("unknown_token_id"), eot_id=opt_id("eot_token_id"), eom_id=opt_id("eom_token_id"),
            # llama.cpp's defaults when the keys are absent: add BOS for SPM, nothing for BPE; Gemma 4 always adds it
            add_bos=bool(get("add_bos_token", model == "llama")) or model == "gemma4",
            add_eos=bool(get("add_eos_token", False)),
            add_space_prefix=bool(get("add_space_prefix", model == "llama")),
        )

    # -- lookups -----------------------------------------------------------------------------------------------------

    def _plain_id(self, text: str) -> int | None:
        """The id of a token plain text may produce (not CONTROL/UNKNOWN: prompt-injection safety), or None."""
        i = self._vocab.get(text)
        return None if i is None or i in self._trusted_only else i

    def token_id(self, text: str) -> int | None:
        """Exact vocabulary lookup, e.g. token_id("<end_of_turn>")."""
        return self._vocab.get(text)

    def token_text(self, id: int) -> str:
        return self._vocab.text(self._check_id(id))

    def token_type(self, id: int) -> int:
        return int(self._types[self._check_id(id)])

    def is_control(self, id: int) -> bool:
        return self._check_id(id) in self._control

    def _check_id(self, id: int) -> int:
        if not 0 <= id < self.vocab_size:
            raise ValueError(f"token id {id} is outside the vocabulary of {self.vocab_size} tokens")
        return id

    # -- encoding ----------------------------------------------------------------------------------------------------

    def encode(self, text: str, *, add_bos: bool = False, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, like llama.cpp's llama_tokenize(text, add_special=add_bos, parse_special).

        add_bos prepends BOS only when the model asks for it (tokenizer.ggml.add_bos_token), as llama.cpp does.
        parse_special=False never yields a CONTROL token, whatever the text contains.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, not {type(text).__name__}")
        text = _clean(text)
        return self._encode(text, [(0, len(text))] if parse_special else [], add_bos)

    def encode_segments(self, segments: Iterable[Segment], *, add_bos: bool) -> list[int]:
        """Encode a rendered prompt: control tokens are recognised only inside trusted segments.

        The segments are tokenized as one text (so ids equal llama.cpp's for the whole prompt whenever the untrusted
        parts hold no control-token text); only the special-token matching looks at where each segment lies.
        """
        parts: list[str] = []
        trusted: list[tuple[int, int]] = []
        pos = 0
        for seg in segments:
            if not isinstance(seg, Segment):
                raise TypeError(f"expected Segment, got {type(seg).__name__}")
            text = _clean(seg.text)
            if seg.trusted and text:
                if trusted and trusted[-1][1] == pos:
                    trusted[-1] = (trusted[-1][0], pos + len(text))
                else:
                    trusted.append((pos, pos + len(text)))
            parts.append(text)
            pos += len(text)
        return self._encode("".join(parts), trusted, add_bos)

    def _encode(self, text: str, trusted: list[tuple[int, int]], add_bos: bool) -> list[int]:
        out: list[int] = [self.bos_id] if add_bos and self.add_bos else []
        prev_special = True  # llama.cpp's SPM space prefix goes at the start and after each special token
        for piece in self._partition(text, trusted):
            if isinstance(piece, int):
                out.append(piece)
                prev_special = True
            elif self.model == "llama":
                if self.add_space_prefix and prev_special:
                    piece = " " + piece
                self._encode_spm(piece, out)
                prev_special = False
            else:
                self._encode_bpe(piece, out)
                prev_special = False
        return out

    def _partition(self, text: str, trusted: list[tuple[int, int]]) -> list[str | int]:
        """Split text at special tokens, longest token first (llama.cpp's tokenizer_st_partition). USER_DEFINED
        tokens match anywhere; CONTROL/UNKNOWN and structural tokens only where they lie wholly inside a trusted
        range."""
        if not text:
            return []
        trusted_text = "\x00".join(text[a:b] for a, b in trusted)
        control = self._trusted_only
        pieces: list[tuple[int, int] | int] = [(0, len(text))]
        for tok, tid in self._specials_all if trusted else self._specials_plain:
            is_control = tid in control
            if tok not in (trusted_text if is_control else text):  # cheap filter: most never occur
                continue
            nxt: list[tuple[int, int] | int] = []
            for p in pieces:
                if isinstance(p, int):
                    nxt.append(p)
                    continue
                cut, end = p
                search = cut
                while (m := text.find(tok, search, end)) >= 0:
                    if is_control and not _inside(trusted, m, m + len(tok)):
                        search = m + 1
                        continue
                    if m > cut:
                        nxt.append((cut, m))
                    nxt.append(tid)
                    cut = search = m + len(tok)
                if cut < end:
                    nxt.append((cut, end))
            pieces = nxt
        return [p if isinstance(p, int) else text[p[0]:p[1]] for p in pieces]

    def _encode_spm(self, text: str, out: list[int]) -> None:
        """llama.cpp's llm_tokenizer_spm: merge the adjacent pair whose joined text is the best-scored token."""
        scores, plain = self._scores, self._plain_id

        def priority(a: str, b: str) -> float | None:
            i = plain(a + b)
            return None if i is None else -scores[i]

        for sym in _merge(list(text.replace(" ", SPACE_ESCAPE)), priority):
            i = plain(sym)
            if i is not None:
                out.append(i)
            else:
                self._byte_fallback(sym, out)

    def _encode_bpe(self, text: str, out: list[int]) -> None:
        if self._escape_spaces:
            text = text.replace(" ", SPACE_ESCAPE)
        cache = self._word_cache
        for word in _split(text, self._regexes):
            ids = cache.get(word)
            if ids is None:
                ids = self._bpe_word(word)
                if len(cache) < 100_000:
                    cache[word] = ids
            out.extend(ids)

    def _bpe_word(self, word: str) -> list[int]:
        """llama.cpp's llm_tokenizer_bpe_session for one pre-tokenized word: merge the lowest-ranked pair first."""
        plain = self._plain_id
        if self._byte_encode:
            symbols = [self._b2u[b] for b in word.encode()]
        elif word.strip("\n") == "" and (tid := plain(word)) is not None:
            return [tid]  # Gemma 4: a run of newlines is one token when there is one
        else:
            symbols = list(word)
        ranks = self._ranks
        ids: list[int] = []
        for sym in _merge(symbols, lambda a, b: ranks.get((a, b))):
            tid = plain(sym)
            if tid is not None:
                ids.append(tid)
            elif self._byte_encode:  # llama.cpp looks up each byte of the piece; only ASCII ones can be tokens
                ids.extend(t for c in sym if c < "\x80" and (t := plain(c)) is not None)
            else:
                self._byte_fallback(sym, ids)
        return ids

    def _byte_fallback(self, sym: str, out: list[int]) -> None:
        """A symbol that is no token goes out as <0xNN> byte tokens (dropped where the vocabulary has none)."""
        out.extend(i for i in (self._byte_ids[b] for b in sym.encode()) if i is not None)

    # -- decoding ----------------------------------------------------------------------------------------------------

    def token_bytes(self, id: int) -> bytes:
        """Raw bytes of one token (control tokens as their text), for byte-exact streaming."""
        data = self._bytes_cache.get(id)
        if data is None:
            data = self._bytes_cache[id] = self._token_bytes(self._check_id(id))
        return data

    def _token_bytes(self, id: int) -> bytes:
        text, ty = self._vocab.text(id), int(self._types[id])
        if ty in (CONTROL, UNKNOWN, USER_DEFINED):
            return text.encode()
        if ty == BYTE and text.startswith("<0x") and len(text) == 6:
            return bytes([int(text[3:5], 16)])
        if self.model != "gpt2":  # SPM and Gemma 4's BPE spell spaces as U+2581
            return text.replace(SPACE_ESCAPE, " ").encode()
        u2b = self._u2b
        return b"".join(bytes([u2b[c]]) if c in u2b else c.encode() for c in text)

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of ids; skip_special drops CONTROL/UNKNOWN tokens (like <bos>, <end_of_turn>)."""
        data = b"".join(self.token_bytes(i) for i in ids if not (skip_special and self.is_control(i)))
        return data.decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, bos={self.bos_id}, "
                f"eos={self.eos_id}, add_bos={self.add_bos}, eog={sorted(self.eog_ids)})")


class StreamDecoder:
    """Turns a stream of token ids into text deltas that never split a UTF-8 character (byte-fallback tokens and
    GPT-2 byte tokens may each carry part of one)."""

    def __init__(self, tok: Tokenizer, *, skip_special: bool = False, keep: Iterable[int] = ()):
        self.tok = tok
        self.skip_special = skip_special
        self.keep = frozenset(keep)  # control tokens decoded anyway (a chat format's output markup)
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, id: int) -> str:
        if self.skip_special and self.tok.is_control(id) and id not in self.keep:
            return ""
        return self._dec.decode(self.tok.token_bytes(id))

    def flush(self) -> str:
        """Whatever is pending (an incomplete character becomes U+FFFD); the decoder is then reset."""
        text = self._dec.decode(b"", final=True)
        self._dec.reset()
        return text


_SURROGATE = re.compile("[\ud800-\udfff]")


def _clean(text: str) -> str:
    """Python strings may hold lone surrogates, which have no UTF-8 form; each becomes U+FFFD (same length, so
    segment offsets stay valid), as invalid bytes do in llama.cpp."""
    return _SURROGATE.sub("\ufffd", text) if not text.isascii() else text


def _inside(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    """Whether [start, end) lies wholly inside one of the sorted, disjoint ranges."""
    k = bisect.bisect_right(ranges, (start, float("inf"))) - 1
    return k >= 0 and ranges[k][0] <= start and end <= ranges[k][1]
