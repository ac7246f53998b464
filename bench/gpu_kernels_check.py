"""The GPU check's kernel sections: copy roofline, the fused GGUF dequant-matmul per quant type, attention, the small
ops, a tile sweep, and --compile-only (every kernel variant compiled for sm_XX without a GPU).

Every timed row also checks the kernel's output against its torch reference on the same device (`check` column).
qmatmul rows go through the engine's facade `ops.qmatmul_gguf` (Triton on CUDA; under --device cpu the script sets
BOLT_KERNELS=triton so the interpreter runs the same kernels); their operands are rotated copies larger than L2.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path

from gpu_common import Ctx, Row, add, rel_err, rotated, skip, tol, verdict

QMATMUL_TYPES = ("Q4_K", "Q6_K", "Q5_0", "Q8_0")  # the reported set: GB/s and % of copy at M=1 and M=block
OTHER_TYPES = ("Q4_0", "Q4_1", "Q5_1", "Q5_K")  # correctness (and a GEMV number) for the rest of SUPPORTED_TYPES


def section_copy(ctx: Ctx) -> None:
    torch = ctx.torch
    x = torch.ones(ctx.shapes.copy_bytes, dtype=torch.uint8, device=ctx.device)
    row = add(ctx, "copy (torch clone)", f"{ctx.shapes.copy_bytes >> 20} MiB", "", lambda: x.clone(),
              check=lambda out: "ok" if bool(torch.equal(out, x)) else "FAIL clone differs",
              nbytes=2 * x.numel(), note="read+write")
    ctx.copy_gbps = row.gbps
    row.pct_copy = 100.0


def _copy(t, i: int):
    return t if i == 0 else t.clone()


def section_qmatmul(ctx: Ctx) -> None:
    torch = ctx.torch
    from bolt_ros.kernels import ops
    from bolt_ros.kernels import quant_ref as qr

    s = ctx.shapes
    by_name = {v: k for k, v in qr.TYPE_NAMES.items()}
    up, down, head = ("ffn_up", s.ffn, s.hidden), ("ffn_down", s.hidden, s.ffn), ("lm_head", s.vocab, s.hidden)
    plan = []
    for name in QMATMUL_TYPES:
        prefill = (s.prefill_m,) if name in ("Q4_K", "Q6_K") else ()
        plan += [(name, up, (1, s.block, *prefill)), (name, down, (1, s.block))]
    plan.append(("Q6_K", head, (1, s.block)))  # the output head's type in a Q4_K_M file
    plan += [(name, up, (1,)) for name in OTHER_TYPES]
    for name, (mat, n, k), ms in plan:
        ty, label = by_name[name], f"qmatmul {name} {mat}"
        if ctx.left() < 20:
            skip(ctx, label, "time budget", f"{n}x{k}")
            continue
        raw = qr.random_blocks(ty, n, k, device=ctx.device, scale=0.002)
        w = qr.dequantize_torch(raw, ty, n, k)  # [N, K] fp32 reference weights, once per matrix
        raws = rotated(ctx, raw.numel(), partial(_copy, raw))
        for m in ms:
            x = torch.randn(m, k, device=ctx.device).to(ctx.dtype)
            ref = x.float() @ w.T
            add(ctx, label, f"{n}x{k}", m,
                [partial(ops.qmatmul_gguf, x, r, ty, n, k) for r in raws], check=_close(ctx, ref),
                nbytes=raw.numel() + (m * k + m * n) * x.element_size(), flops=2.0 * m * n * k,
                note="gemv" if m == 1 else ("small-M" if m <= 16 else "gemm"))
        del raw, raws, w
        if ctx.device == "cuda":
            torch.cuda.empty_cache()


def _close(ctx: Ctx, ref):
    """The check of one row: relative error against the torch reference `ref`."""
    return lambda out: verdict(rel_err(out, ref), tol(ctx))


def section_attention(ctx: Ctx) -> None:
    torch = ctx.torch
    from bolt_ros.kernels import attention as at

    s = ctx.shapes
    for d, window, kind in ((s.d_swa, s.window, "swa"), (s.d_full, 0, "full")):
        if ctx.left() < 15:
            skip(ctx, f"attention {kind} d={d}", "time budget")
            continue
        k = torch.randn(s.n_kv, s.ctx, d, device=ctx.device).to(ctx.dtype)
        v = torch.randn(s.n_kv, s.ctx, d, device=ctx.device).to(ctx.dtype)
        kvs = rotated(ctx, 2 * k.numel() * k.element_size(), lambda i, k=k, v=v: (_copy(k, i), _copy(v, i)))
        scale = 1.0 / d  # ~ Gemma 4 (scale 1.0 on unit-RMS q/k of norm sqrt(d)) with unit-variance random q, k
        seen = min(s.ctx, window) if window else s.ctx
        kv_bytes = 2 * s.n_kv * seen * d * k.element_size()
        shape = f"ctx={s.ctx} d={d} {s.n_q}q/{s.n_kv}kv" + (f" win={window}" if window else "")

        q1 = torch.randn(s.n_q, d, device=ctx.device).to(ctx.dtype)
        ref = at.attention_decode_torch(q1, k, v, s.ctx, scale, window=window)
        add(ctx, f"attn decode {kind}", shape, 1,
            [partial(at.attention_decode_triton, q1, kk, vv, s.ctx, scale, window=window) for kk, vv in kvs],
            check=_close(ctx, ref), nbytes=kv_bytes)

        qb = torch.randn(s.block, s.n_q, d, device=ctx.device).to(ctx.dtype)
        start = s.ctx - s.block
        ref = at.attention_block_torch(qb, k, v, start, scale, window=window)
        add(ctx, f"attn dflash-block {kind}", shape, s.block,
            [partial(at.attention_block_triton, qb, kk, vv, start, scale, window=window) for kk, vv in kvs],
            check=_close(ctx, ref), nbytes=kv_bytes)

        qp = torch.randn(s.ctx, s.n_q, d, device=ctx.device).to(ctx.dtype)
        ref = at.attention_prefill_torch(qp, k, v, 0, scale, window=window)
        pairs = sum(min(i + 1, window) if window else i + 1 for i in range(s.ctx))  # visible (query, key) pairs
        add(ctx, f"attn prefill {kind}", shape, s.ctx, partial(at.attention_prefill_triton, qp, k, v, 0, scale,
                                                               window=window),
            check=_close(ctx, ref), flops=4.0 * s.n_q * d * pairs)
        del k, v, kvs, ref


def _softcap_check(ctx: Ctx, ref_capped):
    def check(out) -> str:
        capped, ids = out
        if not bool(ctx.torch.equal(ids, capped.argmax(-1))):  # ids must be the argmax of what the kernel returns
            return "FAIL argmax"
        return verdict(rel_err(capped, ref_capped), tol(ctx))
    return check


def section_small_ops(ctx: Ctx) -> None:
    torch = ctx.torch
    from bolt_ros.kernels import activation, logits, norm, rope

    s, dev, dt = ctx.shapes, ctx.device, ctx.dtype
    for m in (1, s.block):
        x = torch.randn(m, s.hidden, device=dev).to(dt)
        r = torch.randn(m, s.hidden, device=dev).to(dt)
        w = torch.rand(s.hidden, device=dev).to(dt)
        add(ctx, "rms_norm + residual", f"{m}x{s.hidden}", m, partial(norm.rms_norm_add_triton, x, w, r, 1e-6),
            check=_close(ctx, norm.rms_norm_add_torch(x, w, r, 1e-6)), nbytes=3 * x.numel() * x.element_size())

        q = torch.randn(m, s.n_q, s.d_full, device=dev).to(dt)
        pos = torch.arange(s.ctx - m, s.ctx, device=dev)
        inv = rope.rope_inv_freq(1e6, s.d_full, rotary_pairs=s.d_full // 8, device=dev)
        add(ctx, "rope proportional", f"{m}x{s.n_q}x{s.d_full}", m, partial(rope.rope_triton, q, pos, inv),
            check=_close(ctx, rope.rope_torch(q, pos, inv)), nbytes=2 * q.numel() * q.element_size())

        g = torch.randn(m, s.ffn, device=dev).to(dt)
        u = torch.randn(m, s.ffn, device=dev).to(dt)
        add(ctx, "gelu_tanh_mul", f"{m}x{s.ffn}", m, partial(activation.gelu_tanh_mul_triton, g, u),
            check=_close(ctx, activation.gelu_tanh_mul_torch(g, u)), nbytes=3 * g.numel() * g.element_size())

        lg = (torch.randn(m, s.vocab, device=dev) * 10).to(dt)
        add(ctx, "softcap_argmax", f"{m}x{s.vocab}", m, partial(logits.softcap_argmax_triton, lg, 30.0),
            check=_softcap_check(ctx, logits.softcap_argmax_torch(lg, 30.0)[0]),
            nbytes=2 * lg.numel() * lg.element_size())


def section_sweep(ctx: Ctx) -> None:
    """A few tile configs of the decode-critical matmuls (defaults were chosen without a GPU)."""
    torch = ctx.torch
    from bolt_ros.kernels import quant_ref as qr
    from bolt_ros.kernels.qmatmul import qmatmul_triton

    s = ctx.shapes
    gemv = [{"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4} for bn in (4, 8, 16, 32) for bk in (256, 512)]
    gemv.append({"BLOCK_N": 16, "BLOCK_K": 512, "num_warps": 8})
    small = [{"BLOCK_M": 16, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4} for bn in (16, 32, 64) for bk in (128, 256)]
    matrices = ((s.ffn, s.hidden), (s.hidden, s.ffn))
    if ctx.device == "cpu":
        gemv, small, matrices = gemv[:2], small[:2], matrices[:1]
    for n, k in matrices:
        raw = qr.random_blocks(qr.Q4_K, n, k, device=ctx.device, scale=0.002)
        ref_w = qr.dequantize_torch(raw, qr.Q4_K, n, k)
        raws = rotated(ctx, raw.numel(), partial(_copy, raw))
        for m, configs in ((1, gemv), (s.block, small)):
            x = torch.randn(m, k, device=ctx.device).to(ctx.dtype)
            ref = x.float() @ ref_w.T
            best = None
            for cfg in configs:
                if ctx.left() < 10:
                    skip(ctx, f"tune Q4_K {n}x{k} M={m}", "time budget")
                    break
                desc = " ".join(f"{key.replace('BLOCK_', '')}={val}" for key, val in cfg.items())
                row = add(ctx, f"tune Q4_K {'gemv' if m == 1 else 'small-M'}", f"{n}x{k}", m,
                          [partial(qmatmul_triton, x, r, qr.Q4_K, n, k, config=cfg) for r in raws],
                          check=_close(ctx, ref), nbytes=raw.numel(), note=desc)
                if best is None or row.us < best.us:
                    best = row
            if best is not None:
                best.note += " BEST"
        del raw, raws, ref_w


KERNEL_SECTIONS = {"copy": section_copy, "qmatmul": section_qmatmul, "attention": section_attention,
                   "small": section_small_ops, "sweep": section_sweep}


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
        no_spills = usage.endswith("local=0") or not usage
        ctx.rows.append(Row(f"compile {label}", f"sm_{arch}", "", (time.perf_counter() - t0) * 1e6,
                            check="ok" if no_spills else "ok (spills)",
                            note=f"{usage} warps={warps} smem={kernel.metadata.shared}"))
