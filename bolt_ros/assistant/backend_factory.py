"""Builds the chat backend a BackendConfig names (kept out of backend.py: the interface must not import its
implementations, which import it)."""
from __future__ import annotations

from bolt_ros.assistant.backend import ChatBackend
from bolt_ros.assistant.config import BackendConfig


def make_backend(cfg: BackendConfig) -> ChatBackend:
    """Build the backend named by `cfg.kind`; imports lazily so an openai/scripted setup never loads torch."""
    if cfg.kind == "scripted":
        from bolt_ros.assistant.scripted import ScriptedBackend
        return ScriptedBackend.from_config(cfg)
    if cfg.kind == "openai":
        from bolt_ros.assistant.openai_backend import OpenAIBackend
        return OpenAIBackend.from_config(cfg)
    if cfg.kind == "embedded":
        from bolt_ros.assistant.embedded import EmbeddedBackend
        return EmbeddedBackend.from_config(cfg)
    raise ValueError(f"unknown backend kind {cfg.kind!r} (use embedded, openai or scripted)")
