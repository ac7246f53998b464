"""The robot's own voice in its microphone: a gate that knows what was played and when.

Without an echo-cancelling board the mic hears the speaker. The played audio is the reference, kept as levels on a
32 ms frame grid. A mic frame counts as possible speech only if it is louder than the echo the reference can explain
by `margin_db`. The echo path is learned from the levels themselves while the robot speaks: the delay is the lag at
which the mic's level envelope follows the reference's best, the return loss the lower quartile of the level
differences at that lag. Not their median: where the room's reflections add up, the echo is several dB louder than
typical, and median plus margin let ~4 % of Piper renderings through as a false barge-in (150 ms, -12 dB path); a
quartile still ignores a person who talks for under a quarter of the window. Until 1.5 s of playback have been
heard, and whenever the learned path stops explaining the mic, the gate falls back on the conservative prior: the
loudest reference frame of the last `max_delay_ms + tail_ms`, less `return_loss_db`.

Level gating, not subtraction: it needs no impulse response, holds in reverberant rooms, and a barge-in only has to be
louder than the robot's echo at that moment, which a person talking to a robot is.

A room is not silent (issue 36). When the echo stops, at a sentence's end or a pause inside one, silero goes on
scoring the plain room noise as speech for about three frames (0.99, 0.93, 0.71 over -41 dBFS noise), while the
expected echo falls ~8 dB a frame below the noise: those frames were "not echo", an onset fired, and the robot, still
speaking by `robot_speaking`, barged in on itself (4 of 4 sentences over room noise, none over digital silence). So
the gate knows the room's level: a running low quantile of the frames heard with no playback that silero does not
take for speech (`noise_window_s`, `noise_quantile`). Until there are a second's worth of those, the same quantile
of every frame heard, playback or not, stands in from the first quarter second on (the noise between the echo's
words): over babble at -35 dBFS
silero took most of the 2 s before the robot's first reply for speech, the room stayed unknown, and 1 in ~30 runs
of four replies barged in 4-6 times in the first reply (bench_barge_in_asr.py over new Piper renderings). A frame is
possible speech
only `noise_margin_db` above the room, and while the robot's audio is in the air above the power sum of that and
the expected echo plus `margin_db`: the frames after the echo ends, at the room's level, start no onset whatever
silero says of them, and an onset that comes only as the echo ends is not a person. `vad_hangover_ms` can also
hold the expected echo after it falls; with the room's level in, it only cost detections (bench_barge_in_asr.py).
"""
from __future__ import annotations

import threading
from collections import deque

import numpy as np

from bolt_ros.voice.audio import level_db
from bolt_ros.voice.config import EchoConfig
from bolt_ros.voice.vad import FRAME, FRAME_S

SILENT_DB = -120.0
QUIET_DB = -60.0             # reference frames below this say nothing about the echo path
LEARN_AFTER = 48             # mic frames heard during playback before the path is estimated (1.5 s)
LEARN_EVERY = 16             # ... and re-estimated every 0.5 s
HISTORY = 160                # frames of mic/reference pairs the estimate looks at (~5 s)
MIN_CORRELATION = 0.5        # a lag that explains the mic less well than this is no estimate
ERL_QUANTILE = 0.25          # of (reference - mic) levels: see the module docstring
MIN_ROOM_FRAMES = 31         # frames with no playback before the room's level is believed (1 s)
# silero's probability below which a frame is a sample of the room (its own "not speech" threshold, 0.5 - 0.15): with
# every frame with no playback in it, a person's own 24 s turn raised the room's level to their quieter syllables and
# cut the turn into 3-12 turns
ROOM_MAX_PROB = 0.35
# frames of any kind before their low quantile stands in for the room (a quarter second: babble at -35 dBFS made
# silero start a turn 0.35-0.8 s after the node started, before a room level was known)
ROUGH_FRAMES = 8


