"""A terminal console for the running graph: you type what a person says, it shows live what the robot says,
the tools it calls and how it moves.

    you> wave at me
    [tool] play_animation {"name": "happy"}
    [motion] head r/p/y  +0/ -8/ +0 deg  antennas +45/-45 deg  body +0 deg
    [tool] play_animation -> ok
    Bolt: There, a happy wiggle!

Lines starting with `/see ` publish a caption (what the robot's camera would report); `/quit` or Ctrl-D ends.
"""
from __future__ import annotations

import math
import sys
import threading
import time
from typing import TextIO

from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from bolt_ros.msg import AssistantEvent, Caption

PROMPT = "you> "
HELP = "Type what a person says to the robot. /see <text>: a camera caption. /quit or Ctrl-D: exit."
MOTION_PERIOD_S = 0.25  # joint-state lines at most this often while the robot moves
MOVING_RAD = 0.005


class Console(Node):
    def __init__(self, *, out: TextIO = sys.stdout, transcript: str = "speech/transcript",
                 caption: str = "perception/caption", events: str = "assistant/events", tts: str = "tts/say",
                 joint_states: str = "joint_states", **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "console"), **node_kwargs)
        self.out = out
        self._print_lock = threading.Lock()
        self._transcript = self.create_publisher(String, transcript, 10)
        self._caption = self.create_publisher(Caption, caption, 10)
        self.create_subscription(String, tts, lambda m: self.show(f"Bolt: {m.data}"), 10)
        # what speech_recognizer heard (voice:=true); the console's own typed lines come back here too
        self._typed: list[str] = []
        self.create_subscription(String, transcript, self._on_transcript, 10)
        self.create_subscription(AssistantEvent, events, self._on_event, 100)
        self.create_subscription(JointState, joint_states, self._on_joints, 10)
        self._last_pose: list[float] | None = None
        self._last_motion_t = 0.0
        self._moving = False

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
            self.show(f"[tool] {ev.tool_call.name} {ev.tool_call.arguments}")
        elif ev.type == AssistantEvent.TOOL_RESULT:
            r = ev.tool_result
            self.show(f"[tool] {r.name} -> " + (f"ok {r.content[:120]}" if r.ok else f"error: {r.error}"))
        elif ev.type == AssistantEvent.ERROR:
            self.show(f"[error] {ev.text}")
        elif ev.type == AssistantEvent.STATE and ev.state == AssistantEvent.STATE_THINKING:
            self.show("[thinking...]")

    def _on_joints(self, js: JointState) -> None:
        pose = list(js.position)
        now = time.monotonic()
        moved = self._last_pose is None or max(abs(a - b) for a, b in zip(pose, self._last_pose)) > MOVING_RAD
        if moved and now - self._last_motion_t >= MOTION_PERIOD_S:
            self.show("[motion] " + format_pose(js.name, pose))
            self._last_pose, self._last_motion_t, self._moving = pose, now, True
        elif not moved and self._moving and now - self._last_motion_t >= MOTION_PERIOD_S:
            self.show("[motion] still at " + format_pose(js.name, pose))
            self._moving = False


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
