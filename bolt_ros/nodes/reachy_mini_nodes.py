"""Pollen's Reachy Mini behind our robot contract: `joint_states`, `play_animation` (queued, cancellable),
`goto_pose` (preempting, our limits enforced before anything is sent) and `list_animations`, the same servers as
the simulated robot's (animation_server, motion_server) on a ReachyMiniRobot instead of a SimRobot.

    python -m bolt_ros.nodes.reachy_mini_nodes --ros-args -p mode:=sim          # MuJoCo daemon as a child process
    python -m bolt_ros.nodes.reachy_mini_nodes --ros-args -p mode:=real -p host:=reachy-mini.local

The backend (bolt_ros/robot/reachy_mini) is ROS-free: this node runs its control step at publish_rate_hz, publishes
what the robot reports, and tells the goal runner when a finished goal's robot has caught up. In sim mode it drives
only the daemon it started (supervisor.DaemonSupervisor: restarted when it dies); `robot_status` says in plain
words when the body comes and goes (the console shows it).
"""
from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile
from std_msgs.msg import String

from bolt_ros.nodes.animation_server import AnimationServer
from bolt_ros.nodes.common import run_nodes
from bolt_ros.nodes.motion_server import MotionServer
from bolt_ros.nodes.robot_node import RobotNode
from bolt_ros.robot import JOINT_NAMES, Motion, RobotConfig
from bolt_ros.robot.reachy_mini.bridge import ReachyBridge
from bolt_ros.robot.reachy_mini.convert import REAL_JOINT_NAMES
from bolt_ros.robot.reachy_mini.daemon import DaemonError
from bolt_ros.robot.reachy_mini.link import ReachyLink
from bolt_ros.robot.reachy_mini.reach import Reach
from bolt_ros.robot.reachy_mini.supervisor import DaemonSupervisor, Restarts

# joint_states carries the robot's own actuated joints first, then our six logical joints (the URDF's, which
# robot_state_publisher and the console read), all measured.
PUBLISHED_NAMES = (*REAL_JOINT_NAMES, *JOINT_NAMES)
# robot_status keeps its last lines for late subscribers: the console starts after the robot said where it runs
STATUS_QOS = QoSProfile(depth=10, durability=DurabilityPolicy.TRANSIENT_LOCAL)


class ReachyMiniConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    robot_config: str = ""  # robot YAML (limits, limit_mode, animations); "" = the package's config/robot.yaml
    mode: Literal["sim", "real"] = "sim"  # sim: start reachy-mini-daemon in MuJoCo (headless) as a child process
    host: str = "reachy-mini.local"  # real: the robot's daemon (USB: 127.0.0.1 on the robot's host)
    port: int = Field(8000, ge=0, le=65535)  # the daemon's REST/WebSocket port; sim with 0 = a free port
    # sim, when someone else listens on `port` (a real robot's daemon, another run): our simulator takes a free port
    # and says which, or the node stops with an error naming the port and its holder. Never connects to theirs.
    port_taken: Literal["free_port", "error"] = "free_port"
    # sim: our daemon restarted when it dies, after restart_backoff_s (doubled each time, up to
    # restart_backoff_max_s); given up after max_restarts deaths with no run of restart_stable_s between them
    max_restarts: int = Field(5, ge=0)
    restart_backoff_s: float = Field(1.0, ge=0.0)
    restart_backoff_max_s: float = Field(30.0, ge=0.0)
    restart_stable_s: float = Field(60.0, gt=0.0)
    status_topic: str = "robot_status"  # std_msgs/String: the body came or went, in plain words
    daemon_sleep_on_stop: bool = True  # sim: the daemon walks to its sleep pose at exit (~5 s)
    daemon_log: str = ""  # sim: file for the daemon's output ("" = discarded)
    publish_rate_hz: float = Field(100.0, ge=1.0, le=1000.0)  # control step + joint_states (state arrives ~50 Hz)
    joint_states_topic: str = "joint_states"
    frame_id: str = "base_link"
    connect_timeout_s: float = Field(5.0, gt=0.0)
    # no new state for this long = the daemon hangs or the network dropped (a closed connection is noticed at once);
    # not shorter: with a local model busy on both cores of a small machine the sim's stream stalled for ~0.6 s
    stale_after_s: float = Field(2.0, gt=0.0)
    retry_s: float = Field(1.0, gt=0.0)  # reconnection attempts
    max_head_offset_m: float = Field(0.04, ge=0.0, le=0.05)  # head translation a dance may ask, per axis
    # a goal's end pose must be within the robot's reach (reach.Reach, from the SDK's kinematics and MJCF): Stewart
    # motor angles inside their ranges less reach_margin_rad, and the head ending within reach_tolerance_deg of it
    # in a goal's time (the reach table); past it, refused or clamped per the robot config's limit_mode
    reach_margin_rad: float = Field(0.05, ge=0.0, le=0.3)
    reach_tolerance_deg: float = Field(2.0, gt=0.0, le=10.0)
    # a finished goal reports once every joint is within goal_tolerance_rad of the target, or settle_timeout_s
    # after the command got there (then with where the robot is: the result says what was reached)
    goal_tolerance_rad: float = Field(0.05, gt=0.0)
    settle_timeout_s: float = Field(1.0, ge=0.0)
    dances: bool = True  # add reachy-mini-dances-library's 20 moves to the animation list


