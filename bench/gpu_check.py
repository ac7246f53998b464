"""GPU check of bolt_ros: copy roofline, each kernel's GB/s (and % of copy) on Gemma 4 E4B shapes with a correctness
check against its torch reference on the same GPU, a small tile sweep, and the end-to-end numbers of a random
E4B-shaped model (decode tok/s with and without a DFlash drafter, TTFT of a 3K-token prompt, peak GPU memory at 4K and
16K context).

    python bench/gpu_check.py [--budget-s 330] [--json-out F] [--sections copy,qmatmul,...] [--model M.gguf]
    python bench/gpu_check.py --device cpu     # tiny shapes under TRITON_INTERPRET=1: every code path, no timing value
    python bench/gpu_check.py --compile-only   # no GPU: compile every kernel for sm_90, report registers / spills

This file: the CLI, the table, the summary and the exit status. The sections are in gpu_kernels_check.py and
gpu_e2e_check.py, the shapes, rows and the one timing helper (device synchronized at every start and stop) in
gpu_common.py. Prints ONE table, then one summary line: PASS, FAIL or INCOMPLETE.
Exit status: 0 complete and every check passed; 1 a check failed (a kernel disagreed with its reference, or an
end-to-end run did not produce its numbers: non-zero exit, no JSON, a missing key); 2 no CUDA device; 4 incomplete
(nothing failed, but a section was skipped: the time budget, --sections or --skip-*). Target rows ("met"/"missed")
are information, not checks.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from gpu_common import E4B, TINY, Ctx, Row, fail, skip

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ("copy", "qmatmul", "attention", "small", "sweep", "e2e")
EXIT_FAIL, EXIT_NO_GPU, EXIT_INCOMPLETE = 1, 2, 4


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: tiny shapes through the Triton interpreter (a dry run of every code path)")
    p.add_argument("--dry-run", action="store_true", help="same as --device cpu")
    p.add_argument("--budget-s", type=float, default=330.0,
                   help="wall-clock budget; sections past it are skipped (and the summary says INCOMPLETE)")
    p.add_argument("--json-out", type=Path, help="also write the rows and the summary as JSON here")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    p.add_argument("--skip-sweep", action="store_true", help="drop the sweep section")
    p.add_argument("--skip-e2e", action="store_true", help="drop the e2e section")
    p.add_argument("--model", type=Path, help="E4B GGUF for the end-to-end part (default: write a random one)")
    p.add_argument("--draft", type=Path, help="DFlash drafter GGUF (default: write a random one)")
    p.add_argument("--compile-only", type=int, metavar="SM", nargs="?", const=90,
                   help="no GPU needed: compile every kernel for sm_SM (default 90 = H100/H200), report regs/spills")
    p.add_argument("--only", help="with --compile-only: comma-separated labels to compile (default: all)")
    args = p.parse_args(argv)
    if args.dry_run:
        args.device = "cpu"
    wanted = [x.strip() for x in args.sections.split(",") if x.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        p.error(f"unknown section(s) {', '.join(unknown)} (have {', '.join(SECTIONS)})")
    args.sections = [x for x in SECTIONS if x in wanted and not (x == "sweep" and args.skip_sweep)
                     and not (x == "e2e" and args.skip_e2e)]
    return args


def targets(ctx: Ctx) -> None:
    """The issue's targets, computed from the measured rows (information: they never fail the check)."""
    def find(name: str, m: int) -> Row | None:
        return next((r for r in ctx.rows if r.name == name and r.m == str(m) and r.us), None)

    s = ctx.shapes
    shape = f"{s.ffn}x{s.hidden}"
    m1, mb = find("qmatmul Q4_K ffn_up", 1), find("qmatmul Q4_K ffn_up", s.block)
    if m1 and m1.pct_copy is not None:
        ctx.rows.append(Row("target: Q4_K GEMV >= 70% copy", shape, "1", pct_copy=m1.pct_copy,
                            check="met" if m1.pct_copy >= 70 else "missed"))
    if m1 and mb:
        ratio = mb.us / m1.us
        ctx.rows.append(Row(f"target: Q4_K M={s.block} <= 1.5x M=1", shape, str(s.block),
                            check="met" if ratio <= 1.5 else "missed", note=f"ratio {ratio:.2f}"))
    e2e = next((r for r in ctx.rows if r.name == "e2e decode (no drafter)" and r.pct_copy is not None), None)
    if e2e:
        ctx.rows.append(Row("target: e2e decode >= 40% roofline", e2e.shape, "1", pct_copy=e2e.pct_copy,
                            check="met" if e2e.pct_copy >= 40 else "missed"))


