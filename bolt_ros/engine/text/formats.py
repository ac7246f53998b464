"""Picks the chat format of a GGUF model (a factory kept out of chat_format.py: the formats it builds import that
interface)."""
from __future__ import annotations

from bolt_ros.engine.gguf.reader import GGUFFile
from bolt_ros.engine.text.chat_format import ChatFormat, ChatFormatError, Gemma3ChatFormat
from bolt_ros.engine.text.tokenizer import Tokenizer


def chat_format_for(gf: GGUFFile, tok: Tokenizer) -> ChatFormat:
    arch = gf.arch()
    if arch == "gemma4":
        from bolt_ros.engine.text.gemma4_format import Gemma4ChatFormat  # lazy: only Gemma 4 models need it
        return Gemma4ChatFormat(tok)
    template = gf.metadata.get("tokenizer.chat_template")
    if isinstance(template, str) and template.strip():
        from bolt_ros.engine.text.jinja_format import JinjaChatFormat  # lazy: jinja2 only for templated models
        return JinjaChatFormat(template, tok)
    if arch in ("gemma3", "gemma2", "gemma"):
        return Gemma3ChatFormat(tok)
    raise ChatFormatError(f"{gf.path.name}: no tokenizer.chat_template and no built-in chat format for "
                          f"architecture {arch!r}")
