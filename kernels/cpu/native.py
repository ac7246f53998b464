"""The C CPU kernels (gguf_dequant.c, q8_matmul.c, attention_step.c, rms_norm.c, layer_step.c, head_refine.c):
built once per machine with the system C compiler, loaded with ctypes. q8_matmul.c is built once per instruction-set
level (LEVELS) into the same library, and the CPU's flags (or BOLT_CPU_LEVEL, for a lower one) choose the level at
run time.

Why C and not a torch extension: the files need no torch headers (pointers and sizes only), so they compile in
seconds instead of a minute. Threads: the dequantizer's rows are split across Python threads (ctypes releases the
GIL); the matmul uses OpenMP, whose libgomp.so.1 resolves to the one torch has already loaded (one pool for both).

The library goes to $XDG_CACHE_HOME/bolt_ros/native/ under a name hashed from the source, the compiler's version and
the CPU's flags (the other files are built with -march=native). Without a compiler, or with BOLT_NATIVE=0,
`available()` is False and callers use the torch reference (slower, same values).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(f) for f in ("gguf_dequant.c", "attention_step.c", "rms_norm.c", "layer_step.c",
                                                  "head_refine.c")]
# the int8 matmul, compiled once per instruction-set level (LEVELS) and linked beside the others
LEVELED = Path(__file__).with_name("q8_matmul.c")
HEADERS = sorted(Path(__file__).parent.glob("*.h"))  # gguf_blocks.h, the q8_*.h parts of q8_matmul.c, attention_vec.h
# -ffp-contract=off: no fused multiply-adds, so the dequantized values equal the torch reference's bit for bit
CFLAGS = ["-O3", "-ffp-contract=off", "-fopenmp", "-fPIC", "-std=gnu11"]
MAX_M = 64  # rows of x one gguf_matmul call takes (q8_matmul.c)
# Instruction-set levels of q8_matmul.c, lowest first: (name, compiler flags, CPU flags it needs to run). The machine
# runs the highest it can, or the highest at or below BOLT_CPU_LEVEL: one machine tests every level below its own.
_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
LEVELS: tuple[tuple[str, list[str], frozenset[str]], ...] = (
    ("portable", [], frozenset()),
    ("avx2", _AVX2, frozenset({"avx2", "fma", "f16c"})),
    ("avxvnni", [*_AVX2, "-mavxvnni"], frozenset({"avx2", "fma", "f16c", "avx_vnni"})),
    ("avx512vnni", [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni"],
     frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"})),
    # + byte permutes: a one-row Q4_0 / Q5_0 product gathers 4 blocks' codes, fifth bits and scales with two
    # vpermt2b instead of ~30 scalar loads and inserts (Zen 4/5, Ice Lake and later)
    ("avx512vbmi", [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx512vbmi"],
     frozenset({"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512vbmi"})),
)
TYPES = (2, 3, 6, 7, 8, 12, 13, 14)  # Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K
# Q4_0, Q5_0, Q4_K and Q6_K tiled at load (gguf_blocks.h, q8_tiles.h): TILED + the GGUF type (16 rows a tile, the
# AVX-512 levels') or TILED8 + it (8 rows, AVX2's and AVX-VNNI's): not GGUF types but the layouts those levels'
# products read fastest; dequantize_rows reads them too
TILED, TILED8 = 256, 512
TILEABLE = (2, 6, 12, 14)  # Q4_0 Q5_0 Q4_K Q6_K

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_levels: dict[str, tuple] = {}  # level -> (bolt_q8_parts_<level>, bolt_q8_fast_<level>)
_tried = False
_pool: ThreadPoolExecutor | None = None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (/proc/cpuinfo's flags or Features line; empty where there is none)."""
    line = _cpu_flags()
    return frozenset(line.partition(":")[2].split()) if ":" in line else frozenset()


def _is_x86() -> bool:
    return os.uname().machine in ("x86_64", "AMD64", "i686")


