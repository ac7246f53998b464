"""Self-distillation data for a DFlash drafter: the target's own greedy replies to assistant prompts, with the target's
residual streams at the drafter's layers for every position (the drafter's context features).

Prompts of one kind share a token prefix (tool turns: the system prompt and the tool list; words turns: the system
prompt): its features are computed once per kind and stored once (`Dataset.prefixes`), each sample keeps only its own
suffix (memory note, user turn, reply). Words turns decode under the words grammar the assistant holds them to (no
call syntax: chat_session.stream with tool_choice "none"), and a turn's memory quotes the replies the target wrote to
the earlier turns of its conversation where the data has them (the bench scripts' conversations, in order).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from bolt_ros.engine.decode.decoders import common_prefix
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.train.prompts import WordsTurn, assistant_prompt_ids, words_grammar, words_prompt_ids


@dataclass
class Sample:
    tokens: list[int]  # prompt + reply
    reply_start: int  # index of the first reply token
    features: torch.Tensor  # [len(tokens) - prefix_len, n_layers * H] fp16: rows of this sample's own positions
    prefix: int = 0  # which of Dataset.prefixes this sample starts with


@dataclass
class Dataset:
    capture: tuple[int, ...]  # target layer inputs (GGUF convention: HF id + 1)
    prefixes: list[torch.Tensor]  # [prefix_len, n_layers * H] fp16 each: the shared starts of the prompts
    samples: list[Sample] = field(default_factory=list)

    def features(self, s: Sample) -> torch.Tensor:
        """All context rows of a sample, [len(tokens), n_layers * H] fp32."""
        return torch.cat([self.prefixes[s.prefix], s.features]).float()

    def state(self) -> dict:
        return {"capture": self.capture, "prefixes": self.prefixes,
                "samples": [(s.tokens, s.reply_start, s.features, s.prefix) for s in self.samples]}

    @classmethod
    def from_state(cls, st: dict) -> Dataset:
        if "prefixes" not in st:  # written before words turns: one prefix
            return cls(tuple(st["capture"]), [st["prefix"]], [Sample(t, r, f) for t, r, f in st["samples"]])
        return cls(tuple(st["capture"]), st["prefixes"], [Sample(*s) for s in st["samples"]])


def _features(engine: Engine, session, ids: list[int], capture: tuple[int, ...]) -> torch.Tensor:
    """Features of the positions `session` does not hold yet (prefix reuse), [n_new, n_layers * H] fp16."""
    rows: list[torch.Tensor] = []

    def keep(hidden, chunk):
        rows.append(torch.cat([hidden[i] for i in capture], dim=-1).to("cpu", torch.float16))

    engine.prefill(session, ids, capture=capture, on_chunk=keep)
    return torch.cat(rows)


def build(engine: Engine, items: list[str | WordsTurn], capture: tuple[int, ...], max_new: int = 96,
          progress: bool = True) -> Dataset:
    """items: an utterance (a tool turn: assistant_prompt_ids) or a WordsTurn (words_prompt_ids)."""
    kinds = sorted({isinstance(it, WordsTurn) for it in items})  # False = tool turns, True = words turns
    grammar = words_grammar(engine) if True in kinds else None
    ds = Dataset(capture, [])
    feat_session = engine.new_session()
    gen_session = engine.new_session()
    stops = sorted(set(engine.chat_format.stop_token_ids))
    params = SamplingParams(max_tokens=max_new, stop_token_ids=stops)
    replies: dict[str, str] = {}  # words turns' utterance -> the target's reply (the memory of later turns)
    bar = tqdm(total=len(items), desc="target replies", unit="prompt", disable=not progress)
    for kind in kinds:
        group = [it for it in items if isinstance(it, WordsTurn) == kind]
        # the shared start of the kind's prompts (the system prompt and, for tool turns, the tools; the memory and
        # the words come after)
        probe = [(words_prompt_ids(engine, it) if kind else assistant_prompt_ids(engine, it)) for it in group]
        prefix_len = common_prefix(*probe) if len(probe) > 1 else len(probe[0]) - 1
        feat_session.truncate(0)
        ds.prefixes.append(_features(engine, feat_session, probe[0][:prefix_len], capture))
        for it in group:
            ids = words_prompt_ids(engine, it, replies.get) if kind else assistant_prompt_ids(engine, it)
            assert ids[:prefix_len] == probe[0][:prefix_len], "a prompt without its kind's shared start"
            res = engine.generate(ids, params, session=gen_session, use_draft=False,
                                  grammar=grammar if kind else None)
            reply = list(res.completion_ids)
            if kind:
                replies[it.say] = res.text.strip()
            if res.stop_token is not None:  # the drafter should also learn where a turn ends
                reply.append(res.stop_token)
            tokens = ids + reply
            feat_session.truncate(prefix_len)
            ds.samples.append(Sample(tokens, len(ids), _features(engine, feat_session, tokens, capture),
                                     len(ds.prefixes) - 1))
            bar.update()
    bar.close()
    return ds
