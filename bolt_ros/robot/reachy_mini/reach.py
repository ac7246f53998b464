"""What the Reachy Mini can reach, by its own kinematics: a pose inside our per-joint limits may still be past the
Stewart platform's reach (full pitch with full yaw; in MuJoCo, full yaw alone). Past it the daemon refuses nothing:
it logs "IK error" and holds a bent pose, or stops short and creeps. So a target is checked here before it is sent.

Two checks, both from the SDK's own robot:
- its inverse kinematics (the analytical solver the daemon itself runs, without automatic body yaw: the body goes
  where we say): the six Stewart motor angles must exist (no NaN) and lie inside the motors' MJCF ranges less
  `margin_rad`;
- a reachability table (reach_table.json, `python -m bolt_ros.robot.reachy_mini.reach --build`): for a grid of head
  poses relative to the body, how far (deg) the head ends from the pose when MuJoCo runs the SDK's MJCF with the
  motors at the IK's angles, as the daemon does. The IK alone is not enough: it solves yaw 65 deg, but the daemon's
  head was at 60.5 deg 1.5 s later, and 17 deg short at yaw 58 with roll and pitch -30 (measured). A pose is
  reachable where the table (interpolated) says the head ends within `tolerance_deg`: 2 deg, under a goal's
  0.05 rad (2.9 deg) tolerance by what the daemon and this simulation differ (0.4 deg at yaw 65).

The robot's reach does not depend on the body's yaw (it turns the whole platform about the vertical), so the table
is over (head roll, head pitch, head yaw relative to the body). `nearest` is the reachable pose closest to an
unreachable one along the way from a reachable one (bisection): what a clamped goal and the last-line guard send.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import xml.etree.ElementTree as ET
from importlib.resources import files
from pathlib import Path

import numpy as np

from bolt_ros.robot.config import JOINT_NAMES
from bolt_ros.robot.reachy_mini.convert import from_sdk, to_sdk

STEWART = tuple(f"stewart_{i}" for i in range(1, 7))
RPY = [JOINT_NAMES.index(n) for n in ("head_roll", "head_pitch", "head_yaw")]
TABLE = Path(__file__).with_name("reach_table.json")


def _mjcf_dir():
    import reachy_mini

    return files(reachy_mini).joinpath("descriptions/reachy_mini/mjcf")


def stewart_ranges() -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) of the six Stewart motors, rad, from the SDK's MJCF (read as XML: no MuJoCo import)."""
    mjcf = ET.fromstring(_mjcf_dir().joinpath("reachy_mini.xml").read_text())
    joints = {j.get("name"): j for j in mjcf.iter("joint")}
    ranges = [[float(v) for v in joints[n].get("range").split()] for n in STEWART]
    return np.array([r[0] for r in ranges]), np.array([r[1] for r in ranges])