def _compile(cc: str, args: list[str], out: Path) -> str | None:
    """cc args -o out, atomically (a concurrent builder never loads a half-written file); the error text on failure"""
    with tempfile.NamedTemporaryFile(dir=out.parent, suffix=out.suffix, delete=False) as tmp:
        pass
    r = subprocess.run([cc, *args, "-o", tmp.name], capture_output=True, text=True, timeout=180)
    if r.returncode:
        Path(tmp.name).unlink(missing_ok=True)  # the compiler removes its own output when it fails
        return r.stderr[-2000:] or "failed"
    os.replace(tmp.name, out)
    return None


def library_key(compiler_version: str):
    """The build's identity: the sources, flags, levels, compiler and CPU. The levels' CPU flags go in sorted: a
    frozenset's repr follows the process's string hash seed, and the key (so the library, ~30 s of compiling on 2
    cores) came out new in nearly every process."""
    texts = [f.read_text() for f in [*SOURCES, LEVELED, *HEADERS]]
    levels = repr([(name, flags, sorted(needs)) for name, flags, needs in LEVELS])
    return hashlib.sha256("\0".join([*texts, " ".join(CFLAGS), levels, compiler_version, _cpu_flags()]).encode())


def _build() -> ctypes.CDLL | None:
    global _levels
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        log.warning("no C compiler found: GGUF dequantization uses the torch reference (slower prefill)")
        return None
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("C compiler %s does not run (%s): using the torch reference", cc, e)
        return None
    key = library_key(version)
    out_dir = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "bolt_ros" / "native"
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = key.hexdigest()[:16]
    lib = out_dir / f"bolt_cpu-{tag}.so"
    # every level this compiler can build (an old one may lack -mavxvnni), whether or not this CPU runs it: the
    # library only calls a level the CPU has (_level)
    levels = [name for name, _, _ in LEVELS if name == "portable" or _is_x86()]
    if not lib.exists():
        objs, built = [], []
        for name, flags, _ in LEVELS:
            if name not in levels:
                continue
            # this process's own objects: a concurrent builder of the same tag deletes its objects after linking
            obj = out_dir / f"q8-{tag}-{name}-{os.getpid()}.o"
            err = _compile(cc, [*CFLAGS, *flags, f"-DLEVEL={name}", "-c", str(LEVELED)], obj)
            if err:
                if name == "portable":
                    log.warning("building the CPU kernels failed: using the torch reference\n%s", err)
                    return None
                log.warning("the compiler cannot build the %s kernels: that level is left out\n%s", name, err[-400:])
                continue
            objs.append(obj)
            built.append(name)
        (out_dir / f"bolt_cpu-{tag}.levels").write_text(" ".join(built))
        err = _compile(cc, [*CFLAGS, "-march=native", "-shared", *map(str, SOURCES), *map(str, objs), "-lm"], lib)
        for o in objs:
            o.unlink(missing_ok=True)
        if err:
            log.warning("building the CPU kernels failed: using the torch reference\n%s", err)
            return None
    levels_file = out_dir / f"bolt_cpu-{tag}.levels"
    built = levels_file.read_text().split() if levels_file.exists() else ["portable"]
    so = ctypes.CDLL(str(lib))
    p, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    so.bolt_dequant_rows.argtypes = [i, p, i64, i64, i64, p, i]
    so.bolt_dequant_rows.restype = i
    so.bolt_tile.argtypes = [i, p, i64, i64, p]
    so.bolt_tile.restype = i
    _levels = {}
    for name in built:
        parts, fast = getattr(so, f"bolt_q8_parts_{name}"), getattr(so, f"bolt_q8_fast_{name}")
        parts.argtypes = [i, p, p, p, i64, p, i64, p, i]
        parts.restype = i
        fast.argtypes = [i]
        fast.restype = i
        _levels[name] = (parts, fast)
    so.bolt_attention_step.argtypes = [p, i64, i64, i64, i64, p, p, p, i, ctypes.c_float, p, p, i64, i, p, p, p, i64,
                                       i, p, p, i64, i64, ctypes.c_float, p, i]
    so.bolt_attention_step.restype = ctypes.c_int
    so.bolt_rms_norm.argtypes = [p, p, p, p, i64, i64, ctypes.c_float]
    so.bolt_rms_norm.restype = ctypes.c_int
    so.bolt_layer_step.argtypes = [p, p, p, i64, p, p, i64, i, p, p, p, i64, i, p, i64, i]   # layer.py
    so.bolt_layer_step.restype = ctypes.c_int
    so.bolt_act_mul.argtypes = [i, p, p, i64, i64]
    so.bolt_act_mul.restype = ctypes.c_int
    so.bolt_head_refine.argtypes = [p, p, i64, p, i, i64, i64, i64, ctypes.c_float, i64]
    so.bolt_head_refine.restype = ctypes.c_int
    return so


