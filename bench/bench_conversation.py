"""Multi-turn conversations with the default brain, scored turn by turn (the main job as a person meets it).

    python bench/bench_conversation.py [--seeds 0 1 2] [--only NAME ...] [--set name=value ...] [--png F] [--json F]

Each scripted conversation (bench/conversation_scripts.yaml: greetings, questions with and without a checkable
answer, requests in many phrasings, follow-ups that need the earlier turn, feelings, small talk, thanks, captions
then questions about the scene) goes turn by turn through the `converse` action of the assistant on the simulated
robot, in one conversation (one conversation_id), with make run's config (config/assistant.yaml; `--set` overrides a
parameter, e.g. `--set max_history_messages=1`, to measure a lever), once per sampling seed. Captions go out on
perception/caption before the turn that follows them.

Each turn is scored by bench/conversation_scoring.py: the right call (or rightly none) and answer, and no claim of an
undone action, no tool/meta talk, no echo of the user, no reply repeated from an earlier turn. Latency: goal sent ->
the first spoken sentence or the first tool call (the robot visibly reacts), from the action's feedback. Talk turns
(no move expected, no call made) also get goal sent -> first sentence and -> the reply's end (the action's result):
p50/p90 over them in the totals, e.g. DFlash off and on, greedy, same seed:
    --seeds 0 --set backend.temperature=0 backend.draft_path=none   (then backend.draft_path=auto)
Prints a per-turn table and totals; --png saves a chart (per conversation: right turns and failures by kind).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import yaml
from action_msgs.msg import GoalStatus
from bolt_ros.action import Converse
from bolt_ros.msg import AssistantEvent, Caption
from conversation_scoring import score_turn
from graph_harness import Graph, product_config
from rclpy.action import ActionClient

from bolt_ros.assistant.tool_loop import ToolLoop
from bolt_ros.nodes import assistant_node

SCRIPTS = Path(__file__).with_name("conversation_scripts.yaml")
MOTION_TOOLS = ("play_animation", "look", "move_head")
TRACE: list[dict] = []  # per turn, in order: what the loop decided and held back (TracingLoop)


class TracingLoop(ToolLoop):
    """The node's own tool loop, recording why a turn ended as it did: the intent decision and every model sentence
    held back (a refusal, a parroted opening, the note read out) with the reason. The JSON's `trace` is what tells
    an at-a-loss line caused by a refusal from one caused by a copied memory note; the loop itself is not changed."""

    def run(self, *args, **kwargs):
        self._trace = {"held": []}
        res = super().run(*args, **kwargs)
        keep = ("intent", "intent_p", "at_a_loss", "stopped", "completion_tokens", "acceptance_length",
                "tokens_per_second")
        TRACE.append({**self._trace, **{k: res.stats[k] for k in keep if k in res.stats}})
        return res

    def _speak(self, sentence, res, *, model=True):
        n = len(res.spoken)
        ok = super()._speak(sentence, res, model=model)
        if model and len(res.spoken) == n and res.stopped:
            self._trace["held"].append([res.stopped, sentence])
        return ok


class Runner:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.client = ActionClient(graph.probe, Converse, graph.assistant.config.topics.converse)
        self.caption_pub = graph.probe.create_publisher(Caption, graph.assistant.config.topics.caption, 10)
        if not self.client.wait_for_server(timeout_sec=10.0):
            raise SystemExit("no converse action server")

    def caption(self, text: str) -> None:
        msg = Caption(text=text, source="bench")
        self.caption_pub.publish(msg)
        deadline = time.monotonic() + 5  # until the assistant's scene memory has it
        while not any(it.text == text for it in self.graph.assistant.scene.items):
            if time.monotonic() > deadline:
                raise SystemExit("caption never arrived")
            time.sleep(0.01)

    def turn(self, utterance: str, cid: str) -> dict:
        first: list[float] = []
        sentence: list[float] = []
        done = threading.Event()

        def feedback(fb) -> None:
            now = time.perf_counter()
            if fb.feedback.event.type in (AssistantEvent.SENTENCE, AssistantEvent.TOOL_CALL) and not first:
                first.append(now)
            if fb.feedback.event.type == AssistantEvent.SENTENCE and not sentence:
                sentence.append(now)

        t0 = time.perf_counter()
        fut = self.client.send_goal_async(Converse.Goal(utterance=utterance, conversation_id=cid),
                                          feedback_callback=feedback)
        fut.add_done_callback(lambda _f: done.set())
        if not done.wait(30):
            raise SystemExit("goal not accepted")
        handle = fut.result()
        res_fut = handle.get_result_async()
        res_done = threading.Event()
        res_fut.add_done_callback(lambda _f: res_done.set())
        if not res_done.wait(180):
            raise SystemExit(f"no reply to {utterance!r}")
        res = res_fut.result()
        if res.status != GoalStatus.STATUS_SUCCEEDED:
            raise SystemExit(f"turn failed: {res.result.error}")
        r = res.result
        registry = self.graph.assistant.registry
        calls = [registry.resolution(c.name, json.loads(c.arguments or "{}")) for c in r.tool_calls]
        moved = any(c is not None and c[0] in MOTION_TOOLS and tr.ok for c, tr in zip(calls, r.tool_results))
        return {"reply": r.text, "calls": calls, "raw_calls": [(c.name, c.arguments) for c in r.tool_calls],
                "moved": moved, "react_s": (first[0] - t0) if first else None,
                "sentence_s": (sentence[0] - t0) if sentence else None, "turn_s": time.perf_counter() - t0}


def run_seed(seed: int, scripts: list[dict], overrides: dict, words_after_motion: bool = False) -> list[dict]:
    cfg = product_config(**{"backend.seed": seed, **overrides})
    if words_after_motion:  # the lever off: every call is followed by a words round over its result
        cfg.tools = [t.model_copy(update={"say": []}) for t in cfg.tools]
    graph = Graph(cfg, domain_id=int(os.environ["ROS_DOMAIN_ID"]))
    rows = []
    try:
        graph.wait_connected(("play_animation", "look"))
        deadline = time.monotonic() + 30
        while not graph.assistant.registry.tools["play_animation"].enum_values:  # the animation names
            if time.monotonic() > deadline:
                raise SystemExit("no animation names from the robot")
            time.sleep(0.05)
        runner = Runner(graph)
        runner.turn("Hello.", f"warm-up-{seed}")  # unscored: the first goal pays discovery of the feedback topic
        for conv in scripts:
            cid, replies = f"{conv['name']}-{seed}", []
            for i, turn in enumerate(conv["turns"]):
                if "caption" in turn:
                    runner.caption(turn["caption"])
                    continue
                n_trace = len(TRACE)
                out = runner.turn(turn["say"], cid)
                out["trace"] = TRACE[n_trace] if len(TRACE) > n_trace else {}
                s = score_turn(turn, out["reply"], out["calls"], out["moved"], replies)
                replies.append(out["reply"])
                rows.append({"seed": seed, "conversation": conv["name"], "turn": i, "say": turn["say"], **out,
                             "right": s.right, "call_ok": s.call_ok, "answer_ok": s.answer_ok, "claim": s.claim,
                             "meta": s.meta, "echo": s.echo, "repeat": s.repeat, "refusal": s.refusal,
                             "request": turn.get("expect") not in (None, "none")})
                print(_row(rows[-1]), flush=True)
    finally:
        graph.close()
    return rows


def _row(r: dict) -> str:
    flags = [k for k in ("claim", "meta", "echo", "repeat", "refusal") if r.get(k)]
    if not r["call_ok"]:
        flags.insert(0, "CALL")
    if not r["answer_ok"]:
        flags.insert(0, "ANSWER")
    calls = ",".join(f"{c[0]}({','.join(f'{v}' for v in c[1].values())})" if c else "REFUSED" for c in r["calls"])
    react = f"{r['react_s']:.2f}" if r["react_s"] is not None else "-"
    return (f"s{r['seed']} {r['conversation'][:12]:<12} {r['turn']:>2} {'ok ' if r['right'] else 'BAD'} "
            f"{react:>5}s {r['say'][:34]:<34} | {calls[:28]:<28} | {r['reply'][:70]!r} {' '.join(flags)}"
            + "".join(f"\n      held ({why}): {said!r}" for why, said in r.get("trace", {}).get("held", [])))


def _pct(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank below) of values, None if there are none."""
    v = sorted(values)
    return v[int(q * (len(v) - 1))] if v else None


