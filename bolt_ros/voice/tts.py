"""Text to speech: Piper (en_US-joe-medium, onnxruntime) or Debian's espeak-ng, one sentence at a time.

Both return int16 mono PCM at the voice's own rate. espeak-ng runs as a subprocess with the text on stdin, so no
text can become one of its options.
"""
from __future__ import annotations

import io
import shutil
import subprocess
from typing import Protocol

import numpy as np

from bolt_ros.voice.audio import AudioError, Pcm, read_wav
from bolt_ros.voice.config import SynthesizerConfig

ESPEAK = "espeak-ng"
ESPEAK_TIMEOUT_S = 20.0


class TtsError(RuntimeError):
    pass


class Synthesizer(Protocol):
    rate: int

    def synthesize(self, text: str) -> Pcm: ...


class PiperTts:
    def __init__(self, model: str = "", *, still: bool = False):
        """still: without the voice's sampling noise (noise_scale = noise_w = 0), so a text always renders to the same
        audio: for tests whose verdict must not depend on the rendering (Piper draws a new one every call)."""
        from piper import PiperVoice
        from piper.config import SynthesisConfig

        from bolt_ros.voice.models import piper_files
        onnx, config = (model, f"{model}.json") if model else piper_files()
        self.voice = PiperVoice.load(onnx, config_path=config)
        self.rate = int(self.voice.config.sample_rate)
        self.syn_config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0) if still else None

    def synthesize(self, text: str) -> Pcm:
        chunks = [c.audio_int16_array for c in self.voice.synthesize(text, syn_config=self.syn_config)]
        samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
        return Pcm(samples.astype(np.int16, copy=False), self.rate)


class EspeakTts:
    def __init__(self, voice: str = "en-us", rate_wpm: int = 175):
        if shutil.which(ESPEAK) is None:
            raise TtsError(f"{ESPEAK} is not installed (Debian: apt-get install -y espeak-ng)")
        self.args = [ESPEAK, "--stdout", "--stdin", "-v", voice, "-s", str(rate_wpm)]
        self.rate = self.synthesize("a").rate   # the voice's own rate (22,050 Hz for the stock voices)

    def synthesize(self, text: str) -> Pcm:
        try:
            out = subprocess.run(self.args, input=text.encode(), capture_output=True, timeout=ESPEAK_TIMEOUT_S,
                                 check=True).stdout
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            raise TtsError(f"{ESPEAK} failed: {e}") from e
        # espeak-ng streams: its header may claim a larger data chunk than it wrote; wave reads what is there
        try:
            pcm = read_wav(io.BytesIO(out))
        except AudioError as e:
            raise TtsError(f"{ESPEAK} gave no usable WAV: {e}") from e
        return Pcm(pcm.samples.reshape(-1), pcm.rate)


def make_synthesizer(cfg: SynthesizerConfig) -> Synthesizer:
    if cfg.voice == "espeak":
        return EspeakTts(cfg.espeak_voice, cfg.espeak_rate_wpm)
    return PiperTts(cfg.piper_model)
