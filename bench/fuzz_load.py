"""Hostile-file fuzz: mutated model files through Engine.load and a 3-token generation, in memory- and time-limited
worker processes. Every case must end "refused" (a GGUFError naming the file) or "ok" (a harmless mutation that
loads and generates); anything else is a bug: "crash" (another exception), "hang" (past --timeout), "oom" (an
allocation past the RLIMIT_AS limit) or "killed" (the worker died).

    python bench/fuzz_load.py --cases 10000 --seed 0 --json fuzz.json
    python bench/fuzz_load.py --replay gemma4:0:1234      # one case in this process, with its traceback

Measured 2026-12-01 (2-core AMD EPYC, shared): `--cases 10000 --seed 0 --workers 2` in 269 s (+10 s corpus build):
8562 refused, 1438 ok, 0 crash / hang / oom / killed / unnamed.

Corpora (bench/fuzz_corpus.py): tiny gemma4/gemma3/llama test models and a gemma4 DFlash drafter from our writer, the
real SmolLM2 header rewritten small, and that header with its tensor data cut off. Mutations: bench/fuzz_mutate.py.
Why workers that loop over cases: a fresh Python with torch costs ~2 s, a case ~0.1 s; a worker is restarted only
when it dies, hangs, runs out of memory, or has run --recycle cases.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import selectors
import subprocess
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fuzz_corpus
import fuzz_mutate

PROMPT = "Hello world"
GOOD = ("refused", "ok")


def case_plan(seed: int, n: int) -> list[tuple[str, int]]:
    """(corpus, case index) for n cases: the unmutated corpora first (negative controls), then a seeded mix."""
    rng = random.Random(f"plan:{seed}")
    names, weights = zip(*fuzz_corpus.WEIGHTS.items())
    plan = [(name, -1) for name in names][:n]
    plan += [(rng.choices(names, weights)[0], i) for i in range(len(plan), n)]
    return plan


def make_case(raws: dict, corpus: str, seed: int, index: int) -> tuple[bytes, list[str]]:
    """The file bytes of one case (index -1: the corpus file unmutated)."""
    raw = raws[corpus]
    if index < 0:
        return fuzz_mutate.serialize(raw), ["control"]
    rng = random.Random(f"{seed}:{corpus}:{index}")
    return fuzz_mutate.mutate(raw, rng, structural=corpus != "smollm2-header")


def run_case(raws: dict, workdir: Path, corpus: str, seed: int, index: int, *, trace: bool = False) -> dict:
    """Load and generate one case in this process; the outcome as a dict."""
    import gc

    from bolt_ros.engine.decode.generate import Engine
    from bolt_ros.engine.decode.sampling import SamplingParams
    from bolt_ros.engine.gguf.reader import GGUFError

    data, what = make_case(raws, corpus, seed, index)
    path = workdir / f"case-{os.getpid()}.gguf"
    path.write_bytes(data)
    res = {"corpus": corpus, "index": index, "what": what}
    stage, engine = "load", None
    t0 = time.perf_counter()
    try:
        if corpus == "dflash":
            engine = Engine.load(workdir / "gemma4.gguf", n_ctx=256, draft=path)
        else:
            engine = Engine.load(path, n_ctx=256)
        stage = "generate"
        ids = engine.tok.encode(PROMPT, add_bos=True) or [0]  # a vocabulary without these letters: any token
        engine.generate(ids, SamplingParams(max_tokens=3))
        res["outcome"] = "ok"
    except GGUFError as e:
        # the message must name the file (a drafter case: the drafter) and say what is wrong
        res.update(outcome="refused" if path.name in str(e) else "unnamed", error=str(e)[:300], stage=stage)
    except MemoryError as e:
        res.update(outcome="oom", error=f"MemoryError: {e}"[:300], stage=stage)
    except Exception as e:
        oom = isinstance(e, RuntimeError) and re.search(r"alloc|out of memory", str(e), re.I)
        res.update(outcome="oom" if oom else "crash", error=f"{type(e).__name__}: {e}"[:300], stage=stage)
        tb = traceback.extract_tb(e.__traceback__)
        res["where"] = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
        if trace:
            traceback.print_exc()
    finally:
        del engine
        gc.collect()
        path.unlink(missing_ok=True)
    res["s"] = round(time.perf_counter() - t0, 3)
    return res


def worker_main(workdir: Path, mem_mb: int, seed: int) -> None:
    """Loop: read 'corpus index' lines on stdin, answer one JSON line each on stdout."""
    import gc
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (mem_mb << 20, mem_mb << 20))
    import torch

    torch.set_num_threads(1)
    raws = fuzz_corpus.load_raws(workdir)
    run_case(raws, workdir, "gemma4", seed, -1)  # import what a load imports, then
    gc.freeze()  # keep torch's ~10^6 objects out of every collection (Engine.load collects: 0.14 s each otherwise)
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints must not break the protocol
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        corpus, index = line.split()
        out.write(json.dumps(run_case(raws, workdir, corpus, seed, int(index))) + "\n")
        out.flush()


class Worker:
    def __init__(self, args, log):
        cmd = [sys.executable, __file__, "--worker", "--workdir", str(args.workdir), "--mem-mb", str(args.mem_mb),
               "--seed", str(args.seed)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.case: tuple[str, int] | None = None
        self.deadline = time.monotonic() + args.timeout + 60  # startup: torch import
        self.done = 0
        self.ready = False

    def send(self, case: tuple[str, int], timeout: float) -> None:
        self.case, self.deadline = case, time.monotonic() + timeout
        self.proc.stdin.write(f"{case[0]} {case[1]}\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def run(args) -> dict:
    args.workdir.mkdir(parents=True, exist_ok=True)
    t_build = time.perf_counter()
    fuzz_corpus.build(args.workdir)
    t0 = time.perf_counter()
    plan = case_plan(args.seed, args.cases)
    todo = list(reversed(plan))
    results: list[dict] = []
    log = open(args.workdir / "workers.log", "a")
    sel = selectors.DefaultSelector()
    workers: list[Worker] = []

    def start() -> None:
        w = Worker(args, log)
        workers.append(w)
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)

    def retire(w: Worker, outcome: str | None, error: str = "") -> None:
        if outcome and w.case is not None:
            results.append({"corpus": w.case[0], "index": w.case[1], "outcome": outcome, "error": error})
            bar.update()
        sel.unregister(w.proc.stdout)
        w.stop()
        workers.remove(w)

    from tqdm import tqdm
    bar = tqdm(total=len(plan), unit="case", desc="fuzz", disable=args.no_progress)
    for _ in range(min(args.workers, len(plan))):
        start()
    try:
        _loop(args, todo, workers, sel, start, retire, results, bar)
    finally:  # an interrupt or an error must not leave workers behind
        for w in list(workers):
            w.stop()
        bar.close()
        log.close()
    return summarize(args, results, time.perf_counter() - t0, t0 - t_build)


def _loop(args, todo, workers, sel, start, retire, results, bar) -> None:
    """Feed cases to idle workers; collect answers; replace workers that die, hang or hit the memory limit."""
    while workers:
        for w in list(workers):
            if w.ready and w.case is None:
                if todo and w.done < args.recycle:
                    w.send(todo.pop(), args.timeout)
                else:
                    retire(w, None)
                    if todo:
                        start()
        timeout = max(0.0, min((w.deadline for w in workers), default=0) - time.monotonic())
        for key, _ in sel.select(timeout=timeout):
            w = key.data
            line = w.proc.stdout.readline()
            if not line:  # the worker died (an RLIMIT kill, a segfault): charge its case
                if not w.ready:
                    raise RuntimeError(f"a fuzz worker died while starting (see {args.workdir / 'workers.log'})")
                retire(w, "killed", f"worker exit {w.proc.wait()}")
                if todo:
                    start()
            elif line.strip() == "ready":
                w.ready = True
            else:
                res = json.loads(line)
                results.append(res)
                bar.update()
                w.case, w.done = None, w.done + 1
                if res["outcome"] == "oom":  # a process that hit RLIMIT_AS may hold odd state: start afresh
                    retire(w, None)
                    if todo:
                        start()
        now = time.monotonic()
        for w in [w for w in workers if now > w.deadline]:
            if not w.ready:
                raise RuntimeError(f"a fuzz worker did not start (see {args.workdir / 'workers.log'})")
            retire(w, "hang", f"no answer in {args.timeout} s")
            if todo:
                start()


def summarize(args, results: list[dict], wall: float, build_s: float) -> dict:
    counts = Counter(r["outcome"] for r in results)
    by_corpus: dict[str, Counter] = {}
    by_kind: dict[str, Counter] = {}
    for r in results:
        by_corpus.setdefault(r["corpus"], Counter())[r["outcome"]] += 1
        for w in r.get("what", []):
            by_kind.setdefault(w.split()[0], Counter())[r["outcome"]] += 1
    refusals = Counter(re.sub(r"\d+", "N", r["error"].split(": ", 1)[-1])[:90] for r in results
                       if r["outcome"] == "refused")
    bad = [r for r in results if r["outcome"] not in GOOD and r["index"] >= 0]
    controls = {r["corpus"]: r["outcome"] for r in results if r["index"] < 0}
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "seed": args.seed, "cases": len(results),
        "workers": args.workers, "timeout_s": args.timeout, "mem_mb": args.mem_mb, "corpus_build_s": round(build_s, 1),
        "wall_s": round(wall, 1), "cases_per_s": round(len(results) / wall, 2) if wall else 0.0, "cpu": cpu,
        "counts": {k: counts.get(k, 0) for k in ("refused", "ok", "crash", "hang", "oom", "killed", "unnamed")},
        "controls": controls,
        "by_corpus": {k: dict(v) for k, v in sorted(by_corpus.items())},
        "by_mutation": {k: dict(v) for k, v in sorted(by_kind.items())},
        "top_refusals": refusals.most_common(25),
        "failures": bad[:50],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per case before it counts as a hang")
    p.add_argument("--mem-mb", type=int, default=3072, help="RLIMIT_AS of each worker")
    p.add_argument("--recycle", type=int, default=2000, help="cases per worker before a fresh one")
    p.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "bolt_fuzz_load")
    p.add_argument("--json", type=Path, help="write the summary here")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--replay", help="corpus:seed:index - run one case here and print its outcome and traceback")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker_main(args.workdir, args.mem_mb, args.seed)
        return 0
    if args.replay:
        corpus, seed, index = args.replay.split(":")
        fuzz_corpus.build(args.workdir)
        res = run_case(fuzz_corpus.load_raws(args.workdir), args.workdir, corpus, int(seed), int(index), trace=True)
        print(json.dumps(res, indent=2))
        return 0 if res["outcome"] in GOOD else 1
    summary = run(args)
    text = json.dumps(summary, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(json.dumps({k: summary[k] for k in ("command", "cases", "wall_s", "cases_per_s", "counts", "controls")}))
    return 0 if all(summary["counts"][k] == 0 for k in ("crash", "hang", "oom", "killed", "unnamed")) else 1


if __name__ == "__main__":
    sys.exit(main())
