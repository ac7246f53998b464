"""Typed, bounded tokenizer metadata and a chat template that compiles, checked before the tokenizer is built.

tokenizer.py, vocab.py and the chat formats trust the types of the `tokenizer.*` keys (a str here, an int array there)
and raise their own errors for some bad values, without the file's name. config_from_gguf calls check_tokenizer and
check_chat_template first, so a malformed tokenizer is a GGUFError naming the file and the key, and the checks that
matter for safety (valid UTF-8: texts are encoded back to bytes when decoding) happen before anything trusts them.
"""
from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile, StringArray
from bolt_ros.engine.gguf.validate import MAX_VOCAB, Int, read_metadata, short


def _strings(v: Any) -> Any:
    if not isinstance(v, StringArray):
        raise ValueError(f"should be an array of strings, not {type(v).__name__}")
    if len(v) > MAX_VOCAB:
        raise ValueError(f"has {len(v)} entries (at most {MAX_VOCAB})")
    return v


def _numbers(kinds: str) -> Any:
    def check(v: Any) -> Any:
        if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.kind not in kinds:
            what = "an integer" if kinds == "iu" else "a numeric"
            raise ValueError(f"should be {what} array, not {type(v).__name__} {getattr(v, 'dtype', '')}".rstrip())
        if v.dtype.kind == "f" and not np.isfinite(v).all():
            raise ValueError("has non-finite values")
        return v
    return check


TokenId = Int(0, MAX_VOCAB - 1)


class TokenizerMeta(BaseModel):
    """The `tokenizer.*` keys tokenizer.py, vocab.py and the chat formats read (they trust these types)."""

    model_config = ConfigDict(strict=True, frozen=True)

    tok_model: str | None = Field(None, alias="ggml.model")
    tokens: Annotated[Any, AfterValidator(_strings)] = Field(None, alias="ggml.tokens")
    merges: Annotated[Any, AfterValidator(_strings)] = Field(None, alias="ggml.merges")
    token_type: Annotated[Any, AfterValidator(_numbers("iu"))] = Field(None, alias="ggml.token_type")
    scores: Annotated[Any, AfterValidator(_numbers("iuf"))] = Field(None, alias="ggml.scores")
    pre: str | None = Field(None, alias="ggml.pre")
    bos: TokenId | None = Field(None, alias="ggml.bos_token_id")
    eos: TokenId | None = Field(None, alias="ggml.eos_token_id")
    unk: TokenId | None = Field(None, alias="ggml.unknown_token_id")
    eot: TokenId | None = Field(None, alias="ggml.eot_token_id")
    eom: TokenId | None = Field(None, alias="ggml.eom_token_id")
    mask: TokenId | None = Field(None, alias="ggml.mask_token_id")
    add_bos: bool | None = Field(None, alias="ggml.add_bos_token")
    add_eos: bool | None = Field(None, alias="ggml.add_eos_token")
    add_space_prefix: bool | None = Field(None, alias="ggml.add_space_prefix")
    chat_template: str | None = Field(None, alias="chat_template")


def check_tokenizer(gf: GGUFFile) -> TokenizerMeta:
    """Types and lengths of the tokenizer metadata, before the Tokenizer (which trusts them) is built."""
    meta = read_metadata(gf, TokenizerMeta, "tokenizer.")
    if meta.tokens is None:
        return meta
    n = len(meta.tokens)
    if n == 0:
        raise GGUFError(f"{gf.path.name}: metadata 'tokenizer.ggml.tokens' is empty")
    for key in ("token_type", "scores"):
        arr = getattr(meta, key)
        if arr is not None and len(arr) != n:
            raise GGUFError(f"{gf.path.name}: metadata 'tokenizer.ggml.{key}' has {len(arr)} entries for {n} tokens")
    for name, field in TokenizerMeta.model_fields.items():
        tid = getattr(meta, name)
        if field.alias.endswith("_token_id") and tid is not None and tid >= n:
            raise GGUFError(f"{gf.path.name}: metadata 'tokenizer.{field.alias}' = {tid} is outside the vocabulary "
                            f"of {n} tokens")
    bad = _bad_utf8(meta.tokens)
    if bad is not None:  # GGUF strings are UTF-8; the tokenizer encodes token texts back to bytes when decoding
        raise GGUFError(f"{gf.path.name}: metadata 'tokenizer.ggml.tokens'[{bad}] = {meta.tokens.raw(bad)[:40]!r} "
                        "is not valid UTF-8")
    _check_tokenizer_model(gf, meta)
    dup = _duplicate(meta.tokens)
    if dup is not None:  # vocab.Vocab refuses them too, as llama.cpp does; here the message names the file
        raise GGUFError(f"{gf.path.name}: metadata 'tokenizer.ggml.tokens' has {meta.tokens[dup[1]]!r} twice "
                        f"(ids {dup[0]} and {dup[1]})")
    return meta


