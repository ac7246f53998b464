"""A GIF of the simulated Reachy Mini playing one of our animations (the dances included), for the README and docs,
driven by the ROS-free backend alone: the MuJoCo daemon, the link, the bridge's envelope, the animation library.

    python -m bolt_ros.robot.reachy_mini.showreel --animation side_peekaboo --out docs/reachy_mini_dance.gif

Frames are the robot's measured joints, sampled while it moves and rendered afterwards (rendering on a CPU takes
~1 s a frame, far slower than the motion).
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from bolt_ros.robot import load_robot_config
from bolt_ros.robot.library import config_library
from bolt_ros.robot.reachy_mini.bridge import ReachyBridge
from bolt_ros.robot.reachy_mini.daemon import SimDaemon
from bolt_ros.robot.reachy_mini.dances import DanceMoves
from bolt_ros.robot.reachy_mini.link import ReachyLink
from bolt_ros.robot.reachy_mini.render import render_joints

CONTROL_HZ = 100.0


def record(name: str, fps: float, robot_config: str = "", max_offset_m: float = 0.04) -> list[np.ndarray]:
    """Play animation `name` on a fresh simulated robot; the measured joints [9] at `fps`, until it has settled."""
    robot = load_robot_config(robot_config or None)
    library = config_library(robot).extended(DanceMoves(robot, max_offset_m).entries())
    entry = library.get(name)
    if entry is None:
        raise SystemExit(f"unknown animation {name!r}; one of {', '.join(library.names())}")
    with SimDaemon(sleep_on_stop=False) as daemon:
        link = ReachyLink(daemon.host, daemon.port, log=print).start()
        try:
            bridge = ReachyBridge(link, robot, max_offset_m, log=print)
            deadline = time.monotonic() + 30
            while bridge.step() is None:
                if time.monotonic() > deadline:
                    raise SystemExit(f"no state from the daemon: {link.error}")
                time.sleep(0.05)
            motion = bridge.controller.start(lambda pose: entry.build(pose, 1.0), name)
            frames, next_frame, end = [], 0.0, None
            while end is None or time.monotonic() < end:
                measured = bridge.step()
                now = time.monotonic()
                if measured is not None and now >= next_frame:
                    frames.append(measured.joints.copy())
                    next_frame = now + 1.0 / fps
                if end is None and motion.done.is_set():
                    end = now + 0.5  # the head catches up with the last command
                time.sleep(1.0 / CONTROL_HZ)
            return frames
        finally:
            link.close()


def write_gif(frames: list[np.ndarray], out: str | os.PathLike, fps: float, size: int) -> Path:
    from PIL import Image  # matplotlib's dependency, pinned with it

    with tempfile.TemporaryDirectory() as tmp:
        # 64 colours: the scene is white, grey and blue; a full palette per frame tripled the file
        images = [Image.open(render_joints(j, Path(tmp) / f"{i:04d}.png", size, size)).convert("RGB").quantize(64)
                  for i, j in enumerate(frames)]
        out = Path(out)
        images[0].save(out, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0,
                       optimize=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bolt_ros.robot.reachy_mini.showreel",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--animation", default="side_peekaboo")
    ap.add_argument("--out", default="reachy_mini_dance.gif")
    ap.add_argument("--fps", type=float, default=8.0)
    ap.add_argument("--size", type=int, default=240)
    ns = ap.parse_args(argv)
    frames = record(ns.animation, ns.fps)
    print(f"{len(frames)} frames recorded; rendering")
    print(write_gif(frames, ns.out, ns.fps, ns.size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
