"""What the GPU check's parts share: the shape sets, the table row, the run context, and the ONE way anything is timed.

Timing rule: `Stopwatch` synchronizes the device before it starts and before it stops, so no measured interval ever
ends with work still queued. `time_calls` (kernels) and the end-to-end worker (prefill, TTFT) both time through it.
Rows: `check` is "ok ...", "FAIL ..." or "skipped: ..." (the time budget or an explicit selection); the summary and
the exit status are computed from those prefixes only (gpu_check.summarize).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Shapes:
    hidden: int
    ffn: int
    vocab: int
    prefill_m: int
    ctx: int
    n_q: int
    n_kv: int
    d_swa: int
    d_full: int
    window: int
    block: int  # DFlash verify width (the drafter's block size): the small-M kernels' M
    copy_bytes: int
    rotate_bytes: int  # operands are cloned until they exceed this, so repeated calls do not read from L2
    # end to end: a random model from `bolt testmodel` with this preset, its random drafter, and the measured runs
    preset: str
    quant: str
    draft_layers: int
    prompt_tokens: int
    gen_tokens: int
    ttft_tokens: int
    mem_ctxs: tuple[int, ...]
    e2e_reserve_s: float  # wall time kept back from the kernel sections for the end-to-end part


E4B = Shapes(hidden=2560, ffn=10240, vocab=262144, prefill_m=512, ctx=4096, n_q=8, n_kv=2, d_swa=256, d_full=512,
             window=512, block=8, copy_bytes=1 << 30, rotate_bytes=256 << 20,
             preset="e4b", quant="q4_k_m", draft_layers=5, prompt_tokens=128, gen_tokens=128, ttft_tokens=3072,
             mem_ctxs=(4096, 16384), e2e_reserve_s=150.0)
# the dry run: every code path once (GEMV, small-M, GEMM; each quant type; each attention form; the end-to-end runs
# on the tiny gemma4 preset), interpreter-sized
TINY = Shapes(hidden=256, ffn=256, vocab=64, prefill_m=20, ctx=48, n_q=4, n_kv=2, d_swa=32, d_full=64, window=16,
              block=8, copy_bytes=8 << 20, rotate_bytes=0,
              preset="tiny", quant="q4_k_m", draft_layers=1, prompt_tokens=16, gen_tokens=8, ttft_tokens=48,
              mem_ctxs=(128, 256), e2e_reserve_s=60.0)


@dataclass
class Row:
    name: str
    shape: str = ""
    m: str = ""
    us: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_copy: float | None = None
    check: str = ""
    note: str = ""
    value: float | None = None  # the end-to-end rows' headline number, in `unit` (for JSON readers)
    unit: str = ""


@dataclass
class Ctx:
    torch: object
    triton: object
    device: str
    dtype: object
    shapes: Shapes
    deadline: float
    copy_gbps: float | None = None
    rows: list[Row] = field(default_factory=list)

    def left(self) -> float:
        return self.deadline - time.monotonic()


def sync(device: str) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class Stopwatch:
    """`with Stopwatch(device) as sw: ...` then `sw.s`: seconds, with the device synchronized at start and stop."""

    def __init__(self, device: str):
        self.device, self.s = device, float("nan")

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        sync(self.device)
        self.s = time.perf_counter() - self.t0


def time_calls(ctx: Ctx, fns: list[Callable[[], object]], *, min_s: float = 0.01) -> tuple[float, str, object]:
    """Microseconds per call of fns (cycled: rotated operand copies), the method, and fns[0]'s first result.

    GPU: one CUDA graph of enough calls, replayed until a timing lasts >= min_s (no launch overhead, no warm L2 when
    the rotated copies exceed it), median of 3; if capture fails, the same calls eagerly ("eager": launches included).
    CPU: one interpreted call ("interp"; the number measures nothing but the interpreter)."""
    if ctx.device != "cuda":
        with Stopwatch(ctx.device) as sw:
            first = fns[0]()
        return sw.s * 1e6, "interp", first
    torch = ctx.torch
    first = fns[0]()  # compiles
    n = len(fns)
    with Stopwatch("cuda") as sw:
        for fn in fns:
            fn()
    calls = n * max(1, math.ceil(2e-3 / max(sw.s, 1e-6)))  # >= ~2 ms of eager work per graph
    try:
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fns[0]()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            for i in range(calls):
                fns[i % n]()
        run, how = graph.replay, "graph"
        run()
    except Exception:  # an op that cannot be captured: eager launches still measure it, overhead included
        sync("cuda")

        def run() -> None:
            for i in range(calls):
                fns[i % n]()
        how = "eager"
    with Stopwatch("cuda") as sw:
        run()
    reps = max(1, math.ceil(min_s / max(sw.s, 1e-6)))
    times = []
    for _ in range(3):
        with Stopwatch("cuda") as sw:
            for _ in range(reps):
                run()
        times.append(sw.s / (reps * calls))
    return sorted(times)[1] * 1e6, how, first


def rotated(ctx: Ctx, nbytes: int, make: Callable[[int], object]) -> list[object]:
    """[make(0), make(1), ...]: enough copies of an operand set that together they exceed ctx.shapes.rotate_bytes."""
    count = 1 if nbytes <= 0 else max(1, min(64, math.ceil(ctx.shapes.rotate_bytes / nbytes)))
    return [make(i) for i in range(count)]


def rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def verdict(err: float, tol: float) -> str:
    return f"ok {err:.1e}" if err <= tol else f"FAIL {err:.1e}"


def tol(ctx: Ctx) -> float:
    # bf16 activations (and bf16 dot inputs) on the GPU; fp32 everywhere in the interpreter
    return 2e-2 if ctx.dtype == ctx.torch.bfloat16 else 1e-5


def add(ctx: Ctx, name: str, shape: str, m, fns, *, check: Callable[[object], str] | str = "", nbytes: float = 0.0,
        flops: float = 0.0, note: str = "") -> Row:
    """Time fns (one callable or rotated copies), judge the first result with `check`, append the row."""
    fns = fns if isinstance(fns, list) else [fns]
    us, how, first = time_calls(ctx, fns)
    verdict_text = check(first) if callable(check) else check
    row = Row(name, shape, str(m), us, check=verdict_text,
              note=" ".join(x for x in (how, f"x{len(fns)} copies" if len(fns) > 1 else "", note) if x))
    if nbytes:
        row.gbps = nbytes / us / 1e3
        if ctx.copy_gbps:
            row.pct_copy = 100.0 * row.gbps / ctx.copy_gbps
    if flops:
        row.tflops = flops / us / 1e6
    ctx.rows.append(row)
    return row


def skip(ctx: Ctx, name: str, why: str, shape: str = "") -> None:
    ctx.rows.append(Row(name, shape, check=f"skipped: {why}"))


def fail(ctx: Ctx, name: str, why: str, shape: str = "") -> None:
    ctx.rows.append(Row(name, shape, check=f"FAIL {why}"[:200]))
