"""DFlash speculative decoding: draft a block in one drafter pass, verify it in one target pass, keep what agrees.

One step, with the last committed token `anchor` at position s (not yet in the target cache):
  1. the drafter reads `[anchor, MASK x n]` at positions s..s+n against its injected context (rows 0..s-1) and
     proposes d1..dn greedily (slots 1..n);
  2. the target runs `[anchor, d1..dn]` in one pass (logits on every row, hidden states captured at the drafter's
     layers);
  3. exact-match verification (llama.cpp `common_sampler_sample_and_accept_n`, z-lab `dflash_generate`): at row i the
     target's token t_i is drawn from `Sampler.distribution` given everything accepted so far; d_{i+1} is accepted
     while t_i == d_{i+1}, and the first t_i that differs (or the bonus token after n accepted) is committed too. Every
     committed token is a genuine sample of the target's distribution, so this is lossless for any sampling settings;
     for greedy it is the plain argmax. With a grammar the Sampler masks each row given the rows accepted before it
     (and commits each sampled token to the matcher), so an accepted draft always satisfies the grammar;
  4. rollback: the target cache keeps positions <= s + a (a = accepted drafts); the drafter gets context rows for
     exactly those positions, from the verify pass's captured hidden states.

Invariant between steps: target cache = drafter context (injected rows, then rows waiting for the next draft) =
every committed token but the last (the next anchor).
"""
from __future__ import annotations

import time
import weakref
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from bolt_ros.engine.decode.decoders import common_prefix
from bolt_ros.engine.decode.dflash_model import DFlashDraftModel, DraftCache, check_compatible, draft_config_from_gguf
from bolt_ros.engine.decode.draft_policy import AdaptiveDraft, FixedDraft
from bolt_ros.engine.decode.sampling import Sampler
from bolt_ros.engine.gguf.reader import GGUFFile
from bolt_ros.engine.model.weights import WeightStore

HEAD_ROWS = 4  # drafter head rows scored at a time when a draft may stop early (see DFlashDecoder._draft)


class DFlashOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n_max: int | None = Field(None, ge=1, description="drafts per step; None or > block_size-1 = block_size-1")
    adaptive: bool = Field(True, description="shrink the draft while acceptance is low and back off to plain steps "
                                             "while nothing is accepted (draft_policy.AdaptiveDraft)")
    # 0.5: chosen on the shipped drafter and bench_dflash's held-out prompts (docs/dflash.md): 0.1 let confident but
    # wrong drafts through on questions (slowest prompt 0.58x), 0.8 cut good drafts short (2.22 tokens/pass, 1.34x)
    p_min: float = Field(0.5, ge=0.0, lt=1.0, description="a draft ends before the first slot whose drafter "
                                                          "probability is below this (0 = never)")
    # 0.6, chosen on bench_dflash's held-out prompts (docs/dflash.md): a reply's first token had 0.86-0.91 where the
    # reply was a tool call (drafts accepted from the first step) and 0.32-0.41 where it was free speech (none
    # accepted); a probe costs ~8 ms on 2 cores, 4-5 % of a 4-token reply's decode. 0.5 let a 0.51 token of such a
    # reply probe (slowest prompt 0.86x against 0.92x in the same conditions)
    anchor_min: float = Field(0.6, ge=0.0, lt=1.0, description="while probing (nothing accepted lately), draft only "
                                                               "after a token the target gave at least this "
                                                               "probability (0 = always)")
    draft_vocab: bool = Field(True, description="propose drafts from the file's dflash.draft_vocab rows of the head "
                                                "(the tokens the drafter was trained to predict) where drafts are "
                                                "proposals of ours (confidence-gated or under a grammar); the fixed "
                                                "policy without a grammar keeps the reference loop's whole head")
    embedding_scale: float | Literal["gguf", "none", "sqrt"] = Field(
        "gguf", description="drafter input embedding scale: 'gguf' = dflash.embedding_scale if the file has it, "
                            "else unscaled (llama.cpp); 'none' = 1; 'sqrt' = sqrt(hidden) (HF-style training)")


