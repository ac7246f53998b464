"""Where audio comes from and goes to outside ROS: the laptop's mic and speaker (sounddevice/PortAudio) and WAV
files. Sound hardware is optional: every device call fails with DeviceError saying what is missing and what to
use instead, never with PortAudio's own traceback.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from bolt_ros.voice.audio import Pcm, read_wav

# the launch arguments first (`make run ARGS="..."` takes only those), then the parameters of a node run alone
NO_DEVICE_HINT = ("use a robot's audio topics instead (launch argument audio:=topic), or a WAV file (a copy of "
                  "config/voice.yaml with source: wav and wav_path: ..., as voice_config:=that.yaml); a node run "
                  "alone: -p source:=topic or source:=wav, -p output:=topic")


class DeviceError(RuntimeError):
    pass


def _sounddevice():
    try:
        import sounddevice
    except OSError as e:  # the Python package is there, the PortAudio library is not
        raise DeviceError(f"PortAudio is not installed ({e}); Debian: apt-get install -y libportaudio2") from e
    except ImportError as e:
        raise DeviceError(f"sounddevice is not installed ({e}); run `bash scripts/setup_voice.sh`") from e
    return sounddevice


def check_device(kind: str, device: str = "") -> str:
    """The name of the input/output device that would be used; DeviceError when there is none."""
    sd = _sounddevice()
    try:
        info = sd.query_devices(device or None, kind=kind)
    except (ValueError, sd.PortAudioError) as e:
        raise DeviceError(f"no audio {kind} device{f' {device!r}' if device else ''} ({e}); {NO_DEVICE_HINT}") from e
    return str(info["name"])


OnBlock = Callable[[np.ndarray, int, int, float], object]   # (interleaved int16, rate, channels, t of 1st sample)


class Microphone:
    """Captures mono int16 blocks into `on_block`, on PortAudio's thread (keep it quick)."""

    def __init__(self, rate: int, block_ms: int, on_block: OnBlock, device: str = ""):
        sd = _sounddevice()
        self.name = check_device("input", device)

        def callback(indata, frames, time_info, status):
            on_block(indata[:, 0].copy(), rate, 1, time.time() - frames / rate)
        try:
            self._stream = sd.InputStream(samplerate=rate, channels=1, dtype="int16", device=device or None,
                                          blocksize=int(rate * block_ms / 1000), callback=callback)
            self._stream.start()
        except sd.PortAudioError as e:
            raise DeviceError(f"cannot open the microphone {self.name!r} at {rate} Hz: {e}") from e

    def close(self) -> None:
        self._stream.close()


class Speaker:
    """Blocking writes of mono int16 blocks (the write paces playback); `stop` drops what is buffered."""

    def __init__(self, rate: int, device: str = ""):
        sd = _sounddevice()
        self.name = check_device("output", device)
        try:
            self._stream = sd.OutputStream(samplerate=rate, channels=1, dtype="int16", device=device or None,
                                           latency="low")
            self._stream.start()
        except sd.PortAudioError as e:
            raise DeviceError(f"cannot open the speaker {self.name!r} at {rate} Hz: {e}") from e
        self.rate = rate

    def write(self, block: np.ndarray) -> None:
        self._stream.write(block.reshape(-1, 1))

    def stop(self) -> None:
        self._stream.abort()
        self._stream.start()

    def close(self) -> None:
        self._stream.close()


class WavSource:
    """Plays a WAV file into `on_block` in blocks, at its own pace or as fast as it goes, on a thread of its own;
    `done` is set at the end."""

    def __init__(self, path: str, block_ms: int, on_block: OnBlock, realtime: bool = True):
        self.pcm: Pcm = read_wav(path)
        self.done = threading.Event()
        self._stop = threading.Event()
        self._args = (block_ms, on_block, realtime)
        self._thread = threading.Thread(target=self._run, name="wav-source", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        block_ms, on_block, realtime = self._args
        s, rate = self.pcm.samples, self.pcm.rate
        channels = s.shape[1] if s.ndim == 2 else 1
        n = max(1, int(rate * block_ms / 1000))
        t0 = time.time()
        for i in range(0, len(s), n):
            if self._stop.is_set():
                break
            t = t0 + i / rate
            if realtime and (wait := t - time.time()) > 0:
                self._stop.wait(wait)
            # as fast as it goes = as fast as the consumer takes it: a refused block is offered again
            while not on_block(s[i:i + n].reshape(-1), rate, channels, t) and not realtime and \
                    not self._stop.wait(0.05):
                pass
        self.done.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
