"""Captions of what the camera sees ("a person is in front of you, slightly to the left, about 1 m away") from a
camera index, a video file or a sensor_msgs/Image topic, published on `perception/caption` only when they change
and at most once per `perception.min_interval_s`. The image -> caption logic is bolt_ros.perception."""
from __future__ import annotations

import threading
from typing import Literal

import cv2
import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from rclpy.node import Node
from sensor_msgs.msg import Image

from bolt_ros.msg import Caption
from bolt_ros.nodes.common import NodeLoop, declare_config, run_nodes
from bolt_ros.perception import Captioner, PerceptionConfig, image_to_gray, to_gray

REOPEN_PERIOD_S = 5.0  # a camera that failed to open is retried this often


class CameraCaptionerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: Literal["camera", "video", "topic"] = "camera"
    camera_index: int = 0
    video_path: str = ""
    loop_video: bool = True
    image_topic: str = "camera/image_raw"
    output_topic: str = "perception/caption"
    frame_id: str = "camera_link"
    process_rate_hz: float = Field(5.0, gt=0.0, le=60.0)  # frames analysed per second (the latest one wins)
    perception: PerceptionConfig = PerceptionConfig()


class CameraCaptioner(Node):
    def __init__(self, config: CameraCaptionerConfig | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "camera_captioner"), **node_kwargs)
        self.config = cfg = declare_config(self, config or CameraCaptionerConfig())
        if cfg.source == "video" and not cfg.video_path:
            raise ValueError("node 'camera_captioner': source 'video' needs video_path")
        self._captioner = Captioner(cfg.perception)
        self._pub = self.create_publisher(Caption, cfg.output_topic, 10)
        self._lock = threading.Lock()
        self._latest: tuple[np.ndarray, str] | None = None  # (gray [H, W], frame_id) from the image topic
        self._capture: cv2.VideoCapture | None = None
        self._next_open = 0.0
        if cfg.source == "topic":
            self._sub = self.create_subscription(Image, cfg.image_topic, self._on_image, 2)
        # frames are read and analysed on the node's own thread: a slow camera read or a face detection never holds
        # up the executor, which the other nodes of the process share (spin_nodes is single-threaded)
        self._frames = NodeLoop(self._loop, "camera-captioner").start()
        self.get_logger().info(f"captioning from {self._describe_source()}")

    def _describe_source(self) -> str:
        c = self.config
        return {"camera": f"camera {c.camera_index}", "video": f"video {c.video_path!r}",
                "topic": f"topic {c.image_topic!r}"}[c.source]

    def _on_image(self, msg: Image) -> None:
        try:
            gray = image_to_gray(bytes(msg.data), msg.height, msg.width, msg.step, msg.encoding,
                                 bool(msg.is_bigendian))
        except ValueError as e:
            self.get_logger().warning(f"dropping image: {e}", throttle_duration_sec=5.0)
            return
        with self._lock:
            self._latest = (gray, msg.header.frame_id or self.config.frame_id)

    def _next_frame(self) -> tuple[np.ndarray, str] | None:
        if self.config.source == "topic":
            with self._lock:
                frame, self._latest = self._latest, None
            return frame
        capture = self._open()
        if capture is None:
            return None
        ok, frame = capture.read()
        if not ok and self.config.source == "video" and self.config.loop_video:
            capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
            ok, frame = capture.read()
        if not ok:
            self.get_logger().warning(f"no frame from {self._describe_source()}", throttle_duration_sec=5.0)
            if self.config.source == "video":
                self.get_logger().info("end of video")
                self._frames.stopping.set()
            return None
        return to_gray(frame), self.config.frame_id

    def _open(self) -> cv2.VideoCapture | None:
        if self._capture is not None:
            return self._capture
        now = self.get_clock().now().nanoseconds * 1e-9
        if now < self._next_open:
            return None
        self._next_open = now + REOPEN_PERIOD_S
        target = self.config.camera_index if self.config.source == "camera" else self.config.video_path
        capture = cv2.VideoCapture(target)
        if not capture.isOpened():
            self.get_logger().error(f"cannot open {self._describe_source()}; retrying every {REOPEN_PERIOD_S:.0f} s")
            capture.release()
            return None
        self._capture = capture
        return capture

    def _loop(self, stopping: threading.Event) -> None:
        period = 1.0 / self.config.process_rate_hz
        while not stopping.wait(period):
            self._tick()

    def _tick(self) -> None:
        try:
            item = self._next_frame()
            if item is None:
                return
            gray, frame_id = item
            text = self._captioner.process(gray, self.get_clock().now().nanoseconds * 1e-9)
        except Exception as e:  # one bad frame must not stop the captioner
            self.get_logger().error(f"captioning failed: {e!r}", throttle_duration_sec=5.0)
            return
        if text is not None:
            msg = Caption(source="camera_captioner", text=text, confidence=-1.0)
            msg.header.stamp = self.get_clock().now().to_msg()
            msg.header.frame_id = frame_id
            self._pub.publish(msg)
            self.get_logger().info(f"caption: {text}")

    def close(self) -> None:
        if hasattr(self, "_frames"):  # not when __init__ failed before the loop started
            self._frames.stop()

    def destroy_node(self) -> None:
        self.close()
        if self._capture is not None:
            self._capture.release()
        super().destroy_node()


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(lambda: [CameraCaptioner()], args))


if __name__ == "__main__":
    main()
