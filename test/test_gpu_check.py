"""bench/gpu_check.py can fail: its reader of `bolt bench --json` accepts what the real command prints (run here on a
tiny model), and a failed or missing end-to-end run makes the check's exit status non-zero, never "skipped".
No GPU; about 15 s.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402
import gpu_e2e_check as e2e  # noqa: E402
from gpu_common import TINY, Ctx  # noqa: E402

PROMPT, GEN = 8, 4


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", "BOLT_KERNELS": "auto"}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny gemma4 Q4_K_M target and a 1-layer random drafter, as the check writes them (smaller)."""
    from bolt_ros.devtools.testmodel import write_random_model

    d = tmp_path_factory.mktemp("gpu_check_models")
    target = write_random_model(d / "t.gguf", "gemma4", "tiny", seed=0, quant="q4_k_m")
    return target, write_random_model(d / "d.gguf", "dflash", target=target, layers=1, seed=0)


def test_reader_accepts_what_bolt_bench_prints(tiny_models, tmp_path):
    target, draft = tiny_models
    cmd = e2e.bolt_cmd(e2e.bench_args(target, "cpu", PROMPT, GEN, draft))  # the check's own command line
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    out = e2e.read_json_report(res.returncode, res.stdout, res.stderr, e2e.bench_keys(PROMPT, GEN, draft=True))
    assert out["spec_decode_tok_s"] > 0 and out[f"tg{GEN}_tok_s"] > 0
    e2e.read_json_report(res.returncode, res.stdout, res.stderr, e2e.bench_keys(PROMPT, GEN, draft=False))
    with pytest.raises(e2e.E2EError, match="missing key"):  # the key the old check looked for, never printed
        e2e.read_json_report(res.returncode, res.stdout, res.stderr, ("decode_tok_s",))


@pytest.mark.parametrize("code, stdout, stderr, why", [
    (2, "", "bolt: error: no such model file: x.gguf", "exit 2: bolt: error: no such model file"),
    (-9, '{"load_s": 1.0}', "", "exit -9"),
    (0, "", "", "no JSON object"),
    (0, "wrote x.gguf\n", "", "no JSON object"),
    (0, '{"load_s": 1.0, "pp8_tok_s": ', "", "unparsable JSON"),
    (0, '{"load_s": 1.0, "pp8_tok_s": 5.0}', "", "missing key"),
    (0, '{"load_s": 1.0, "pp8_tok_s": 5.0, "tg4_tok_s": "fast"}', "", "not a positive number"),
    (0, '{"load_s": 1.0, "pp8_tok_s": 5.0, "tg4_tok_s": 0}', "", "not a positive number"),
    (0, '{"load_s": 1.0, "pp8_tok_s": 5.0, "tg4_tok_s": NaN}', "", "not a positive number"),
    (0, '{"load_s": 1.0, "pp8_tok_s": 5.0, "tg4_tok_s": true}', "", "not a positive number"),
])
def test_reader_rejects_runs_without_numbers(code, stdout, stderr, why):
    with pytest.raises(e2e.E2EError, match=why):
        e2e.read_json_report(code, stdout, stderr, e2e.bench_keys(PROMPT, GEN, draft=False))


def test_failed_runs_are_fail_rows_and_exit_1(tiny_models, tmp_path, monkeypatch):
    target, draft = tiny_models
    good = json.dumps({"load_s": 1.0, f"pp{TINY.prompt_tokens}_tok_s": 50.0, f"tg{TINY.gen_tokens}_tok_s": 10.0})
    answers = iter([
        subprocess.CompletedProcess([], 0, good, ""),  # plain bench: fine
        subprocess.CompletedProcess([], 0, good, ""),  # bench with the drafter: its keys are missing
        subprocess.CompletedProcess([], 1, "", "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory"),  # worker
    ])
    monkeypatch.setattr(e2e, "run", lambda cmd, device, timeout: next(answers))
    ctx = Ctx(None, None, "cpu", None, TINY, time.monotonic() + 60)
    e2e.section_e2e(ctx, tmp_path, None, target, draft)
    checks = {r.name: r.check for r in ctx.rows}
    assert checks["e2e test model"].startswith("ok") and checks["e2e decode (no drafter)"].startswith("ok")
    assert checks["e2e decode + dflash drafter"].startswith("FAIL missing key(s) plain_decode_tok_s")
    assert checks[f"e2e TTFT {TINY.ttft_tokens}-token prompt"].startswith("FAIL exit 1: torch.OutOfMemoryError")
    assert all(checks[f"e2e peak RSS memory ctx={c}"].startswith("FAIL") for c in TINY.mem_ctxs)
    code, summary = gpu_check.summarize(ctx.rows)
    assert code == gpu_check.EXIT_FAIL and summary.startswith("summary: FAIL")


def _check(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "check.json"
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--json-out",
                          str(out), *args], capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    return res, (json.loads(out.read_text()) if out.exists() else {})


def test_unreadable_model_fails_the_check(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    res, report = _check(tmp_path, "--sections", "e2e", "--model", str(bad))
    assert res.returncode == gpu_check.EXIT_FAIL, res.stdout + res.stderr
    e2e_rows = [r for r in report["rows"] if r["name"].startswith("e2e")]
    assert len(e2e_rows) == 4 + len(TINY.mem_ctxs)  # model, plain, drafter, TTFT, memory per context
    assert all(r["check"].startswith("FAIL") for r in e2e_rows), e2e_rows
    assert "summary: FAIL" in res.stdout and report["exit_status"] == gpu_check.EXIT_FAIL


def test_time_budget_skips_visibly_and_is_incomplete(tmp_path):
    res, report = _check(tmp_path, "--budget-s", "0")
    assert res.returncode == gpu_check.EXIT_INCOMPLETE, res.stdout + res.stderr
    assert "summary: INCOMPLETE" in res.stdout
    assert {r["name"] for r in report["rows"]} == {f"{s} (section)" for s in gpu_check.SECTIONS}
    assert all(r["check"] == "skipped: time budget" for r in report["rows"])
