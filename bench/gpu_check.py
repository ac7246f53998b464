"""GPU check of the bolt_ros kernels: copy bandwidth, each kernel's GB/s (or TFLOP/s) on Gemma 4 E4B shapes with a
correctness check against its torch reference on the same GPU, a small tile sweep, and end-to-end decode tok/s.

    python bench/gpu_check.py [--budget-s 330] [--json-out F] [--skip-sweep] [--skip-e2e] [--model M.gguf]
    python bench/gpu_check.py --device cpu     # tiny shapes under TRITON_INTERPRET=1: every code path, no timing value
    python bench/gpu_check.py --compile-only   # no GPU: compile every kernel for sm_90, report registers / spills

Prints ONE table. Exit status: 0 every check passed, 1 a correctness check failed, 2 no CUDA device.
Sections past the time budget are reported as skipped rather than run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Shapes:
    hidden: int
    ffn: int
    vocab: int
    ms: tuple[int, ...]
    prefill_m: int
    ctx: int
    n_q: int
    n_kv: int
    d_swa: int
    d_full: int
    window: int
    block: int
    copy_bytes: int


E4B = Shapes(hidden=2560, ffn=10240, vocab=262144, ms=(1, 2, 4, 8, 16), prefill_m=512, ctx=4096, n_q=8, n_kv=2,
             d_swa=256, d_full=512, window=512, block=16, copy_bytes=1 << 30)
# the dry run: every code path once (GEMV, small-M, GEMM; each quant type; each attention form), interpreter-sized
TINY = Shapes(hidden=256, ffn=256, vocab=64, ms=(1, 8), prefill_m=20, ctx=48, n_q=4, n_kv=2,
              d_swa=32, d_full=64, window=16, block=4, copy_bytes=8 << 20)


@dataclass
class Row:
    name: str
    shape: str
    m: str = ""
    us: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_copy: float | None = None
    check: str = ""
    note: str = ""


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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: tiny shapes through the Triton interpreter (a dry run of every code path)")
    p.add_argument("--dry-run", action="store_true", help="same as --device cpu")
    p.add_argument("--budget-s", type=float, default=330.0, help="wall-clock budget; later sections are skipped")
    p.add_argument("--json-out", type=Path, help="also write the rows as JSON here")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--model", type=Path, help="e4b GGUF for the end-to-end decode (default: write a random one)")
    p.add_argument("--draft", type=Path, help="DFlash drafter GGUF (default: write a random one)")
    p.add_argument("--compile-only", type=int, metavar="SM", nargs="?", const=90,
                   help="no GPU needed: compile every kernel for sm_SM (default 90 = H100/H200), report regs/spills")
    p.add_argument("--only", help="with --compile-only: comma-separated labels to compile (default: all)")
    args = p.parse_args(argv)
    if args.dry_run:
        args.device = "cpu"
    return args


# ------------------------------------------------------------------------------------------------------ measuring

def timed(ctx: Ctx, fn: Callable[[], object]) -> tuple[float, str]:
    """Microseconds per call: CUDA-graph replay (no launch overhead) on a GPU, one interpreted call on the CPU."""
    if ctx.device == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e6, "interp"
    testing = ctx.triton.testing
    try:
        return testing.do_bench_cudagraph(fn, rep=20) * 1e3, "graph"
    except Exception:  # e.g. an op that cannot be captured; plain events still measure it
        return testing.do_bench(fn, warmup=5, rep=25) * 1e3, "events"


def rel_err(out, ref) -> float:
    out, ref = out.float(), ref.float()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def verdict(err: float, tol: float) -> str:
    return f"ok {err:.1e}" if err <= tol else f"FAIL {err:.1e}"


def add(ctx: Ctx, name: str, shape: str, m, fn, *, nbytes: float = 0.0, flops: float = 0.0, check: str = "",
        note: str = "") -> Row:
    us, how = timed(ctx, fn)
    row = Row(name, shape, str(m), us, check=check, note=" ".join(x for x in (how, note) if x))
    if nbytes:
        row.gbps = nbytes / us / 1e3
        if ctx.copy_gbps:
            row.pct_copy = 100.0 * row.gbps / ctx.copy_gbps
    if flops:
        row.tflops = flops / us / 1e6
    ctx.rows.append(row)
    return row


def skip(ctx: Ctx, name: str, why: str) -> None:
    ctx.rows.append(Row(name, "", check=f"skipped: {why}"))


def tol(ctx: Ctx) -> float:
    # bf16 activations (and bf16 dot inputs) on the GPU; fp32 everywhere in the interpreter
    return 2e-2 if ctx.dtype == ctx.torch.bfloat16 else 1e-5


# ------------------------------------------------------------------------------------------------------ sections

def section_copy(ctx: Ctx) -> None:
    torch = ctx.torch
    x = torch.ones(ctx.shapes.copy_bytes, dtype=torch.uint8, device=ctx.device)
    row = add(ctx, "copy (torch clone)", f"{ctx.shapes.copy_bytes >> 20} MiB", "", lambda: x.clone(),
              nbytes=2 * x.numel(), note="read+write")
    ctx.copy_gbps = row.gbps
    row.pct_copy = 100.0


def section_qmatmul(ctx: Ctx) -> None:
    torch = ctx.torch
    from bolt_ros.kernels import quant_ref as qr
    from bolt_ros.kernels.qmatmul import qmatmul_triton

    s = ctx.shapes
    matrices = (("ffn_up", s.ffn, s.hidden), ("ffn_down", s.hidden, s.ffn), ("lm_head", s.vocab, s.hidden))
    plan = [(ty, name, n, k) for ty in (qr.Q4_K, qr.Q6_K) for name, n, k in matrices]
    plan += [(ty, "ffn_up", s.ffn, s.hidden) for ty in (qr.Q8_0, qr.Q5_0, qr.Q4_0, qr.Q4_1, qr.Q5_K)]
    for ty, name, n, k in plan:
        label = f"qmatmul {qr.TYPE_NAMES[ty]} {name}"
        if ctx.left() < 20:
            skip(ctx, label, "time budget")
            continue
        raw = qr.random_blocks(ty, n, k, device=ctx.device, scale=0.002)
        w = qr.dequantize_torch(raw, ty, n, k)  # [N, K] fp32 reference weights, once per matrix
        ms = (*s.ms, s.prefill_m) if ty in (qr.Q4_K, qr.Q6_K) else s.ms[::2]
        for m in ms:
            x = torch.randn(m, k, device=ctx.device).to(ctx.dtype)
            out = qmatmul_triton(x, raw, ty, n, k)
            check = verdict(rel_err(out, x.float() @ w.T), tol(ctx))
            nbytes = raw.numel() + (x.numel() + out.numel()) * x.element_size()
            add(ctx, label, f"{n}x{k}", m, lambda x=x, raw=raw, ty=ty, n=n, k=k: qmatmul_triton(x, raw, ty, n, k),
                nbytes=nbytes,
                flops=2.0 * m * n * k, check=check, note="gemv" if m == 1 else ("small-M" if m <= 16 else "gemm"))
        del raw, w
        if ctx.device == "cuda":
            torch.cuda.empty_cache()


def section_attention(ctx: Ctx) -> None:
    torch = ctx.torch
    from bolt_ros.kernels import attention as at

    s = ctx.shapes
    for d, window, scale_name in ((s.d_swa, s.window, "swa"), (s.d_full, 0, "full")):
        if ctx.left() < 15:
            skip(ctx, f"attention d={d}", "time budget")
            continue
        k = torch.randn(s.n_kv, s.ctx, d, device=ctx.device).to(ctx.dtype)
        v = torch.randn(s.n_kv, s.ctx, d, device=ctx.device).to(ctx.dtype)
        scale = 1.0 / d  # ~ Gemma 4 (scale 1.0 on unit-RMS q/k of norm sqrt(d)) with unit-variance random q, k
        seen = min(s.ctx, window) if window else s.ctx
        kv_bytes = 2 * s.n_kv * seen * d * k.element_size()
        shape = f"ctx={s.ctx} d={d} {s.n_q}q/{s.n_kv}kv" + (f" win={window}" if window else "")

        q1 = torch.randn(s.n_q, d, device=ctx.device).to(ctx.dtype)
        ref = at.attention_decode_torch(q1, k, v, s.ctx, scale, window=window)
        err = rel_err(at.attention_decode_triton(q1, k, v, s.ctx, scale, window=window), ref)
        add(ctx, f"attn decode {scale_name}", shape, 1,
            lambda q1=q1, k=k, v=v, scale=scale, window=window:
            at.attention_decode_triton(q1, k, v, s.ctx, scale, window=window),
            nbytes=kv_bytes, check=verdict(err, tol(ctx)))

        qb = torch.randn(s.block, s.n_q, d, device=ctx.device).to(ctx.dtype)
        start = s.ctx - s.block
        ref = at.attention_block_torch(qb, k, v, start, scale, window=window)
        err = rel_err(at.attention_block_triton(qb, k, v, start, scale, window=window), ref)
        add(ctx, f"attn dflash-block {scale_name}", shape, s.block,
            lambda qb=qb, k=k, v=v, scale=scale, window=window, start=start:
            at.attention_block_triton(qb, k, v, start, scale, window=window),
            nbytes=kv_bytes, check=verdict(err, tol(ctx)))

        qp = torch.randn(s.ctx, s.n_q, d, device=ctx.device).to(ctx.dtype)
        ref = at.attention_prefill_torch(qp, k, v, 0, scale, window=window)
        err = rel_err(at.attention_prefill_triton(qp, k, v, 0, scale, window=window), ref)
        pairs = sum(min(i + 1, window) if window else i + 1 for i in range(s.ctx))  # visible (query, key) pairs
        add(ctx, f"attn prefill {scale_name}", shape, s.ctx,
            lambda qp=qp, k=k, v=v, scale=scale, window=window:
            at.attention_prefill_triton(qp, k, v, 0, scale, window=window),
            flops=4.0 * s.n_q * d * pairs, check=verdict(err, tol(ctx)))
        del k, v, ref


def section_small_ops(ctx: Ctx) -> None:
    torch = ctx.torch
    from bolt_ros.kernels import activation, logits, norm, rope

    s, dev, dt = ctx.shapes, ctx.device, ctx.dtype
    for m in (1, s.block):
        x = torch.randn(m, s.hidden, device=dev).to(dt)
        r = torch.randn(m, s.hidden, device=dev).to(dt)
        w = torch.rand(s.hidden, device=dev).to(dt)
        err = rel_err(norm.rms_norm_add_triton(x, w, r, 1e-6), norm.rms_norm_add_torch(x, w, r, 1e-6))
        add(ctx, "rms_norm + residual", f"{m}x{s.hidden}", m,
            lambda x=x, w=w, r=r: norm.rms_norm_add_triton(x, w, r, 1e-6),
            nbytes=3 * x.numel() * x.element_size(), check=verdict(err, tol(ctx)))

        q = torch.randn(m, s.n_q, s.d_full, device=dev).to(dt)
        pos = torch.arange(s.ctx - m, s.ctx, device=dev)
        inv = rope.rope_inv_freq(1e6, s.d_full, rotary_pairs=s.d_full // 8, device=dev)
        err = rel_err(rope.rope_triton(q, pos, inv), rope.rope_torch(q, pos, inv))
        add(ctx, "rope proportional", f"{m}x{s.n_q}x{s.d_full}", m,
            lambda q=q, pos=pos, inv=inv: rope.rope_triton(q, pos, inv),
            nbytes=2 * q.numel() * q.element_size(), check=verdict(err, tol(ctx)))

        g = torch.randn(m, s.ffn, device=dev).to(dt)
        u = torch.randn(m, s.ffn, device=dev).to(dt)
        err = rel_err(activation.gelu_tanh_mul_triton(g, u), activation.gelu_tanh_mul_torch(g, u))
        add(ctx, "gelu_tanh_mul", f"{m}x{s.ffn}", m, lambda g=g, u=u: activation.gelu_tanh_mul_triton(g, u),
            nbytes=3 * g.numel() * g.element_size(), check=verdict(err, tol(ctx)))

        lg = (torch.randn(m, s.vocab, device=dev) * 10).to(dt)
        capped, ids = logits.softcap_argmax_triton(lg, 30.0)
        ref_capped, _ = logits.softcap_argmax_torch(lg, 30.0)
        ok = bool(torch.equal(ids, capped.argmax(-1)))  # ids must be the argmax of what the kernel returns
        check = verdict(rel_err(capped, ref_capped), tol(ctx)) if ok else "FAIL argmax"
        add(ctx, "softcap_argmax", f"{m}x{s.vocab}", m, lambda lg=lg: logits.softcap_argmax_triton(lg, 30.0),
            nbytes=2 * lg.numel() * lg.element_size(), check=check)


def section_sweep(ctx: Ctx) -> None:
    """A few tile configs of the decode-critical matmuls (defaults were chosen without a GPU)."""
    torch = ctx.torch
    from bolt_ros.kernels import quant_ref as qr
    from bolt_ros.kernels.qmatmul import qmatmul_triton

    s = ctx.shapes
    gemv = [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": nw} for bn in (4, 8, 16, 32) for bk in (256, 512)
            for nw in (4,)] + [{"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 8}]
    small = [{"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4} for bn in (16, 32, 64) for bk in (128, 256)]
    matrices = ((s.ffn, s.hidden), (s.hidden, s.ffn))
    if ctx.device == "cpu":
        gemv, small, matrices = gemv[:2], small[:2], matrices[:1]
    for n, k in matrices:
        raw = qr.random_blocks(qr.Q4_K, n, k, device=ctx.device, scale=0.002)
        ref_w = qr.dequantize_torch(raw, qr.Q4_K, n, k)
        for m, configs in ((1, gemv), (8, small)):
            x = torch.randn(m, k, device=ctx.device).to(ctx.dtype)
            ref = x.float() @ ref_w.T
            best = None
            for cfg in configs:
                if ctx.left() < 10:
                    skip(ctx, f"tune Q4_K {n}x{k} M={m}", "time budget")
                    break
                check = verdict(rel_err(qmatmul_triton(x, raw, qr.Q4_K, n, k, config=cfg), ref), tol(ctx))
                desc = " ".join(f"{key.replace('BLOCK_', '')}={val}" for key, val in cfg.items())
                row = add(ctx, f"tune Q4_K {'gemv' if m == 1 else 'small-M'}", f"{n}x{k}", m,
                          lambda x=x, cfg=cfg, raw=raw, n=n, k=k: qmatmul_triton(x, raw, qr.Q4_K, n, k, config=cfg),
                          nbytes=raw.numel(), check=check, note=desc)
                if best is None or row.us < best.us:
                    best = row
            if best is not None:
                best.note += " BEST"


def _find_number(obj, key: str) -> float | None:
    if isinstance(obj, dict):
        for k_, v_ in obj.items():
            if k_ == key and isinstance(v_, (int, float)):
                return float(v_)
            found = _find_number(v_, key)
            if found is not None:
                return found
    return None


def _bolt(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([sys.executable, "-m", "bolt_ros.cli", *args], capture_output=True, text=True,
                          timeout=max(1.0, timeout), env=env, cwd=ROOT)


def _last_line(res: subprocess.CompletedProcess) -> str:
    lines = (res.stderr or res.stdout or "").strip().splitlines()
    return lines[-1][:80] if lines else f"exit {res.returncode}"


def _weight_bytes_per_token(path: Path) -> int:
    """Bytes one decode step must read: every tensor except the per-layer token table (one row of it is read)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    total = 0
    for t in reader.tensors:
        nbytes = int(t.n_bytes)
        total += nbytes // int(t.shape[-1]) if t.name == "per_layer_token_embd.weight" else nbytes
    return total


