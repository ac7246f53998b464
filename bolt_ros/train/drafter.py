"""`bolt train-drafter`: a DFlash drafter for any target, trained by self-distillation on the CPU (or CUDA).

The network is z-lab's `DFlashDraftModel` (the reference our engine is tested against, so the trained weights mean
the same thing in both), its input embeddings and output head the target's own, frozen. Each step takes one sample
(train/data.py) and `--anchors` random anchor positions s in its reply: the block [token_s, MASK x (B-1)] at
positions s..s+B-1 sees the target's features of positions < s and its own block, and slot k predicts the target's
token at s+k. The loss is cross-entropy per slot weighted exp(-(k-1)/gamma) (DFlash paper Eq. 4; gamma 4 for block
8, as SpecForge and Model-Optimizer use): early slots decide how many drafts are accepted.

The frozen head is nearly all of a CPU step (32 blocks x 7 slots against a 152k x 896 head: ~120 GFLOP forward and
backward, against ~30 for the drafter itself). `--negatives N` computes the softmax over the tokens the target
wrote in the data (every label is one of them) plus N tokens drawn uniformly from the whole vocabulary each step,
so the rest of the vocabulary is pushed down too (sampled softmax); 0 = the full vocabulary. Checkpoints every
`--checkpoint-every` steps hold the model, the optimizer, the step and the RNG states; `--resume` continues one. The
result is written in llama.cpp's `dflash` GGUF layout by the test-model writer's exporter.
"""
from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from bolt_ros.engine.decode.generate import Engine
from bolt_ros.engine.model.linear import prefill_dtype

ROPE_BASE = 10000.0  # the drafter's own RoPE (its positions are the target's)


class TrainConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    layers: int = Field(2, ge=1, le=8, description="drafter layers")
    target_layers: int = Field(5, ge=1, le=16, description="target layers whose features the drafter reads")
    ff_mult: float = Field(2.0, gt=0, description="drafter MLP width / hidden size")
    block_size: int = Field(8, ge=2, le=16)
    gamma: float = Field(4.0, gt=0, description="position decay of the loss (DFlash Eq. 4)")
    corpus: str = Field("assistant", pattern="^(assistant|talk|mixed)$",
                        description="assistant: tool turns (system prompt, tools; replies and calls); talk: words "
                                    "turns (no tools, the memory note: what the chat model writes with the intent "
                                    "classifier on), the conversation bench's talk turns and `prompts` small-talk "
                                    "utterances; mixed: talk and `tool_prompts` tool turns (train/prompts.py)")
    prompts: int = Field(240, ge=1, description="training utterances from templates (train/prompts.py)")
    tool_prompts: int = Field(80, ge=0, description="mixed: tool turns beside the talk")
    chat_prompts: int = Field(0, ge=0, description="talk, mixed: general-chat turns from topic frames beside the "
                                                   "small talk (train/chat_prompts.py)")
    init: str | None = Field(None, description="start from this drafter GGUF's weights (same shape): a fine-tune")
    max_new: int = Field(96, ge=8, description="reply tokens generated per prompt")
    steps: int = Field(4000, ge=1)
    anchors: int = Field(32, ge=1, description="blocks per step")
    lr: float = Field(1e-3, gt=0)
    seed: int = 0
    checkpoint_every: int = Field(250, ge=1)
    negatives: int = Field(4096, ge=0, description="sampled softmax: random vocabulary rows per step beside the data's "
                                                 "own tokens (0 = full softmax)")
    quant: str = Field("q8_0", pattern="^(f32|f16|q8_0)$")


def _mask_token(engine: Engine) -> int:
    """A token whose embedding is not empty and that never occurs in replies (FIM padding, else the last id)."""
    for text in ("<|fim_pad|>", "<mask>", "[MASK]", "<unused0>"):
        tid = engine.tok.token_id(text)
        if tid is not None:
            return tid
    return engine.cfg.n_vocab - 1