class ReachyMiniRobot(RobotNode):
    def __init__(self, config: ReachyMiniConfig | None = None, robot: RobotConfig | None = None, **node_kwargs):
        super().__init__("reachy_mini", config or ReachyMiniConfig(), robot, node_kwargs)
        cfg, log = self.config, self.get_logger()
        reach = Reach(cfg.reach_margin_rad, cfg.reach_tolerance_deg)  # before a daemon starts: nothing to clean up
        self._status = self.create_publisher(String, cfg.status_topic, STATUS_QOS)
        self.supervisor: DaemonSupervisor | None = None
        host, port, endpoint = cfg.host, cfg.port, None
        if cfg.mode == "sim":
            self.supervisor = DaemonSupervisor(
                cfg.port, port_taken=cfg.port_taken, sleep_on_stop=cfg.daemon_sleep_on_stop,
                log_path=cfg.daemon_log or None, info=log.info, error=log.error, status=self.say_status,
                restarts=Restarts(cfg.max_restarts, cfg.restart_backoff_s, cfg.restart_backoff_max_s,
                                  cfg.restart_stable_s))
            try:
                self.supervisor.start()
            except DaemonError as e:  # no simulator of ours: stop, rather than run a robot node with no body
                self.supervisor.close()
                self.destroy_node()
                raise ValueError(f"reachy-mini-daemon (robot:=reachy_mini_sim): {e}") from e
            host, port = self.supervisor.daemon.host, self.supervisor.daemon.port
            endpoint = self.supervisor.endpoint  # the link connects to our daemon, wherever it runs now, or to none
        self.link = ReachyLink(host, port, connect_timeout_s=cfg.connect_timeout_s, stale_after_s=cfg.stale_after_s,
                               retry_s=cfg.retry_s, log=log.info, endpoint=endpoint).start()
        self._was_connected: bool | None = None
        self.bridge = ReachyBridge(self.link, self.robot, cfg.max_head_offset_m,
                                   log=lambda m: log.warning(m, throttle_duration_sec=2.0),
                                   reach=reach)
        self.controller = self.bridge.controller
        if cfg.dances:
            self._add_dances()
        self._measured = None
        self.start_loop("reachy-mini-bridge")

    def _add_dances(self) -> None:
        try:
            from bolt_ros.robot.reachy_mini.dances import DanceMoves
        except ImportError as e:
            self.get_logger().warning(f"no dance moves (reachy-mini-dances-library not installed: {e})")
            return
        moves = DanceMoves(self.robot, self.config.max_head_offset_m)
        for name, joints in moves.clipped.items():
            if joints:
                self.get_logger().info(f"dance {name!r}: our limits clip {', '.join(joints)}")
        self.library = self.library.extended(moves.entries())

    def say_status(self, text: str) -> None:
        self._status.publish(String(data=text))

    def _cycle(self):
        self._measured = m = self.bridge.step()
        if self.link.connected != self._was_connected:
            if self._was_connected is not None or self.link.connected:
                self.say_status("my body is connected" if self.link.connected else "my body isn't connected")
            self._was_connected = self.link.connected
        if m is None:
            return None  # no robot, no joint_states: nothing made up
        return PUBLISHED_NAMES, [*m.joints, *m.pose], []

    def settled(self, motion: Motion) -> bool:
        return self.bridge.settled(motion, self._measured, self.config.goal_tolerance_rad,
                                   self.config.settle_timeout_s)

    def shortfall(self, motion: Motion) -> str:
        missed = self.bridge.shortfall(motion, self._measured, self.config.goal_tolerance_rad)
        return f"{missed} (the robot's reach ends there)" if missed else ""

    def reached(self) -> np.ndarray:
        m = self._measured
        return m.pose.copy() if m is not None else np.full(len(JOINT_NAMES), np.nan)  # NaN: unknown, no robot

    def close(self) -> None:
        super().close()
        if hasattr(self, "link"):
            self.link.close()
        if getattr(self, "supervisor", None) is not None:
            self.supervisor.close()


def make_reachy_mini_nodes(config: ReachyMiniConfig | None = None, animation_config=None, motion_config=None,
                           **node_kwargs) -> list[Node]:
    """[ReachyMiniRobot, AnimationServer, MotionServer]; node_kwargs (context, namespace, ...) go to every node."""
    robot = ReachyMiniRobot(config, **node_kwargs)
    return [robot, AnimationServer(robot, animation_config, **node_kwargs),
            MotionServer(robot, motion_config, **node_kwargs)]


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(make_reachy_mini_nodes, args))


if __name__ == "__main__":
    main()