def talk_times(rows: list[dict]) -> dict:
    """Talk turns (no move expected, no call made): goal -> first sentence and -> the reply's end, p50 and p90."""
    talk = [r for r in rows if not r["request"] and not r["calls"]]
    first = [r["sentence_s"] for r in talk if r.get("sentence_s") is not None]
    end = [r["turn_s"] for r in talk]
    return {"talk_turns": len(talk), "talk_first_sentence_p50_s": _pct(first, 0.5),
            "talk_first_sentence_p90_s": _pct(first, 0.9), "talk_end_p50_s": _pct(end, 0.5),
            "talk_end_p90_s": _pct(end, 0.9),
            "talk_completion_tokens": sum(r.get("trace", {}).get("completion_tokens", 0) for r in talk)}


def totals(rows: list[dict]) -> dict:
    reqs = [r for r in rows if r["request"]]
    reacts = [r["react_s"] for r in rows if r["react_s"] is not None]
    req_reacts = [r["react_s"] for r in reqs if r["react_s"] is not None]
    return {"turns": len(rows), "right": sum(r["right"] for r in rows),
            "requests": len(reqs), "requests_called_right": sum(r["call_ok"] for r in reqs),
            "no_call_turns_right": sum(r["call_ok"] for r in rows if not r["request"]),
            "answers_wrong": sum(not r["answer_ok"] for r in rows),
            **{k: sum(r.get(k, False) for r in rows) for k in ("claim", "meta", "echo", "repeat", "refusal")},
            "median_react_s": statistics.median(reacts) if reacts else None,
            "median_request_react_s": statistics.median(req_reacts) if req_reacts else None,
            "p90_react_s": sorted(reacts)[int(0.9 * (len(reacts) - 1))] if reacts else None,
            "no_reaction_turns": sum(r["react_s"] is None for r in rows), **talk_times(rows)}


