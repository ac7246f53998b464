"""DFlash on CPU: tokens per target pass and wall-clock decode speed vs plain decoding in the same run, and the greedy
losslessness check, over a prompt set.

    python bench/bench_dflash.py [--target default-chat] [--draft D.gguf] [--prompts assistant|chat|text]
                                 [--tokens 64] [--threads N] [--n-max 7] [--fixed] [--repeats 3] [--json]

--prompts assistant (the default): the held-out utterances of bolt_ros/train/prompts.py (none used in training),
rendered as the assistant renders them (system prompt, tools). --prompts chat: its held-out general-chat turns
(HELD_OUT_CHAT), rendered as the words turn the chat model gets with the intent classifier on (system prompt, no
tools, the memory note of earlier turns where they have some) and decoded under the words grammar, as there
(--no-grammar: without it; the DFlash decoder's confidence gates and cheap probes are off under a grammar).
--prompts text: one plain text continuation.
Without --draft a random drafter (the test-model writer) is written for the target first: that measures the cost
side (a random drafter is accepted almost never). --fixed turns the adaptive policy off (whole blocks every step).
--repeats N (3) runs each prompt at least N times on both sides, in turn, and until each side has decoded for
--min-seconds (2.0), and sums the times.
Reported: committed tokens per target pass and decode tok/s of both runs summed over the set, the slowest prompt's
speed ratio, and per-prompt figures. Exit 1 if any greedy output differs from plain decoding.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import SamplingParams
from bolt_ros.engine.default_models import resolve_model

TEXT_PROMPT = "The robot arm moved slowly toward the red cube on the table, and then"


def _prompts(engine: Engine, kind: str) -> list[tuple[str, list[int]]]:
    if kind == "text":
        return [(TEXT_PROMPT, engine.tok.encode(TEXT_PROMPT, add_bos=engine.tok.add_bos))]
    if kind == "chat":
        from bolt_ros.train.prompts import HELD_OUT_CHAT, words_prompt_ids

        return [(t.say, words_prompt_ids(engine, t)) for t in HELD_OUT_CHAT]
    from bolt_ros.train.prompts import HELD_OUT, assistant_prompt_ids

    return [(u, assistant_prompt_ids(engine, u)) for u in HELD_OUT]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="default-chat", help="target GGUF or a default-model name")
    ap.add_argument("--draft", help="drafter GGUF (default: write a random drafter for the target)")
    ap.add_argument("--layers", type=int, default=5, help="layers of the random drafter")
    ap.add_argument("--prompts", choices=["assistant", "chat", "text"], default="assistant")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--n-max", type=int, default=None, help="drafts per step (default block_size-1)")
    ap.add_argument("--p-min", type=float, default=None, help="drafter confidence cut (default: DFlashOptions')")
    ap.add_argument("--anchor-min", type=float, default=None, help="target confidence to probe at (default: "
                                                                     "DFlashOptions')")
    ap.add_argument("--no-grammar", action="store_true", help="--prompts chat: decode without the words grammar")
    ap.add_argument("--fixed", action="store_true", help="whole blocks every step (no adaptive drafting, no p_min)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3, help="plain/DFlash runs per prompt at least, in turn (times "
                                                           "summed)")
    ap.add_argument("--min-seconds", type=float, default=2.0, help="...and until each side decoded this long")
    ap.add_argument("--compile", action="store_true", help="small steps through torch.compile (both sides)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    target = resolve_model(args.target)
    tmp = tempfile.TemporaryDirectory()
    draft = str(resolve_model(args.draft)) if args.draft else None  # a path or a name (default-chat-dflash)
    if draft is None:
        from bolt_ros.devtools.testmodel import write_random_model

        draft = str(Path(tmp.name) / "random-drafter.gguf")
        t0 = time.perf_counter()
        write_random_model(draft, "dflash", target=target, layers=args.layers, seed=0)
        print(f"wrote a random {args.layers}-layer drafter in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    options = {"n_max": args.n_max} | ({"adaptive": False, "p_min": 0.0, "anchor_min": 0.0} if args.fixed else {})
    if args.p_min is not None:
        options["p_min"] = args.p_min
    if args.anchor_min is not None:
        options["anchor_min"] = args.anchor_min
    engine = Engine.load(target, draft=draft, n_ctx=4096, draft_options=options, compile_steps=args.compile)
    stops = sorted(set(engine.chat_format.stop_token_ids))
    params = SamplingParams(max_tokens=args.tokens, stop_token_ids=stops)
    prompts = _prompts(engine, args.prompts)
    grammar = None
    if args.prompts == "chat" and not args.no_grammar:  # the words grammar a words turn decodes under (both sides)
        from bolt_ros.train.prompts import words_grammar

        grammar = words_grammar(engine)
    engine.generate(prompts[0][1][:8], SamplingParams(max_tokens=2), use_draft=False)  # warm-up
    if args.compile:  # compile the step shapes outside the timed runs
        t0 = time.perf_counter()
        engine.warm_up(prompts[0][1])
        print(f"compiled in {time.perf_counter() - t0:.0f} s", file=sys.stderr)

    rows, equal = [], True
    sums = {"plain_s": 0.0, "spec_s": 0.0, "plain_tok": 0, "spec_tok": 0, "committed": 0, "passes": 0}
    for text, ids in prompts:
        # plain and DFlash in turn, at least `repeats` times and until each side has decoded for --min-seconds; a
        # prompt's times are summed over its runs on both sides. A reply of a few tokens decodes in ~150 ms, which
        # this VM's neighbours move by 10-40 % from one run to the next. One session per side: after the first run
        # the prompt's KV is reused (only its last token is prefilled again), so repeats cost decode time only.
        t = {"plain_s": 0.0, "spec_s": 0.0, "plain_tok": 0, "spec_tok": 0}
        same, runs = True, 0
        plain_session, spec_session = engine.new_session(), engine.new_session()
        while runs < args.repeats or min(t["plain_s"], t["spec_s"]) < args.min_seconds:
            plain = engine.generate(ids, params, use_draft=False, session=plain_session, grammar=grammar)
            spec = engine.generate(ids, params, session=spec_session, grammar=grammar)
            same &= plain.completion_ids == spec.completion_ids
            t["plain_s"] += plain.timings.decode_s
            t["spec_s"] += spec.timings.decode_s
            t["plain_tok"] += plain.timings.decode_tokens
            t["spec_tok"] += spec.timings.decode_tokens
            runs += 1
            if not plain.timings.decode_tokens:  # a one-token reply has no decode time to accumulate
                break
        equal &= same
        s = spec.spec
        for k, v in t.items():
            sums[k] += v
        sums["committed"] += len(spec.completion_ids) - 1  # the first token comes from the prefill
        sums["passes"] += s["target_passes"]
        plain_tok_s = t["plain_tok"] / t["plain_s"] if t["plain_s"] else 0.0
        spec_tok_s = t["spec_tok"] / t["spec_s"] if t["spec_s"] else 0.0
        ratio = spec_tok_s / plain_tok_s if plain_tok_s else None
        rows.append({"prompt": text, "reply": spec.text, "tokens": len(spec.completion_ids), "greedy_equal": same,
                     "runs": runs,
                     "tokens_per_pass": s["tokens_per_pass"], "speed_ratio": round(ratio, 3) if ratio else None,
                     "plain_tok_s": round(plain_tok_s, 2), "spec_tok_s": round(spec_tok_s, 2),
                     "drafter_passes": s["drafter_passes"],
                     "draft_ms_per_pass": s["draft_ms_per_pass"], "verify_ms_per_pass": s["verify_ms_per_pass"]})
    plain_rate = sums["plain_tok"] / sums["plain_s"] if sums["plain_s"] else 0.0
    spec_rate = sums["spec_tok"] / sums["spec_s"] if sums["spec_s"] else 0.0
    out = {"target": Path(target).name, "draft": Path(draft).name, "threads": torch.get_num_threads(),
           "prompts": len(prompts), "adaptive": not args.fixed, "grammar": grammar is not None, "greedy_equal": equal,
           "tokens_per_pass": round(sums["committed"] / sums["passes"], 3) if sums["passes"] else 1.0,
           "plain_decode_tok_s": round(plain_rate, 2), "spec_decode_tok_s": round(spec_rate, 2),
           "speedup": round(spec_rate / plain_rate, 3) if plain_rate else None,
           "slowest_prompt_ratio": min((r["speed_ratio"] for r in rows if r["speed_ratio"]), default=None),
           "per_prompt": rows}
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            if k != "per_prompt":
                print(f"{k:>22}: {v}")
        for r in rows:
            print(f"  {r['tokens_per_pass']:5.2f} tok/pass  x{r['speed_ratio']}  {r['runs']:2d} runs  "
                  f"{r['prompt'][:50]!r}"
                  f"{'' if r['greedy_equal'] else '  MISMATCH'}")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
