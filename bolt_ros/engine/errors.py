"""The engine's errors that callers act on (torch-free, so a backend without the engine can raise them too)."""
from __future__ import annotations


class PromptTooLong(ValueError):
    """A prompt as long as the context or longer: nothing was run. A caller that talks to people says so (the
    assistant asks for fewer words) rather than failing the turn. n_tokens / n_ctx: 0 where a server did not say."""

    def __init__(self, n_tokens: int, n_ctx: int):
        super().__init__(f"prompt of {n_tokens} tokens does not fit the context ({n_ctx})")
        self.n_tokens, self.n_ctx = n_tokens, n_ctx
