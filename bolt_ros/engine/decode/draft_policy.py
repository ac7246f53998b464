"""How many tokens a DFlash step drafts. Drafting costs a drafter pass and a wider verify pass; when the drafter is
not being accepted (a random or mismatched drafter, text unlike its training data) that cost buys nothing, so the
adaptive policy drafts what has recently been accepted plus a margin (an exponential average of accepted counts,
so one miss doesn't collapse a good drafter's blocks) and, after steps that accept nothing, skips drafting for a
backoff that doubles (1, 2, 4 .. MAX_BACKOFF steps) until a
probe is accepted again. Skipped steps are plain decoding inside the DFlash decoder: the drafter's context keeps
growing, so a probe drafts from the full history. Which tokens are committed never depends on the policy (every
committed token is the target's own sample), so it changes speed only.
"""
from __future__ import annotations

MAX_BACKOFF = 32  # plain steps between probes at most: a useless drafter then costs ~1/32 of a drafter pass per token
EMA = 0.3  # weight of the newest step in the average of accepted drafts
MARGIN = 2  # drafts beyond the average accepted count (room to grow back)
PROBING_BELOW = 1.0  # average accepted drafts under which a draft starts with its first slot alone
# plain steps after the drafter's first unsure probe at least: the next token's probe is seldom surer (bench_dflash's
# 8-token reply probed at steps 3 and 5 in vain before 1; 2 skips the second, ~8 ms of ~350)
CUT_BACKOFF = 2


class FixedDraft:
    """Always n_max drafts (the reference behaviour; tests compare it with z-lab's loop)."""

    def __init__(self, n_max: int):
        self.n_max = n_max
        self.cut_passes = 0  # drafter passes whose every slot fell below p_min

    def next_n(self) -> int:
        return self.n_max

    @property
    def probing(self) -> bool:
        """True while drafts are rarely accepted: the decoder then checks the drafter's confidence cheaply first."""
        return False

    def update(self, asked: int, drafted: int, accepted: int) -> None:
        self.cut_passes += asked > 0 and drafted == 0

    def observe(self, asked: int, seconds: float, committed: int) -> None:
        """The wall time of a step that committed `committed` tokens (asked = drafts requested, 0 = a plain step)."""

    def carry(self) -> int:
        """What the next generation of the same kind starts from (AdaptiveDraft's backoff; nothing here)."""
        return 0

    def resume(self, backoff: int) -> None:
        """Start from the last generation's carry (nothing to resume for whole blocks every step)."""


class AdaptiveDraft(FixedDraft):
    def __init__(self, n_max: int):
        super().__init__(n_max)
        self.avg = float(n_max)  # recent accepted drafts per drafting step
        self.accepted_any = False  # until a draft is accepted, a step probes (short replies pay little for a miss)
        self.misses = 0  # consecutive drafting steps that accepted nothing
        self.backoff = 0  # plain steps still to take
        self.next_backoff = 1
        self.cost: dict[bool, float | None] = {False: None, True: None}  # EMA seconds per committed token

    @property
    def n(self) -> int:
        return min(self.n_max, max(1, int(self.avg) + MARGIN))

    @property
    def probing(self) -> bool:
        return not self.accepted_any or self.avg < PROBING_BELOW

    def next_n(self) -> int:
        if self.backoff > 0:
            self.backoff -= 1
            return 0
        return self.n

    def update(self, asked: int, drafted: int, accepted: int) -> None:
        super().update(asked, drafted, accepted)
        if asked == 0:  # a backoff step: nothing learned
            return
        self.avg = (1 - EMA) * self.avg + EMA * accepted
        if drafted == 0:  # the drafter itself was unsure of its first slot (p_min): plain steps for a while
            self.next_backoff = max(self.next_backoff, CUT_BACKOFF)
            self._back_off()
            return
        if accepted > 0:
            self.accepted_any = True
            self.misses = 0
            if self.cost[False] is None:  # no plain-step timing yet: acceptance is all there is to go by
                self.next_backoff = 1
            return
        self.misses += 1
        if self.misses >= 2:  # two drafting steps in a row found nothing: plain steps for a while
            self._back_off()

    def observe(self, asked: int, seconds: float, committed: int) -> None:
        drafting = asked > 0
        per_token = seconds / max(1, committed)
        old = self.cost[drafting]
        self.cost[drafting] = per_token if old is None else (1 - EMA) * old + EMA * per_token
        plain, spec = self.cost[False], self.cost[True]
        if drafting and plain is not None and spec > plain and self.backoff == 0:
            self._back_off()  # drafting is slower here than plain steps: probe again later
        elif drafting and plain is not None and spec <= plain:
            self.next_backoff = 1

    def carry(self) -> int:
        """What the next generation of the same kind starts from (Drafter.carry): the backoff reached while nothing
        was accepted, else 0. Each generation used to start probing afresh: a reply of 6-37 tokens of talk the drafter
        cannot foresee paid 2-5 probes (~4 ms each) whatever the replies before it had shown."""
        return 0 if self.accepted_any and self.avg >= PROBING_BELOW else self.next_backoff

    def resume(self, backoff: int) -> None:
        """Start where the last generation of this kind left off: half its backoff in plain steps, then a probe."""
        if backoff > 1:
            self.next_backoff = min(MAX_BACKOFF, backoff)
            self.backoff = backoff // 2

    def _back_off(self) -> None:
        self.backoff, self.next_backoff = self.next_backoff, min(MAX_BACKOFF, 2 * self.next_backoff)
