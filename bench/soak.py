"""Soak benchmark of the assistant graph: many turns in one process, watching memory, threads, goals and queues.

    python bench/soak.py [--turns 1000] [--real-turns 100] [--sample-every 1] [--png out.png] [--json out.json]

The graph is bench_graph's (graph_harness.Graph: robot + assistant on one SingleThreadedExecutor, a probe talking).
Phase 1 ("scripted", --turns): the scripted backend answers by the kind named in the utterance ("look#12"): chat;
  nod (play_animation); look (move_head in range); far (move_head out of range: the router must refuse it); list
  (list_animations); stream_barge (a new utterance while a long reply streams); goal_barge (a new utterance while a
  4 s animation runs: the barge-in cancels the goal). Every --flood-every turns, --flood-size captions go out on the
  perception caption topic between turns.
Phase 2 ("real", --real-turns, 0 skips it): short utterances to the default chat model (config/assistant.yaml's
  embedded backend) on --real-threads (2) torch threads; the same caption floods.
Sampled every --sample-every turns: RSS, glibc malloc's bytes in use and kept free, threads (Python's, and the OS's:
DDS threads are not Python's), live goals (animation and motion server goals not in a terminal state), the goal
handles the servers keep, the router's running goals, what its rclpy clients hold for requests in flight (futures,
pending requests, feedback callbacks: 0 between turns unless something leaks), queues, scene memory, history.
Overhead of each turn the worker ran = utterance_to_request (transcript callback -> engine request: job.t_received ->
res.t_request, the node's own stamps, as bench_graph reads them) + bookkeeping (tool loop ended -> the worker is done
with the turn: idle event, history commit, log lines).
Warm-up = the first 10% of a phase's turns. RSS growth = mean RSS of the last 10% of the turns / mean RSS of the
first 10% after warm-up - 1, in %: window means rather than a fitted slope, because allocator arenas grow in steps
that a line through 100 real turns turns into a noisy extrapolation.
Goals, per phase (exit status 1 when one fails): RSS growth <= 5 %; 0 live goals after the last turn and a drain of
up to 3 s; threads after the drain <= the first post-warm-up sample; no turn errors; every out-of-range move_head
refused. Timing is reported (p50/p99), not judged.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import sys
import threading
import time
from array import array
from collections import Counter, deque

from bolt_ros.msg import Caption
from graph_harness import Graph, percentiles, product_config

from bolt_ros.assistant.scripted import ScriptedBackend
from bolt_ros.nodes.animation_server import AnimationServer
from bolt_ros.nodes.motion_server import MotionServer

KINDS = ("chat", "nod", "look", "far", "list", "stream_barge", "goal_barge")
REAL_UTTERANCES = ("wave hello", "look left", "what do you see?", "nod please", "look right", "are you happy?",
                   "look up", "dance for me", "hello!", "what can you do?")
CAPTIONS = ("A person is in front of you, about 1 m away.", "A person is waving at you.", "Nobody is in view.",
            "A cup on the table, to the left.", "Two people, slightly to the right.")
GAUGES = ("live_goals", "kept_goals", "runner_goals", "anim_queue", "router_running", "client_pending", "jobs_queued",
          "scene_items", "history", "prompt_tokens")
THREADS = ("py_threads", "os_threads")
COLUMNS = ("turn", "t_s", "rss_mib", "heap_used_mib", "heap_free_mib", *THREADS, *GAUGES)
# what the router's clients hold per request or goal in flight (rclpy's own tables): all empty between turns
CLIENT_DICTS = ("_futures", "_pending_requests", "_pending_goal_requests", "_pending_result_requests",
                "_pending_cancel_requests", "_feedback_callbacks", "_goal_handles")
DRAIN_S = 3.0  # the last goals' ends: a cancelled goal stops at the robot's next control tick, so 3 s is ample
RSS_GOAL_PCT = 5.0

def rss_bytes() -> int:
    try:  # psutil where installed (accelerate brings it), else the kernel's count that psutil reads too
        import psutil
        return psutil.Process().memory_info().rss
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usm fsm uordblks fordblks kc".split()]


_LIBC = ctypes.CDLL(None)
_MALLINFO2 = getattr(_LIBC, "mallinfo2", None)  # glibc >= 2.33
if _MALLINFO2 is not None:
    _MALLINFO2.restype = _MallInfo2


def heap_mib() -> tuple[float, float]:
    """(in use, freed but kept) by glibc's malloc, MiB ((0, 0) elsewhere): RSS that steps up while 'in use' stays
    flat is the allocator keeping freed blocks (a high-water mark of temporaries), not live objects growing."""
    m = _MALLINFO2() if _MALLINFO2 is not None else None
    return ((m.uordblks + m.hblkhd) / 2**20, m.fordblks / 2**20) if m else (0.0, 0.0)


def os_threads() -> int:
    with open("/proc/self/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Threads:")))


class SoakScript:
    """The scripted model: the steps for the kind named in the latest user message ("far#12"); arguments are
    seeded by the tag, so a run is reproducible. `streaming` is set once a long reply has begun to stream."""

    def __init__(self):
        self.streaming = threading.Event()

    def __call__(self, messages: list[dict]):
        user = next(m["content"] for m in reversed(messages) if m["role"] == "user")
        kind, tag = re.search(r"([a-z_]+)#(\w+)", user).groups()  # captions carry no '#'
        if messages[-1]["role"] == "tool":
            return [{"text": "I cannot turn that far." if kind == "far" else "Done. Anything else?"}]
        r = random.Random(tag)
        call = {"nod": ("play_animation", {"name": "nod", "speed": 2.0}),
                "look": ("move_head", {"yaw": r.uniform(-60, 60), "pitch": r.uniform(-30, 30), "duration": 0.3}),
                "far": ("move_head", {"yaw": r.choice((-1, 1)) * r.uniform(61, 180), "pitch": 0}),
                "list": ("list_animations", {}),
                "goal_barge": ("play_animation", {"name": "look_around"})}.get(kind)
        if call is None:  # chat, or stream_barge's long reply
            return self._long_reply() if kind == "stream_barge" else [{"text": "Sure. I am listening."}]
        return [{"text": "Okay. "}, {"tool_call": {"name": call[0], "arguments": call[1]}}]

    def _long_reply(self):
        # a generator: ScriptedBackend takes the steps lazily, so this runs when the reply has started
        yield {"text": "Let me tell you a long story. "}
        self.streaming.set()
        yield {"text": "la " * 2000}


class TurnLog:
    """Wraps the assistant's _run_turn (an instance attribute: the worker looks it up on the instance), because
    the node stamps a turn's start (job.t_received, res.t_request) but not when the worker is done with it."""

    def __init__(self, assistant):
        self.to_request, self.bookkeeping = array("d"), array("d")  # ms, per turn the worker ran (compact)
        self.count = self.errors = self.cancelled = self.prompt_tokens = 0
        # (tool, ok) -> calls; what a barged-in call was waiting for -> calls; why turns ended ("" = the model ended)
        self.outcomes, self.barged_while, self.stopped = Counter(), Counter(), Counter()
        self.recent: deque = deque(maxlen=16)  # (seq, utterance, [(tool, ok, error)])
        self._cond = threading.Condition()
        run_turn = assistant._run_turn

        def timed(job):
            res = run_turn(job)
            t_end = time.perf_counter()
            if res.t_request:
                self.to_request.append((res.t_request - job.t_received) * 1e3)
            self.bookkeeping.append((t_end - job.t_received) * 1e3 - res.stats.get("total_ms", 0.0))
            calls = [(r.name, r.ok, r.error) for r in res.tool_results]
            with self._cond:
                self.count += 1
                self.errors += bool(res.error)
                self.cancelled += res.cancelled
                self.stopped["cancelled" if res.cancelled else res.stopped] += 1
                self.prompt_tokens = res.stats.get("prompt_tokens", 0)  # of the latest turn, summed over its calls
                self.outcomes.update((name, ok) for name, ok, _ in calls)
                self.barged_while.update(re.sub(r"^interrupted by the user (while waiting for )?| of \S+$", "", e)
                                         for _, ok, e in calls if e.startswith("interrupted by the user"))
                self.recent.append((self.count, job.utterance, calls))
                self._cond.notify_all()
            return res
        assistant._run_turn = timed

    def wait(self, utterance: str, after: int, timeout: float) -> list:
        """The tool outcomes of the turn of `utterance` that the worker finished after turn number `after`."""
        with self._cond:
            hit = self._cond.wait_for(lambda: next((r for r in self.recent if r[0] > after and r[1] == utterance),
                                                   None), timeout)
        if hit is None:
            raise SystemExit(f"the turn {utterance!r} did not finish within {timeout:.0f} s")
        return hit[2]