class _DraftState:
    """The drafter context belonging to one target Session (kept across generations for prefix reuse).

    Rows of plain steps wait in `_rows` and are injected together before the next draft: a step that drafts nothing
    then only keeps its captured features (injecting one row is ~1 ms of small matmuls and dispatch; a batch of them
    costs about the same as one)."""

    def __init__(self, model: DFlashDraftModel, cache: DraftCache):
        self.model, self.cache = model, cache
        self._tokens: list[int] = []  # the tokens whose target features fill cache rows 0..n-1
        self._rows: list[torch.Tensor] = []  # [T_i, n_layers * H] features not injected yet
        self._row_tokens: list[int] = []

    @property
    def tokens(self) -> list[int]:
        """Every token the context holds or will hold once the waiting rows are injected."""
        return self._tokens + self._row_tokens

    def add(self, features: torch.Tensor, tokens: list[int], *, now: bool) -> None:
        self._rows.append(features)
        self._row_tokens.extend(tokens)
        if now:
            self.flush()

    def flush(self) -> None:
        if self._rows:
            self.model.inject(torch.cat(self._rows), self.cache)
            self._tokens.extend(self._row_tokens)
            self._rows.clear()
            self._row_tokens.clear()

    def truncate(self, n: int) -> None:
        self.flush()
        self.cache.truncate(min(n, self.cache.n))
        del self._tokens[n:]