def _check_tokenizer_model(gf: GGUFFile, meta: TokenizerMeta) -> None:
    """What tokenizer.Tokenizer refuses, checked here so that the message names the file."""
    from bolt_ros.engine.text.tokenizer import (
        _BPE_PRE,  # the pre-tokenizers it implements (not copied: they must stay in step)
    )

    name, model = gf.path.name, meta.tok_model
    if model not in ("llama", "gpt2", "gemma4"):
        what = "missing" if model is None else f"{model!r}, not one of 'llama' (SPM), 'gpt2', 'gemma4' (BPE)"
        raise GGUFError(f"{name}: metadata 'tokenizer.ggml.model' is {what}")
    if model == "llama" and meta.scores is None:
        raise GGUFError(f"{name}: missing metadata key 'tokenizer.ggml.scores' (an SPM tokenizer merges by score)")
    if model == "gpt2" and (meta.pre or "gpt2") not in _BPE_PRE:
        raise GGUFError(f"{name}: metadata 'tokenizer.ggml.pre' = {short(meta.pre)} is not a pre-tokenizer this "
                        f"engine has ({', '.join(sorted(_BPE_PRE))})")
    if model in ("gpt2", "gemma4"):
        if meta.merges is None:
            raise GGUFError(f"{name}: missing metadata key 'tokenizer.ggml.merges' (a BPE tokenizer needs them)")
        bad = _bad_merge(meta.merges)
        if bad is not None:
            raise GGUFError(f"{name}: metadata 'tokenizer.ggml.merges'[{bad}] = {short(meta.merges[bad])} is not "
                            "'left right'")
    if meta.add_bos and meta.bos is None:
        raise GGUFError(f"{name}: metadata 'tokenizer.ggml.add_bos_token' is true but 'tokenizer.ggml.bos_token_id' "
                        "is missing")


def _bad_merge(merges: StringArray) -> int | None:
    """The first merge without a space after its first character (tokenizer._init_bpe splits there), or None.
    In bytes: a 0x20 past byte 0 (UTF-8 continuation bytes are never 0x20, so it follows the first character)."""
    blob, off = merges.buffers()
    if not len(merges):
        return None
    space = blob == 0x20
    space[off[:-1][off[:-1] < len(blob)]] = False  # byte 0 of each merge does not count
    lengths = np.diff(off)
    has = np.add.reduceat(space, np.minimum(off[:-1], max(len(blob) - 1, 0))) if len(blob) else np.zeros(len(merges))
    ok = (lengths > 1) & (has > 0)
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else None


def _bad_utf8(tokens: StringArray) -> int | None:
    """The first token that is not valid UTF-8 on its own, or None. The whole blob decodes iff every token does,
    unless a token boundary splits a character: then the later token starts with a continuation byte."""
    blob, off = tokens.buffers()
    starts = off[:-1][np.diff(off) > 0]
    split = np.flatnonzero((blob[starts] & 0xC0) == 0x80)
    try:
        blob.tobytes().decode("utf-8")
    except UnicodeDecodeError as e:  # the token holding the first bad byte
        return int(np.searchsorted(off, e.start, side="right") - 1)
    return int(np.searchsorted(off, starts[split[0]], side="right") - 1) if len(split) else None


def _duplicate(tokens: StringArray) -> tuple[int, int] | None:
    """Two ids with the same (non-empty) text, or None: a 64-bit polynomial hash of every token in one vectorized
    pass (~20 ms for 262k tokens), texts compared only where hashes collide."""
    blob, off = tokens.buffers()
    lengths = np.diff(off)
    if not len(blob):
        return None
    starts = np.repeat(off[:-1], lengths)
    pos = np.arange(len(blob), dtype=np.int64) - starts  # byte index within its token
    powers = np.cumprod(np.full(int(lengths.max()), 1_000_003, np.uint64), dtype=np.uint64)
    with np.errstate(over="ignore"):
        terms = (blob.astype(np.uint64) + np.uint64(1)) * powers[pos]
        sums = np.add.reduceat(terms, np.minimum(off[:-1], len(blob) - 1))
    h = np.where(lengths > 0, sums ^ lengths.astype(np.uint64) << np.uint64(48), np.arange(len(lengths),
                                                                                            dtype=np.uint64))
    order = np.argsort(h, kind="stable")
    same = np.flatnonzero(h[order[1:]] == h[order[:-1]])
    for k in same.tolist():
        a, b = sorted((int(order[k]), int(order[k + 1])))
        if lengths[a] and tokens.raw(a) == tokens.raw(b):
            return a, b
    return None


def check_chat_template(gf: GGUFFile, arch: str, meta: TokenizerMeta) -> None:
    """The chat format Engine will pick (text.formats.chat_format_for) must be buildable: a template that compiles
    in the sandbox, or an architecture with a built-in format. Only for files with a tokenizer (layout-only test files
    have none and never reach an Engine)."""
    if meta.tokens is None or arch == "gemma4":  # Gemma 4's format is built in and ignores the template
        return
    template = meta.chat_template
    if template is None or not template.strip():
        if arch not in ("gemma3", "gemma2", "gemma"):
            raise GGUFError(f"{gf.path.name}: missing metadata key 'tokenizer.chat_template' (architecture {arch!r} "
                            "has no built-in chat format)")
        return
    import jinja2  # lazy, like jinja_format: only for models that bring a template

    from bolt_ros.engine.text.jinja_format import make_jinja_env
    try:
        make_jinja_env().from_string(template)
    except (jinja2.TemplateError, RecursionError) as e:
        raise GGUFError(f"{gf.path.name}: metadata 'tokenizer.chat_template' does not compile: "
                        f"{type(e).__name__}: {short(str(e), 120)}") from None