def goal_handles(node) -> list:
    return list(node._server._goal_handles.values())  # one C-level copy: safe while the executor adds goals


class Soak:
    def __init__(self, graph: Graph, name: str, turn_timeout: float):
        self.graph, self.name, self.turn_timeout = graph, name, turn_timeout
        self.assistant = graph.assistant
        self.servers = [n for n in graph.robot_nodes if isinstance(n, AnimationServer | MotionServer)]
        self.anim = next(n for n in self.servers if isinstance(n, AnimationServer))
        self.log = TurnLog(self.assistant)
        self.captions = graph.probe.create_publisher(Caption, self.assistant.config.topics.caption, 100)
        self.samples = {c: array("d") for c in COLUMNS}
        self.counts: Counter = Counter()
        self.t0 = time.perf_counter()

    def live_goals(self, server=None) -> int:
        return sum(h.is_active for s in ([server] if server else self.servers) for h in goal_handles(s))

    def say_and_wait(self, text: str) -> list:
        after = self.log.count
        self.graph.say(text)
        return self.log.wait(text, after, self.turn_timeout)

    def flood(self, n: int, i: int) -> None:
        for k in range(n):
            self.captions.publish(Caption(source="soak", text=f"{CAPTIONS[k % len(CAPTIONS)]} (frame {i}.{k})",
                                          confidence=-1.0))
        self.counts["captions"] += n

    def wait_until(self, cond, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def scripted_turn(self, i: int, kind: str, script: SoakScript) -> None:
        self.counts[kind] += 1
        if kind == "stream_barge":
            script.streaming.clear()
            self.graph.say(f"stream_barge#{i}")
            if not script.streaming.wait(self.turn_timeout):
                raise SystemExit(f"turn {i}: the long reply did not start")
            self.say_and_wait(f"chat#{i}b")
        elif kind == "goal_barge":
            # every other one as soon as the robot runs the goal, often before the router saw it accepted (it then
            # cancels the goal by id); the others once the router tracks it (the barge-in cancels it)
            early = self.counts[kind] % 2
            before = {bytes(h.goal_id.uuid) for h in goal_handles(self.anim)}  # a cancelled one may still be live
            self.graph.say(f"goal_barge#{i}")
            if not self.wait_until(lambda: any(h.is_active and bytes(h.goal_id.uuid) not in before
                                               for h in goal_handles(self.anim))
                                   and (early or self.assistant.router.running_goals()), self.turn_timeout):
                raise SystemExit(f"turn {i}: the animation goal did not start")
            self.say_and_wait(f"chat#{i}b")
        else:
            calls = self.say_and_wait(f"{kind}#{i}")
            if kind == "far":
                heads = [ok for name, ok, _ in calls if name == "move_head"]
                self.counts["far_refused"] += bool(heads) and not any(heads)

    def sample(self, turn: int) -> None:
        a, router = self.assistant, self.assistant.router
        clients = [*router._clients.values(), *router._enum_clients.values()]
        heap_used, heap_free = heap_mib()
        row = {"turn": turn, "t_s": time.perf_counter() - self.t0, "rss_mib": rss_bytes() / 2**20,
               "heap_used_mib": heap_used, "heap_free_mib": heap_free, "prompt_tokens": self.log.prompt_tokens,
               "py_threads": threading.active_count(), "os_threads": os_threads(), "live_goals": self.live_goals(),
               "kept_goals": sum(len(goal_handles(s)) for s in self.servers),
               "runner_goals": sum(len(s._runner._goals) for s in self.servers),
               "anim_queue": len(self.anim._queue), "router_running": router.running_goals(),
               "client_pending": sum(len(getattr(c, d, ())) for c in clients for d in CLIENT_DICTS),
               "jobs_queued": a._jobs.qsize() + len(a._pending), "scene_items": len(a.scene.items),
               "history": sum(len(c.history) for c in list(a._conversations.values()))}
        for c in COLUMNS:
            self.samples[c].append(float(row[c]))

    def run(self, turns: int, turn_fn, *, sample_every: int, flood_every: int, flood_size: int) -> dict:
        warmup = turns // 10
        jobs_at_warmup = 0
        for i in range(turns):
            if i == warmup:
                jobs_at_warmup = self.log.count
            if flood_every and i % flood_every == flood_every - 1:
                self.flood(flood_size, i)
            turn_fn(self, i)
            if i % sample_every == 0 or i == turns - 1:
                self.sample(i)
            if (i + 1) % max(1, turns // 10) == 0:
                s = self.samples
                print(f"{self.name}: turn {i + 1}/{turns}  rss {s['rss_mib'][-1]:.1f} MiB  threads "
                      f"{s['os_threads'][-1]:.0f}  live goals {s['live_goals'][-1]:.0f}", flush=True)
        self.wait_until(lambda: not self.live_goals() and not self.assistant.router.running_goals(), DRAIN_S)
        time.sleep(0.2)  # threads that end with the last goals (none expected) get to exit
        self.sample(turns)
        out = self.report(turns, warmup, jobs_at_warmup)
        _LIBC.malloc_trim(0)  # what of the last RSS is freed heap glibc kept (only now: trimming changes the process)
        out["rss_trimmed_end_mib"] = rss_bytes() / 2**20
        return out

    def report(self, turns: int, warmup: int, jobs_at_warmup: int) -> dict:
        s = {c: list(v) for c, v in self.samples.items()}
        post = [k for k, t in enumerate(s["turn"][:-1]) if t >= warmup]  # sample rows after warm-up (not the drain)
        w = max(1, len(post) // 10)
        mean = lambda col, rows: sum(s[col][k] for k in rows) / len(rows)  # noqa: E731
        first, last = mean("rss_mib", post[:w]), mean("rss_mib", post[-w:])
        heap_first, heap_last = mean("heap_used_mib", post[:w]), mean("heap_used_mib", post[-w:])
        tr, bk = self.log.to_request[jobs_at_warmup:], self.log.bookkeeping[jobs_at_warmup:]
        base = post[0]
        out = {"turns": turns, "warmup_turns": warmup, "duration_s": round(s["t_s"][-1], 1),
               "worker_turns": self.log.count, "rss_mib": {"first": s["rss_mib"][0], "post_warmup_mean": first,
                                                          "last_mean": last, "max": max(s["rss_mib"])},
               "rss_growth_pct": 100 * (last / first - 1),
               "heap_used_mib": {"post_warmup_mean": heap_first, "last_mean": heap_last},
               "heap_used_growth_pct": 100 * (heap_last / heap_first - 1) if heap_first else None,
               **{k: {"post_warmup": s[k][base], "end": s[k][-1], "max": max(s[k])} for k in THREADS},
               "live_goals_end": s["live_goals"][-1], "router_running_end": s["router_running"][-1],
               "client_pending_end": s["client_pending"][-1],
               "max": {c: max(s[c]) for c in GAUGES},
               "overhead_ms": {"utterance_to_request": percentiles(tr), "bookkeeping": percentiles(bk),
                               "turn": percentiles([a + b for a, b in zip(tr, bk)])},
               "turn_errors": self.log.errors, "cancelled_turns": self.log.cancelled,
               "tool_outcomes": {f"{n}:{'ok' if ok else 'failed'}": k for (n, ok), k in self.log.outcomes.items()},
               "barged_while": dict(self.log.barged_while), "stopped": dict(self.log.stopped),
               "counts": dict(self.counts), "samples": s}
        far = self.counts.get("far", 0)
        out["checks"] = {"rss_growth": out["rss_growth_pct"] <= RSS_GOAL_PCT,
                         "no_live_goals": out["live_goals_end"] == 0 and out["router_running_end"] == 0,
                         "threads_back": all(out[k]["end"] <= out[k]["post_warmup"] for k in THREADS),
                         "no_turn_errors": self.log.errors == 0,
                         "out_of_range_refused": self.counts.get("far_refused", 0) == far}
        return out


def run_phase(name: str, turns: int, args, domain_id: int) -> dict:
    if name == "scripted":
        script = SoakScript()
        # a short request log: the backend keeps its last max_log requests for test assertions, and the default
        # 1000 (~2 per turn, each a copy of the prompt) fill up over the first 500 turns, which reads as growth
        backend = ScriptedBackend(script, token_delay_s=0.001, max_log=16)
        graph = Graph(product_config(**{"backend.kind": "scripted"}), backend, domain_id=domain_id)
        order = [k for _ in range(turns // len(KINDS) + 1) for k in random.Random(args.seed).sample(KINDS, len(KINDS))]
        turn_fn = lambda soak, i: soak.scripted_turn(i, order[i], script)  # noqa: E731
        timeout = 10.0
    else:
        import torch  # the engine's threads; the scripted phase never loads torch
        torch.set_num_threads(args.real_threads)
        graph = Graph(product_config(), None, domain_id=domain_id)  # the backend config/assistant.yaml names
        turn_fn = lambda soak, i: soak.say_and_wait(REAL_UTTERANCES[i % len(REAL_UTTERANCES)])  # noqa: E731
        timeout = 180.0
    try:
        graph.wait_connected(("play_animation", "move_head"))
        # the animation tools are offered once the robot's ListAnimations answered (the node's enum thread)
        soak = Soak(graph, name, timeout)
        if not soak.wait_until(lambda: graph.assistant.registry.tools["play_animation"].enum_values, 30):
            raise SystemExit("the animation names never arrived")
        return soak.run(turns, turn_fn, sample_every=args.sample_every, flood_every=args.flood_every,
                        flood_size=args.flood_size)
    finally:
        graph.close()


def plot(phases: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # no display; a file only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(phases), 1, figsize=(10, 3.6 * len(phases)), squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], phases.items()):
        s = r["samples"]
        ax.axvspan(0, r["warmup_turns"], color="0.9", label="warm-up")
        ax.plot(s["turn"], s["rss_mib"], color="tab:blue", label="RSS")
        if any(s["heap_used_mib"]):
            ax.plot(s["turn"], s["heap_used_mib"], color="tab:blue", ls="--", lw=1, label="malloc in use")
        ax.set(title=f"{name}: {r['turns']} turns, RSS growth {r['rss_growth_pct']:+.2f} % after warm-up",
               xlabel="turn", ylabel="RSS (MiB)")
        ax2 = ax.twinx()
        ax2.step(s["turn"], s["os_threads"], color="tab:orange", where="post", label="threads (OS)")
        ax2.set_ylabel("threads")
        ax2.set_ylim(0, max(s["os_threads"]) * 1.3)
        lines = ax.get_legend_handles_labels(), ax2.get_legend_handles_labels()
        ax.legend(lines[0][0] + lines[1][0], lines[0][1] + lines[1][1], loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(phases: dict) -> str:
    rows = [f"{'phase':<10}{'turns':>7}{'RSS MiB':>9}{'growth %':>10}{'threads':>10}{'live goals':>11}"
            f"{'p50 ms':>8}{'p99 ms':>8}  checks"]
    for name, r in phases.items():
        o = r["overhead_ms"]["turn"]
        failed = [k for k, ok in r["checks"].items() if not ok]
        verdict = "ok" if not failed else "FAILED: " + ", ".join(failed)
        rows.append(f"{name:<10}{r['turns']:>7}{r['rss_mib']['last_mean']:>9.1f}{r['rss_growth_pct']:>+10.2f}"
                    f"{r['os_threads']['post_warmup']:>5.0f}->{r['os_threads']['end']:<3.0f}"
                    f"{r['live_goals_end']:>11.0f}{o.get('p50', 0):>8.2f}{o.get('p99', 0):>8.2f}  {verdict}")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=1000, help="scripted turns (0: skip)")
    ap.add_argument("--real-turns", type=int, default=100, help="turns on the default chat model (0: skip)")
    ap.add_argument("--real-threads", type=int, default=2, help="torch threads of the real phase")
    ap.add_argument("--sample-every", type=int, default=1)
    ap.add_argument("--flood-every", type=int, default=10, help="a caption flood before every n-th turn (0: none)")
    ap.add_argument("--flood-size", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--domain-id", type=int, help="ROS domain (default: a random one of 100-200, a private graph)")
    ap.add_argument("--png")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if any(0 < n < 10 for n in (args.turns, args.real_turns)) or not (args.turns or args.real_turns):
        ap.error("a phase needs at least 10 turns (10 % of them are the warm-up); --turns 0 skips the scripted one")
    domain_id = args.domain_id if args.domain_id is not None else random.randint(100, 200)
    phases = {}
    for name, turns in (("scripted", args.turns), ("real", args.real_turns)):
        if turns:
            phases[name] = run_phase(name, turns, args, domain_id)
    ok = all(all(r["checks"].values()) for r in phases.values())
    print(table(phases))
    if args.png:
        plot(phases, args.png)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rss_goal_pct": RSS_GOAL_PCT, "ok": ok, "phases": phases}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
