"""ROS-free perception for the camera captioner: image decoding, OpenCV face detection, pinhole geometry and the
caption text, plus the gate that publishes a caption only when it changed (and held), at a bounded rate.

Geometry (REP 103, bearing positive = to the robot's left, like head_yaw): with a pinhole camera of horizontal
field of view F on an image W px wide, the focal length is f = (W/2) / tan(F/2) px; a face whose box is w px wide
and centred at u is at bearing atan((W/2 - u) / f) and at distance face_width_m * f / w.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

try:
    import cv2
except ImportError:  # the engine-only install has no OpenCV; only the captioner needs it
    cv2 = None


class PerceptionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    horizontal_fov_deg: float = Field(65.0, gt=1.0, lt=179.0)  # of the camera (a typical webcam: 60-70)
    face_width_m: float = Field(0.16, gt=0.0)  # real width that the detector's face box spans
    cascade_path: str = ""  # "" = OpenCV's bundled haarcascade_frontalface_default.xml
    scale_factor: float = Field(1.1, gt=1.0)
    min_neighbors: int = Field(5, ge=1)
    min_face_px: int = Field(24, ge=8)  # in the downscaled frame
    max_width_px: int = Field(640, ge=64)  # wider frames are downscaled before detection (speed)
    center_deg: float = Field(6.0, ge=0.0)  # |bearing| below this: straight ahead
    side_deg: float = Field(18.0, ge=0.0)  # below this: slightly to the side; above: to the side
    max_people: int = Field(3, ge=1)  # described individually; more are only counted
    min_interval_s: float = Field(1.0, ge=0.0)  # at most one caption per this many seconds
    stable_frames: int = Field(2, ge=1)  # a new caption must be seen in this many consecutive frames


@dataclass(frozen=True)
class Face:
    x: int
    y: int
    w: int
    h: int


@dataclass(frozen=True)
class Person:
    bearing_deg: float  # positive = to the left
    distance_m: float


class FaceDetector:
    def __init__(self, config: PerceptionConfig):
        if cv2 is None or not hasattr(cv2, "CascadeClassifier"):
            raise RuntimeError("OpenCV with CascadeClassifier is needed (opencv-python-headless 4.x; "
                               "OpenCV 5 moved Haar cascades out of the main package)")
        path = config.cascade_path or str(Path(cv2.data.haarcascades) / "haarcascade_frontalface_default.xml")
        self._cascade = cv2.CascadeClassifier(path)
        if self._cascade.empty():
            raise ValueError(f"cannot load face cascade {path!r}")
        self.config = config

    def detect(self, gray: np.ndarray) -> list[Face]:
        """Faces in a [H, W] uint8 image, in its pixel coordinates."""
        c = self.config
        scale = min(1.0, c.max_width_px / gray.shape[1])
        small = gray if scale == 1.0 else cv2.resize(gray, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
        boxes = self._cascade.detectMultiScale(small, scaleFactor=c.scale_factor,
                                               minNeighbors=c.min_neighbors, minSize=(c.min_face_px, c.min_face_px))
        return [Face(*(round(v / scale) for v in box)) for box in boxes]


def locate(faces: list[Face], image_width: int, config: PerceptionConfig) -> list[Person]:
    """Bearing and distance of each face (pinhole model), nearest first."""
    f = (image_width / 2) / math.tan(math.radians(config.horizontal_fov_deg) / 2)  # focal length, px
    people = [Person(bearing_deg=math.degrees(math.atan2(image_width / 2 - (face.x + face.w / 2), f)),
                     distance_m=config.face_width_m * f / face.w) for face in faces if face.w > 0]
    return sorted(people, key=lambda p: p.distance_m)


def _direction(bearing: float, config: PerceptionConfig) -> str:
    side = "left" if bearing > 0 else "right"
    if abs(bearing) < config.center_deg:
        return "straight ahead"
    return f"slightly to the {side}" if abs(bearing) < config.side_deg else f"to the {side}"


def _distance(d: float) -> str:
    if d < 0.35:
        return "very close"
    step = 0.5 if d < 3.0 else 1.0  # coarse on purpose: a caption should not change with every small step
    return f"about {max(step, round(d / step) * step):g} m away"


def describe(people: list[Person], config: PerceptionConfig) -> str:
    if not people:
        return "nobody is in front of you"
    where = [f"{_direction(p.bearing_deg, config)}, {_distance(p.distance_m)}" for p in people[: config.max_people]]
    if len(people) == 1:
        return f"a person is in front of you, {where[0]}"
    listed = "; ".join(f"one {w}" for w in where)
    more = len(people) - len(where)
    return f"{len(people)} people are in front of you: {listed}" + (f"; and {more} more" if more else "")


class CaptionGate:
    """Lets a caption through when it differs from the last published one, has been seen in `stable_frames`
    consecutive frames (no flicker at a bin boundary) and `min_interval_s` has passed since the last one."""

    def __init__(self, min_interval_s: float, stable_frames: int):
        self.min_interval_s, self.stable_frames = min_interval_s, stable_frames
        self.published: str | None = None
        self._last_time = -math.inf
        self._candidate, self._seen = None, 0

    def push(self, text: str, now: float) -> str | None:
        self._seen = self._seen + 1 if text == self._candidate else 1
        self._candidate = text
        if text == self.published or self._seen < self.stable_frames or now - self._last_time < self.min_interval_s:
            return None
        self.published, self._last_time = text, now
        return text


class Captioner:
    """frame -> caption text when it should be published (None otherwise)."""

    def __init__(self, config: PerceptionConfig):
        self.config = config
        self.detector = FaceDetector(config)
        self.gate = CaptionGate(config.min_interval_s, config.stable_frames)

    def caption(self, gray: np.ndarray) -> str:
        return describe(locate(self.detector.detect(gray), gray.shape[1], self.config), self.config)

    def process(self, gray: np.ndarray, now: float) -> str | None:
        return self.gate.push(self.caption(gray), now)


def to_gray(frame: np.ndarray) -> np.ndarray:
    """[H, W] / [H, W, 1] / [H, W, 3] (BGR) / [H, W, 4] (BGRA) uint8 -> [H, W] uint8."""
    if frame.ndim == 3 and frame.shape[2] == 1:
        frame = frame[:, :, 0]
    if frame.ndim == 2:
        return np.ascontiguousarray(frame)
    code = {3: cv2.COLOR_BGR2GRAY, 4: cv2.COLOR_BGRA2GRAY}.get(frame.shape[2])
    if code is None:
        raise ValueError(f"cannot convert a frame of shape {frame.shape} to grayscale")
    return cv2.cvtColor(frame, code)


# sensor_msgs/Image encoding -> (channels, numpy dtype, cv2 code to gray or None)
_ENCODINGS = {
    "mono8": (1, np.uint8, None), "8UC1": (1, np.uint8, None),
    "mono16": (1, np.uint16, None), "16UC1": (1, np.uint16, None),
    "bgr8": (3, np.uint8, "COLOR_BGR2GRAY"), "8UC3": (3, np.uint8, "COLOR_BGR2GRAY"),
    "rgb8": (3, np.uint8, "COLOR_RGB2GRAY"),
    "bgra8": (4, np.uint8, "COLOR_BGRA2GRAY"), "8UC4": (4, np.uint8, "COLOR_BGRA2GRAY"),
    "rgba8": (4, np.uint8, "COLOR_RGBA2GRAY"),
}


def image_to_gray(data: bytes, height: int, width: int, step: int, encoding: str,
                  is_bigendian: bool = False) -> np.ndarray:
    """The fields of a sensor_msgs/Image -> [height, width] uint8 (no cv_bridge: rows may carry padding)."""
    if encoding not in _ENCODINGS:
        raise ValueError(f"unsupported image encoding {encoding!r}; supported: {', '.join(_ENCODINGS)}")
    channels, dtype, code = _ENCODINGS[encoding]
    row_bytes = width * channels * np.dtype(dtype).itemsize
    if height <= 0 or width <= 0 or step < row_bytes or len(data) < step * height:
        raise ValueError(f"inconsistent image: {width}x{height} {encoding}, step {step}, {len(data)} bytes")
    rows = np.frombuffer(data, np.uint8, count=step * height).reshape(height, step)[:, :row_bytes]  # [H, row_bytes]
    dt = np.dtype(dtype).newbyteorder(">" if is_bigendian else "<")
    pixels = np.ascontiguousarray(rows).view(dt).reshape(height, width, channels)  # [H, W, C]
    if dtype == np.uint16:
        return (pixels[:, :, 0] >> 8).astype(np.uint8)
    return pixels[:, :, 0].copy() if code is None else cv2.cvtColor(pixels, getattr(cv2, code))
