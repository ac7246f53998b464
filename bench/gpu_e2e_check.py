"""The GPU check's end-to-end part: decode tok/s with and without a DFlash drafter (`bolt bench --json`), TTFT of a
3K-token prompt and peak GPU memory at 4K and 16K context (the worker below), on a random E4B-shaped model.

    start(ctx, model), then section_e2e(ctx, ...)
                                 rows for gpu_check.py (the target is written by `bolt testmodel` in the background
                                 while the kernel sections run, the drafter while the plain bench runs)
    read_json_report(...)        the pure reader of every subprocess's JSON: a non-zero exit, no JSON object, a
                                 missing key or a non-numeric value raises E2EError, which becomes a FAIL row
    python bench/gpu_e2e_check.py worker --model M.gguf --device cuda --ttft-tokens 3072 --ctx 4096 --ctx 16384
                                 prints one JSON line: ttft_s, ttft_cold_s, loaded_mib, peak_mib_ctx<N>, ...
Nothing here ever turns a failure into "skipped": only the time budget skips (visibly; the summary then says
INCOMPLETE). Under --device cpu the same runs use the tiny gemma4 preset on the engine's CPU path.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gpu_common import Ctx, Row, Stopwatch, fail, skip, sync

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve()


class E2EError(Exception):
    """An end-to-end run that did not produce its numbers; the message goes into the table."""


def _tail(text: str, n: int = 160) -> str:
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1][:n] if lines else ""


def read_json_report(returncode: int, stdout: str, stderr: str, keys: Sequence[str]) -> dict:
    """The last JSON object line of a run's stdout, with every key in `keys` a finite number > 0; else E2EError."""
    if returncode != 0:
        raise E2EError(f"exit {returncode}: {_tail(stderr) or _tail(stdout) or 'no output'}")
    obj = None
    for line in reversed((stdout or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise E2EError(f"unparsable JSON ({exc.msg} at {exc.pos}): {line[:80]}") from None
            break
    if not isinstance(obj, dict):
        raise E2EError(f"no JSON object on stdout: {_tail(stdout) or 'empty'}")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise E2EError(f"missing key(s) {', '.join(missing)}; got {', '.join(sorted(obj))}"[:200])
    for k in keys:
        v = obj[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise E2EError(f"{k} = {v!r} is not a positive number")
    return obj


def bench_keys(prompt_tokens: int, gen_tokens: int, draft: bool) -> tuple[str, ...]:
    """The keys `bolt bench --json` prints for these flags (bolt_ros/engine/bench.py run_bench)."""
    keys = ("load_s", f"pp{prompt_tokens}_tok_s", f"tg{gen_tokens}_tok_s")
    return keys + (("plain_decode_tok_s", "spec_decode_tok_s", "spec_speedup") if draft else ())


def bench_args(model: Path, device: str, prompt_tokens: int, gen_tokens: int, draft: Path | None) -> list[str]:
    args = ["bench", "--model", str(model), "--device", device, "--prompt-tokens", str(prompt_tokens),
            "--gen-tokens", str(gen_tokens), "--json"]
    return args + (["--draft", str(draft)] if draft is not None else [])


def worker_keys(ctxs: Sequence[int]) -> tuple[str, ...]:
    per_ctx = (f"{p}_ctx{c}" for c in ctxs for p in ("peak_mib", "prefill_tok_s"))
    return ("ttft_s", "ttft_cold_s", "loaded_mib", *per_ctx)


def child_env(device: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    if device == "cpu":  # the dry run's BOLT_KERNELS=triton is for the kernel rows; the engine runs its CPU path
        env.pop("BOLT_KERNELS", None)
    return env


def bolt_cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "bolt_ros.cli", *args]


def run(cmd: list[str], device: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, timeout), env=child_env(device),
                          cwd=ROOT)


class Background:
    """A `bolt testmodel` run in the background (the target is written on the CPU while the kernel sections use the
    GPU); its output goes to files, so a chatty child never blocks on a full pipe."""

    def __init__(self, ctx: Ctx, args: list[str], out: Path):
        self.out, self.what = out, " ".join(args[:3])
        self.log = open(out.with_suffix(".log"), "w+")  # closed in wait() or kill()
        self.proc = subprocess.Popen(bolt_cmd(args), stdout=self.log, stderr=subprocess.STDOUT, text=True,
                                     env=child_env(ctx.device), cwd=ROOT)

    def wait(self, timeout: float) -> Path:
        code = self.proc.wait(timeout=max(1.0, timeout))  # TimeoutExpired: the budget ran out (the caller skips)
        self.log.seek(0)
        text = self.log.read()
        self.log.close()
        if code != 0:
            raise E2EError(f"bolt {self.what}: exit {code}: {_tail(text) or 'no output'}")
        return self.out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def target_writer(ctx: Ctx, work: Path) -> Background:
    s = ctx.shapes
    out = work / f"gemma4-{s.preset}-{s.quant}.gguf"
    return Background(ctx, ["testmodel", "--arch", "gemma4", "--preset", s.preset, "--quant", s.quant, "--seed", "0",
                            "--out", str(out)], out)


def start(ctx: Ctx, model: Path | None) -> tuple[Path, Background | None]:
    """A work directory and, without --model, the target's writer, started now."""
    work = Path(tempfile.mkdtemp(prefix="bolt_gpu_check_"))
    return work, (target_writer(ctx, work) if model is None else None)


def weight_bytes_per_token(path: Path) -> int:
    """Bytes one decode step must read: every tensor except the per-layer token table (one row of it is read)."""
    from bolt_ros.engine.gguf.reader import GGUFFile

    try:
        with GGUFFile(path) as gf:
            infos = list(gf.tensors.values())
    except Exception as exc:  # any unreadable file: the same failure
        raise E2EError(f"{path.name} is not a readable GGUF: {type(exc).__name__}: {exc}"[:200]) from None
    # ggml order: shape[-1] is the number of rows
    return sum(t.nbytes // t.shape[-1] if t.name == "per_layer_token_embd.weight" else t.nbytes for t in infos)


def _decode_row(ctx: Ctx, name: str, tok_s: float, per_token: int, note: str) -> Row:
    row = Row(name, f"{per_token / 1e9:.3f} GB/token", "1", 1e6 / tok_s, gbps=tok_s * per_token / 1e9,
              check=f"ok {tok_s:.1f} tok/s", note=note, value=tok_s, unit="tok/s")
    if ctx.copy_gbps:
        row.pct_copy = 100.0 * row.gbps / ctx.copy_gbps
        row.note += f"; roofline {ctx.copy_gbps * 1e9 / per_token:.0f} tok/s"
    return row


def section_e2e(ctx: Ctx, work: Path, writer: Background | None, model: Path | None, draft: Path | None) -> None:
    """Rows: test model, decode without and with the drafter, TTFT, peak memory per context. Any failure: FAIL."""
    s, dev = ctx.shapes, ctx.device
    names = {"model": "e2e test model", "plain": "e2e decode (no drafter)", "spec": "e2e decode + dflash drafter",
             "ttft": f"e2e TTFT {s.ttft_tokens}-token prompt",
             **{f"mem{c}": f"e2e peak {'GPU' if dev == 'cuda' else 'RSS'} memory ctx={c}" for c in s.mem_ctxs}}

    def step(keys: list[str], fn) -> object:
        """Run the part that makes these rows; a budget timeout skips them (visibly), anything else fails them."""
        if ctx.left() < 5:
            outcome = (skip, "time budget")
        else:
            try:
                return fn()
            except subprocess.TimeoutExpired as exc:
                outcome = (skip, f"time budget (timed out after {exc.timeout:.0f} s)")
            except E2EError as exc:
                outcome = (fail, str(exc))
            except Exception as exc:  # a bug here shows as a FAIL row, not a traceback
                outcome = (fail, f"{type(exc).__name__}: {exc}")
        add_row, why = outcome
        for key in keys:
            add_row(ctx, names[key], why if key == keys[0] else f"{why[:60]}... (see {names[keys[0]]})")
        return None

    def write_model() -> tuple[Path, int]:
        path = writer.wait(ctx.left() - 5) if writer is not None else model
        per_token = weight_bytes_per_token(path)
        size = path.stat().st_size
        ctx.rows.append(Row(names["model"], f"gemma4 {s.preset} {s.quant}", check=f"ok {size / 1e9:.2f} GB",
                            note=f"{path.name}; reads {per_token / 1e9:.3f} GB/token", value=size / 2**30, unit="GiB"))
        return path, per_token

    got = step(list(names), write_model)  # without a target model every row goes the same way
    if got is None:
        return
    path, per_token = got
    drafter = None
    if draft is None:  # the drafter reads the target's GGUF: written while the plain bench runs
        draft = work / "dflash-drafter.gguf"
        drafter = Background(ctx, ["testmodel", "--arch", "dflash", "--target", str(path), "--layers",
                                   str(s.draft_layers), "--seed", "0", "--out", str(draft)], draft)

    def plain() -> None:
        res = run(bolt_cmd(bench_args(path, dev, s.prompt_tokens, s.gen_tokens, None)), dev, ctx.left() - 5)
        out = read_json_report(res.returncode, res.stdout, res.stderr, bench_keys(s.prompt_tokens, s.gen_tokens, False))
        ctx.rows.append(_decode_row(ctx, names["plain"], out[f"tg{s.gen_tokens}_tok_s"], per_token,
                                    f"bolt bench tg{s.gen_tokens}; pp{s.prompt_tokens} "
                                    f"{out[f'pp{s.prompt_tokens}_tok_s']:.0f} tok/s; load {out['load_s']:.1f} s"))

    def spec() -> None:
        if drafter is not None:
            drafter.wait(ctx.left() - 5)
        res = run(bolt_cmd(bench_args(path, dev, s.prompt_tokens, s.gen_tokens, draft)), dev, ctx.left() - 5)
        out = read_json_report(res.returncode, res.stdout, res.stderr, bench_keys(s.prompt_tokens, s.gen_tokens, True))
        acc = (out.get("spec") or {}).get("acceptance_rate")
        ctx.rows.append(_decode_row(ctx, names["spec"], out["spec_decode_tok_s"], per_token,
                                    f"{s.draft_layers}-layer random drafter (accepts ~nothing: the cost side); plain "
                                    f"{out['plain_decode_tok_s']:.1f} tok/s, speedup {out['spec_speedup']:.2f}, "
                                    f"acceptance {acc}"))

    def measure() -> None:
        cmd = [sys.executable, str(WORKER), "worker", "--model", str(path), "--device", dev,
               "--ttft-tokens", str(s.ttft_tokens), *(a for c in s.mem_ctxs for a in ("--ctx", str(c)))]
        res = run(cmd, dev, ctx.left() - 2)
        out = read_json_report(res.returncode, res.stdout, res.stderr, worker_keys(s.mem_ctxs))
        ctx.rows.append(Row(names["ttft"], f"{s.ttft_tokens} tok", str(s.ttft_tokens), out["ttft_s"] * 1e6,
                            check=f"ok {out['ttft_s']:.3f} s", value=out["ttft_s"], unit="s",
                            note=f"prefill + first token, warm; cold {out['ttft_cold_s']:.3f} s"))
        for c in s.mem_ctxs:
            peak = out[f"peak_mib_ctx{c}"]
            ctx.rows.append(Row(names[f"mem{c}"], f"ctx={c}", check=f"ok {peak / 1024:.2f} GiB", value=peak / 1024,
                                unit="GiB", note=f"{out['what']}; after load {out['loaded_mib'] / 1024:.2f} GiB; "
                                f"{c - 32}-token prompt at {out[f'prefill_tok_s_ctx{c}']:.0f} tok/s, 16 steps"))

    try:
        step(["plain"], plain)
        step(["spec"], spec)
        step(["ttft", *(f"mem{c}" for c in s.mem_ctxs)], measure)
    finally:
        if drafter is not None:
            drafter.kill()


def cleanup(work: Path, writer: Background | None) -> None:
    if writer is not None:
        writer.kill()
    shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------ worker

def _peak_rss_reset() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux)
    except OSError:
        pass


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gpu_e2e_check.py worker")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--ttft-tokens", type=int, default=3072)
    p.add_argument("--ctx", type=int, action="append", required=True, help="contexts to measure peak memory at")
    p.add_argument("--decode-steps", type=int, default=16)
    args = p.parse_args(argv)
    import torch

    from bolt_ros.engine.decode.generate import Engine
    from bolt_ros.engine.decode.sampling import SamplingParams
    from bolt_ros.engine.device import resolve_device

    dev = resolve_device(args.device)
    cuda = dev.type == "cuda"
    need = max(*args.ctx, args.ttft_tokens + 64)
    engine = Engine.load(args.model, n_ctx=need, device=dev)
    if engine.n_ctx < need:
        print(f"worker: the model's context ({engine.n_ctx}) is below the {need} tokens asked for", file=sys.stderr)
        return 2
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, min(engine.tok.vocab_size, 30000), (need,), generator=g).tolist()
    if engine.tok.bos_id is not None:
        ids[0] = engine.tok.bos_id
    out: dict = {"what": "torch.cuda.max_memory_allocated" if cuda else "process VmHWM (CPU dry run)"}
    out["loaded_mib"] = torch.cuda.memory_allocated(dev) / 2**20 if cuda else _peak_rss_mib()  # weights and all

    def first_token(n_ctx: int, n_prompt: int):
        """(seconds from the prompt to the first sampled token, the session, the generation) in a fresh session."""
        engine.n_ctx = n_ctx  # the size of the session's cache
        session = engine.new_session()
        with Stopwatch(str(dev)) as sw:
            res = engine.generate(ids[:n_prompt], SamplingParams(max_tokens=1), session=session, use_draft=False)
        return sw.s, session, res

    ttft_ctx = min((c for c in args.ctx if c > args.ttft_tokens + 8), default=args.ttft_tokens + 64)
    out["ttft_cold_s"] = first_token(ttft_ctx, args.ttft_tokens)[0]  # kernel JIT and first allocations included
    out["ttft_s"] = first_token(ttft_ctx, args.ttft_tokens)[0]
    for c in args.ctx:
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
        else:
            _peak_rss_reset()
        n_prompt = c - 32
        secs, session, res = first_token(c, n_prompt)
        # then decode steps on the same cache (the prompt is reused): the decode path's graphs and buffers count too
        engine.generate(ids[:n_prompt] + res.completion_ids, SamplingParams(max_tokens=args.decode_steps),
                        session=session, use_draft=False)
        sync(str(dev))
        out[f"peak_mib_ctx{c}"] = torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else _peak_rss_mib()
        out[f"prefill_tok_s_ctx{c}"] = n_prompt / secs
        del session, res
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"]:
        sys.exit("usage: python bench/gpu_e2e_check.py worker --model M.gguf --device cuda --ctx 4096 ...")
    sys.path.insert(0, str(ROOT))
    sys.exit(worker(sys.argv[2:]))
