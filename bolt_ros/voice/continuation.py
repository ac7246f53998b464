"""A person who goes on after a pause the robot took for the end of their turn (issue 33, item 3).

Words decide the end of a turn (turn_end.py) only against words that read unfinished. Half a request often reads
finished: paused at its quietest point, "Can you dance | for me?" was heard "Can you dance?", "Thank you, | have
a nice day." "Thank you.". Spoken with a 0.7 s pause in the middle, 31 of 40 such requests ended at the pause with
tiny.en's words in ~0.4 s (bench/bench_turn_end.py, load 2.5): any rule that answers within half a second of
silence answers there. So the turn may end early, and is taken back when the person goes on: speech that starts
within `continue_ms` of a turn's end, before the robot has said anything since, continues that turn. The
recognizer then stops what the robot began on the first part (the barge-in signal: nothing has been said yet, a
move may have started) and the joined audio, the pause included, is transcribed as one turn, which the assistant
answers in place of the first part.
"""
from __future__ import annotations

import numpy as np

from bolt_ros.voice.audio import MODEL_RATE

# speech/barge_in's text for it: the assistant stops the turn and keeps it out of the history (the joined turn
# holds its words)
CONTINUES = "the person goes on"


class Continuation:
    """The last turn's audio and end; whether new speech continues it, and the joined audio (16 kHz float)."""

    def __init__(self, continue_ms: int):
        self.window_s = continue_ms / 1000
        self._audio: np.ndarray | None = None
        self._t_end = 0.0          # time of the last turn's last sample
        self.joining = False       # the current turn continues the last one

    def ended(self, audio: np.ndarray, t_end: float) -> None:
        """A turn ended with `audio` (joined already if it continued one), its last sample at t_end."""
        self._audio, self._t_end, self.joining = audio, t_end, False

    def onset(self, t_start: float, robot_spoke_since: bool) -> bool:
        """Speech starting at t_start: True (and `joining`) when it continues the last turn. robot_spoke_since: the
        robot's voice was played after that turn ended (then the person answers the robot or interrupts it)."""
        self.joining = (self.window_s > 0 and self._audio is not None and not robot_spoke_since
                        and 0.0 <= t_start - self._t_end <= self.window_s)
        return self.joining

    def last_end(self) -> float:
        return self._t_end

    def joined(self, audio: np.ndarray, t_first: float) -> np.ndarray:
        """The current turn's audio (its first sample at t_first) after the last turn's, the silence between them
        kept, or the audio alone when it does not continue one. A pre-roll that reaches back into the last turn
        is cut where that turn ended."""
        if not self.joining or self._audio is None:
            return audio
        gap = round((t_first - self._t_end) * MODEL_RATE)
        if gap >= 0:
            return np.concatenate([self._audio, np.zeros(gap, np.float32), audio])
        return np.concatenate([self._audio, audio[-gap:]])