def chart(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["conversation"] for r in rows))
    kinds = [("right", "tab:green"), ("wrong call", "tab:red"), ("wrong answer", "tab:orange"),
             ("claim", "tab:purple"), ("meta", "tab:brown"), ("echo", "tab:pink"), ("repeat", "tab:gray"),
             ("refusal", "tab:olive")]
    key = {"right": lambda r: r["right"], "wrong call": lambda r: not r["call_ok"],
           "wrong answer": lambda r: not r["answer_ok"], "claim": lambda r: r["claim"], "meta": lambda r: r["meta"],
           "echo": lambda r: r["echo"], "repeat": lambda r: r["repeat"], "refusal": lambda r: r.get("refusal", False)}
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [3, 1]})
    w = 0.8 / len(kinds)
    for k, (kind, color) in enumerate(kinds):
        vals = [sum(key[kind](r) for r in rows if r["conversation"] == n) for n in names]
        ax.bar([i + (k - len(kinds) / 2) * w + w / 2 for i in range(len(names))], vals, w, label=kind, color=color)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("turns (all seeds)")
    ax.legend(fontsize=7, ncol=4)
    reacts = sorted(r["react_s"] for r in rows if r["react_s"] is not None)
    ax2.hist(reacts, bins=20, color="tab:blue")
    ax2.set_xlabel("request -> first sentence or tool call (s)")
    ax2.set_title(f"median {statistics.median(reacts):.2f} s" if reacts else "no reactions", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", nargs="+", help="conversation names to run")
    ap.add_argument("--scripts", type=Path, default=SCRIPTS,
                    help="the conversations (bench/conversation_scripts_heldout.yaml: never tuned on)")
    ap.add_argument("--set", nargs="+", default=[], metavar="NAME=VALUE", help="assistant parameter overrides")
    ap.add_argument("--words-after-motion", action="store_true",
                    help="no `say` lines: the model words every tool result (the design before them)")
    ap.add_argument("--png", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    os.environ["ROS_DOMAIN_ID"] = str(random.randint(100, 200))
    assistant_node.ToolLoop = TracingLoop  # the node builds its loop per turn from this name
    scripts = yaml.safe_load(args.scripts.read_text())["conversations"]
    if args.only:
        scripts = [c for c in scripts if c["name"] in args.only]
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = yaml.safe_load(value)
    rows = []
    for seed in args.seeds:
        rows += run_seed(seed, scripts, overrides, args.words_after_motion)
    t = totals(rows)
    print(f"\n{t['right']}/{t['turns']} turns right ({100 * t['right'] / t['turns']:.1f} %), "
          f"requests called right {t['requests_called_right']}/{t['requests']}, "
          f"no-call turns right {t['no_call_turns_right']}/{t['turns'] - t['requests']}, "
          f"wrong answers {t['answers_wrong']}, claims {t['claim']}, meta {t['meta']}, echoes {t['echo']}, "
          f"repeats {t['repeat']}, refusals {t['refusal']}")
    print(f"request -> first sentence or call: median {t['median_react_s']:.2f} s (requests only "
          f"{t['median_request_react_s']:.2f} s), p90 {t['p90_react_s']:.2f} s, turns with neither: "
          f"{t['no_reaction_turns']}")
    if t["talk_turns"] and t["talk_first_sentence_p50_s"] is not None:
        print(f"talk turns ({t['talk_turns']}): first sentence p50 {t['talk_first_sentence_p50_s']:.2f} s, p90 "
              f"{t['talk_first_sentence_p90_s']:.2f} s; end p50 {t['talk_end_p50_s']:.2f} s, p90 "
              f"{t['talk_end_p90_s']:.2f} s ({t['talk_completion_tokens']} reply tokens)")
    if args.json:
        args.json.write_text(json.dumps({"overrides": overrides, "seeds": args.seeds, "totals": t, "rows": rows},
                                        indent=1))
    if args.png:
        label = ", ".join([f"{k}={v}" for k, v in overrides.items()]
                          + (["words after motion"] if args.words_after_motion else [])) or "make run's config"
        chart(rows, args.png, f"bench_conversation: {t['right']}/{t['turns']} turns right ({label}, seeds "
                              f"{args.seeds})")
        print(f"chart: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
