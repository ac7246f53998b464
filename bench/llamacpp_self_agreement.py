"""How well does llama.cpp agree with itself? Its batched (prompt-processing) argmax vs its own greedy decode.

    python bench/llamacpp_self_agreement.py [--fixture fidelity_gemma3.json] [--model default]

The fidelity fixtures (bench/make_fidelity_fixtures.py) hold llama.cpp's greedy continuation, decoded one token at
a time. Here every continuation position is re-evaluated by the same llama-server with the prefix sent as a prompt
(processed as a batch) and one token predicted: the share of positions where that argmax equals the decoded token
is llama.cpp's own batch-vs-decode agreement, the floor for any teacher-forced comparison with its decode. A request
that hangs (llama-server waits for a complete UTF-8 piece after a byte token) restarts the server and is skipped.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llamacpp_ref import LlamaServer

from bolt_ros.engine.default_models import resolve_model

FIXTURES = Path(__file__).resolve().parents[1] / "test" / "fixtures"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", default="fidelity_gemma3.json")
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    data = json.loads((FIXTURES / args.fixture).read_text())
    todo = [(case, i) for case in data["cases"] for i in range(len(case["completion_ids"]))]
    agree = scored = skipped = 0
    diffs: list[float] = []
    t0, k = time.time(), 0
    while k < len(todo):
        with LlamaServer(resolve_model(args.model), threads=args.threads) as srv:
            while k < len(todo):
                case, i = todo[k]
                k += 1
                body = {"prompt": case["prompt_ids"] + case["completion_ids"][:i], "n_predict": 1,
                        "temperature": 0.0, "top_k": 1, "n_probs": 5, "cache_prompt": False,
                        "post_sampling_probs": False, "seed": 0}
                try:
                    step = srv.post("/completion", body, timeout=5)["completion_probabilities"][0]
                except OSError:
                    skipped += 1
                    break  # restart the server
                token = case["completion_ids"][i]
                scored += 1
                agree += step["id"] == token
                top = {t["id"]: t["logprob"] for t in step["top_logprobs"]}
                if token in top:
                    diffs.append(abs(top[token] - case["logprobs"][i]))
    print(f"{args.fixture}: {scored} positions ({skipped} skipped), llama.cpp batched argmax == its greedy decode: "
          f"{agree / scored:.4f}; mean |logprob difference| {sum(diffs) / len(diffs):.4f} ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