class Reach:
    def __init__(self, margin_rad: float = 0.05, tolerance_deg: float = 2.0, table: Path = TABLE):
        from reachy_mini.kinematics import AnalyticalKinematics  # the SDK (its import pulls GLib): only here

        self._kin = AnalyticalKinematics(automatic_body_yaw=False)
        lower, upper = stewart_ranges()
        self.lower, self.upper = lower + margin_rad, upper - margin_rad
        self.tolerance_deg = tolerance_deg
        t = json.loads(Path(table).read_text())
        self.axes = [np.array(t[a]) for a in ("roll", "pitch", "yaw")]
        self.table = np.array(t["miss_deg"])  # [roll, pitch, yaw]

    def motors(self, pose: np.ndarray, offset: np.ndarray | None = None) -> np.ndarray:
        """The six Stewart motor angles the SDK's IK gives for our pose (NaN where it has no solution)."""
        head, _, body = to_sdk(pose, offset)
        try:
            joints = self._kin.ik(head, body_yaw=body)
        except (ValueError, RuntimeError):  # no solution at all
            return np.full(len(STEWART), np.nan)
        return np.asarray(joints, dtype=float)[1:]

    def miss_deg(self, pose: np.ndarray) -> float:
        """How far (deg) the simulated head ends from `pose`: the table, interpolated (trilinear). Outside the grid
        (past our per-joint limits, which refuse it first anyway) counts as unreachable."""
        lo, frac = [], []
        for axis, v in zip(self.axes, pose[RPY]):
            if not axis[0] - 1e-9 <= v <= axis[-1] + 1e-9:
                return 1e3
            i = int(np.clip(np.searchsorted(axis, v) - 1, 0, len(axis) - 2))
            lo.append(i)
            frac.append(float(np.clip((v - axis[i]) / (axis[i + 1] - axis[i]), 0.0, 1.0)))
        cell = self.table[lo[0]:lo[0] + 2, lo[1]:lo[1] + 2, lo[2]:lo[2] + 2]
        for f in frac:  # one axis at a time
            cell = cell[0] * (1.0 - f) + cell[1] * f
        return float(cell)

    def why_not(self, pose: np.ndarray, offset: np.ndarray | None = None) -> str:
        """"" when the robot can take `pose`, else why not (for the log and the goal's result)."""
        m = self.motors(pose, offset)
        if not np.all(np.isfinite(m)):
            return "its head has no kinematic solution there"
        bad = np.flatnonzero((m < self.lower) | (m > self.upper))
        if bad.size:
            return ", ".join(f"{STEWART[i]} would be at {math.degrees(m[i]):.0f} deg (range "
                             f"{math.degrees(self.lower[i]):.0f}..{math.degrees(self.upper[i]):.0f})" for i in bad)
        miss = self.miss_deg(pose)
        if miss > self.tolerance_deg:
            return f"its head stops {min(miss, 99):.1f} deg short there, by the reach table"
        return ""

    def reachable(self, pose: np.ndarray, offset: np.ndarray | None = None) -> bool:
        return not self.why_not(pose, offset)

    def nearest(self, pose: np.ndarray, toward: np.ndarray, offset: np.ndarray | None = None,
                tol_rad: float = 0.002) -> np.ndarray:
        """The reachable pose closest to `pose` on the straight way from `toward` (reachable) to it: only the head's
        roll, pitch and yaw move along it (the body and the antennas do not change the reach), bisected to
        tol_rad."""
        if self.reachable(pose, offset):
            return pose.copy()
        lo, hi = 0.0, 1.0  # fraction of the way from toward to pose: lo reachable, hi not
        span = float(np.max(np.abs(pose[RPY] - toward[RPY]))) or 1.0
        while (hi - lo) * span > tol_rad:
            mid = 0.5 * (lo + hi)
            if self.reachable(self._between(toward, pose, mid), offset):
                lo = mid
            else:
                hi = mid
        return self._between(toward, pose, lo)

    @staticmethod
    def _between(a: np.ndarray, b: np.ndarray, f: float) -> np.ndarray:
        out = b.copy()
        out[RPY] = a[RPY] + f * (b[RPY] - a[RPY])
        return out


