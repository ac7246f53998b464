"""Render the simulated Reachy Mini's pose to a PNG with MuJoCo, offscreen.

    python -m bolt_ros.robot.reachy_mini.render --port 8000 --out docs/reachy_mini.png

reads the pose from a running daemon (`make run ARGS="robot:=reachy_mini_sim"` serves it on port 8000) and draws the
robot's own MJCF model in that pose. MUJOCO_GL defaults to egl (Mesa's software renderer where there is no GPU,
~1 s a frame); osmesa (libosmesa6) works too.

The daemon renders nothing headless, so we load the same model here: the actuated joints (body yaw, the six
Stewart motors, the antennas) get the measured values, and a short physics settle lets the passive joints of the
Stewart platform close their loops, as the daemon does at start-up.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

from bolt_ros.robot.reachy_mini.daemon import get_json

SETTLE_STEPS = 300  # 0.6 s at the model's 2 ms step: the passive joints converge in ~0.2 s


def measured_joints(host: str, port: int) -> np.ndarray:
    """[9]: yaw_body, stewart_1..6, right_antenna, left_antenna, as the daemon reports them."""
    s = get_json(host, port, "/api/state/full?with_head_joints=true", timeout=3.0)
    return np.array([*s["head_joints"], *s["antennas_position"]], dtype=float)


def render_joints(joints: np.ndarray, out: str | os.PathLike, width: int = 480, height: int = 480,
                  camera: str = "studio_close") -> Path:
    os.environ.setdefault("MUJOCO_GL", "egl")
    from importlib.resources import files

    import mujoco
    import reachy_mini

    scene = files(reachy_mini).joinpath("descriptions/reachy_mini/mjcf/scenes/empty.xml")
    model = mujoco.MjModel.from_xml_path(str(scene))
    data = mujoco.MjData(model)
    # actuators in model order: the seven head motors, then the antennas (whose MuJoCo sign is the SDK's opposite)
    addr = [model.jnt_qposadr[model.actuator_trnid[i, 0]] for i in range(model.nu)]
    values = np.concatenate([joints[:7], -joints[7:9]])
    data.qpos[addr] = values
    data.ctrl[:] = values
    mujoco.mj_forward(model, data)
    for _ in range(SETTLE_STEPS):
        mujoco.mj_step(model, data)
    with mujoco.Renderer(model, height=height, width=width) as renderer:
        renderer.update_scene(data, camera=camera)
        pixels = renderer.render()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _write_png(pixels, out)
    return out


def _write_png(rgb: np.ndarray, path: Path) -> None:
    import cv2  # opencv-python-headless is one of our pinned requirements

    if not cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)):
        raise OSError(f"cannot write {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bolt_ros.robot.reachy_mini.render",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="the daemon's port (default 8000)")
    ap.add_argument("--out", default="reachy_mini.png")
    ap.add_argument("--size", type=int, nargs=2, default=(480, 480), metavar=("W", "H"))
    ap.add_argument("--camera", default="studio_close", help="an MJCF camera: studio_close (default) or eye_camera")
    ns = ap.parse_args(argv)
    try:
        joints = measured_joints(ns.host, ns.port)
    except OSError as e:
        print(f"error: no Reachy Mini daemon at {ns.host}:{ns.port}: {e}", file=sys.stderr)
        return 2
    print(render_joints(joints, ns.out, *ns.size, camera=ns.camera))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
