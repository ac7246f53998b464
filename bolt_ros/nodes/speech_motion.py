"""The speech_motion node: while the robot speaks, its head and antennas move a little with its voice
(bolt_ros.voice.sway on the played audio, `audio/out`), around the pose it held when it started speaking.

It moves only through the `goto_pose` action, so the motion server's joint and velocity limits apply (it keeps its
targets inside the robot's joint limits: a target out of range is refused whole), and it yields
to any motion a tool asked for: while the assistant is acting, or any goal that is not its own runs on `goto_pose`
or `play_animation`, it sends nothing, and it takes the pose the tool left as its next base.
"""
from __future__ import annotations

import math
import time
import uuid

from action_msgs.msg import GoalStatus, GoalStatusArray
from rclpy.action import ActionClient
from rclpy.node import Node
from sensor_msgs.msg import JointState
from unique_identifier_msgs.msg import UUID

from bolt_ros.action import GotoPose
from bolt_ros.msg import AssistantEvent, AudioChunk, RobotPose
from bolt_ros.nodes.common import declare_config, run_nodes
from bolt_ros.nodes.speech_common import chunk_samples, from_stamp
from bolt_ros.robot import load_robot_config
from bolt_ros.voice.audio import to_mono_float
from bolt_ros.voice.config import SpeechMotionConfig
from bolt_ros.voice.sway import Sway, within

ACTIVE = (GoalStatus.STATUS_ACCEPTED, GoalStatus.STATUS_EXECUTING, GoalStatus.STATUS_CANCELING)
HEAD_AND_ANTENNAS = ("head_roll", "head_pitch", "head_yaw", "antenna_right", "antenna_left")


class SpeechMotion(Node):
    def __init__(self, config: SpeechMotionConfig | None = None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "speech_motion"), **node_kwargs)
        try:
            self.config = cfg = declare_config(self, config or SpeechMotionConfig())
            limits = load_robot_config(cfg.robot_config).limits  # RobotConfigError is a ValueError
        except ValueError:
            self.destroy_node()
            raise
        self.sway = Sway(cfg.sway)
        self.envelope = {j: (getattr(limits, j).lower, getattr(limits, j).upper) for j in HEAD_AND_ANTENNAS}
        t = cfg.topics
        self._client = ActionClient(self, GotoPose, t.goto)
        self.create_subscription(AudioChunk, t.playback, self._on_playback, 100)
        self.create_subscription(JointState, t.joint_states, self._on_joints, 10)
        self.create_subscription(AssistantEvent, "assistant/events", self._on_assistant, 100)
        self._foreign: dict[str, set[bytes]] = {}
        for action in t.busy_actions:
            self.create_subscription(GoalStatusArray, f"{action}/_action/status",
                                     lambda m, a=action: self._on_status(a, m), 10)
        self._own: set[bytes] = set()
        self._acting = False
        self._joints: dict[str, float] = {}
        self._base: dict[str, float] | None = None     # the pose speech started from
        self.counts = {"goals": 0, "yielded": 0}
        self.create_timer(1.0 / cfg.sway.rate_hz, self._tick)

    # ---- inputs ----------------------------------------------------------------------------------------------
    def _on_playback(self, msg: AudioChunk) -> None:
        if msg.channels >= 1 and msg.sample_rate > 0 and len(msg.data) % msg.channels == 0:
            self.sway.add_audio(to_mono_float(chunk_samples(msg), msg.channels), msg.sample_rate,
                                from_stamp(msg.header.stamp))

    def _on_joints(self, js: JointState) -> None:
        self._joints = dict(zip(js.name, js.position))

    def _on_assistant(self, ev: AssistantEvent) -> None:
        if ev.type == AssistantEvent.STATE:
            self._acting = ev.state == AssistantEvent.STATE_ACTING

    def _on_status(self, action: str, msg: GoalStatusArray) -> None:
        self._foreign[action] = {bytes(s.goal_info.goal_id.uuid) for s in msg.status_list if s.status in ACTIVE
                                 and bytes(s.goal_info.goal_id.uuid) not in self._own}

    def busy(self) -> bool:
        """A tool's motion runs (or is about to): speech motion keeps still."""
        return self._acting or any(self._foreign.values())

    # ---- the timer -------------------------------------------------------------------------------------------
    def _tick(self) -> None:
        if not self.config.sway.enabled:
            return
        now = time.time()
        if self.busy():
            self.counts["yielded"] += self.sway.speaking(now)
            self._base = None        # the tool moves the robot: its pose is the next base
            return
        if not self.sway.speaking(now):
            if self._base is not None:
                self._send(self._base, 0.3)   # back to where speech started
                self._base = None
            return
        if self._base is None:
            if not all(j in self._joints for j in HEAD_AND_ANTENNAS):
                return
            self._base = {j: self._joints[j] for j in HEAD_AND_ANTENNAS}
        off = self.sway.offsets(now)
        self._send(within({j: self._base[j] + off[j] for j in HEAD_AND_ANTENNAS}, self.envelope),
                   1.0 / self.config.sway.rate_hz)

    def _send(self, pose: dict[str, float], duration: float) -> None:
        if not self._client.server_is_ready():
            return
        target = RobotPose(head_roll=pose["head_roll"], head_pitch=pose["head_pitch"], head_yaw=pose["head_yaw"],
                           antennas=[pose["antenna_right"], pose["antenna_left"]], body_yaw=math.nan)
        goal_id = uuid.uuid4().bytes
        self._own.add(goal_id)
        if len(self._own) > 1000:
            self._own = set(list(self._own)[-500:])
        self._client.send_goal_async(GotoPose.Goal(target=target, duration=duration,
                                                   interpolation=GotoPose.Goal.INTERPOLATION_LINEAR),
                                     goal_uuid=UUID(uuid=list(goal_id)))
        self.counts["goals"] += 1


def make_nodes(**node_kwargs) -> list[Node]:
    return [SpeechMotion(**node_kwargs)]


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(make_nodes, args))


if __name__ == "__main__":
    main()
