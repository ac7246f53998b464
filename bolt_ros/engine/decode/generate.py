"""The engine: load a GGUF model, prefill with prefix reuse, and decode with streaming, stops and cancellation.

Decoding is split into a *decoder* (how tokens are proposed and committed: one per forward pass for plain decoding,
several for DFlash) and one outer loop (stop tokens and strings, max tokens, streaming text, cancellation, timings)
shared by both.
"""
from __future__ import annotations

import ctypes
import gc
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bolt_ros.engine.decode.decoders import Decoder, common_prefix, plain_decoder
from bolt_ros.engine.decode.sampling import Sampler, SamplingParams
from bolt_ros.engine.default_models import resolve_model
from bolt_ros.engine.errors import PromptTooLong
from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile
from bolt_ros.engine.model.config import ModelConfig, config_from_gguf
from bolt_ros.engine.model.kv_cache import KVCache
from bolt_ros.engine.model.transformer import Interrupted, Transformer
from bolt_ros.engine.model.weights import WeightStore
from bolt_ros.engine.text.formats import chat_format_for
from bolt_ros.engine.text.tokenizer import StreamDecoder, Tokenizer


@dataclass
class Timings:
    load_s: float = 0.0
    prompt_tokens: int = 0  # tokens in the prompt
    prefill_tokens: int = 0  # tokens actually run (the rest came from the reused prefix)
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {"load_s": round(self.load_s, 4), "prompt_tokens": self.prompt_tokens,
                "prefill_tokens": self.prefill_tokens, "ttft_ms": round(self.ttft_s * 1e3, 3),
                "prefill_tok_s": round(self.prefill_tok_s, 2), "decode_tok_s": round(self.decode_tok_s, 2)}


@dataclass
class TokenEvent:
    id: int
    text: str  # new text; may be "" while a UTF-8 character or a possible stop string is incomplete


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    finish_reason: str  # "eos" | "stop" | "length" | "cancelled" | "context"
    timings: Timings
    spec: dict | None = None  # speculative decoding statistics
    grammar: dict | None = None  # constrained decoding statistics (grammar.Constraint.stats)
    stop_token: int | None = None  # the end-of-generation token that ended it (finish "eos"; not in completion_ids)


class Session:
    """One sequence's KV cache and the tokens it holds. A prompt sharing a prefix with `tokens` reuses it."""

    def __init__(self, cache: KVCache):
        self.cache = cache
        self.tokens: list[int] = []
        self.last_prefill = 0  # tokens the last prefill actually ran
        # (n, logits [vocab]) after the first n tokens, from the last plain prefill: a prompt the cache already holds
        # whole gets these back instead of re-running its last token as a step, whose rounding (a step's kernels, not
        # a prefill chunk's) could turn a near-tie the other way: the same request twice is the same reply
        self.held_logits: tuple[int, torch.Tensor] | None = None
        self.lock = threading.Lock()  # one generation at a time per session
        self.cancel: threading.Event | None = None  # set by stream(): a long prefill stops between layers
        self.graph_step = None  # decoders.CudaGraphStep: the CUDA graphs captured for this cache

    def truncate(self, n: int) -> None:
        self.cache.truncate(n)
        del self.tokens[n:]
        if self.held_logits is not None and self.held_logits[0] > n:
            self.held_logits = None

    def reset(self) -> None:
        self.truncate(0)


