"""Self-distillation data for a DFlash drafter: the target's own greedy replies to assistant prompts, with the target's
residual streams at the drafter's layers for every position (the drafter's context features).

The prompts share the assistant's system prompt and tool list, so their token prefix is common: its features are
computed once and stored once (`Dataset.prefix`), each sample keeps only its own suffix (user turn + reply).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from bolt_ros.engine.decode.decoders import common_prefix
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.train.prompts import assistant_prompt_ids


@dataclass
class Sample:
    tokens: list[int]  # prompt + reply
    reply_start: int  # index of the first reply token
    features: torch.Tensor  # [len(tokens) - prefix_len, n_layers * H] fp16: rows of this sample's own positions


@dataclass
class Dataset:
    capture: tuple[int, ...]  # target layer inputs (GGUF convention: HF id + 1)
    prefix_len: int
    prefix: torch.Tensor  # [prefix_len, n_layers * H] fp16
    samples: list[Sample] = field(default_factory=list)

    def features(self, s: Sample) -> torch.Tensor:
        """All context rows of a sample, [len(tokens), n_layers * H] fp32."""
        return torch.cat([self.prefix, s.features]).float()

    def state(self) -> dict:
        return {"capture": self.capture, "prefix_len": self.prefix_len, "prefix": self.prefix,
                "samples": [(s.tokens, s.reply_start, s.features) for s in self.samples]}

    @classmethod
    def from_state(cls, st: dict) -> Dataset:
        return cls(tuple(st["capture"]), st["prefix_len"], st["prefix"],
                   [Sample(t, r, f) for t, r, f in st["samples"]])


def _features(engine: Engine, session, ids: list[int], capture: tuple[int, ...]) -> torch.Tensor:
    """Features of the positions `session` does not hold yet (prefix reuse), [n_new, n_layers * H] fp16."""
    rows: list[torch.Tensor] = []

    def keep(hidden, chunk):
        rows.append(torch.cat([hidden[i] for i in capture], dim=-1).to("cpu", torch.float16))

    engine.prefill(session, ids, capture=capture, on_chunk=keep)
    return torch.cat(rows)


def build(engine: Engine, utterances: list[str], capture: tuple[int, ...], max_new: int = 96,
          progress: bool = True) -> Dataset:
    prompts = [assistant_prompt_ids(engine, u) for u in utterances]
    prefix_len = common_prefix(*prompts) if len(prompts) > 1 else len(prompts[0]) - 1
    feat_session = engine.new_session()
    prefix = _features(engine, feat_session, prompts[0][:prefix_len], capture)
    ds = Dataset(capture, prefix_len, prefix)
    gen_session = engine.new_session()
    stops = sorted(set(engine.chat_format.stop_token_ids))
    params = SamplingParams(max_tokens=max_new, stop_token_ids=stops)
    for ids in tqdm(prompts, desc="target replies", unit="prompt", disable=not progress):
        res = engine.generate(ids, params, session=gen_session, use_draft=False)
        reply = list(res.completion_ids)
        if res.stop_token is not None:  # the drafter should also learn where a turn ends
            reply.append(res.stop_token)
        tokens = ids + reply
        feat_session.truncate(prefix_len)
        ds.samples.append(Sample(tokens, len(ids), _features(engine, feat_session, tokens, capture)))
    return ds
