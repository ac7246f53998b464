"""Prefill/decode speed in llama-bench's terms (pp N: one prompt of N tokens; tg N: N single-token steps)."""
from __future__ import annotations

import time

import torch
from tqdm import tqdm

from .generate import Engine
from .sampling import SamplingParams


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _prompt(engine: Engine, n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, min(engine.tok.vocab_size, 30000), (n,), generator=g).tolist()
    return [engine.tok.bos_id, *ids[1:]] if engine.tok.bos_id is not None else ids


def run_bench(model: str, *, prompt_tokens: int = 512, gen_tokens: int = 128, threads: int | None = None,
              draft: str | None = None, repeats: int = 1, n_ctx: int = 4096, device: str = "cpu") -> dict:
    n_ctx = max(n_ctx, prompt_tokens + gen_tokens + 16)
    engine = Engine.load(model, n_ctx=n_ctx, threads=threads, draft=draft, device=device)
    out = {"model": engine.gguf.path.name, "threads": torch.get_num_threads(), "load_s": round(engine.load_s, 3),
           "rss_mib_after_load": round(rss_mib(), 1),
           "gguf_mib": round(engine.gguf.path.stat().st_size / 2**20, 1)}
    bar = tqdm(total=repeats * 2, desc="bench", leave=False, disable=repeats * (prompt_tokens + gen_tokens) < 2000)
    pp, tg = [], []
    for r in range(repeats):
        if prompt_tokens:
            s = engine.new_session()
            ids = _prompt(engine, prompt_tokens, seed=r)
            t0 = time.perf_counter()
            engine.forward(s, ids)
            pp.append(prompt_tokens / (time.perf_counter() - t0))
        bar.update()
        if gen_tokens:
            s = engine.new_session()
            tok = _prompt(engine, 1, seed=r)[0]
            t0 = time.perf_counter()
            for _ in range(gen_tokens):
                tok = int(engine.forward(s, [tok]).argmax())
            tg.append(gen_tokens / (time.perf_counter() - t0))
        bar.update()
    bar.close()
    if pp:
        out[f"pp{prompt_tokens}_tok_s"] = round(max(pp), 2)
    if tg:
        out[f"tg{gen_tokens}_tok_s"] = round(max(tg), 2)
    if engine.draft is not None and gen_tokens:
        # speculative decoding is measured on a real generation (acceptance depends on the text)
        ids = _prompt(engine, min(prompt_tokens, 64) or 16)
        for use_draft in (False, True):
            res = engine.generate(ids, SamplingParams(max_tokens=gen_tokens), use_draft=use_draft)
            out["spec_decode_tok_s" if use_draft else "plain_decode_tok_s"] = round(res.timings.decode_tok_s, 2)
            if use_draft:
                out["spec"] = res.spec
        if out["plain_decode_tok_s"]:
            out["spec_speedup"] = round(out["spec_decode_tok_s"] / out["plain_decode_tok_s"], 3)
    out["rss_mib_peak"] = round(rss_mib(), 1)
    return out