def summarize(rows: list[Row]) -> tuple[int, str]:
    """(exit status, summary line) from the rows' check prefixes: any FAIL -> 1; else any skipped -> 4; else 0."""
    failed = [r.name for r in rows if r.check.startswith("FAIL")]
    skipped = [r.name for r in rows if r.check.startswith("skipped")]
    ok = sum(r.check.startswith("ok") for r in rows)
    counts = f"{ok} ok, {len(failed)} failed, {len(skipped)} skipped"
    if failed:
        return EXIT_FAIL, f"summary: FAIL ({counts}): " + "; ".join(dict.fromkeys(failed))
    if skipped:
        return EXIT_INCOMPLETE, f"summary: INCOMPLETE ({counts}): " + "; ".join(dict.fromkeys(skipped))
    return 0, f"summary: PASS ({counts})"


def fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def print_table(rows: list[Row], header: str, summary: str) -> None:
    cols = ("kernel", "shape", "M", "time_us", "GB/s", "TFLOP/s", "%copy", "check", "note")
    body = [(r.name, r.shape, r.m, fmt(r.us, ".1f"), fmt(r.gbps, ".0f"), fmt(r.tflops, ".2f"), fmt(r.pct_copy, ".0f"),
             r.check, r.note) for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    line = "  ".join("-" * w for w in widths)
    print(header)
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
    print(line)
    for b in body:
        print("  ".join(v.ljust(w) for v, w in zip(b, widths)).rstrip())
    print(line)
    print(summary)


def compile_only(args: argparse.Namespace, started: float) -> int:
    import torch
    import triton
    from gpu_kernels_check import section_compile

    ctx = Ctx(torch, triton, "cpu", torch.bfloat16, E4B, started + args.budget_s)
    section_compile(ctx, args.compile_only, args.only)
    code, summary = summarize(ctx.rows)
    print_table(ctx.rows, f"gpu_check --compile-only: sm_{args.compile_only}, triton {triton.__version__}", summary)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    sys.path.insert(0, str(ROOT))
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
        os.environ["BOLT_KERNELS"] = "triton"  # ops.qmatmul_gguf runs the Triton kernel (interpreted) on the CPU
    if args.compile_only:
        os.environ["BOLT_TRITON"] = "1"  # compile for a GPU this machine lacks: import Triton all the same
        return compile_only(args, started)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device: torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no GPU "
              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); "
              "run on the GPU machine, or `--device cpu` for a dry run", file=sys.stderr)
        return EXIT_NO_GPU
    import gpu_e2e_check as e2e
    import triton
    from gpu_kernels_check import KERNEL_SECTIONS

    versions = f"torch {torch.__version__}, triton {triton.__version__}, BOLT_KERNELS={os.environ.get('BOLT_KERNELS')}"
    if args.device == "cuda":
        shapes, dtype = E4B, torch.bfloat16
        props = torch.cuda.get_device_properties(0)
        header = (f"gpu_check: {props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB; "
                  f"{versions}")
    else:
        shapes, dtype = TINY, torch.float32
        header = f"gpu_check DRY RUN on CPU (Triton interpreter, tiny shapes; no number means anything); {versions}"
    torch.manual_seed(0)
    deadline = started + args.budget_s
    run_e2e = "e2e" in args.sections
    # the kernel sections leave the end-to-end part its share of the budget
    ctx = Ctx(torch, triton, args.device, dtype, shapes,
              deadline - min(shapes.e2e_reserve_s, args.budget_s / 2) if run_e2e else deadline)
    work = writer = None
    if run_e2e and ctx.left() > 0:
        work, writer = e2e.start(ctx, args.model)  # the test model is written while the kernels run
    try:
        for name in SECTIONS:
            if name not in args.sections:
                skip(ctx, f"{name} (section)", "not selected (--sections/--skip-*)")
                continue
            if name == "e2e":
                ctx.deadline = deadline
                if args.device == "cuda":
                    torch.cuda.empty_cache()  # the end-to-end children get the memory the kernel rows cached
            if ctx.left() <= 0:
                skip(ctx, f"{name} (section)", "time budget")
                continue
            try:
                if name == "e2e":
                    e2e.section_e2e(ctx, work, writer, args.model, args.draft)
                else:
                    KERNEL_SECTIONS[name](ctx)
            except Exception as exc:  # one broken section must not hide the others' numbers
                fail(ctx, f"{name} (section)", f"{type(exc).__name__}: {exc}")
    finally:
        if work is not None:
            e2e.cleanup(work, writer)
    targets(ctx)
    code, summary = summarize(ctx.rows)
    print_table(ctx.rows, header + f"; {time.monotonic() - started:.0f} s", summary)
    if args.json_out:
        args.json_out.write_text(json.dumps({"header": header, "summary": summary, "exit_status": code,
                                             "rows": [asdict(r) for r in ctx.rows]}, indent=1))
    return code


if __name__ == "__main__":
    sys.exit(main())
