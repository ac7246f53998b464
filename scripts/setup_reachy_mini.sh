#!/usr/bin/env bash
# Idempotent: Pollen's Reachy Mini SDK, its MuJoCo simulator and the dances library in .venv (robot:=reachy_mini_sim,
# robot:=reachy_mini, the render command and test/test_reachy_mini*.py). Fast when already installed.
# Pins: reachy-mini 1.13.0, mujoco 3.3.0, reachy-mini-dances-library 0.2.1. The rest of our pins (torch, numpy,
# pydantic, ...) are constraints, so the SDK's dependencies never replace them.
set -eo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -n "$VIRTUAL_ENV" ] || . .venv/bin/activate

# PyGObject (<= 3.46, the SDK's Linux dependency) builds from source; the daemon loads GStreamer typelibs even with
# --no-media; MuJoCo renders offscreen through EGL (Mesa) or OSMesa.
debs="pkg-config libgirepository1.0-dev libcairo2-dev gir1.2-gstreamer-1.0 gir1.2-gst-plugins-base-1.0 libosmesa6
libegl1 libgl1"
missing=""
for p in $debs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[setup] apt-get install$missing (Reachy Mini simulator)"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null
  else
    echo "[setup] the Reachy Mini simulator needs Debian packages; run:  sudo apt-get install -y$missing"
    echo "[setup] (skipping the Reachy Mini SDK; everything else works)"
    exit 0
  fi
fi

stamp=.venv/.reachy_mini_stamp
want=$(cat scripts/setup_reachy_mini.sh requirements.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then exit 0; fi
echo "[setup] installing the Reachy Mini SDK and its MuJoCo simulator into .venv"
pip install -q -c requirements.txt "reachy-mini[mujoco]==1.13.0" mujoco==3.3.0
# its own deps would reinstall the SDK (unpinned)
pip install -q --no-deps reachy-mini-dances-library==0.2.1
python -c "import reachy_mini, mujoco, reachy_mini_dances_library, torch; assert torch.__version__.startswith('2.13.0')"
echo "$want" > "$stamp"