class Drafter:
    """A loaded DFlash drafter attached to one engine; `decoder()` makes the per-generation Decoder."""

    def __init__(self, model: DFlashDraftModel, options: DFlashOptions, path: Path):
        self.model, self.options, self.path = model, options, path
        cfg = model.cfg
        self.n_max = min(options.n_max or cfg.block_size - 1, cfg.block_size - 1)
        self.p_min = options.p_min
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # per kind of generation (under a grammar or not): the adaptive policy's backoff where the last one ended
        self.carry: dict[bool, int] = {}

    @property
    def capture(self) -> tuple[int, ...]:
        return tuple(self.model.cfg.target_layers)

    def state(self, session) -> _DraftState:
        st = self._states.get(session)
        if st is None:
            st = self._states[session] = _DraftState(self.model, self.model.new_cache())
        return st

    def features(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        return torch.cat([hidden[i] for i in self.model.cfg.target_layers], dim=-1)  # [T, n_layers * H_target]

    def decoder(self, engine, session, sampler: Sampler, stops: frozenset[int] = frozenset()) -> DFlashDecoder:
        return DFlashDecoder(self, engine, session, sampler, stops)


class DFlashDecoder:
    """The Decoder protocol of generate.py with DFlash steps."""

    def __init__(self, drafter: Drafter, engine, session, sampler: Sampler, stops: frozenset[int] = frozenset()):
        self.drafter, self.engine, self.session, self.sampler = drafter, engine, session, sampler
        self.stops = stops  # end-of-generation tokens: a proposed draft ends with the first one (nothing follows it)
        self.model = engine.model
        self.state = drafter.state(session)
        self.logits: torch.Tensor | None = None  # the target's next-token logits after prefill
        self.anchor_logits: torch.Tensor | None = None  # [vocab] the target's row that gave the pending token
        self.pending: int | None = None  # committed, not yet in either cache
        self.n_prompt = 0
        self.log: list[tuple[list[int], int]] = []  # per step: (drafted tokens, accepted count)
        self.draft_s = self.verify_s = 0.0
        self.committed = 0
        self.policy = AdaptiveDraft(drafter.n_max) if drafter.options.adaptive else FixedDraft(drafter.n_max)
        self.kind = sampler.constraint is not None  # spoken replies decode under the words grammar, tool turns not
        self.policy.resume(drafter.carry.get(self.kind, 0))

    # --- target passes with feature capture --------------------------------------------------------------------
    def _inject(self, hidden: dict[int, torch.Tensor], tokens: list[int], now: bool = True) -> None:
        self.state.add(self.drafter.features(hidden), tokens, now=now)

    # --- Decoder protocol ----------------------------------------------------------------------------------------
    def prefill(self, ids: list[int]) -> None:
        # reuse only the prefix both the target cache and the drafter context hold; a prompt both hold whole gets
        # its prefill's logits back, as a plain decoder's does (re-running its last token as a step rounds another
        # way: the same request twice gave DFlash and plain decoding different replies)
        both = common_prefix(self.session.tokens, self.state.tokens, ids)
        whole = both == len(ids) and self.engine.holds_logits(self.session, ids)
        keep = len(ids) if whole else min(both, max(len(ids) - 1, 0))
        self.state.truncate(keep)
        self.n_prompt = len(ids)
        self.logits = self.engine.prefill(self.session, ids, max_reuse=keep, capture=self.drafter.capture,
                                          on_chunk=self._inject)
        self.pending = None

    def step(self, recent: list[int]) -> list[int]:
        if self.pending is None:  # the first token comes from the prefill logits
            self.pending = self.sampler.sample(self.logits, recent)
            self.anchor_logits = self.logits
            return [self.pending]
        start = self.session.cache.n_past
        n = min(self.policy.next_n(), self.engine.n_ctx - start - 1)
        forced = n > 0 and self._forced()  # asked of the grammar once a step
        if n > 0 and self._target_unsure(forced):
            n = 0  # a plain step, as if backing off (the policy learns nothing from it)
        anchor = self.pending
        t0 = time.perf_counter()
        drafts = self._draft(anchor, n, forced) if n > 0 else []  # none: a plain step (the drafter context grows)
        t1 = time.perf_counter()
        # a last draft that ends the generation is verified by the row before it: as an input it would only give
        # the bonus token, and nothing follows a stop
        block = [anchor, *drafts[:-1]] if drafts and drafts[-1] in self.stops else [anchor, *drafts]
        out = self.model(torch.tensor(block, dtype=torch.long), self.session.cache, logits="all",
                         capture=self.drafter.capture)
        self.session.tokens.extend(block)
        new = self.verify(out.logits, drafts, recent)
        a = len(new) if new == drafts[: len(new)] else len(new) - 1  # accepted drafts (all of them: up to a stop)
        kept = min(len(new), len(block))  # block rows whose tokens are committed: the anchor and accepted drafts
        self.session.truncate(start + kept)  # drop the rejected drafts' KV (sliding layers included)
        self._inject({i: h[:kept] for i, h in out.hidden.items()}, block[:kept], now=False)
        self.verify_s += time.perf_counter() - t1
        self.draft_s += t1 - t0
        self.log.append((drafts, a))
        self.policy.update(n, len(drafts), a)
        self.policy.observe(n, time.perf_counter() - t0, len(new))
        self.drafter.carry[self.kind] = self.policy.carry()
        self.committed += len(new)
        self.pending = new[-1]
        self.anchor_logits = out.logits[len(new) - 1]  # the row that gave the pending token
        return new

    def _forced(self) -> bool:
        """A grammar forces the next token: then a draft gets it whatever the drafter says, so neither the drafter's
        confidence nor the target's may cut the draft. A grammar that forces nothing here (the words grammar every
        spoken reply decodes under) gates like no grammar: with the gates off there, talk the drafter could not
        foresee took whole 8-row verifies, 0.59x plain on held-out chat with the shipped drafter."""
        c = self.sampler.constraint
        return c is not None and c.forces_next()

    def _target_unsure(self, forced: bool) -> bool:
        """While probing: the target gave the anchor less than anchor_min. Where the target itself is unsure (free
        speech) its next tokens are hard to foresee and a probe rarely pays; the check is free (the logits are at
        hand), a probe is not. Never where a grammar forces the next token."""
        q = self.drafter.options.anchor_min
        if q <= 0 or forced or not self.policy.probing or self.anchor_logits is None:
            return False
        return float(torch.softmax(self.anchor_logits.float(), dim=-1).max()) < q

    def _draft(self, anchor: int, n: int, forced: bool) -> list[int]:
        model = self.drafter.model
        self.state.flush()  # the rows of the plain steps since the last draft
        mask = model.cfg.mask_token_id
        constraint = self.sampler.constraint
        gate = self.drafter.p_min > 0 and not forced
        if gate and self.policy.probing and n > 1:
            # recent steps accepted little: score slot 1 alone first, from a block of [anchor, MASK] (slot 1's
            # confidence with the other masks absent: it picked the same token on 76 of 77 bench steps) and the head's
            # held form unrefined (a confidence needs no exact ranking), so a draft the drafter is unsure of costs
            # ~4 ms of drafter and one head row (~4.5 ms) instead of a whole block (~7 ms) and n rows
            probe = model.draft_hidden([anchor, mask], self.state.cache)  # [1, H]
            if float(torch.softmax(model.draft_logits(probe), dim=-1).max()) < self.drafter.p_min:
                return []  # then this is a plain step
        hidden = model.draft_hidden([anchor] + [mask] * n, self.state.cache)  # [n, H]
        if not gate:
            return self._exact_drafts(hidden, constraint)
        # confidence-gated drafts are proposals only (verify is exact): the draft vocabulary's rows, or the whole head
        # in its held form without the exact refinement (4.6 vs 6.9 ms for 1 row on 2 cores), HEAD_ROWS at a time,
        # stopping at the first slot below p_min (the int4 head takes rows in fours: 1-4 rows 4.6-8 ms, 5-8 16 ms)
        rows = n if model.draft_ids is not None else HEAD_ROWS
        drafts: list[int] = []
        for lo in range(0, n, rows):
            p, cols = torch.softmax(model.draft_logits(hidden[lo:lo + rows]), dim=-1).max(dim=-1)
            sure = (p >= self.drafter.p_min).tolist()
            keep = sure.index(False) if False in sure else len(sure)
            drafts += model.token_ids(cols[:keep]).tolist()
            if keep < len(sure):
                break
        if constraint is not None:  # the prefix the grammar accepts, and what it forces after it
            drafts = constraint.repair_drafts(drafts)
        return self._end_at_stop(drafts)

    def _end_at_stop(self, drafts: list[int]) -> list[int]:
        """Drafts up to and with the first stop token: the generation ends there, so a verify row after it is spent
        for nothing (a 5-row verify costs ~2.6 one-row steps on 2 cores)."""
        end = next((i + 1 for i, t in enumerate(drafts) if t in self.stops), len(drafts))
        return drafts[:end]

    def _exact_drafts(self, hidden: torch.Tensor, constraint) -> list[int]:
        """Every slot's exact greedy token, as llama.cpp and the reference do over the whole head (the fixed policy's
        loop, which the tests compare with theirs); with a grammar, over the draft vocabulary, every slot kept and the
        tokens the grammar forces repaired in."""
        model = self.drafter.model
        if constraint is None:
            return model.output(hidden).argmax(-1).tolist()  # [n]
        drafts = model.token_ids(model.draft_logits(hidden, exact=True).argmax(-1)).tolist()
        return self._end_at_stop(constraint.repair_drafts(drafts))

    def verify(self, logits: torch.Tensor, drafts: list[int], recent: list[int]) -> list[int]:
        """Exact-match verification: the target's own sample at each row, accepting drafts while they agree.

        logits: [len(drafts) + 1, vocab] (or len(drafts) when the last draft is a stop), row i = the target's
        prediction after the anchor and drafts[:i].
        Returns the committed tokens: the accepted drafts followed by the target's token at the first disagreement
        (or the bonus token after the last draft); nothing after a committed stop token.
        """
        history = list(recent)
        out: list[int] = []
        for i in range(len(drafts) + 1):
            tok = self.sampler.sample(logits[i], history)  # the same distribution() a plain step would use
            out.append(tok)
            if i == len(drafts) or tok != drafts[i] or tok in self.stops:
                break
            history.append(tok)
        return out

    def rollback(self, n_keep_committed: int) -> None:
        """The outer loop stopped inside an accepted run: keep the prompt and the first n completion tokens."""
        n = min(self.session.cache.n_past, self.n_prompt + n_keep_committed)
        self.session.truncate(n)
        self.state.truncate(n)
        self.sampler.rollback_to(n_keep_committed)  # the grammar forgets the dropped tokens too

    def stats(self) -> dict:
        steps = len(self.log)
        drafted = sum(len(d) for d, _ in self.log)
        accepted = sum(a for _, a in self.log)
        hist = [0] * (self.drafter.n_max + 1)
        for _, a in self.log:
            hist[a] += 1
        return {
            "method": "dflash", "block_size": self.drafter.model.cfg.block_size, "n_max": self.drafter.n_max,
            "embedding_scale": self.drafter.model.embedding_scale,
            "target_passes": steps, "drafted": drafted, "accepted": accepted,
            "drafter_passes": sum(1 for d, _ in self.log if d) + self.policy.cut_passes,
            "adaptive": self.drafter.options.adaptive, "p_min": self.drafter.p_min,
            "anchor_min": self.drafter.options.anchor_min,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
            "tokens_per_pass": round(self.committed / steps, 4) if steps else 1.0,
            "accept_hist": hist,  # accept_hist[a] = steps that accepted a drafts
            "draft_s": round(self.draft_s, 4), "verify_s": round(self.verify_s, 4),
            "draft_ms_per_pass": round(1e3 * self.draft_s / steps, 3) if steps else 0.0,
            "verify_ms_per_pass": round(1e3 * self.verify_s / steps, 3) if steps else 0.0,
        }


def _embedding_scale(option, gguf_value: float | None, n_embd: int) -> float:
    if option == "gguf":
        return gguf_value if gguf_value is not None else 1.0
    if option == "none":
        return 1.0
    if option == "sqrt":
        return float(n_embd) ** 0.5
    return float(option)


def load_drafter(engine, path: str | Path, *, policy: str = "fast", **options) -> Drafter:
    """Load a `dflash` GGUF for the engine's target (borrowing its embeddings/head); checks compatibility."""
    opts = DFlashOptions(**options)
    path = Path(path)
    gf = GGUFFile(path)
    cfg = draft_config_from_gguf(gf)
    check_compatible(cfg, engine.model, engine.gguf, path.name)
    scale = _embedding_scale(opts.embedding_scale, cfg.embedding_scale, cfg.n_embd)
    w = WeightStore(gf, policy, device=engine.model.out_norm.device)  # where the target lives
    return Drafter(DFlashDraftModel(cfg, w, engine.model, scale, use_draft_vocab=opts.draft_vocab), opts, path)


def attach_drafter(engine, path: str | Path, *, policy: str = "fast", **options) -> Drafter:
    """Engine.load(..., draft=path) calls this: the engine then decodes with DFlash unless use_draft=False."""
    engine.draft = load_drafter(engine, path, policy=policy, **options)
    return engine.draft
