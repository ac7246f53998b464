"""The `bolt` command line: JSON outputs, and one clear error line (exit 2, no traceback) for bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from bolt_ros.cli import main


def bolt(*args: str, stdin: str | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bolt_ros.cli", *args], capture_output=True, text=True,
                          input=stdin, timeout=timeout, env={**os.environ, "BOLT_THREADS": "2"})


def test_inspect_json_describes_the_real_model(capsys):
    assert main(["inspect", "default", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["architecture"] == "gemma3"
    assert info["hparams"]["n_layer"] == 18 and info["hparams"]["n_embd"] == 640
    assert set(info["tensor_types"]) == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    assert info["tokenizer"]["vocab"] == 262144 and info["tokenizer"]["bos"] == 2


def test_tokenize_plain_vs_special(capsys):
    assert main(["tokenize", "--model", "default", "--text", "<start_of_turn>hi", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)["ids"]
    assert main(["tokenize", "--model", "default", "--text", "<start_of_turn>hi", "--special", "--json"]) == 0
    special = json.loads(capsys.readouterr().out)["ids"]
    assert plain[0] == special[0] == 2  # BOS
    assert 105 not in plain  # user text never becomes a control token
    assert special[1] == 105
    assert main(["tokenize", "--model", "default", "--text", "hi", "--no-bos", "--json"]) == 0
    assert 2 not in json.loads(capsys.readouterr().out)["ids"]


def test_generate_json_and_logprobs_agree():
    out = bolt("generate", "--model", "smollm2", "--chat", "--prompt", "What is the capital of France?",
               "--max-tokens", "12", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert {"prompt_ids", "completion_ids", "text", "timings"} <= res.keys()
    assert "Paris" in res["text"]
    t = res["timings"]
    assert t["ttft_ms"] > 0 and t["prefill_tok_s"] > 0 and t["load_s"] > 0 and "decode_tok_s" in t
    lp = bolt("logprobs", "--model", "smollm2", "--prompt-ids", ",".join(map(str, res["prompt_ids"])),
              "--continuation-ids", ",".join(map(str, res["completion_ids"][:4])), "--top", "3", "--json")
    assert lp.returncode == 0, lp.stderr
    rows = json.loads(lp.stdout)["continuation"]
    assert [r["top"][0][0] for r in rows] == res["completion_ids"][:4]  # greedy = teacher-forced argmax


def test_draft_names_resolve_like_models():
    """--draft auto: no drafter ships for smollm2, so plain decoding; a drafter by name is found (and refused for a
    target it was not made for, as one clear error line)."""
    out = bolt("generate", "--model", "smollm2", "--prompt", "Hi", "--max-tokens", "2", "--json", "--draft", "auto")
    assert out.returncode == 0, out.stderr
    assert "spec" not in json.loads(out.stdout)
    out = bolt("generate", "--model", "smollm2", "--prompt", "Hi", "--max-tokens", "2", "--draft",
               "default-chat-dflash")
    assert out.returncode != 0 and "drafter" in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_chat_reuses_the_prefix_on_the_second_turn():
    out = bolt("chat", "--model", "smollm2", "--max-tokens", "16",
               stdin="Hello! Who are you?\nWhat can you do?\n")
    assert out.returncode == 0, out.stderr
    stats = [line for line in out.stderr.splitlines() if line.startswith("[ttft")]
    assert len(stats) == 2
    first, second = (int(s.split("prefilled ")[1].split()[0]) for s in stats)
    assert out.stdout.count("bot>") == 2
    assert second < first + 40  # the second turn runs only its new tokens, not the whole conversation again


@pytest.mark.parametrize(("args", "message"), [
    (["inspect", "/nonexistent/model.gguf"], "no such model file"),
    (["generate", "--model", "smollm2", "--prompt-ids", "1,x,3"], "comma-separated token ids"),
    (["generate", "--model", "smollm2", "--prompt-ids", "1,99999999"], "out of range"),
    (["generate", "--model", "smollm2", "--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["logprobs", "--model", "smollm2", "--prompt-ids", "1", "--continuation-ids", ""], "non-empty"),
])
def test_bad_arguments_give_one_error_line(args, message):
    out = bolt(*args)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("bolt: error:") and message in lines[-1]


def test_hostile_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (2**40).to_bytes(8, "little") + bytes(16))
    out = bolt("inspect", str(bad))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "bolt: error: bad.gguf" in out.stderr