def runnable_levels() -> list[str]:
    """The q8_matmul levels built here that this CPU can run, lowest first (tests run each)."""
    if library() is None:
        return []
    flags = cpu_flags()
    return [name for name, _, needs in LEVELS if name in _levels and needs <= flags]


@functools.cache
def level() -> str:
    """The level the kernels run at: the highest this CPU runs, or the highest at or below $BOLT_CPU_LEVEL."""
    ok = runnable_levels()
    if not ok:
        return "portable"
    want = os.environ.get("BOLT_CPU_LEVEL", "").strip()
    names = [name for name, _, _ in LEVELS]
    if not want:
        return ok[-1]
    if want not in names:
        raise ValueError(f"BOLT_CPU_LEVEL={want!r}: choose one of {', '.join(names)}")
    below = [name for name in ok if names.index(name) <= names.index(want)]
    return below[-1] if below else "portable"


def library() -> ctypes.CDLL | None:
    global _lib, _tried
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get("BOLT_NATIVE", "1") != "0":
                _lib = _build()
        return _lib


def available() -> bool:
    # the hot path (ops asks per small op): no lock once the library was tried
    return (_lib if _tried else library()) is not None


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads()), thread_name_prefix="bolt-dequant")
        return _pool


def dequantize_rows(data: torch.Tensor, ggml_type: int, n_rows: int, n_cols: int,
                    dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None) -> torch.Tensor:
    """GGUF bytes `data` (uint8, contiguous, exactly n_rows whole rows) -> [n_rows, n_cols] fp32 or bf16.

    out: a contiguous buffer of n_rows * n_cols elements of `dtype` to write into (a reused one spares the page faults
    of a fresh multi-MiB allocation, which cost more than the dequantization itself). The caller checks that the type
    is in TYPES, that the library is available and the byte count (quants.py does); the rows are split across
    torch.get_num_threads() threads."""
    lib = library()
    assert lib is not None and _known(ggml_type) and data.dtype == torch.uint8 and data.is_contiguous()
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dequantize to float32 or bfloat16, not {dtype}")
    if out is None:
        out = torch.empty(n_rows, n_cols, dtype=dtype)
    elif out.dtype != dtype or not out.is_contiguous() or out.numel() != n_rows * n_cols or out.device.type != "cpu":
        raise ValueError(f"out must be a contiguous CPU {dtype} tensor of {n_rows * n_cols} elements")
    out = out.view(n_rows, n_cols)
    src, dst, as_bf16 = data.data_ptr(), out.data_ptr(), int(dtype == torch.bfloat16)
    n = min(torch.get_num_threads(), max(1, n_rows // 16))

    def run(i: int) -> int:
        return lib.bolt_dequant_rows(ggml_type, src, n_rows * i // n, n_rows * (i + 1) // n, n_cols, dst, as_bf16)

    codes = [run(0)] if n == 1 else list(_threads().map(run, range(n)))
    if any(codes):
        raise ValueError(f"native dequantization refused ggml type {ggml_type} with {n_cols} columns")
    return out


def _parts_call(level_name: str | None):
    return _levels[level_name or level()][0]


def gguf_matmul(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, n_out: int, *,
                level: str | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_M) @ W^T -> [M, n_out] fp32, W's GGUF rows in `blocks` (uint8, contiguous, n_out rows).

    x is quantized to int8 inside as llama.cpp does (Q8_0 per 32, Q8_K per 256 for the K-quants); the caller checks
    type and sizes. level: a q8_matmul level to run instead of the machine's (tests; it must be runnable)."""
    return gguf_matmul_parts(x, BlockParts([(blocks, ggml_type, n_out)]), level=level)


class BlockParts:
    """Several GGUF weights with the same K side by side (q|k|v, gate|up), each in its own type, as one
    `gguf_matmul_parts` call takes them: the ctypes arrays are built once."""

    def __init__(self, parts: list[tuple[torch.Tensor, int, int]]):
        """parts: (blocks uint8 [N_p, row_bytes] contiguous, ggml type, N_p) each; the tensors must outlive this."""
        self.blocks = [b for b, _, _ in parts]  # keeps the views alive
        n = len(parts)
        self.n_parts, self.n_out = n, sum(p[2] for p in parts)
        self.types = (ctypes.c_int * n)(*(t for _, t, _ in parts))
        self.ptrs = (ctypes.c_void_p * n)(*(b.data_ptr() for b in self.blocks))
        self.rows = (ctypes.c_int64 * n)(*(r for _, _, r in parts))


def gguf_matmul_parts(x: torch.Tensor, parts: BlockParts, *, level: str | None = None) -> torch.Tensor:
    """x [M, K] (M <= MAX_M) @ [W_0; W_1; ...]^T -> [M, sum N_p] fp32 in one call (x quantized once)."""
    if not _tried:
        library()
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.float().contiguous()
    m, k = x.shape
    y = torch.empty(m, parts.n_out, dtype=torch.float32)
    if _parts_call(level)(parts.n_parts, parts.types, parts.ptrs, parts.rows, k, x.data_ptr(), m, y.data_ptr(),
                          torch.get_num_threads()):
        raise ValueError(f"gguf_matmul refused types {list(parts.types)} with K={k}, M={m} (M <= {MAX_M})")
    return y


def gguf_matmul_fast(ggml_type: int, level_name: str | None = None) -> bool:
    """Whether this machine's level (or `level_name`) has a vectorized gguf_matmul for the type (Q4_0, Q5_0, Q8_0,
    Q4_K, Q6_K from AVX2 + F16C + FMA up; the tiles of Q4_0, Q5_0, Q4_K and Q6_K of the level's kind, tiled_type)."""
    lib = library()
    return lib is not None and _known(ggml_type) and bool(_levels[level_name or level()][1](ggml_type))


def _known(t: int) -> bool:
    return t in TYPES or (t - TILED in TILEABLE) or (t - TILED8 in TILEABLE)


_BLOCK = {2: (32, 18), 6: (32, 22), 12: (256, 144), 14: (256, 210)}  # the tileable types' (weights, bytes) a block


def tiled_type(ggml_type: int, level_name: str | None = None) -> int | None:
    """The tiled layout this machine's level (or `level_name`) multiplies `ggml_type` in fastest (Q4_0 .. Q6_K:
    tiles of 16 rows with AVX-512, of 8 on AVX2 and AVX-VNNI), or None where the GGUF rows are the fastest."""
    if ggml_type not in TILEABLE:
        return None
    return next((t for t in (TILED + ggml_type, TILED8 + ggml_type) if gguf_matmul_fast(t, level_name)), None)


def tile(blocks: torch.Tensor, tiled: int, n_rows: int, n_cols: int) -> torch.Tensor:
    """GGUF rows of Q4_0, Q5_0, Q4_K or Q6_K (uint8, contiguous, n_rows whole rows) -> their tiles of type `tiled`
    (TILED or TILED8 + the type), uint8 [n_rows rounded up to the tile's rows, row_bytes] (padding rows zero). A copy:
    the tiles live in the process's memory, not in the file's pages."""
    lib = library()
    base, rows = tiled % 256, 16 if tiled < TILED8 else 8
    if base not in TILEABLE or not (TILED <= tiled < TILED8 + 256):
        raise ValueError(f"tile makes tiles of Q4_0, Q5_0, Q4_K and Q6_K, not type {tiled}")
    elems, nbytes = _BLOCK[base]
    row_bytes = n_cols // elems * nbytes
    if lib is None or blocks.dtype != torch.uint8 or n_cols % elems or blocks.numel() != n_rows * row_bytes:
        raise ValueError(f"tile takes {n_rows} whole rows of {n_cols} columns as uint8")
    src = blocks.contiguous()
    out = torch.empty((n_rows + rows - 1) // rows * rows, row_bytes, dtype=torch.uint8)
    if lib.bolt_tile(tiled, src.data_ptr(), n_rows, n_cols, out.data_ptr()):
        raise ValueError(f"tile refused {n_cols} columns")
    return out


@torch.library.custom_op("bolt_ros::gguf_matmul", mutates_args=())
def gguf_matmul_op(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, n_out: int) -> torch.Tensor:
    """gguf_matmul as a torch operator: what a torch.compile'd graph calls (a ctypes call can't be traced)."""
    return gguf_matmul(x, blocks, ggml_type, n_out)


@gguf_matmul_op.register_fake
def _(x: torch.Tensor, blocks: torch.Tensor, ggml_type: int, n_out: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], n_out), dtype=torch.float32)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def attention_step(qkv: torch.Tensor, n_head: int, n_kv: int, head_dim: int, *, bias: torch.Tensor | None,
                   q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, v_norm: bool, eps: float,
                   cos: torch.Tensor, sin: torch.Tensor, neox: bool, k_cache: torch.Tensor, v_cache: torch.Tensor,
                   slot_pos: torch.Tensor, write: bool, positions: torch.Tensor, ring: bool,
                   n_scan: int, window: int, scale: float) -> torch.Tensor:
    """attention_step.c: qkv [T, W] (fp32; W = n_head*hd, + 2*n_kv*hd when `write`) -> attention output [T, n_head*hd].

    Writes this step's k, v and positions into the cache (k_cache/v_cache [n_kv, S, hd] fp32, slot_pos [S] long) at
    slot position % S on a sliding `ring`, position otherwise, when `write`. cos/sin [T, P] fp32, positions [T]
    long. Every tensor contiguous on the CPU; the caller checks dtypes."""
    lib = _lib if _tried else library()
    t = qkv.shape[0]
    out = torch.empty(t, n_head * head_dim, dtype=torch.float32)
    rc = lib.bolt_attention_step(
        qkv.data_ptr(), t, n_head, n_kv, head_dim, _ptr(bias), _ptr(q_norm), _ptr(k_norm), int(v_norm), eps,
        cos.data_ptr(), sin.data_ptr(), cos.shape[-1], int(neox), k_cache.data_ptr(), v_cache.data_ptr(),
        slot_pos.data_ptr(), k_cache.shape[1], int(write), positions.data_ptr(), int(ring), n_scan, window, scale,
        out.data_ptr(), torch.get_num_threads())
    if rc:
        raise ValueError(f"attention_step refused T={t}, heads {n_head}/{n_kv}x{head_dim}, {n_scan} of "
                         f"{k_cache.shape[1]} slots")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float,
             residual: torch.Tensor | None = None) -> torch.Tensor:
    """rms_norm.c: norm(x) * w over the last dim, plus `residual` when given -> a new tensor shaped like x. Every
    tensor fp32, contiguous, on the CPU (the caller checks)."""
    lib = _lib if _tried else library()
    d = x.shape[-1]
    y = torch.empty_like(x)
    if lib.bolt_rms_norm(x.data_ptr(), _ptr(weight), _ptr(residual), y.data_ptr(), x.numel() // d, d, eps):
        raise ValueError(f"rms_norm refused a tensor of shape {tuple(x.shape)}")
    return y


def head_refine(x: torch.Tensor, y: torch.Tensor, raw: torch.Tensor, ggml_type: int, margin: float,
                max_candidates: int) -> bool:
    """head_refine.c: the exact logits, in place in y [T, N], of every candidate within `margin` of its row's best
    (a row with more than max_candidates of them: its max_candidates best, ties by column), from x [T, K] and the
    head's GGUF bytes `raw` (uint8, contiguous, N rows); a row's candidates depend on that row alone. False (y
    untouched) when a row holds a NaN or an infinity: the caller's torch form decides."""
    lib = _lib if _tried else library()
    t, n = y.shape
    rc = lib.bolt_head_refine(x.data_ptr(), y.data_ptr(), t, raw.data_ptr(), ggml_type, n, x.shape[1],
                              raw.numel() // n, margin, max_candidates)
    if rc < 0:
        raise ValueError(f"head_refine refused ggml type {ggml_type} with {x.shape[1]} columns")
    return rc == 0
