"""Sampling: one function turns logits (+ the recent tokens) into the distribution the next token is drawn from.

Plain decoding and DFlash verification both call `distribution()`, so a speculative run samples every committed token
from exactly the distribution a plain run would use at that position.
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
    ids = torch.tensor(sorted(set(recent)), dtype=torch.long)
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
    """Draws tokens with its own seeded generator (reproducible per request, independent of other threads)."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.gen = torch.Generator()
        self.gen.manual_seed(params.seed if params.seed is not None else torch.seed() & 0xFFFFFFFF)

    def distribution(self, logits: torch.Tensor, recent: list[int]) -> torch.Tensor:
        return distribution(logits, self.params, recent)

    def sample(self, logits: torch.Tensor, recent: list[int]) -> int:
        if self.params.greedy:  # skip building a one-hot distribution on the hot path
            return int(apply_penalty(logits, recent[-self.params.penalty_last_n:] if self.params.penalty_last_n
                                     else [], self.params.repetition_penalty).argmax())
        return self.draw(self.distribution(logits, recent))

    def draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.gen))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.gen))
