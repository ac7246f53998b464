"""What both voice nodes need from ROS: time stamps as float seconds of the system clock (the voice package's time
base; the ROS clock is the system clock unless sim time is on), audio messages <-> numpy, and their parameters
for the graph (config/voice.yaml with the `audio` launch argument applied)."""
from __future__ import annotations

import array
import time
from pathlib import Path
from typing import Any

import numpy as np
from builtin_interfaces.msg import Time
from pydantic import ValidationError

from bolt_ros.assistant.config import load_params_file, unflatten
from bolt_ros.msg import AudioChunk
from bolt_ros.nodes.common import flatten_config
from bolt_ros.voice.config import RecognizerConfig, SpeechMotionConfig, SynthesizerConfig

RECOGNIZER, SYNTHESIZER, MOTION = "speech_recognizer", "speech_synthesizer", "speech_motion"
AUDIO_MODES = ("device", "topic")   # the laptop's mic and speaker | a robot's audio/in and audio/out


def to_stamp(t: float) -> Time:
    sec = int(t)
    return Time(sec=sec, nanosec=min(round((t - sec) * 1e9), 999_999_999))


def from_stamp(stamp: Time) -> float:
    """Seconds; an unset stamp (0) means now (a mic driver that does not stamp its blocks)."""
    t = stamp.sec + stamp.nanosec * 1e-9
    return t if t > 0 else time.time()


def chunk_msg(samples: np.ndarray, rate: int, t_start: float, frame_id: str = "") -> AudioChunk:
    msg = AudioChunk(sample_rate=rate, channels=1)
    msg.header.stamp = to_stamp(t_start)
    msg.header.frame_id = frame_id
    values = array.array("h")
    values.frombytes(samples.astype(np.int16, copy=False).tobytes())
    msg.data = values   # an array.array('h') is taken as is; anything else is checked value by value
    return msg


def chunk_samples(msg: AudioChunk) -> np.ndarray:
    """The message's int16 values (interleaved), without a per-element copy."""
    data = msg.data
    return np.frombuffer(data, dtype=np.int16) if isinstance(data, array.array) else np.asarray(data, dtype=np.int16)


def voice_parameters(path: str | Path, audio: str) -> dict[str, dict[str, Any]]:
    """{node name: flat ROS parameters} of the voice nodes, complete and validated, with audio:=device turning
    the sources to the microphone and the speaker. ValueError names the file and the problem."""
    if audio not in AUDIO_MODES:
        raise ValueError(f"audio:={audio!r}: expected one of {', '.join(AUDIO_MODES)}")
    out = {}
    for node, model, device in ((RECOGNIZER, RecognizerConfig, {"source": "microphone"}),
                                (SYNTHESIZER, SynthesizerConfig, {"output": "speaker"}),
                                (MOTION, SpeechMotionConfig, {})):
        params = load_params_file(path, node) | (device if audio == "device" else {})
        try:
            out[node] = flatten_config(model.model_validate(unflatten(params)))
        except ValidationError as e:
            raise ValueError(f"{path}: invalid {node} parameters:\n{e}") from None
    return out
