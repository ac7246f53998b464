"""Perception: the face detector on a real photograph (NASA astronaut portrait, public domain, from scikit-image's
sample data), pinhole geometry, caption text, the change/rate gate, Image decoding, and the two caption nodes."""
from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from bolt_ros.msg import Caption
from conftest import wait_for
from rclpy.parameter import Parameter
from sensor_msgs.msg import Image
from std_msgs.msg import String

from bolt_ros.nodes.camera_captioner import CameraCaptioner, CameraCaptionerConfig
from bolt_ros.nodes.caption_bridge import CaptionBridge
from bolt_ros.perception import (
    Captioner,
    CaptionGate,
    Face,
    FaceDetector,
    PerceptionConfig,
    describe,
    image_to_gray,
    locate,
)

FACE = cv2.imread(str(Path(__file__).parent / "data" / "astronaut_face.png"), cv2.IMREAD_GRAYSCALE)  # [120, 120]
CFG = PerceptionConfig(min_interval_s=0.0, stable_frames=1)


def scene(center_x: int | None, width: int = 320, height: int = 240, scale: float = 0.6) -> np.ndarray:
    """The face photo pasted on a grey background (or no face at all), [height, width] uint8."""
    canvas = np.full((height, width), 110, np.uint8)
    if center_x is not None:
        face = cv2.resize(FACE, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
        h, w = face.shape
        x0, y0 = min(max(0, center_x - w // 2), width - w), (height - h) // 2
        canvas[y0:y0 + h, x0:x0 + w] = face
    return canvas


@pytest.fixture(scope="module")
def detector():
    return FaceDetector(CFG)


@pytest.mark.parametrize(("center_x", "where"), [(40, "to the left"), (125, "slightly to the left"),
                                                  (160, "straight ahead"), (280, "to the right")])
def test_real_face_is_found_where_it_is(detector, center_x, where):
    img = scene(center_x)
    faces = detector.detect(img)
    assert len(faces) == 1
    f = faces[0]
    assert abs(f.x + f.w / 2 - center_x) < 12 and 0.45 * 72 < f.w < 1.0 * 72  # the face, not the whole paste
    text = describe(locate(faces, img.shape[1], CFG), CFG)
    assert text.startswith("a person is in front of you, " + where + ", about ")


def test_a_bigger_face_is_nearer(detector):
    near, far = (locate(detector.detect(scene(160, 640, 480, s)), 640, CFG)[0] for s in (2.0, 0.8))
    assert far.distance_m / near.distance_m == pytest.approx(2.5, rel=0.15)
    assert 0.3 < near.distance_m < 1.0 < far.distance_m < 2.5


def test_no_face_means_nobody(detector):
    rng = np.random.default_rng(0)
    blank, noise = scene(None), rng.integers(0, 256, (240, 320), dtype=np.uint8)
    drawing = scene(None)  # objects but no face (note: a drawn cartoon face with eyes and mouth DOES fire Haar)
    cv2.rectangle(drawing, (30, 40), (120, 200), 220, -1)
    cv2.line(drawing, (0, 230), (319, 10), 20, 4)
    cv2.putText(drawing, "BOLT", (150, 140), cv2.FONT_HERSHEY_SIMPLEX, 1.5, 10, 3)
    for img in (blank, noise, drawing):
        assert detector.detect(img) == []
    assert Captioner(CFG).caption(blank) == "nobody is in front of you"


def test_pinhole_geometry():
    cfg = PerceptionConfig(horizontal_fov_deg=90.0, face_width_m=0.2)  # f = 320 px on a 640 px image; nearest first
    near, centred, edge = locate([Face(300, 0, 40, 40), Face(0, 0, 20, 20), Face(380, 0, 160, 160)], 640, cfg)
    assert (near.distance_m, near.bearing_deg) == pytest.approx((0.4, -math.degrees(math.atan(140 / 320))))
    assert (centred.distance_m, centred.bearing_deg) == pytest.approx((1.6, 0.0))
    assert edge.distance_m == pytest.approx(3.2) and edge.bearing_deg == pytest.approx(
        math.degrees(math.atan(310 / 320)))  # left edge of the image: to the left


def test_caption_text_for_several_people():
    from bolt_ros.perception import Person

    cfg = PerceptionConfig(max_people=2)
    people = [Person(20.0, 0.9), Person(-3.0, 2.2), Person(-10.0, 3.6)]
    assert describe(people, cfg) == ("3 people are in front of you: one to the left, about 1 m away; "
                                     "one straight ahead, about 2 m away; and 1 more")
    assert describe([Person(-8.0, 0.2)], cfg) == "a person is in front of you, slightly to the right, very close"


def test_gate_publishes_only_changes_stable_and_rate_limited():
    gate = CaptionGate(min_interval_s=1.0, stable_frames=2)
    seq = [(0.0, "a"), (0.1, "a"), (0.2, "a"), (0.3, "b"), (0.4, "a"), (0.5, "b"), (0.6, "b"), (1.2, "b"),
           (1.3, "b"), (1.4, "c"), (1.5, "c")]
    out = [(t, gate.push(text, t)) for t, text in seq]
    published = [(t, text) for t, text in out if text is not None]
    # "a" once it held 2 frames; the "b"/"a" flicker is ignored; "b" waits for the 1 s interval; "c" too early
    assert published == [(0.1, "a"), (1.2, "b")]
    assert gate.push("c", 2.3) == "c"


def test_image_decoding_handles_padding_channel_order_and_errors():
    h, w, pad = 3, 4, 5
    red = np.zeros((h, w, 3), np.uint8)
    red[..., 0] = 255  # R in rgb order
    rows = np.concatenate([red.reshape(h, w * 3), np.full((h, pad), 77, np.uint8)], axis=1)
    rgb = image_to_gray(rows.tobytes(), h, w, w * 3 + pad, "rgb8")
    bgr = image_to_gray(rows.tobytes(), h, w, w * 3 + pad, "bgr8")  # same bytes read as blue
    assert rgb.shape == (h, w) and np.all(rgb == 76) and np.all(bgr == 29)
    mono16 = np.full((h, w), 0xAB00, ">u2")
    assert np.all(image_to_gray(mono16.tobytes(), h, w, w * 2, "mono16", is_bigendian=True) == 0xAB)
    with pytest.raises(ValueError, match="unsupported image encoding 'yuv422'"):
        image_to_gray(rows.tobytes(), h, w, w * 3, "yuv422")
    with pytest.raises(ValueError, match="inconsistent image"):
        image_to_gray(b"\0" * 10, h, w, w * 3, "rgb8")


def test_bad_cascade_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="cannot load face cascade"):
        FaceDetector(PerceptionConfig(cascade_path=str(tmp_path / "missing.xml")))


# ----------------------------------------------------------------------------------------- ROS nodes
def image_msg(gray: np.ndarray, pad: int = 3) -> Image:
    """As an rgb8 Image with padded rows (what many camera drivers send)."""
    rgb = np.repeat(gray[:, :, None], 3, axis=2)
    h, w = gray.shape
    rows = np.concatenate([rgb.reshape(h, w * 3), np.zeros((h, pad), np.uint8)], axis=1)
    msg = Image(height=h, width=w, encoding="rgb8", step=w * 3 + pad, data=rows.tobytes())
    msg.header.frame_id = "test_cam"
    return msg


def caption_listener(ros):
    node = ros.node()
    node.captions = []
    node.create_subscription(Caption, "perception/caption", node.captions.append, 10)
    return node


def test_camera_captioner_from_image_topic_publishes_on_change(ros):
    cfg = CameraCaptionerConfig(source="topic", process_rate_hz=20.0,
                                perception=PerceptionConfig(min_interval_s=0.0, stable_frames=1))
    ros.add(CameraCaptioner(cfg, context=ros.context))
    listener = caption_listener(ros)
    pub = listener.create_publisher(Image, "camera/image_raw", 2)
    wait_for(lambda: pub.get_subscription_count() > 0, what="captioner subscribed")
    left, nobody = image_msg(scene(40)), image_msg(scene(None))
    pub.publish(Image(encoding="yuv422", height=1, width=1, step=2, data=b"ab"))  # dropped with a warning
    for _ in range(4):  # the same scene four times: one caption
        pub.publish(left)
        wait_for(lambda: listener.captions, 3.0, "a caption")
    first = listener.captions[0]
    assert first.text.startswith("a person is in front of you, to the left, about ")
    assert first.source == "camera_captioner" and first.header.frame_id == "test_cam"
    pub.publish(nobody)
    wait_for(lambda: len(listener.captions) >= 2, 3.0, "the changed caption")
    assert [c.text for c in listener.captions[1:]] == ["nobody is in front of you"]


def test_camera_captioner_from_video_file(ros, tmp_path):
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (320, 240))
    assert writer.isOpened()
    for _ in range(3):
        writer.write(cv2.cvtColor(scene(280), cv2.COLOR_GRAY2BGR))
    writer.release()
    ros.add(CameraCaptioner(context=ros.context, parameter_overrides=[
        Parameter("source", value="video"), Parameter("video_path", value=str(path)),
        Parameter("process_rate_hz", value=20.0), Parameter("perception.stable_frames", value=1)]))
    listener = caption_listener(ros)
    wait_for(lambda: listener.captions, 5.0, "a caption from the video")
    assert listener.captions[0].text.startswith("a person is in front of you, to the right, about ")


def test_camera_captioner_survives_a_missing_camera(ros):
    node = ros.add(CameraCaptioner(CameraCaptionerConfig(source="camera", camera_index=97, process_rate_hz=50.0),
                                   context=ros.context))
    listener = caption_listener(ros)
    wait_for(lambda: node._next_open > 0, 3.0, "an attempt to open the camera")
    assert node._capture is None and listener.captions == []
    with pytest.raises(ValueError, match="video_path"):
        CameraCaptioner(CameraCaptionerConfig(source="video"), context=ros.context)


def test_caption_bridge(ros):
    ros.add(CaptionBridge(context=ros.context, parameter_overrides=[
        Parameter("input_topic", value="vlm/text"), Parameter("source", value="cosmos")]))
    listener = caption_listener(ros)
    pub = listener.create_publisher(String, "vlm/text", 10)
    wait_for(lambda: pub.get_subscription_count() > 0, what="bridge subscribed")
    pub.publish(String(data="   "))  # ignored
    pub.publish(String(data="a red cup\n on the  table"))
    wait_for(lambda: listener.captions, 3.0, "a bridged caption")
    c = listener.captions[0]
    assert (c.text, c.source, c.confidence, c.header.frame_id) == ("a red cup on the table", "cosmos", -1.0,
                                                                   "camera_link")
    assert len(listener.captions) == 1