def _zlab_model(engine: Engine, cfg: TrainConfig, capture_hf: list[int], mask: int):
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    tc = engine.cfg
    head_dim = 64 if tc.n_embd % 64 == 0 else tc.n_embd // tc.n_head
    n_head = tc.n_embd // head_dim
    n_kv = max(1, n_head // 4) if n_head % 4 == 0 else n_head
    qc = Qwen3Config(vocab_size=tc.n_vocab, hidden_size=tc.n_embd, intermediate_size=int(cfg.ff_mult * tc.n_embd),
                     num_hidden_layers=cfg.layers, num_attention_heads=n_head, num_key_value_heads=n_kv,
                     head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=ROPE_BASE, max_position_embeddings=32768,
                     num_target_layers=tc.n_layer,
                     dflash_config={"target_layer_ids": capture_hf, "block_size": cfg.block_size,
                                    "mask_token_id": mask})
    model = DFlashDraftModel(qc)
    with torch.no_grad():  # small init: the residual stream starts near the (frozen) token embedding
        for p in model.parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                torch.nn.init.normal_(p, std=0.02)
    return model, qc


def corpus_items(cfg: TrainConfig) -> list:
    """The prompts of `cfg.corpus`: utterances (tool turns) and WordsTurns (words turns), train/prompts.py."""
    from bolt_ros.train.prompts import chat_turns, script_talk_turns, talk_turns, training_utterances

    if cfg.corpus == "assistant":
        return training_utterances(cfg.prompts, cfg.seed)
    talk = script_talk_turns() + talk_turns(cfg.prompts, cfg.seed) + chat_turns(cfg.chat_prompts, cfg.seed)
    return talk if cfg.corpus == "talk" else talk + training_utterances(cfg.tool_prompts, cfg.seed)


def _load_init(model, path: str | Path) -> list[int]:
    """Copy a drafter GGUF's weights (dequantized) into the z-lab model; returns its draft vocabulary ([] if none)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from bolt_ros.engine.gguf.writer import hf_to_gguf_name

    reader = GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    state = model.state_dict()
    with torch.no_grad():
        for key, value in state.items():
            if key.endswith(("rotary_emb.inv_freq", "v_norm.weight")):
                continue
            t = tensors[hf_to_gguf_name("dflash", key)]
            arr = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(value.shape)
            value.copy_(torch.from_numpy(arr))
    field = reader.fields.get("dflash.draft_vocab")
    return [int(field.parts[i][0]) for i in field.data] if field is not None else []


def _step_batch(ds, sample, anchors: list[int], block: int, mask: int, embed: torch.Tensor):
    """Inputs for one step: m blocks of one sample against its context (keys: context rows, then the blocks)."""
    ctx = ds.features(sample)[: max(anchors)]  # [C, n_layers * H]: rows before the last anchor
    m, c = len(anchors), ctx.shape[0]
    toks = torch.tensor(sample.tokens)
    block_ids = torch.stack([torch.cat([toks[s:s + 1], torch.full((block - 1,), mask)]) for s in anchors])  # [m, B]
    labels = torch.stack([torch.cat([toks[s + 1:s + block], torch.full((block,), -100)])[: block - 1]
                          for s in anchors])  # [m, B-1]; -100 past the end
    pos = torch.cat([torch.arange(c)] + [torch.arange(s, s + block) for s in anchors])  # [C + m*B]
    q = torch.arange(m * block) // block  # block of each query row
    vis_ctx = torch.arange(c)[None, :] < torch.tensor(anchors)[q][:, None]  # [m*B, C]
    vis_blk = q[:, None] == q[None, :]  # [m*B, m*B]: a block sees itself only
    attn = torch.cat([vis_ctx, vis_blk], dim=1)[None, None]  # [1, 1, m*B, C + m*B]
    noise = F.embedding(block_ids.reshape(-1), embed)[None]  # [1, m*B, H]
    return ctx[None], noise, pos[None], attn, labels


def _vocab_rows(support: torch.Tensor, labels: torch.Tensor, negatives: int, n_vocab: int, gen: torch.Generator):
    """(head rows of the sampled softmax or None for the full vocabulary, labels as indices into those rows)."""
    if negatives == 0:
        return None, labels
    rows = torch.unique(torch.cat([support, torch.randint(n_vocab, (negatives,), generator=gen)]))  # sorted
    idx = torch.searchsorted(rows, labels.clamp_min(0))
    return rows, torch.where(labels >= 0, idx, labels)


def train_drafter(target: str | Path, out: str | Path, cfg: TrainConfig, *, threads: int | None = None,
                  resume: bool = False, device: str = "cpu", progress: bool = True) -> dict:
    from bolt_ros.engine.default_models import resolve_model
    from bolt_ros.engine.gguf.writer import write_model
    from bolt_ros.train import data as data_mod

    target = resolve_model(target)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    ckpt_path, data_path = out.with_suffix(".ckpt"), out.with_suffix(".data.pt")
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    engine = Engine.load(target, n_ctx=4096, threads=threads)
    from dflash.model import build_target_layer_ids
    capture_hf = build_target_layer_ids(engine.cfg.n_layer, cfg.target_layers)
    capture = tuple(i + 1 for i in capture_hf)  # layer outputs = the next layer's inputs (the GGUF convention)
    data_cached = data_path.exists()
    if data_cached:
        ds = data_mod.Dataset.from_state(torch.load(data_path, weights_only=False))
    else:
        ds = data_mod.build(engine, corpus_items(cfg), capture, cfg.max_new, progress)
        torch.save(ds.state(), data_path)
    t_data = time.perf_counter() - t0
    mask = _mask_token(engine)
    model, qc = _zlab_model(engine, cfg, capture_hf, mask)
    init_vocab = _load_init(model, resolve_model(cfg.init)) if cfg.init else []
    dev = torch.device(device)
    embed = engine.model.tok_embd.dequantized().to(dev)  # [V, H] fp32, frozen: the drafter's input rows
    # [V, H], frozen; bf16 where it is native (CUDA, AVX512_BF16/AMX CPUs): emulated on an AVX2-only CPU, one
    # [112, 64] x [64, 262144] step with its backward took 14.7 s in bf16 against 0.38 s in fp32
    head_dtype = torch.bfloat16 if dev.type != "cpu" else prefill_dtype()
    head = engine.model.output.dequantized().to(dev, head_dtype)
    del engine
    model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, cfg.steps) / cfg.steps)))
    start = 0
    gen = torch.Generator().manual_seed(cfg.seed)  # the sampled-softmax rows
    if resume and ckpt_path.exists():
        st = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        start, rng = st["step"], st["rng"]
        torch.set_rng_state(st["torch_rng"])
        if "vocab_rng" in st:
            gen.set_state(st["vocab_rng"])
    weights = torch.exp(-torch.arange(cfg.block_size - 1, dtype=torch.float32) / cfg.gamma).to(dev)  # [B-1]
    usable = [s for s in ds.samples if len(s.tokens) - s.reply_start >= 2]
    # every possible label; a fine-tune keeps its start's draft vocabulary (those rows stay positives of the softmax)
    support = torch.tensor(sorted({t for s in usable for t in s.tokens[s.reply_start:]} | set(init_vocab)))
    bar = tqdm(range(start, cfg.steps), desc="train drafter", unit="step", disable=not progress, initial=start,
               total=cfg.steps)
    losses: list[float] = []
    for step in bar:
        sample = rng.choice(usable)
        hi = len(sample.tokens) - 1
        anchors = sorted(rng.randrange(sample.reply_start, hi) for _ in range(cfg.anchors))
        ctx, noise, pos, attn, labels = _step_batch(ds, sample, anchors, cfg.block_size, mask, embed)
        h = model(position_ids=pos.to(dev), attention_mask=attn.to(dev), noise_embedding=noise.to(dev),
                  target_hidden=ctx.to(dev))  # [1, m*B, H]
        h = h.view(len(anchors), cfg.block_size, -1)[:, 1:]  # slots 1..B-1 predict s+1..s+B-1
        rows, labels = _vocab_rows(support, labels, cfg.negatives, head.shape[0], gen)
        w_head = head if rows is None else head[rows.to(dev)]  # [V or n_rows, H]
        logits = (h.to(head_dtype) @ w_head.T).float()  # [m, B-1, V or n_rows]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).to(dev), ignore_index=-100,
                             reduction="none").view(labels.shape)
        valid = (labels != -100).to(dev).float()
        loss = (ce * weights * valid).sum() / (weights * valid).sum().clamp_min(1e-6)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                        "step": step + 1, "rng": rng, "torch_rng": torch.get_rng_state(), "vocab_rng": gen.get_state(),
                        "config": cfg.model_dump()},
                       ckpt_path)
    model.eval()
    spec = dict(n_layer=cfg.layers, n_embd=qc.hidden_size, n_head=qc.num_attention_heads,
                n_head_kv=qc.num_key_value_heads, head_dim=qc.head_dim, n_ff=qc.intermediate_size,
                vocab_size=qc.vocab_size, rope_base=ROPE_BASE, rms_eps=qc.rms_norm_eps, target_layers=capture_hf,
                target_hidden=qc.hidden_size, block_size=cfg.block_size, mask_token_id=mask,
                # every label it was trained on: the runtime drafts from these rows of the head alone (a few hundred
                # of the target's 151936 on the shipped drafter, whose full-vocabulary argmax never left them on
                # the held-out prompts: docs/dflash.md)
                draft_vocab=support.tolist())
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    write_model(out, "dflash", spec, state, cfg.quant, target=target, search=False,
                name=f"bolt train-drafter seed {cfg.seed}")
    return {"out": str(out), "samples": len(ds.samples), "steps": cfg.steps, "data_s": round(t_data, 1),
            "data_cached": data_cached,
            "total_s": round(time.perf_counter() - t0, 1), "first_loss": round(losses[0], 4) if losses else None,
            "final_loss": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4), "resumed_from": start}
