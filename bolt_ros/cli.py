"""`bolt`: inspect, tokenize, generate, score, chat with and benchmark GGUF models; write test models.

Every failure the user can cause (bad arguments, missing or malformed files) ends in one `bolt: error: ...` line and
exit status 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections import Counter

from bolt_ros.engine.default_models import ModelNotFound, resolve_model
from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile

EXIT_USAGE = 2


class CLIError(Exception):
    pass


def _ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise CLIError(f"expected comma-separated token ids, got {text!r}") from None


def _draft(args):
    """--draft: a GGUF path, a name (default-chat-dflash), auto (the drafter shipped for --model) or none."""
    from bolt_ros.engine.default_models import resolve_drafter
    return resolve_drafter(getattr(args, "draft", None) or "", args.model)


def _engine(args, **kw):
    from bolt_ros.engine.decode.generate import Engine
    from bolt_ros.engine.device import resolve_device
    return Engine.load(args.model, n_ctx=args.ctx, threads=args.threads, progress=sys.stderr.isatty(),
                       draft=_draft(args), device=resolve_device(args.device),
                       compile_steps=getattr(args, "compile", False), **kw)


def _sampling(args):
    from bolt_ros.engine.decode.sampling import SamplingParams
    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repetition_penalty=args.repeat_penalty, seed=args.seed, max_tokens=args.max_tokens,
                          stop=args.stop or [])


# --- commands --------------------------------------------------------------------------------------------------------
def cmd_inspect(args) -> int:
    from bolt_ros.engine.model.config import config_from_gguf
    t0 = time.perf_counter()
    with GGUFFile(resolve_model(args.model)) as gf:
        open_s = time.perf_counter() - t0
        types = Counter(i.type_name for i in gf.tensors.values())
        type_bytes = Counter()
        for i in gf.tensors.values():
            type_bytes[i.type_name] += i.nbytes
        tokens = gf.get("tokenizer.ggml.tokens") or []
        info = {
            "file": str(gf.path), "gguf_version": gf.version, "open_s": round(open_s, 3), "architecture": gf.arch(),
            "name": gf.get("general.name"), "tensors": len(gf.tensors),
            "tensor_types": {k: {"count": types[k], "bytes": type_bytes[k]} for k in sorted(types)},
            "tensor_bytes": sum(type_bytes.values()),
            "tokenizer": {"model": gf.get("tokenizer.ggml.model"), "pre": gf.get("tokenizer.ggml.pre"),
                          "vocab": len(tokens), "bos": gf.get("tokenizer.ggml.bos_token_id"),
                          "eos": gf.get("tokenizer.ggml.eos_token_id"),
                          "chat_template": "tokenizer.chat_template" in gf.metadata},
        }
        try:
            info["hparams"] = config_from_gguf(gf).model_dump()
        except GGUFError as e:  # a drafter or an unsupported arch still gets inspected
            info["hparams"] = {k: v for k, v in gf.metadata.items()
                               if k.startswith(gf.arch() + ".") and not hasattr(v, "__len__")}
            info["hparams_note"] = str(e)
    if args.json:
        print(json.dumps(info, indent=2, default=str))
        return 0
    print(f"{info['file']}\n  arch {info['architecture']} ({info['name']}), GGUF v{info['gguf_version']}, "
          f"{info['tensors']} tensors, {info['tensor_bytes'] / 2**20:.1f} MiB, opened in {info['open_s']} s")
    for k, v in info["tensor_types"].items():
        print(f"  {k:>6}: {v['count']:4d} tensors {v['bytes'] / 2**20:9.1f} MiB")
    t = info["tokenizer"]
    print(f"  tokenizer {t['model']}/{t['pre']} vocab {t['vocab']} bos {t['bos']} eos {t['eos']}"
          f" chat_template {'yes' if t['chat_template'] else 'no'}")
    for k, v in info["hparams"].items():
        print(f"  {k}: {_short(v)}")
    return 0


def _short(v) -> str:
    if isinstance(v, list) and len(v) > 8 and len(set(map(str, v))) == 1:
        return f"[{v[0]}] x {len(v)}"
    return str(v)


def cmd_tokenize(args) -> int:
    from bolt_ros.engine.text.tokenizer import Tokenizer
    with GGUFFile(resolve_model(args.model)) as gf:
        tok = Tokenizer.from_gguf(gf)
    ids = tok.encode(args.text, add_bos=tok.add_bos and not args.no_bos, parse_special=args.special)
    if args.json:
        print(json.dumps({"ids": ids, "pieces": [tok.token_text(i) for i in ids]}, ensure_ascii=False))
    else:
        print(" ".join(map(str, ids)))
    return 0


def _prompt_ids(args, engine) -> list[int]:
    if args.prompt_ids:
        ids = _ids(args.prompt_ids)
        bad = [i for i in ids if not 0 <= i < engine.tok.vocab_size]
        if bad:
            raise CLIError(f"token ids out of range for vocab {engine.tok.vocab_size}: {bad[:5]}")
        return ids
    if args.prompt is None:
        raise CLIError("give --prompt or --prompt-ids")
    if args.chat:
        msgs = ([{"role": "system", "content": args.system}] if args.system else [])
        msgs.append({"role": "user", "content": args.prompt})
        return engine.tok.encode_segments(engine.chat_format.render(msgs), add_bos=engine.tok.add_bos)
    return engine.tok.encode(args.prompt, add_bos=engine.tok.add_bos)


def cmd_generate(args) -> int:
    from bolt_ros.engine.decode.generate import GenerationResult
    params = _sampling(args)  # validate before spending seconds on loading
    engine = _engine(args)
    ids = _prompt_ids(args, engine)
    if args.chat:
        params.stop_token_ids.extend(sorted(engine.chat_format.stop_token_ids))
    result = None
    for ev in engine.stream(ids, params):
        if isinstance(ev, GenerationResult):
            result = ev
        elif not args.json:
            print(ev.text, end="", flush=True)
    if args.json:
        out = {"prompt_ids": result.prompt_ids, "completion_ids": result.completion_ids, "text": result.text,
               "finish_reason": result.finish_reason, "timings": result.timings.as_dict()}
        if result.spec is not None:
            out["spec"] = result.spec
        print(json.dumps(out, ensure_ascii=False))
    else:
        print()
        print(f"[{result.finish_reason}; ttft {result.timings.ttft_s * 1e3:.0f} ms, "
              f"decode {result.timings.decode_tok_s:.1f} tok/s]", file=sys.stderr)
    return 0


def cmd_logprobs(args) -> int:
    engine = _engine(args)
    prompt, cont = _ids(args.prompt_ids), _ids(args.continuation_ids)
    if not prompt or not cont:
        raise CLIError("--prompt-ids and --continuation-ids must both be non-empty")
    rows = engine.logprobs(prompt, cont, top=args.top)
    print(json.dumps({"prompt_ids": prompt, "continuation": rows}))
    return 0


def cmd_chat(args) -> int:
    from bolt_ros.engine.decode.chat_session import ChatSession
    params = _sampling(args)
    engine = _engine(args)
    chat = ChatSession(engine, system=args.system)
    print(f"bolt chat: {engine.gguf.path.name} ({engine.cfg.arch}). Empty line or Ctrl-D quits.", file=sys.stderr)
    while True:
        try:
            line = input("you> ")
        except EOFError:
            break
        if not line.strip():
            break
        cancel = threading.Event()
        print("bot> ", end="", flush=True)
        try:
            for ev in chat.send(line, params=params, cancel=cancel):
                if hasattr(ev, "text") and type(ev).__name__ == "TextEvent":
                    print(ev.text, end="", flush=True)
                elif type(ev).__name__ == "ToolCallEvent":
                    print(f"\n[tool call {ev.name} {json.dumps(ev.arguments)}]", end="", flush=True)
        except KeyboardInterrupt:
            cancel.set()
        st = chat.last_stats
        print(f"\n[ttft {st.get('ttft_ms', 0):.0f} ms, prefilled {st.get('prefill_tokens', 0)} new tokens, "
              f"{st.get('decode_tok_s', 0):.1f} tok/s]", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from bolt_ros.engine.bench import run_bench
    from bolt_ros.engine.device import resolve_device
    result = run_bench(args.model, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen_tokens,
                       threads=args.threads, draft=_draft(args), repeats=args.repeats, n_ctx=args.ctx,
                       device=resolve_device(args.device), compile_steps=args.compile)
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>16}: {v}")
    return 0


# --- parser ----------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bolt", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    model_help = "GGUF path, or 'default' (Gemma 3 270M), 'default-chat' (Qwen2.5-Coder-0.5B), 'smollm2'"

    def model_arg(p, positional=False):
        if positional:
            p.add_argument("model", help=model_help)
        else:
            p.add_argument("--model", "-m", default="default", help=model_help)

    def runtime_args(p):
        p.add_argument("--threads", "-t", type=int, default=None)
        p.add_argument("--ctx", type=int, default=4096, help="context length (tokens)")
        p.add_argument("--device", default="auto",
                       help="auto (CUDA when present), cpu (torch kernels) or cuda[:N] (Triton kernels + CUDA graphs; "
                            "BOLT_KERNELS overrides)")
        p.add_argument("--compile", action="store_true",
                       help="CPU: decode and verify steps through torch.compile (docs/performance.md; the first "
                            "step compiles for ~1-2 min, ~20 s from inductor's cache afterwards)")

    def sampling_args(p):
        p.add_argument("--max-tokens", "-n", type=int, default=128)
        p.add_argument("--temperature", type=float, default=0.0)
        p.add_argument("--top-k", type=int, default=0)
        p.add_argument("--top-p", type=float, default=1.0)
        p.add_argument("--min-p", type=float, default=0.0)
        p.add_argument("--repeat-penalty", type=float, default=1.0)
        p.add_argument("--seed", type=int, default=None)
        p.add_argument("--stop", action="append", help="stop string (repeatable)")

    p = sub.add_parser("inspect", help="architecture, hyper-parameters, tensor types, tokenizer")
    model_arg(p, positional=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("tokenize", help="text -> token ids")
    model_arg(p)
    p.add_argument("--text", required=True)
    p.add_argument("--special", action="store_true", help="parse control-token text (trusted input only)")
    p.add_argument("--no-bos", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tokenize)

    p = sub.add_parser("generate", help="generate a continuation")
    model_arg(p)
    runtime_args(p)
    sampling_args(p)
    p.add_argument("--prompt")
    p.add_argument("--prompt-ids")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat format")
    p.add_argument("--system")
    p.add_argument("--draft", help="DFlash drafter: a GGUF, a name (default-chat-dflash) or auto")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("logprobs", help="teacher-forced log-probabilities of a continuation")
    model_arg(p)
    runtime_args(p)
    p.add_argument("--prompt-ids", required=True)
    p.add_argument("--continuation-ids", required=True)
    p.add_argument("--top", type=int, default=5)
    p.add_argument("--json", action="store_true", help="(output is always JSON)")
    p.set_defaults(func=cmd_logprobs)

    p = sub.add_parser("chat", help="interactive multi-turn chat (streaming)")
    model_arg(p)
    runtime_args(p)
    sampling_args(p)
    p.add_argument("--system")
    p.add_argument("--draft")
    p.set_defaults(func=cmd_chat, max_tokens=256)

    p = sub.add_parser("bench", help="prefill and decode speed")
    model_arg(p)
    runtime_args(p)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--draft")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("train-drafter", help="train a DFlash drafter for a target by self-distillation")
    p.add_argument("--target", required=True, help="target GGUF path or model name (e.g. default-chat)")
    p.add_argument("--out", required=True, help="drafter GGUF to write (checkpoints and data cache beside it)")
    for name, kind in (("steps", int), ("layers", int), ("prompts", int), ("anchors", int), ("max-new", int),
                       ("seed", int), ("lr", float), ("target-layers", int), ("checkpoint-every", int),
                       ("negatives", int), ("tool-prompts", int), ("chat-prompts", int)):
        p.add_argument(f"--{name}", type=kind)
    p.add_argument("--quant", choices=["f32", "f16", "q8_0"])
    p.add_argument("--corpus", choices=["assistant", "talk", "mixed"],
                   help="tool turns (default), words turns as the chat model gets them with the intent classifier "
                        "on, or both (train/prompts.py)")
    p.add_argument("--init", help="start from this drafter GGUF's weights (a fine-tune)")
    p.add_argument("--resume", action="store_true", help="continue from OUT.ckpt (and reuse OUT.data.pt)")
    p.add_argument("--threads", type=int)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (training; data generation runs on the CPU)")
    p.set_defaults(func=cmd_train_drafter)

    try:
        from bolt_ros.devtools.testmodel import add_testmodel_parser
    except ImportError:  # pragma: no cover - the writer is part of the package; keep the CLI usable without it
        pass
    else:
        add_testmodel_parser(sub)
    return ap


def cmd_train_drafter(args) -> int:
    from bolt_ros.engine.device import resolve_device
    from bolt_ros.train.drafter import TrainConfig, train_drafter

    fields = {k: getattr(args, k.replace("-", "_")) for k in ("steps", "layers", "prompts", "anchors", "max_new",
                                                              "seed", "lr", "target_layers", "checkpoint_every",
                                                              "quant", "negatives", "tool_prompts", "corpus",
                                                              "init", "chat_prompts")}
    cfg = TrainConfig(**{k: v for k, v in fields.items() if v is not None})
    res = train_drafter(resolve_model(args.target), args.out, cfg, threads=args.threads, resume=args.resume,
                        device=str(resolve_device(args.device)))
    print(json.dumps(res))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if getattr(args, "threads", None) is None and "threads" in args:
        args.threads = int(os.environ.get("BOLT_THREADS", "0")) or None
    try:
        return args.func(args) or 0
    except (CLIError, GGUFError, ModelNotFound, ValueError) as e:
        msg = "; ".join(line.strip() for line in str(e).splitlines() if line.strip())
        print(f"bolt: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