class MujocoHead:
    """The SDK's MJCF in MuJoCo, driven as its daemon drives it (motor targets from the analytical IK, 2 ms steps),
    without the daemon: where the head ends for a pose, to build and check the table."""

    def __init__(self):
        import mujoco
        from reachy_mini.kinematics import AnalyticalKinematics

        self.mj = mujoco
        self.model = mujoco.MjModel.from_xml_path(str(_mjcf_dir().joinpath("scenes/empty.xml")))
        self.model.opt.timestep = 0.002  # the daemon's
        self.site = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_SITE, "head")
        self.addr = [self.model.jnt_qposadr[self.model.actuator_trnid[i, 0]] for i in range(7)]
        self.kin = AnalyticalKinematics(automatic_body_yaw=False)
        self.home = mujoco.MjData(self.model)
        neutral = self.kin.ik(to_sdk(np.zeros(len(JOINT_NAMES)))[0], body_yaw=0.0)
        self.home.qpos[self.addr], self.home.ctrl[:7] = neutral, neutral
        mujoco.mj_forward(self.model, self.home)
        for _ in range(500):
            mujoco.mj_step(self.model, self.home)
        self.data = mujoco.MjData(self.model)

    def reached(self, pose: np.ndarray, ramp_s: float = 1.0, hold_s: float = 1.0) -> np.ndarray:
        """Our pose the head ends in: from neutral, the motors ramped to the IK's angles in ramp_s, held hold_s.
        A goal's timing: a 1 s move (the look tool's), then the 1 s a goal waits for the robot to settle
        (ReachyMiniConfig.settle_timeout_s). The head settles slowly near its reach's edge (yaw 65 deg alone: 4.9 deg
        short after 1.5 s, 0.2 deg after 4 s; the daemon measured 4.5 deg short after 1.5 s): what it does not reach
        in a goal's time is out of reach for a goal."""
        d, h = self.data, self.home
        d.qpos[:], d.qvel[:], d.act[:], d.ctrl[:], d.qacc_warmstart[:] = h.qpos, h.qvel, h.act, h.ctrl, h.qacc_warmstart
        self.mj.mj_forward(self.model, d)
        head, _, body = to_sdk(pose)
        target = np.asarray(self.kin.ik(head, body_yaw=body), dtype=float)
        start = self.data.ctrl[:7].copy()
        n_ramp, n = int(ramp_s / 0.002), int((ramp_s + hold_s) / 0.002)
        for k in range(n):
            self.data.ctrl[:7] = start + min(1.0, (k + 1) / n_ramp) * (target - start)
            self.mj.mj_step(self.model, self.data)
        m = np.eye(4)
        m[:3, :3] = self.data.site_xmat[self.site].reshape(3, 3)
        return from_sdk(m, [0.0, 0.0], float(self.data.qpos[self.addr[0]]))

    def miss_deg(self, pose: np.ndarray) -> float:
        if not np.all(np.isfinite(self.kin.ik(to_sdk(pose)[0], body_yaw=float(pose[JOINT_NAMES.index('body_yaw')])))):
            return 1e3
        return float(np.degrees(np.max(np.abs(self.reached(pose)[RPY] - pose[RPY]))))


def build_table(out: Path = TABLE, n_rp: int = 13, n_yaw: int = 17) -> None:
    """The grid spans our per-joint limits (config/robot.yaml): roll and pitch +-0.6 rad, relative yaw +-1.1344."""
    from bolt_ros.robot import load_robot_config

    lim = load_robot_config().limits
    axes = {"roll": np.linspace(lim.head_roll.lower, lim.head_roll.upper, n_rp),
            "pitch": np.linspace(lim.head_pitch.lower, lim.head_pitch.upper, n_rp),
            "yaw": np.linspace(lim.head_yaw.lower, lim.head_yaw.upper, n_yaw)}
    sim, t0 = MujocoHead(), time.monotonic()
    miss = np.zeros((n_rp, n_rp, n_yaw))
    for i, r in enumerate(axes["roll"]):
        for j, p in enumerate(axes["pitch"]):
            for k, y in enumerate(axes["yaw"]):
                pose = np.zeros(len(JOINT_NAMES))
                pose[RPY] = r, p, y
                miss[i, j, k] = sim.miss_deg(pose)
        print(f"roll {math.degrees(r):+.0f} deg done ({time.monotonic() - t0:.0f} s)", flush=True)
    about = "deg the simulated head ends from the pose (bolt_ros/robot/reachy_mini/reach.py)"
    out.write_text(json.dumps({"about": about, **{a: [round(float(v), 5) for v in x] for a, x in axes.items()},
                               "miss_deg": np.round(miss, 2).tolist()}) + "\n")
    print(f"wrote {out}: {int((miss <= 2.0).sum())} of {miss.size} grid poses within 2 deg")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="build the Reachy Mini reachability table (MuJoCo, ~2 min)")
    ap.add_argument("--build", action="store_true")
    if ap.parse_args().build:
        build_table()
