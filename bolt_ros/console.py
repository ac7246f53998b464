"""A terminal console for the running graph, made for a person: you type what a person says, and read the
conversation, one line per move the robot makes, and problems in plain words.

    you: look to your left
    [moves: look left]
    [motion] moving
    Bolt: Looking left.
    [motion] stopped: head r/p/y  +0/ +0/+34 deg  antennas  +0/ +0 deg  body  +0 deg
    [robot] my body isn't connected

ROS logs and the tools' JSON go to bringup's log file; `verbose=True` (bringup --verbose) shows the tool calls and
results as JSON here too. Motion lines come when a move starts and when it ends, not while the head holds still
(the simulated head creeps by fractions of a degree) nor while it sways with the robot's voice (a few degrees).
Lines starting with `/see ` publish a caption (what the robot's camera would report); `/quit` or Ctrl-D ends.
"""
from __future__ import annotations

import json
import math
import sys
import threading
import time
from typing import TextIO

from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from bolt_ros.assistant.priming import READY
from bolt_ros.msg import AssistantEvent, Caption

PROMPT = "you: "
HELP = "Type what a person says to the robot. /see <text>: a camera caption. /quit or Ctrl-D: exit."
# A move starts when a joint leaves its rest pose by more than START_RAD (antennas: START_ANTENNA_RAD): above the
# voice sway's peaks (4 deg head, 12 deg antennas, voice/config.py SwayConfig). It ends when every joint stayed
# within STILL_RAD for STILL_S: the MuJoCo head settles to < 0.5 deg within ~0.3 s of its last command.
START_RAD, START_ANTENNA_RAD = 0.1, 0.35
STILL_RAD, STILL_S = 0.02, 0.4
GAP_S = 1.0  # joint states stop while a robot is gone (both robots publish at 100 Hz)
ANTENNAS = ("antenna_right", "antenna_left")
WATCHED = ("head_roll", "head_pitch", "head_yaw", *ANTENNAS, "body_yaw")