def release_heap() -> None:
    """Give the heap freed after repacking back to the OS. glibc raises its mmap threshold as large blocks are freed,
    so later repack temporaries come from the heap and stay resident once freed: ~95 MiB of RSS for Gemma 3 270M."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim this way
        pass

class Engine:
    def __init__(self, gf: GGUFFile, model: Transformer, tokenizer: Tokenizer, n_ctx: int, load_s: float = 0.0):
        self.gguf, self.model, self.tok = gf, model, tokenizer
        self.cfg: ModelConfig = model.cfg
        self.n_ctx = n_ctx
        self.load_s = load_s
        self.chat_format = chat_format_for(gf, tokenizer)
        self.draft = None  # a DFlash drafter, attached by bolt_ros.engine.decode.dflash

    @classmethod
    def load(cls, model: str | Path, *, n_ctx: int = 4096, policy: str = "fast", threads: int | None = None,
             draft: str | Path | None = None, progress: bool = False, device: str = "cpu",
             draft_options: dict | None = None, compile_steps: bool = False) -> Engine:
        """draft_options: dflash.DFlashOptions fields (n_max, adaptive, p_min, embedding_scale). compile_steps: small
        steps (decode, DFlash verify) through torch.compile on the CPU (engine/model/compiled.py)."""
        if threads:
            torch.set_num_threads(threads)
        t0 = time.perf_counter()
        gf = GGUFFile(resolve_model(model))
        cfg = config_from_gguf(gf)
        tok = Tokenizer.from_gguf(gf)
        weights = WeightStore(gf, policy, device=device, progress=progress)
        net = Transformer(cfg, weights)
        if compile_steps:
            from bolt_ros.engine.model.compiled import compile_layers
            compile_layers(net)
        gf.release_pages()
        release_heap()
        engine = cls(gf, net, tok, min(n_ctx, cfg.n_ctx_train), time.perf_counter() - t0)
        if draft is not None:
            from bolt_ros.engine.decode.dflash import attach_drafter
            attach_drafter(engine, draft, policy=policy, **(draft_options or {}))
        engine.load_s = time.perf_counter() - t0
        return engine

    # --- forward passes --------------------------------------------------------------------------------------------
    def warm_up(self, ids: list[int]) -> None:
        """With compiled steps (compile_steps=True): compile the shapes a generation meets now, not in the first reply
        - single-token steps and, with a drafter, verify blocks. Without compiled steps: nothing to do."""
        from bolt_ros.engine.model.compiled import CompiledLayers
        if not isinstance(self.model.layers, CompiledLayers):
            return
        self.generate(ids, SamplingParams(max_tokens=4), use_draft=False)
        if self.draft is not None:
            self.generate(ids, SamplingParams(max_tokens=16))

    def new_session(self) -> Session:
        return Session(self.model.new_cache(self.n_ctx))

    def forward(self, session: Session, ids: list[int], *, logits: str = "last", capture: tuple[int, ...] = (),
                on_chunk: Callable[[dict, list[int]], None] | None = None) -> torch.Tensor:
        """Append ids to the session (chunked to the cache's step size); logits of the last (or every) token.

        capture/on_chunk: the residual streams entering these layers are handed to on_chunk(hidden, chunk) after
        each chunk (DFlash feeds its drafter this way)."""
        out = []
        step = session.cache.max_step
        stop = session.cancel.is_set if session.cancel is not None else None
        for i in range(0, len(ids), step):
            chunk = ids[i:i + step]
            last = i + step >= len(ids)
            mode = logits if last or logits == "all" else None
            res = self.model(torch.tensor(chunk, dtype=torch.long), session.cache, logits=mode, capture=capture,
                             stop=stop)
            session.tokens.extend(chunk)
            if on_chunk is not None:
                on_chunk(res.hidden, chunk)
            if res.logits is not None:
                out.append(res.logits)
        return out[-1][-1] if logits == "last" else torch.cat(out)

    def prefill(self, session: Session, ids: list[int], *, max_reuse: int | None = None, **forward_kw) -> torch.Tensor:
        """Logits after `ids`, reusing the longest prefix the session already holds (at most max_reuse tokens)."""
        if not ids:
            raise ValueError("empty prompt")
        if len(ids) >= self.n_ctx:
            raise PromptTooLong(len(ids), self.n_ctx)
        common = common_prefix(session.tokens, ids)
        if self.holds_logits(session, ids) and (max_reuse is None or max_reuse >= len(ids)):
            session.truncate(len(ids))
            session.last_prefill = 0
            return session.held_logits[1].clone()
        keep = min(common, len(ids) - 1)  # run at least one token to get its logits
        if max_reuse is not None:
            keep = min(keep, max_reuse)
        session.truncate(keep)
        session.last_prefill = len(ids) - keep
        logits = self.forward(session, ids[keep:], **forward_kw)
        if not bool(torch.isfinite(logits).all()):  # finite weights whose products overflow fp32: refuse, don't babble
            raise GGUFError(f"{self.gguf.path.name}: the model's logits are not finite (its weights overflow fp32)")
        if set(forward_kw) <= {"capture", "on_chunk"}:  # they read hidden states: the logits are the same
            session.held_logits = (len(ids), logits.clone())
        return logits

    @staticmethod
    def holds_logits(session: Session, ids: list[int]) -> bool:
        """The session holds the whole prompt and its prefill's logits (prefill then runs nothing)."""
        held = session.held_logits
        return held is not None and held[0] == len(ids) and common_prefix(session.tokens, ids) == len(ids)

    # --- generation ------------------------------------------------------------------------------------------------
    def stream(self, prompt_ids: list[int], params: SamplingParams | None = None, *, session: Session | None = None,
               cancel: threading.Event | None = None, use_draft: bool = True,
               grammar: str | None = None) -> Iterator[TokenEvent | GenerationResult]:
        """Yield TokenEvents as tokens are committed, then one GenerationResult.

        grammar: an llguidance grammar (grammar.py) every committed token must follow, e.g. the tool-call grammar a
        ChatFormat builds; with a drafter, each verified row is masked, so accepted drafts follow it too."""
        params = params or SamplingParams()
        session = session or self.new_session()
        with session.lock:
            session.cancel = cancel
            try:
                yield from self._stream(prompt_ids, params, session, cancel, use_draft, grammar)
            finally:
                session.cancel = None

    def prime(self, prompt_ids: list[int], session: Session, *, use_draft: bool = True,
              cancel: threading.Event | None = None) -> int:
        """Run a prompt's prefix into the session now (and into the drafter's context, with one), so a generation
        whose prompt starts with it later prefills only the rest: the conversation's next turn, prepared while the
        robot waits for the person. Returns the tokens run; a cancel stops it between chunks (what ran is kept)."""
        if not prompt_ids:
            return 0
        return 0 if self.next_logits(prompt_ids, session, use_draft=use_draft, cancel=cancel) is None \
            else session.last_prefill

    def next_logits(self, prompt_ids: list[int], session: Session, *, use_draft: bool = True,
                    cancel: threading.Event | None = None) -> torch.Tensor | None:
        """[vocab] the next-token logits after the prompt, run into the session the way a generation's prefill runs
        it (the drafter's context too), so the generation that follows reuses all of it. None when cancelled."""
        with session.lock:
            session.cancel = cancel
            try:
                decoder = self._decoder(session, Sampler(SamplingParams()), use_draft, frozenset())
                decoder.prefill(list(prompt_ids))
                return decoder.logits
            except Interrupted:
                return None
            finally:
                session.cancel = None

    def _decoder(self, session: Session, sampler: Sampler, use_draft: bool, stops: frozenset[int]) -> Decoder:
        """DFlash steps with the attached drafter (use_draft), else plain ones."""
        if use_draft and self.draft is not None:
            return self.draft.decoder(self, session, sampler, stops)
        return plain_decoder(self, session, sampler)

    def _stream(self, prompt_ids, params, session, cancel, use_draft, grammar=None):
        stops = set(self.tok.eog_ids) | set(params.stop_token_ids)
        constraint = None
        if grammar is not None:
            from bolt_ros.engine.text.grammar import (
                make_constraint,  # lazy: llguidance only for constrained generations
            )
            constraint = make_constraint(self.tok, grammar, stops)
        sampler = Sampler(params, constraint)
        decoder = self._decoder(session, sampler, use_draft, frozenset(stops))
        t = Timings(load_s=self.load_s, prompt_tokens=len(prompt_ids))
        text_out = _StopStringFilter(params.stop)
        markup = (self.tok.token_id(m) for m in self.chat_format.output_markup)
        detok = StreamDecoder(self.tok, skip_special=True, keep=[i for i in markup if i is not None])
        completion: list[int] = []
        recent = list(prompt_ids)
        t0 = time.perf_counter()
        try:
            decoder.prefill(prompt_ids)
        except Interrupted:  # cancelled mid-prefill: the session keeps the chunks it committed (prefix reuse)
            t.prefill_s = time.perf_counter() - t0
            yield GenerationResult(list(prompt_ids), [], "", "cancelled", t, None, None)
            return
        t.prefill_tokens = session.last_prefill
        t.prefill_s = time.perf_counter() - t0
        finish = "length"
        stop_token = None
        t_first = None
        room = self.n_ctx - len(prompt_ids) - 1
        limit = min(params.max_tokens, room)
        while len(completion) < limit:
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            new = decoder.step(recent)
            if t_first is None:
                t_first = time.perf_counter()
                t.ttft_s = t_first - t0
            done = False
            for i, tok_id in enumerate(new):
                if tok_id in stops:
                    finish, done, stop_token = "eos", True, tok_id
                elif len(completion) < limit:
                    completion.append(tok_id)
                    recent.append(tok_id)
                    delta, hit = text_out.push(detok.push(tok_id))
                    yield TokenEvent(tok_id, delta)
                    done = hit or len(completion) >= limit
                    finish = "stop" if hit else finish
                if done:
                    if i < len(new) - 1:
                        decoder.rollback(len(completion))  # drop committed-but-unused tokens from the cache
                    break
            if done:
                break
        if finish == "length" and len(completion) >= room and room < params.max_tokens:
            finish = "context"
        if t_first is not None:
            t.decode_s = time.perf_counter() - t_first
            t.decode_tokens = len(completion) - 1  # the first token is charged to time-to-first-token
        tail, _ = text_out.push(detok.flush())
        tail += text_out.flush() if finish != "stop" else ""
        if tail:
            yield TokenEvent(-1, tail)
        yield GenerationResult(list(prompt_ids), completion, text_out.text, finish, t, decoder.stats(),
                               constraint.stats() if constraint is not None else None, stop_token)

    def generate(self, prompt_ids: list[int], params: SamplingParams | None = None, **kw) -> GenerationResult:
        for ev in self.stream(prompt_ids, params, **kw):
            if isinstance(ev, GenerationResult):
                return ev
        raise RuntimeError("generation ended without a result")

    def logprobs(self, prompt_ids: list[int], continuation_ids: list[int], top: int = 5) -> list[dict]:
        """Teacher-forced log-probabilities of each continuation token, with the top-k alternatives."""
        session = self.new_session()
        ids = list(prompt_ids) + list(continuation_ids)
        logits = self.forward(session, ids, logits="all")[len(prompt_ids) - 1: len(ids) - 1]  # [C, vocab]
        lp = torch.log_softmax(logits.float(), dim=-1)
        top_lp, top_ids = lp.topk(top, dim=-1)
        return [{"id": int(c), "logprob": float(lp[i, c]),
                 "top": [[int(a), float(b)] for a, b in zip(top_ids[i], top_lp[i])]}
                for i, c in enumerate(continuation_ids)]


@dataclass
class _StopStringFilter:
    """Streams text, holding back any tail that could still become a stop string; cuts at the first stop."""

    stops: list[str]
    text: str = ""
    _held: str = field(default="", repr=False)

    def push(self, delta: str) -> tuple[str, bool]:
        if not self.stops:
            self.text += delta
            return delta, False
        buf = self._held + delta
        for s in self.stops:
            at = buf.find(s)
            if at >= 0:
                out = buf[:at]
                self.text += out
                self._held = ""
                return out, True
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out, self._held = buf[: len(buf) - hold], buf[len(buf) - hold:]
        self.text += out
        return out, False

    def flush(self) -> str:
        out, self._held = self._held, ""
        self.text += out
        return out
