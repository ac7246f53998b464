"""Scale check for Gemma 4 E4B: a random model with E4B's exact shapes in a Q4_K_M-like mix, run by our engine on CPU.

    python bench/bench_e4b.py [--model X.gguf] [--threads 2] [--prompt 32] [--gen 16] [--json out.json]

Without --model the file is written once with the test-model writer (seed 0) and cached as
~/.cache/bolt_ros/testmodels/gemma4-e4b-q4_k_m-seed0.gguf (about 5 GB; tens of minutes on 2 cores).
Reports: `bolt inspect` (tensor types), load time, RSS, prefill/decode tok/s, and the KV-cache bytes for 4K/16K/64K
contexts next to the published llama.cpp figures (8.7 GiB for 64K context with the drafter; "about 4 GB" for
2.5K-16K inputs). Those figures are whole-process memory (weights + KV + compute buffers), the KV part is ours.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path.home() / ".cache" / "bolt_ros" / "testmodels" / "gemma4-e4b-q4_k_m-seed0.gguf"
CONTEXTS = (4096, 16384, 65536)
GIB = 2**30


def ensure_model(path: Path) -> tuple[Path, float | None]:
    """The cached random E4B, written (atomically) if missing; returns (path, seconds spent writing or None)."""
    from bolt_ros.devtools.testmodel import write_random_model

    if path.exists():
        return path, None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    t0 = time.perf_counter()
    write_random_model(tmp, "gemma4", "e4b", seed=0, quant="q4_k_m")
    tmp.rename(path)
    return path, time.perf_counter() - t0


def proc_memory_mib() -> dict[str, float]:
    """RSS split into anonymous (heap, repacked weights) and file-backed (mmap'ed GGUF pages), plus the peak."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = round(int(line.split()[1]) / 1024, 1)
    return out


def kv_table(cfg, max_step: int = 512) -> dict:
    """KV-cache bytes per context: f16 (llama.cpp's default cache type), and what our engine allocates (fp32,
    sliding layers with the step margin)."""
    rows = {}
    for n in CONTEXTS:
        rows[n] = {"f16_gib": round(cfg.kv_bytes(n, 2) / GIB, 3),
                   "ours_fp32_gib": round(cfg.kv_bytes(n, 4, max_step) / GIB, 3),
                   "all_layers_full_f16_gib": round(sum(2 * n * cfg.n_head_kv[il] * cfg.head_dim[il] * 2
                                                        for il in range(cfg.n_layer)) / GIB, 3)}
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="an E4B-shaped GGUF (default: the cached random one)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=32, help="prefill tokens")
    ap.add_argument("--gen", type=int, default=16, help="decode steps")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)

    path, write_s = (args.model, None) if args.model else ensure_model(CACHE)
    res: dict = {"file": str(path), "file_gib": round(path.stat().st_size / GIB, 3), "write_s": write_s}
    inspect = subprocess.run([sys.executable, "-m", "bolt_ros.cli", "inspect", str(path)], capture_output=True,
                             text=True, check=True)
    print(inspect.stdout)

    import torch

    from bolt_ros.engine.bench import run_bench
    from bolt_ros.engine.gguf.reader import GGUFFile
    from bolt_ros.engine.model.config import config_from_gguf

    with GGUFFile(path) as gf:
        cfg = config_from_gguf(gf)
    owners = [il for il in range(cfg.n_layer) if cfg.owns_kv(il)]
    res["kv_owning_layers"] = {"count": len(owners), "sliding": sum(cfg.swa[il] for il in owners),
                               "full": sum(not cfg.swa[il] for il in owners)}
    res["kv_cache"] = kv_table(cfg)
    res["bench"] = run_bench(str(path), prompt_tokens=args.prompt, gen_tokens=args.gen, threads=args.threads,
                             n_ctx=4096)
    res["memory_mib"] = proc_memory_mib()
    res["torch_threads"] = torch.get_num_threads()
    res["loadavg"] = os.getloadavg()
    # the published llama.cpp figures are whole-process memory: our comparable estimate is weights + KV (f16)
    res["estimate_weights_plus_kv_f16_gib"] = {n: round(res["file_gib"] + row["f16_gib"], 2)
                                               for n, row in res["kv_cache"].items()}
    text = json.dumps(res, indent=2, default=str)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