class EchoGate:
    def __init__(self, cfg: EchoConfig, keep_s: float = 10.0):
        self.cfg = cfg
        self._lock = threading.Lock()   # the reference arrives on the executor, the mic on the audio thread
        self._ref: dict[int, float] = {}                 # frame index (t / FRAME_S) -> level dB
        self._order: deque[int] = deque()
        self._keep = max(1, int(keep_s / FRAME_S))
        self._t_last_ref = -1e18
        self._t_last_voice = -1e18       # end of the last played frame with sound in it (> QUIET_DB)
        self._mic: deque[tuple[int, float]] = deque(maxlen=HISTORY)   # mic frames heard during playback
        self._since_fit = 0
        self.lag: int | None = None      # learned delay, frames
        self.erl_db = 0.0                # learned return loss at that delay
        self._quiet: deque[float] = deque(maxlen=max(1, int(cfg.noise_window_s / FRAME_S)))  # levels, no playback
        self._since_floor = 0
        self.noise_floor_db = SILENT_DB  # the room with nobody and no robot in it (SILENT_DB: not known yet)
        self._heard: deque[float] = deque(maxlen=self._quiet.maxlen)   # every frame's level
        self.rough_floor_db = SILENT_DB  # their low quantile: the room until noise_floor_db is known
        self._since_rough = 0
        # frames let through as possible speech, by the newest played time their echo could hold: a reference that
        # arrives later for that time came too late for them (a busy executor), and they are counted
        self._passed: deque[float] = deque(maxlen=64)
        self.late_frames = 0

    # ---- the reference ---------------------------------------------------------------------------------------
    def add_reference(self, x: np.ndarray, t_start: float) -> None:
        """Played audio (16 kHz float) whose first sample left the speaker at t_start."""
        with self._lock:
            for i in range(0, len(x), FRAME):
                block = x[i:i + FRAME]
                t_end = t_start + (i + len(block)) * FRAME_S / FRAME
                k = _frame(t_end)
                if k not in self._ref:
                    self._order.append(k)
                self._ref[k] = max(self._ref.get(k, SILENT_DB), level_db(block))
                self._t_last_ref = max(self._t_last_ref, t_end)
                if self._ref[k] > QUIET_DB:
                    self._t_last_voice = max(self._t_last_voice, t_end)
            while self._passed and self._passed[-1] > t_start:
                self._passed.pop()
                self.late_frames += 1
            while len(self._order) > self._keep:
                self._ref.pop(self._order.popleft(), None)

    def robot_speaking(self, t: float) -> bool:
        """Whether the mic can still hear the robot at time t (playback plus the room's tail)."""
        with self._lock:
            return bool(self._ref) and self._t_last_ref + (self.cfg.max_delay_ms + self.cfg.tail_ms) / 1000 >= t

    def voice_reaches(self, t: float) -> bool:
        """Whether the robot's voice itself (not the silence a sentence ends with, nor the room's tail) may still
        reach the mic at time t: its last sounding frame plus the echo's delay (learned, else max_delay_ms). A person
        who starts after it answers the robot rather than talking over it, and their words are clean."""
        with self._lock:
            delay = self.lag * FRAME_S if self.lag is not None else self.cfg.max_delay_ms / 1000
            return self._t_last_voice + delay + FRAME_S >= t

    def voice_since(self, t: float) -> bool:
        """Whether the robot's voice was played after time t."""
        with self._lock:
            return self._t_last_voice > t

    # ---- the mic ---------------------------------------------------------------------------------------------
    def is_echo(self, frame: np.ndarray, t_end: float, speech_prob: float | None = None,
                in_turn: bool = False) -> bool:
        """True when the frame can be explained by the robot's own voice or the room's noise (so it must not count
        as speech). speech_prob: silero's for this frame; a frame it takes for speech is no sample of the room.
        in_turn: a person's turn is under way; with the robot silent the room then vetoes nothing (their soft
        syllables and short pauses are theirs: vetoed, a 24 s turn at +8 dB over the room fell into 9-12 turns)."""
        if not self.cfg.enabled:
            return False
        level, k = level_db(frame), _frame(t_end)
        self._hear_any(level)
        floor = self.noise_floor_db if self.noise_floor_db > SILENT_DB else self.rough_floor_db
        room = floor + self.cfg.noise_margin_db if floor > SILENT_DB else SILENT_DB
        if not self.robot_speaking(t_end):
            if speech_prob is None or speech_prob < ROOM_MAX_PROB:
                self._hear_room(level)
            echo = not in_turn and room > SILENT_DB and level < room
        else:
            with self._lock:
                self._learn(k, level)
                expected = max(self._expected(j) for j in range(k - self._hangover, k + 1))
            bar = _power_sum(expected + self.cfg.margin_db if expected > SILENT_DB else SILENT_DB, room)
            echo = bar > SILENT_DB and level < bar
        if not echo:
            with self._lock:
                self._passed.append(t_end - (self.lag if self.lag is not None else 2) * FRAME_S)
        return echo

    @property
    def _hangover(self) -> int:
        return round(self.cfg.vad_hangover_ms / 1000 / FRAME_S)

    def _hear_room(self, level: float) -> None:
        """A frame with no playback in the air: the room's level (or a person, whose pauses the quantile finds)."""
        if self.cfg.noise_window_s <= 0:
            return
        self._quiet.append(level)
        self._since_floor += 1
        if len(self._quiet) >= MIN_ROOM_FRAMES and self._since_floor >= LEARN_EVERY:
            self._since_floor = 0
            self.noise_floor_db = float(np.quantile(self._quiet, self.cfg.noise_quantile))

    def _hear_any(self, level: float) -> None:
        """Every frame: the stand-in for the room's level while too few frames with no playback were heard."""
        if self.cfg.noise_window_s <= 0 or self.noise_floor_db > SILENT_DB:
            return
        self._heard.append(level)
        self._since_rough += 1
        if len(self._heard) >= ROUGH_FRAMES and self._since_rough >= ROUGH_FRAMES:
            self._since_rough = 0
            self.rough_floor_db = float(np.quantile(self._heard, self.cfg.noise_quantile))

    def path(self) -> tuple[int | None, float]:
        """The learned delay (frames; None: not learned) and return loss (dB), read together."""
        with self._lock:
            return self.lag, self.erl_db

    def expected_echo_db(self, t_end: float) -> float:
        """The loudest echo a mic frame ending at t_end may hold."""
        with self._lock:
            return self._expected(_frame(t_end))

    def _expected(self, k: int) -> float:
        if self.lag is None:
            return self._prior(k)
        return self._aligned(k, self.lag) - self.erl_db

    def _prior(self, k: int) -> float:
        span = int((self.cfg.max_delay_ms + self.cfg.tail_ms) / 1000 / FRAME_S) + 1
        levels = [self._ref.get(j, SILENT_DB) for j in range(k - span, k + 2)]
        return max(levels) - self.cfg.return_loss_db

    def _aligned(self, k: int, lag: int) -> float:
        """The reference level that reaches the mic at frame k through a path of `lag` frames: the frame itself and
        its neighbours (the delay is not a whole number of frames), then the room's tail decaying over tail_ms."""
        decay = 60.0 / max(self.cfg.tail_ms / 1000, FRAME_S) * FRAME_S    # dB per frame (tail_ms ~ RT60)
        best = SILENT_DB
        for j in range(-1, int(self.cfg.tail_ms / 1000 / FRAME_S) + 2):
            best = max(best, self._ref.get(k - lag - j, SILENT_DB) - decay * max(0, j - 1))
        return best

    def _learn(self, k: int, level: float) -> None:
        self._mic.append((k, level))
        self._since_fit += 1
        if len(self._mic) < LEARN_AFTER or self._since_fit < LEARN_EVERY:
            return
        self._since_fit = 0
        mic = np.array([m for _, m in self._mic])
        best = (MIN_CORRELATION, None, 0.0)
        for lag in range(int(self.cfg.max_delay_ms / 1000 / FRAME_S) + 2):
            ref = np.array([self._aligned(kk, lag) for kk, _ in self._mic])
            live = ref > QUIET_DB
            if live.sum() < LEARN_AFTER // 2 or np.std(ref[live]) < 1e-3 or np.std(mic[live]) < 1e-3:
                continue
            r = float(np.corrcoef(ref[live], mic[live])[0, 1])
            if r > best[0]:
                best = (r, lag, float(np.quantile(ref[live] - mic[live], ERL_QUANTILE)))
        _, self.lag, erl = best
        self.erl_db = max(0.0, erl)


def _power_sum(a_db: float, b_db: float) -> float:
    """The level of two uncorrelated sounds together (the echo and the room add as powers)."""
    if min(a_db, b_db) <= SILENT_DB:
        return max(a_db, b_db)
    return float(10 * np.log10(10 ** (a_db / 10) + 10 ** (b_db / 10)))


def _frame(t: float) -> int:
    return round(t / FRAME_S)
