"""The spoken replies' model alone: the default 0.5B against a larger sibling (issue 34, item 4), on talk turns.

    python bench/bench_words_model.py [--words same qwen2.5-coder-1.5b] [--seeds 0] [--json F]

Each talk turn of the conversation scripts that a model answers in words goes to make run's backend as one fresh
turn (system prompt + the person's words; no memory, no tools shown: what `words_only` sends when the intent
classifier has chosen talk), through `EmbeddedBackend.from_config` with `backend.words_model_path` set (the 0.5B
still loaded as the deciding engine, as in make run). The turns: questions with a checkable answer that is not in
the conversation's earlier words or captions (facts: a spider's legs, days in a week, ...), and the statements of
the third held-out set (mishaps, feelings, plans: where the 0.5B refused small talk). A question is drawn at
intent.question_temperature, a statement at the backend's temperature, as make run does. Scored with
bench/conversation_scoring.py: the answer right, a refusal, a claim of a motion. Time: request -> the first unit
the loop would send to TTS (SentenceSplitter with first_clause_words, as ToolLoop), and -> the reply's end (at
most two sentences). On a shared 2-core VM the times are upper bounds; the two models' ratio is what carries.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import yaml
from conversation_scoring import is_claim, is_refusal

from bolt_ros.assistant.backend import TextDelta
from bolt_ros.assistant.config import from_ros_parameters, load_params_file
from bolt_ros.assistant.embedded import EmbeddedBackend
from bolt_ros.assistant.mention import is_question
from bolt_ros.assistant.sentences import SentenceSplitter
from bolt_ros.graph import package_file

BENCH = Path(__file__).parent
SETS = ["conversation_scripts.yaml", "conversation_scripts_heldout.yaml", "conversation_scripts_heldout2.yaml",
        "conversation_scripts_heldout3.yaml"]


def talk_turns() -> list[dict]:
    """Facts asked (their answer not given earlier in the conversation) and held out 3's statements."""
    out = []
    for name in SETS:
        for conv in yaml.safe_load((BENCH / name).read_text())["conversations"]:
            earlier = []
            for t in conv["turns"]:
                if "caption" in t:
                    earlier.append(t["caption"])
                    continue
                said, expect = t["say"], t.get("expect")
                no_move = expect in (None, "none") or (isinstance(expect, list) and "none" in expect)
                given = " ".join(earlier).lower()
                if t.get("answer") and no_move and not any(a.lower() in given for a in t["answer"]):
                    out.append({"set": name, "say": said, "answer": t["answer"], "kind": "fact"})
                elif name.endswith("heldout3.yaml") and no_move and not is_question(said):
                    out.append({"set": name, "say": said, "answer": None, "kind": "statement"})
                earlier.append(said)
    return out


def one_turn(backend: EmbeddedBackend, system: str, said: str, temperature: float | None, first_clause: int) -> dict:
    splitter, units, text = SentenceSplitter(first_clause=first_clause), [], []
    t0 = time.perf_counter()
    first = None
    stream = backend.stream_chat([{"role": "system", "content": system}, {"role": "user", "content": said}], [],
                                 enable_thinking=False, cancel=threading.Event(), words_only=True,
                                 **({"temperature": temperature} if temperature is not None else {}))
    try:
        for ev in stream:
            if isinstance(ev, TextDelta) and ev.text:
                text.append(ev.text)
                got = splitter.push(ev.text)
                if got and first is None:
                    first = time.perf_counter() - t0
                units += got
                if sum(u.rstrip()[-1:] in ".!?" for u in units) >= 2:
                    break
    finally:
        stream.close()
    units += splitter.flush()
    end = time.perf_counter() - t0
    return {"reply": " ".join(u.strip() for u in units) or "".join(text).strip(),
            "first_s": first if first is not None else end, "end_s": end}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--words", nargs="+", default=["same", "qwen2.5-coder-1.5b"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--limit", type=int, default=0, help="first N turns only (0: all)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    cfg = from_ros_parameters(load_params_file(package_file("config/assistant.yaml"), "assistant_node"))
    turns = talk_turns()[:args.limit or None]
    rows, summary = [], {}
    for words in args.words:
        for seed in args.seeds:
            bcfg = cfg.backend.model_copy(update={"words_model_path": words, "seed": seed, "draft_path": "none"})
            t_load = time.perf_counter()
            backend = EmbeddedBackend.from_config(bcfg)
            load_s = time.perf_counter() - t_load
            print(f"== words {words} seed {seed}: {backend.label} (loaded in {load_s:.1f} s)", flush=True)
            one_turn(backend, cfg.system_prompt, "Hello!", None, cfg.first_clause_words)  # a warm start
            for t in turns:
                temp = cfg.intent.question_temperature if is_question(t["say"]) else None
                r = one_turn(backend, cfg.system_prompt, t["say"], temp, cfg.first_clause_words)
                ok = None if t["answer"] is None else any(a.lower() in r["reply"].lower() for a in t["answer"])
                row = {**t, **r, "words": words, "seed": seed, "answer_ok": ok, "refusal": is_refusal(r["reply"]),
                       "claim": is_claim(r["reply"])}
                rows.append(row)
                mark = {True: "ok ", False: "BAD", None: "   "}[ok]
                print(f"{mark} {r['first_s']:5.2f}s {r['end_s']:5.2f}s {t['say'][:44]:44} | {r['reply'][:90]}",
                      flush=True)
            del backend
    for words in args.words:
        mine = [r for r in rows if r["words"] == words]
        facts = [r for r in mine if r["kind"] == "fact"]
        firsts = sorted(r["first_s"] for r in mine)
        summary[words] = {
            "turns": len(mine), "facts_right": sum(r["answer_ok"] for r in facts), "facts": len(facts),
            "refusals": sum(r["refusal"] for r in mine), "claims": sum(r["claim"] for r in mine),
            "first_unit_p50_s": statistics.median(firsts), "first_unit_p90_s": firsts[int(0.9 * (len(firsts) - 1))],
            "reply_end_p50_s": statistics.median(r["end_s"] for r in mine),
            "wrong_facts": sorted({f"{r['say']} -> {r['reply']}" for r in facts if not r["answer_ok"]}),
            "refused": sorted({f"{r['say']} -> {r['reply']}" for r in mine if r["refusal"]}),
        }
        print(json.dumps({words: summary[words]}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({"seeds": args.seeds, "summary": summary, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