class Console(Node):
    def __init__(self, *, out: TextIO = sys.stdout, verbose: bool = False, transcript: str = "speech/transcript",
                 caption: str = "perception/caption", events: str = "assistant/events", tts: str = "tts/say",
                 joint_states: str = "joint_states", robot_status: str = "robot_status", **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "console"), **node_kwargs)
        self.out, self.verbose = out, verbose
        self._print_lock = threading.Lock()
        self._transcript = self.create_publisher(String, transcript, 10)
        self._caption = self.create_publisher(Caption, caption, 10)
        self.create_subscription(String, tts, lambda m: self.show(f"Bolt: {m.data}"), 10)
        # what speech_recognizer heard (voice:=true); the console's own typed lines come back here too
        self._typed: list[str] = []
        self.create_subscription(String, transcript, self._on_transcript, 10)
        self.create_subscription(AssistantEvent, events, self._on_event, 100)
        self.create_subscription(JointState, joint_states, self._on_joints, 10)
        self.create_subscription(String, robot_status, lambda m: self.show(f"[robot] {m.data}"),
                                 QoSProfile(depth=10, durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.motion = MotionLines()
        self._thinking = False
        self._calls: dict[str, str] = {}  # call id -> its words, for the line of a call that failed

    # ---- input -----------------------------------------------------------------------------------------------
    def start_input(self, stop: threading.Event, stdin: TextIO = sys.stdin) -> threading.Thread:
        """Read lines in a daemon thread; EOF or /quit sets `stop` (the bringup loop then shuts down)."""
        def read() -> None:
            self.show(HELP)
            for line in stdin:
                if not self.handle_line(line):
                    break
            stop.set()
        t = threading.Thread(target=read, name="console-input", daemon=True)
        t.start()
        return t

    def handle_line(self, line: str) -> bool:
        """One typed line; False when the console should end."""
        text = line.strip()
        if text in ("/quit", "/exit"):
            return False
        if text.startswith("/see "):
            msg = Caption(source="console", text=text[5:].strip(), confidence=-1.0)
            msg.header.stamp = self.get_clock().now().to_msg()
            self._caption.publish(msg)
            self.show(f"[camera] {msg.text}")
        elif text:
            self._typed = [*self._typed[-7:], text]
            self._transcript.publish(String(data=text))
        return True

    # ---- output ----------------------------------------------------------------------------------------------
    def show(self, line: str) -> None:
        with self._print_lock:
            if self.out.isatty():
                self.out.write("\r\033[K" + line + "\n" + PROMPT + _typed())
            else:
                self.out.write(line + "\n")
            self.out.flush()

    def _on_transcript(self, msg: String) -> None:
        if msg.data in self._typed:
            self._typed.remove(msg.data)
        else:
            self.show(f"you (voice): {msg.data}")

    def _on_event(self, ev: AssistantEvent) -> None:
        if ev.type == AssistantEvent.TOOL_CALL:
            words = move_words(ev.tool_call.name, ev.tool_call.arguments)
            self._calls = {**dict(list(self._calls.items())[-15:]), ev.tool_call.id: words}
            self.show(f"[{words}]")
            if self.verbose:
                self.show(f"[tool] {ev.tool_call.name} {ev.tool_call.arguments}")
        elif ev.type == AssistantEvent.TOOL_RESULT:
            r = ev.tool_result
            if self.verbose:
                self.show(f"[tool] {r.name} -> " + (f"ok {r.content}" if r.ok else f"error: {r.error}"))
            elif not r.ok:  # why is the robot's own sentence (or the log's, in detail)
                self.show(f"[{self._calls.get(r.id) or move_words(r.name, '{}')}: not done]")
        elif ev.type == AssistantEvent.ERROR:
            self.show(f"[problem] {ev.text}" if self.verbose else "[problem] something went wrong in my thinking "
                      "(details in the log)")
        elif ev.type == AssistantEvent.STATE and ev.state == READY:   # primed: answers come at full speed
            self.show("[ready: the robot answers at full speed now]")
        elif ev.type == AssistantEvent.STATE:
            if ev.state == AssistantEvent.STATE_THINKING and not self._thinking:
                self.show("[thinking...]")  # once a turn: a turn may think again after each tool round
            self._thinking = ev.state != AssistantEvent.STATE_IDLE

    def _on_joints(self, js: JointState) -> None:
        line = self.motion.update(js.name, js.position, time.monotonic())
        if line:
            self.show(line)


class MotionLines:
    """Joint states -> a line when a move starts ("[motion] moving") and when it ends (where the robot stopped)."""

    def __init__(self):
        self.rest: dict[str, float] | None = None  # where the robot was still last
        self.moving = False
        self._recent: list[tuple[float, dict[str, float]]] = []  # the last STILL_S of poses

    def update(self, names, positions, now: float) -> str:
        pose = {n: p for n, p in zip(names, positions) if n in WATCHED}
        if not pose:
            return ""
        if self._recent and now - self._recent[-1][0] > GAP_S:
            # no state for a while: the robot was gone (a Reachy Mini daemon restarting starts elsewhere); where it
            # is now is its rest, not a move of ours
            self.rest, self.moving, self._recent = None, False, []
        self._recent = [(t, p) for t, p in self._recent if now - t <= STILL_S] + [(now, pose)]
        still = now - self._recent[0][0] >= STILL_S * 0.9 and all(
            max(p[n] for _, p in self._recent) - min(p[n] for _, p in self._recent) <= STILL_RAD for n in pose)
        if self.rest is None:
            self.rest = pose
            return ""
        if not self.moving:
            if any(abs(pose[n] - self.rest.get(n, pose[n])) > (START_ANTENNA_RAD if n in ANTENNAS else START_RAD)
                   for n in pose):
                self.moving = True
                return "[motion] moving"
            if still:
                self.rest = pose  # a slow creep at rest moves the rest pose, not the robot's story
            return ""
        if still:
            self.moving, self.rest = False, pose
            return "[motion] stopped: " + format_pose(list(pose), list(pose.values()))
        return ""


def move_words(name: str, arguments: str) -> str:
    """A tool call as a person would say it: "moves: look left", "moves: dance", "checks: list animations"."""
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        args = {}
    args = args if isinstance(args, dict) else {}
    if name == "play_animation" and isinstance(args.get("name"), str):
        words = args.pop("name")
    else:
        words = name
    words = " ".join([words.replace("_", " "), *(str(v).replace("_", " ") for v in args.values()
                                                 if isinstance(v, str))])
    nums = ", ".join(f"{k} {v:g}" for k, v in args.items() if isinstance(v, int | float) and not isinstance(v, bool))
    return ("checks: " if name.startswith("list_") else "moves: ") + words + (f" ({nums})" if nums else "")


def format_pose(names: list[str], pos: list[float]) -> str:
    d = {n: math.degrees(p) for n, p in zip(names, pos)}
    g = lambda n: d.get(n, 0.0)  # noqa: E731
    return (f"head r/p/y {g('head_roll'):+4.0f}/{g('head_pitch'):+4.0f}/{g('head_yaw'):+4.0f} deg  "
            f"antennas {g('antenna_right'):+4.0f}/{g('antenna_left'):+4.0f} deg  body {g('body_yaw'):+4.0f} deg")


def _typed() -> str:
    try:
        import readline
        return readline.get_line_buffer()
    except ImportError:
        return ""