def section_e2e(ctx: Ctx, args: argparse.Namespace) -> None:
    """Decode tok/s of the random e4b Q4_K_M model, without and with a random DFlash drafter (optional section)."""
    names = ("e2e decode e4b q4_k_m", "e2e decode e4b + dflash")
    if ctx.device == "cpu":
        for name in names:
            skip(ctx, name, "needs a GPU (--device cpu is a dry run)")
        return
    try:
        help_text = _bolt(["--help"], 60).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        help_text = f"{exc}"
    for needed in ("testmodel", "bench"):
        if needed not in help_text:
            for name in names:
                skip(ctx, name, f"`bolt {needed}` not available in this tree")
            return
    work = Path(tempfile.mkdtemp(prefix="bolt_gpu_check_"))
    try:
        model = args.model or work / "e4b-q4_k_m.gguf"
        if args.model is None:
            res = _bolt(["testmodel", "--arch", "gemma4", "--preset", "e4b", "--quant", "q4_k_m", "--seed", "0",
                         "--out", str(model)], ctx.left() - 30)
            if res.returncode != 0:
                for name in names:
                    skip(ctx, name, "testmodel failed: " + _last_line(res))
                return
        per_token = _weight_bytes_per_token(model)
        device_flag = ["--device", "cuda"] if "--device" in _bolt(["bench", "--help"], 60).stdout else []
        bench = ["bench", "--model", str(model), "--prompt-tokens", "128", "--gen-tokens", "128", "--json",
                 *device_flag]
        draft = args.draft
        for name, extra in ((names[0], []), (names[1], ["--draft"])):
            if ctx.left() < 20:
                skip(ctx, name, "time budget")
                continue
            if extra:
                if draft is None:
                    draft = work / "dflash.gguf"
                    res = _bolt(["testmodel", "--arch", "dflash", "--target", str(model), "--layers", "5", "--seed",
                                 "0", "--out", str(draft)], ctx.left() - 20)
                    if res.returncode != 0:
                        skip(ctx, name, "dflash testmodel failed: " + _last_line(res))
                        continue
                extra = ["--draft", str(draft)]
            res = _bolt(bench + extra, ctx.left() - 5)
            tok_s = None
            if res.returncode == 0:
                match = re.search(r"\{.*\}", res.stdout, re.S)
                tok_s = _find_number(json.loads(match.group(0)), "decode_tok_s") if match else None
            if tok_s is None:
                skip(ctx, name, "bolt bench failed: " + _last_line(res))
                continue
            row = Row(name, f"{per_token / 1e9:.2f} GB/token", "1", 1e6 / tok_s, gbps=tok_s * per_token / 1e9,
                      check=f"{tok_s:.1f} tok/s", note="bolt bench")
            if ctx.copy_gbps:
                row.pct_copy = 100.0 * row.gbps / ctx.copy_gbps
                row.note += f", roofline {ctx.copy_gbps * 1e9 / per_token:.0f} tok/s"
            ctx.rows.append(row)
    except subprocess.TimeoutExpired:
        skip(ctx, "e2e decode", "time budget (subprocess timed out)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------------------------------------------ compile only

def _compile_specs(dt: str) -> list[tuple[str, object, dict, dict, int]]:
    """(label, kernel, runtime arg types, constexprs, num_warps) for every kernel variant the GPU run launches."""
    from bolt_ros.kernels import activation, attention, logits, norm, qmatmul, rope
    from bolt_ros.kernels import quant_ref as qr

    i32 = "i32"
    specs = []
    mm_args = {"x_ptr": f"*{dt}", "w_ptr": "*u8", "w16_ptr": "*fp16", "out_ptr": f"*{dt}", "N": i32, "K": i32,
               "row_bytes": i32, "stride_xm": i32, "stride_om": i32}
    for ty in qmatmul.SUPPORTED_TYPES:
        _, bb, sub = qr.BLOCKS[ty]
        for m in (1, 8, 64):
            cfg = qmatmul.default_config(m, 4096, 4096, ty)
            consts = {"TYPE": ty, "BB": bb, "SUB": sub, "BLOCK_N": cfg["BLOCK_N"], "G": cfg["BLOCK_K"] // sub}
            if m == 1:
                specs.append((f"qgemv {qr.TYPE_NAMES[ty]}", qmatmul._qgemv_kernel, mm_args, consts, cfg["num_warps"]))
            else:
                consts["BLOCK_M"] = cfg["BLOCK_M"]
                specs.append((f"qmm {qr.TYPE_NAMES[ty]} BM={cfg['BLOCK_M']}", qmatmul._qmm_kernel,
                              {**mm_args, "M": i32}, consts, cfg["num_warps"]))
    for d in (256, 512):
        bm, bn, warps = attention._fwd_config(d)
        fwd = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "o_ptr": f"*{dt}", "T": i32, "start": i32,
               "window": i32, "qk_scale": "fp32", **{n: i32 for n in ("sq_t", "sq_h", "sk_h", "sk_s", "sv_h", "sv_s",
                                                                        "so_t", "so_h")}}
        for causal in (True, False):
            specs.append((f"attn {'prefill' if causal else 'dflash-block'} d={d}", attention._attn_fwd_kernel, fwd,
                          {"GROUP": 4, "D": d, "BLOCK_D": d, "CAUSAL": causal, "BLOCK_M": bm, "BLOCK_N": bn}, warps))
        part = {"q_ptr": f"*{dt}", "k_ptr": f"*{dt}", "v_ptr": f"*{dt}", "m_ptr": "*fp32", "l_ptr": "*fp32",
                "acc_ptr": "*fp32", "lo": i32, "n_kv": i32, "split_len": i32, "qk_scale": "fp32", "sq_h": i32,
                "sk_h": i32, "sk_s": i32, "sv_h": i32, "sv_s": i32, "n_splits": i32}
        specs.append((f"attn decode d={d}", attention._decode_partial_kernel, part,
                      {"GROUP": 4, "BLOCK_G": 16, "D": d, "BLOCK_D": d, "BLOCK_S": 32}, 4 if d <= 256 else 8))
        specs.append((f"attn decode merge d={d}", attention._decode_merge_kernel,
                      {"m_ptr": "*fp32", "l_ptr": "*fp32", "acc_ptr": "*fp32", "o_ptr": f"*{dt}", "so_h": i32,
                       "n_splits": i32}, {"D": d, "BLOCK_DC": 128, "BLOCK_SPLITS": 64}, 4))
        specs.append((f"rope d={d}", rope._rope_kernel,
                      {"x_ptr": f"*{dt}", "pos_ptr": "*i64", "f_ptr": "*fp32", "o_ptr": f"*{dt}", "sx_t": i32,
                       "sx_h": i32, "so_t": i32, "so_h": i32, "P": i32, "half": i32}, {"D": d, "BLOCK_D": d}, 4))
    for mode in (0, 1, 2):
        specs.append((f"rms_norm mode={mode}", norm._rms_norm_kernel,
                      {"x_ptr": f"*{dt}", "r_ptr": f"*{dt}", "w_ptr": f"*{dt}", "y_ptr": f"*{dt}", "s_ptr": f"*{dt}",
                       "D": i32, "eps": "fp32"}, {"MODE": mode, "HAS_WEIGHT": True, "BLOCK_D": 4096}, 8))
    specs.append(("gelu_tanh_mul", activation._gelu_tanh_mul_kernel,
                  {"g_ptr": f"*{dt}", "u_ptr": f"*{dt}", "o_ptr": f"*{dt}", "n": i32}, {"BLOCK": 1024}, 4))
    specs.append(("softcap_argmax", logits._softcap_argmax_kernel,
                  {"x_ptr": f"*{dt}", "o_ptr": f"*{dt}", "pv_ptr": "*fp32", "pi_ptr": "*i32", "V": i32,
                   "n_chunks": i32, "cap": "fp32", "inv_cap": "fp32"},
                  {"HAS_CAP": True, "CHUNK": logits._CHUNK, "BLOCK": 1024}, 4))
    return specs


def section_compile(ctx: Ctx, arch: int, only: str | None = None) -> None:
    """Compile every kernel variant to a cubin for sm_`arch` (no GPU needed) and report registers and spills."""
    triton = ctx.triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    wanted = set(only.split(",")) if only else None
    for label, fn, args, consts, warps in _compile_specs("bf16"):
        if wanted is not None and label not in wanted:
            continue
        sig = {name: ("constexpr" if name in consts else args[name]) for name in fn.arg_names}
        t0 = time.perf_counter()
        try:
            kernel = triton.compile(ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", arch, 32),
                                    options={"num_warps": warps})
        except Exception as exc:  # a kernel that does not compile is exactly what this mode is for
            ctx.rows.append(Row(f"compile {label}", f"sm_{arch}", check=f"FAIL {type(exc).__name__}"[:60],
                                note=str(exc).splitlines()[0][:100] if str(exc) else ""))
            continue
        usage = ""
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(kernel.asm["cubin"])
            f.flush()
            if cuobjdump.exists():
                out = subprocess.run([str(cuobjdump), "-res-usage", f.name], capture_output=True, text=True).stdout
                found = re.search(r"REG:(\d+).*?LOCAL:(\d+)", out)
                usage = f"regs={found.group(1)} local={found.group(2)}" if found else ""
        spills = usage.endswith("local=0") or not usage
        ctx.rows.append(Row(f"compile {label}", f"sm_{arch}", "", (time.perf_counter() - t0) * 1e6,
                            check="ok" if spills else "ok (spills)",
                            note=f"{usage} warps={warps} smem={kernel.metadata.shared}"))


# ------------------------------------------------------------------------------------------------------ report

def targets(ctx: Ctx) -> None:
    """The issue's targets, computed from the measured rows."""
    def find(name: str, shape: str, m: int) -> Row | None:
        return next((r for r in ctx.rows if r.name == name and r.shape == shape and r.m == str(m) and r.us), None)

    s = ctx.shapes
    shape = f"{s.ffn}x{s.hidden}"
    m1, m8 = find("qmatmul Q4_K ffn_up", shape, 1), find("qmatmul Q4_K ffn_up", shape, 8)
    if m1 and m1.pct_copy is not None:
        ctx.rows.append(Row("target: Q4_K GEMV >= 70% copy", shape, "1", pct_copy=m1.pct_copy,
                            check="met" if m1.pct_copy >= 70 else "missed"))
    if m1 and m8:
        ratio = m8.us / m1.us
        ctx.rows.append(Row("target: Q4_K M=8 <= 1.5x M=1", shape, "8", check="met" if ratio <= 1.5 else "missed",
                            note=f"ratio {ratio:.2f}"))
    e2e = next((r for r in ctx.rows if r.name == "e2e decode e4b q4_k_m" and r.pct_copy is not None), None)
    if e2e:
        ctx.rows.append(Row("target: e2e decode >= 40% roofline", e2e.shape, "1", pct_copy=e2e.pct_copy,
                            check="met" if e2e.pct_copy >= 40 else "missed"))


def fmt(v: float | None, spec: str) -> str:
    return "" if v is None else format(v, spec)


def print_table(ctx: Ctx, header: str) -> None:
    cols = ("kernel", "shape", "M", "time_us", "GB/s", "TFLOP/s", "%copy", "check", "note")
    body = [(r.name, r.shape, r.m, fmt(r.us, ".1f"), fmt(r.gbps, ".0f"), fmt(r.tflops, ".2f"), fmt(r.pct_copy, ".0f"),
             r.check, r.note) for r in ctx.rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) for i, c in enumerate(cols)]
    line = "  ".join("-" * w for w in widths)
    print(header)
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print(line)
    for b in body:
        print("  ".join(v.ljust(w) for v, w in zip(b, widths)))
    print(line)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import torch

    if args.compile_only:
        import triton

        sys.path.insert(0, str(ROOT))
        ctx = Ctx(torch, triton, "cpu", torch.bfloat16, E4B, started + args.budget_s)
        section_compile(ctx, args.compile_only, args.only)
        print_table(ctx, f"gpu_check --compile-only: sm_{args.compile_only}, triton {triton.__version__}")
        return 1 if any(r.check.startswith("FAIL") for r in ctx.rows) else 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device: torch {torch.__version__} (CUDA build: {torch.version.cuda}) sees no GPU "
              f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); "
              "run on the GPU machine, or `--device cpu` for a dry run", file=sys.stderr)
        return 2
    import triton
    import triton.testing  # do_bench lives here

    sys.path.insert(0, str(ROOT))
    if args.device == "cuda":
        shapes, dtype = E4B, torch.bfloat16
        props = torch.cuda.get_device_properties(0)
        header = (f"gpu_check: {props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB; "
                  f"torch {torch.__version__}, triton {triton.__version__}")
    else:
        shapes, dtype = TINY, torch.float32
        header = f"gpu_check DRY RUN on CPU (Triton interpreter, tiny shapes); torch {torch.__version__}, " \
                 f"triton {triton.__version__}"
    torch.manual_seed(0)
    ctx = Ctx(torch, triton, args.device, dtype, shapes, started + args.budget_s)
    sections = [("copy", section_copy), ("qmatmul", section_qmatmul), ("attention", section_attention),
                ("small ops", section_small_ops)]
    if not args.skip_sweep:
        sections.append(("sweep", section_sweep))
    for name, fn in sections:
        if ctx.left() <= 0:
            skip(ctx, name, "time budget")
            continue
        try:
            fn(ctx)
        except Exception as exc:  # one broken section must not hide the others' numbers
            ctx.rows.append(Row(f"{name} (section)", "", check=f"FAIL {type(exc).__name__}: {exc}"[:160]))
    if args.skip_e2e:
        skip(ctx, "e2e decode", "--skip-e2e")
    else:
        section_e2e(ctx, args)
    targets(ctx)
    print_table(ctx, header + f"; {time.monotonic() - started:.0f} s")
    if args.json_out:
        args.json_out.write_text(json.dumps({"header": header, "rows": [asdict(r) for r in ctx.rows]}, indent=1))
    return 1 if any(r.check.startswith("FAIL") for r in ctx.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
