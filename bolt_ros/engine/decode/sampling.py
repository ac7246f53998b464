"""Sampling: one function turns logits (+ the recent tokens) into the distribution the next token is drawn from.

Plain decoding and DFlash verification both call `distribution()`, so a speculative run samples every committed token
from exactly the distribution a plain run would use at that position.

With a grammar (`constraint`, see grammar.py) that distribution is the one of the masked logits (forbidden tokens at
-inf). Computing a mask costs far more than checking one token, so `sample` first tries the unmasked choice and
masks only when the grammar rejects it. That is exact, not an approximation: for greedy decoding the unmasked argmax,
when allowed, is the masked argmax; for plain temperature sampling, accepting an allowed draw and otherwise drawing
from the masked distribution gives each allowed token p(t) + (1 - Z) p(t) / Z = p(t) / Z (Z = the allowed mass).
top-k/top-p/min-p cut the distribution before renormalising, so there the mask comes first, except when the grammar
allows all top-k tokens (then masking changes nothing).
"""
from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    top_k: int = Field(0, ge=0, description="0 = off")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, description="1 = off (llama.cpp repeat_penalty semantics)")
    penalty_last_n: int = Field(64, ge=0, description="how many recent tokens the penalty looks at")
    seed: int | None = None
    max_tokens: int = Field(256, ge=0)
    stop: list[str] = Field(default_factory=list, description="stop strings (not included in the output)")
    stop_token_ids: list[int] = Field(default_factory=list, description="extra stop tokens besides the model's EOG")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def apply_penalty(logits: torch.Tensor, recent: list[int], penalty: float) -> torch.Tensor:
    if penalty == 1.0 or not recent:
        return logits
    ids = torch.tensor(sorted(set(recent)), dtype=torch.long, device=logits.device)
    vals = logits[ids]
    logits = logits.clone()
    logits[ids] = torch.where(vals > 0, vals / penalty, vals * penalty)
    return logits


def distribution(logits: torch.Tensor, params: SamplingParams, recent: list[int]) -> torch.Tensor:
    """[vocab] logits -> [vocab] probabilities after penalty, temperature, top-k, top-p and min-p."""
    logits = apply_penalty(logits.float(), recent[-params.penalty_last_n:] if params.penalty_last_n else [],
                           params.repetition_penalty)
    if params.greedy:
        probs = torch.zeros_like(logits)
        probs[int(logits.argmax())] = 1.0
        return probs
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing the threshold stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs / probs.sum()


class Sampler:
    """Draws tokens with its own seeded generator (reproducible per request, independent of other threads).

    The generator is a host one whatever the logits' device: it yields one uniform float per draw, and the draw is a
    searchsorted on the device's CDF, so the same seed gives the same tokens on every device.

    constraint: a grammar.Constraint; every token `sample` returns is then allowed by it and committed to it (the
    decoders commit every sampled token; `rollback_to` undoes the ones a decoder drops)."""

    def __init__(self, params: SamplingParams, constraint=None):
        self.params = params
        self.constraint = constraint
        self.gen = torch.Generator()
        self.gen.manual_seed(params.seed if params.seed is not None else torch.seed() & 0xFFFFFFFF)

    def distribution(self, logits: torch.Tensor, recent: list[int]) -> torch.Tensor:
        return distribution(logits, self.params, recent)

    def sample(self, logits: torch.Tensor, recent: list[int]) -> int:
        c = self.constraint
        if c is None:
            return self._sample(logits, recent)
        tok = self._sample_constrained(logits, recent, c) if c.active else self._sample(logits, recent)
        c.consume(tok)
        return tok

    def rollback_to(self, n_tokens: int) -> None:
        """The decoder kept only the first n_tokens sampled tokens of this generation."""
        if self.constraint is not None:
            self.constraint.rollback_to(n_tokens)

    def _sample(self, logits: torch.Tensor, recent: list[int]) -> int:
        if self.params.greedy:  # skip building a one-hot distribution on the hot path
            return int(self._penalized(logits, recent).argmax())
        return self.draw(self.distribution(logits, recent))

    def _penalized(self, logits: torch.Tensor, recent: list[int]) -> torch.Tensor:
        p = self.params
        return apply_penalty(logits, recent[-p.penalty_last_n:] if p.penalty_last_n else [], p.repetition_penalty)

    def _sample_constrained(self, logits: torch.Tensor, recent: list[int], c) -> int:
        p = self.params
        if p.greedy:
            logits = self._penalized(logits, recent)
            tok = int(logits.argmax())
            return tok if c.allows(tok) else int(c.mask(logits).argmax())
        if not (p.top_k or p.top_p < 1.0 or p.min_p > 0.0):
            tok = self.draw(self.distribution(logits, recent))
            if c.allows(tok):
                return tok
        elif p.top_k and p.top_k < logits.shape[-1]:
            # top-k keeps the same logits whether or not the rest is masked, so if the grammar allows all of them,
            # the masked distribution is the unmasked one (ties at the k-th value included, as distribution() does)
            scores = self._penalized(logits, recent)
            kept = (scores >= torch.topk(scores, p.top_k).values[-1]).nonzero().flatten().tolist()
            if all(c.allows(t) for t in kept):
                return self.draw(self.distribution(logits, recent))
        return self.draw(self.distribution(c.mask(logits), recent))

    def draw(self, probs: torch.Tensor) -> int:
        """One token by inverting the cumulative distribution (torch.multinomial takes 1.2 ms for a 49k vocabulary
        and 6 ms for 262k; this ~0.1-0.5 ms). Zero-probability tokens are never drawn: `right=True` skips the flat
        stretches of the CDF they leave."""
        cdf = probs.float().cumsum(-1)
        x = float(torch.rand((), generator=self.gen, dtype=torch.float64)) * float(cdf[-1])
        i = int(torch.searchsorted(cdf, torch.tensor([x], dtype=cdf.dtype, device=cdf.device), right=True))
        if i >= len(cdf) or probs[i] <= 0:  # x rounded up to the total: the last token with mass
            i = int(torch.nonzero(probs > 0)[-1])
        return i

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.gen))
