"""Prefill/decode speed in llama-bench's terms (pp N: one prompt of N tokens; tg N: N single-token steps).

Reported as llama-bench does: the mean over repeats (`*_tok_s`) with its standard deviation (`*_std`); the best run
is kept beside (`*_best`). Decode steps go through the decoder generation uses (a CUDA graph replay on CUDA), and
every timing ends on a device synchronisation."""
from __future__ import annotations

import time

import torch
from tqdm import tqdm

from bolt_ros.engine.decode.decoders import plain_decoder
from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.decode.sampling import Sampler, SamplingParams


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


def _sync(engine: Engine) -> None:
    if engine.model.device.type == "cuda":
        torch.cuda.synchronize(engine.model.device)


def _stats(out: dict, key: str, rates: list[float]) -> None:
    mean = sum(rates) / len(rates)
    std = (sum((r - mean) ** 2 for r in rates) / (len(rates) - 1)) ** 0.5 if len(rates) > 1 else 0.0
    out[f"{key}_tok_s"], out[f"{key}_std"], out[f"{key}_best"] = round(mean, 2), round(std, 2), round(max(rates), 2)
    out[f"{key}_runs"] = [round(r, 2) for r in rates]  # every run (llama-bench's samples_ts)


def run_bench(model: str, *, prompt_tokens: int = 512, gen_tokens: int = 128, threads: int | None = None,
              draft: str | None = None, repeats: int = 1, n_ctx: int = 4096, device: str = "cpu",
              compile_steps: bool = False) -> dict:
    n_ctx = max(n_ctx, prompt_tokens + gen_tokens + 16)
    engine = Engine.load(model, n_ctx=n_ctx, threads=threads, draft=draft, device=device, compile_steps=compile_steps)
    out = {"model": engine.gguf.path.name, "threads": torch.get_num_threads(), "load_s": round(engine.load_s, 3),
           "rss_mib_after_load": round(rss_mib(), 1),
           "gguf_mib": round(engine.gguf.path.stat().st_size / 2**20, 1)}
    if compile_steps:  # compile outside the timed runs: the step shapes they will meet (a new regime recompiles)
        t0 = time.perf_counter()
        engine.warm_up(_prompt(engine, 16))
        engine.generate(_prompt(engine, max(prompt_tokens, 1)), SamplingParams(max_tokens=8))
        warm = plain_decoder(engine, engine.new_session(), Sampler(SamplingParams()))
        for _ in range(4):  # the timed decode below starts at position 0: its own specialization
            warm.advance(0)
        out["compile_s"] = round(time.perf_counter() - t0, 1)
    # an untimed run of each kind first, as llama-bench does by default: the first pass pages the weights in and
    # sizes the buffers (a run timed from a cold start read ~10-30 % slow)
    if prompt_tokens:
        engine.forward(engine.new_session(), _prompt(engine, prompt_tokens, seed=repeats))
    if gen_tokens:
        warm = plain_decoder(engine, engine.new_session(), Sampler(SamplingParams()))
        for _ in range(4):
            warm.advance(0)
    bar = tqdm(total=repeats * 2, desc="bench", leave=False, disable=repeats * (prompt_tokens + gen_tokens) < 2000)
    pp, tg = [], []
    for r in range(repeats):
        if prompt_tokens:
            s = engine.new_session()
            ids = _prompt(engine, prompt_tokens, seed=r)
            _sync(engine)
            t0 = time.perf_counter()
            engine.forward(s, ids)
            _sync(engine)
            pp.append(prompt_tokens / (time.perf_counter() - t0))
        bar.update()
        if gen_tokens:
            dec = plain_decoder(engine, engine.new_session(), Sampler(SamplingParams()))
            tok = _prompt(engine, 1, seed=r)[0]
            _sync(engine)
            t0 = time.perf_counter()
            for _ in range(gen_tokens):
                tok = int(dec.advance(tok).argmax())  # a host read each step, as generation does
            tg.append(gen_tokens / (time.perf_counter() - t0))
        bar.update()
    bar.close()
    if pp:
        _stats(out, f"pp{prompt_tokens}", pp)
    if tg:
        _stats(out, f"tg{gen_tokens}", tg)
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
