"""Which of a few fixed continuations the model prefers: exact probabilities over a closed set of options.

A classifier prompt ends where the answer goes; the options are short token sequences (labels). Greedy decoding
under a grammar that allows only the options would take the likeliest first token and follow it, so a family of
labels sharing a first token (`head_left`, `head_right`, ...) pools its mass there and wins against a label with
more mass of its own. Here each option's probability is the product of its tokens' conditional probabilities,
renormalized over the options (what decoding constrained to the options would give each), computed with one
forward pass for the prompt plus one per shared prefix that branches (a trie walk).
"""
from __future__ import annotations

import itertools
import math
import threading
from collections import defaultdict

import torch

# a branch with less mass than this is not expanded: its options share its mass evenly (none of them can win)
MIN_BRANCH_P = 1e-4


def option_probabilities(engine, session, prompt_ids: list[int], options: list[list[int]], *,
                         cancel: threading.Event | None = None) -> list[float] | None:
    """P(option | prompt) for each option (token ids), normalized over the options; None when cancelled.

    The options must be prefix-free (none is the start of another): a constrained decoder could not tell where such
    an option ends. The session keeps the prompt (prefix reuse for the next call) but none of the options' tokens."""
    if not options or any(not o for o in options):
        raise ValueError("options must be non-empty token sequences")
    check_prefix_free(options)
    logits = engine.next_logits(prompt_ids, session, use_draft=False, cancel=cancel)
    if logits is None:
        return None
    n_prompt = len(session.tokens)
    logp = [0.0] * len(options)
    try:
        _walk(engine, session, options, list(range(len(options))), 0, 0.0, logits, logp)
    finally:
        session.truncate(n_prompt)
    top = max(logp)
    p = [math.exp(x - top) for x in logp]
    z = sum(p)
    return [x / z for x in p]


def _walk(engine, session, options, members, depth, logp_prefix, logits, out) -> None:
    """Fill out[i] = log P(options[i]) for the options in `members`, which share their first `depth` tokens."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in members:
        groups[options[i][depth]].append(i)
    allowed = torch.tensor(list(groups), dtype=torch.long)
    # renormalized over the tokens that continue some option: the constrained decoder's own step
    lp_allowed = lp[allowed] - torch.logsumexp(lp[allowed], dim=0)
    for tok, lpt in zip(groups, lp_allowed.tolist()):
        ids, lpt = groups[tok], logp_prefix + lpt
        if len(ids) == 1 or math.exp(lpt) < MIN_BRANCH_P:
            # one option left: its other tokens are forced; or a branch too small to matter: shared evenly
            for i in ids:
                out[i] = lpt - math.log(len(ids))
            continue
        n = len(session.tokens)
        nxt = engine.forward(session, [tok])
        _walk(engine, session, options, ids, depth + 1, lpt, nxt, out)
        session.truncate(n)


def check_prefix_free(options: list[list[int]]) -> None:
    """ValueError when an option is the start of another (a constrained decoder could not tell where it ends)."""
    seqs = sorted(tuple(o) for o in options)
    for a, b in itertools.pairwise(seqs):
        if b[:len(a)] == a:
            raise ValueError(f"options are not prefix-free: {list(a)} starts {list(b)}")
