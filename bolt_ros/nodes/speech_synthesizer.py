"""The speech_synthesizer node: `tts/say` sentences become audio, published as it plays on `audio/out` (a robot's
speaker driver plays it; the speech_recognizer takes it as its echo reference) and, with output:=speaker, played on
the laptop's speaker.

Two threads: one synthesizes the next sentence while the other plays the current one, so the first sentence plays
while the model still writes the rest. Playback goes in blocks of `block_ms`; a barge-in (`speech/barge_in`) or a
new turn (`speech/transcript`) moves the node to a new turn epoch, and every queued or playing item of an older
epoch is dropped at its next block. After a barge-in the node stays muted until the next transcript, so no sentence
of the interrupted turn plays. It reports each sentence's start and end on `speech/events` and, per spoken turn,
the latency stages on `speech/turn_stats`.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from rclpy.node import Node
from std_msgs.msg import String

from bolt_ros.msg import AssistantEvent, AudioChunk, AudioEvent, AudioTurnStats
from bolt_ros.nodes.common import NodeLoop, declare_config, run_nodes
from bolt_ros.nodes.speech_common import chunk_msg, from_stamp, to_stamp
from bolt_ros.voice.audio import Pcm
from bolt_ros.voice.config import SynthesizerConfig

CACHED_CHARS = 40   # lines this short keep their audio (config keep_lines: how many, the newest)
END_OF_SPEECH_MAX_AGE_S = 30.0   # a SPEECH_END older than this when a transcript comes belongs to no turn
SILENT_TURN_WAIT_S = 1.0         # after the assistant's idle, a turn with no sentence yet said nothing


@dataclass
class TurnTimes:
    """The stages of one turn, as float seconds of the system clock (None: not reached)."""
    transcript: str
    t_transcript: float
    end_of_speech: float | None = None
    t_end_of_turn: float | None = None
    t_first_token: float | None = None
    t_first_sentence: float | None = None
    t_first_audio: float | None = None

    def stats_msg(self) -> AudioTurnStats:
        ms = lambda t: -1.0 if t is None else (t - self.end_of_speech) * 1e3  # noqa: E731
        return AudioTurnStats(end_of_speech=to_stamp(self.end_of_speech), end_of_turn_ms=ms(self.t_end_of_turn),
                              transcript_ms=ms(self.t_transcript), first_token_ms=ms(self.t_first_token),
                              first_sentence_ms=ms(self.t_first_sentence), first_audio_ms=ms(self.t_first_audio),
                              transcript=self.transcript)


class SpeechSynthesizer(Node):
    def __init__(self, config: SynthesizerConfig | None = None, *, tts=None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "speech_synthesizer"), **node_kwargs)
        try:
            self.config = cfg = declare_config(self, config or SynthesizerConfig())
            self.tts, self.speaker = tts or self._make_tts(), self._make_speaker()
        except ValueError:
            self.destroy_node()
            raise
        t = cfg.topics
        self._playback_pub = self.create_publisher(AudioChunk, t.playback, 100)
        self._events_pub = self.create_publisher(AudioEvent, t.events, 50)
        self._stats_pub = self.create_publisher(AudioTurnStats, t.stats, 10)
        self.create_subscription(String, t.say, self._on_say, 50)
        self.create_subscription(String, t.barge_in, lambda _m: self.stop("barge-in", mute=True), 10)
        self.create_subscription(String, t.transcript, self._on_transcript, 10)
        self.create_subscription(AudioEvent, t.events, self._on_audio_event, 50)
        self.create_subscription(AssistantEvent, t.assistant_events, self._on_assistant_event, 100)
        self._lock = threading.Lock()
        self._epoch, self._muted = 0, False
        self._end_of_speech: tuple[float, float, float] | None = None   # (audio time, decision, received)
        self._turn: TurnTimes | None = None
        self._say: queue.Queue[tuple[int, str]] = queue.Queue()
        self._play: queue.Queue[tuple[int, str, Pcm]] = queue.Queue(maxsize=2)  # synthesize at most 2 ahead
        self.counts = {"sentences": 0, "played": 0, "stopped": 0, "dropped": 0, "underruns": 0, "cached": 0}
        self._cached: OrderedDict[str, Pcm] = OrderedDict()   # short lines' audio, newest last
        self._clock = float("-inf")         # where the last played block ends, on the playback clock
        self.stopped_at: list[float] = []   # when each stop request came (bench: stop latency)
        self._loops = [NodeLoop(self._synthesize_loop, "tts-synth").start(),
                       NodeLoop(self._play_loop, "tts-play").start()]
        self.get_logger().info(f"speech synthesizer ready: voice {cfg.voice} at {self.tts.rate} Hz, output "
                               f"{cfg.output}" + (f" ({self.speaker.name})" if self.speaker else ""))

    def _make_tts(self):
        from bolt_ros.voice.tts import TtsError, make_synthesizer
        try:
            return make_synthesizer(self.config)
        except (TtsError, OSError) as e:
            raise ValueError(f"node {self.get_name()!r}: cannot load the {self.config.voice} voice: {e}") from e

    def _make_speaker(self):
        if self.config.output != "speaker":
            return None
        from bolt_ros.voice.devices import DeviceError, Speaker
        try:
            return Speaker(self.tts.rate, self.config.device)
        except DeviceError as e:
            raise ValueError(f"node {self.get_name()!r}: {e}") from e

    # ---- inputs (executor thread: quick) ---------------------------------------------------------------------
    def _on_say(self, msg: String) -> None:
        text = msg.data.strip()
        with self._lock:
            if not text or self._muted:
                self.counts["dropped"] += bool(text)
                return
            if self._turn is not None and self._turn.t_first_sentence is None:
                self._turn.t_first_sentence = time.time()
            self._say.put((self._epoch, text))

    def _on_transcript(self, msg: String) -> None:
        now = time.time()
        self.stop("new turn", mute=False)
        with self._lock:
            turn = TurnTimes(msg.data, now)
            eos, self._end_of_speech = self._end_of_speech, None
            if eos is not None and now - eos[2] < END_OF_SPEECH_MAX_AGE_S:
                turn.end_of_speech, turn.t_end_of_turn = eos[0], eos[1]
            self._turn = turn

    def _on_audio_event(self, ev: AudioEvent) -> None:
        if ev.type == AudioEvent.SPEECH_END:
            eos = (from_stamp(ev.audio_time), from_stamp(ev.header.stamp), time.time())
            with self._lock:
                turn = self._turn
                # the transcript can come first (another topic): when the pause's words were in before the turn
                # ended, the recognizer publishes both at once (issue 33). An end decided before this turn's
                # transcript came is this turn's
                if turn is not None and turn.end_of_speech is None and eos[1] <= turn.t_transcript:
                    turn.end_of_speech, turn.t_end_of_turn = eos[0], eos[1]
                else:
                    self._end_of_speech = eos

    def _on_assistant_event(self, ev: AssistantEvent) -> None:
        if ev.type in (AssistantEvent.TEXT_DELTA, AssistantEvent.SENTENCE, AssistantEvent.TOOL_CALL):
            with self._lock:
                if self._turn is not None and self._turn.t_first_token is None:
                    self._turn.t_first_token = from_stamp(ev.stamp)
        elif ev.type == AssistantEvent.STATE and ev.state == AssistantEvent.STATE_IDLE:
            # a turn that said nothing gets its stages so far (first_audio_ms -1); decided a moment later, as its
            # sentences travel on another topic and may arrive after this event. An interrupted turn's idle comes
            # before the next turn's first output: only an idle after this turn's first output is this turn's.
            with self._lock:
                turn = self._turn if self._turn is not None and self._turn.t_first_token is not None else None
            if turn is not None:
                threading.Timer(SILENT_TURN_WAIT_S, self._silent_turn, args=(turn,)).start()

    def _silent_turn(self, turn: TurnTimes) -> None:
        with self._lock:
            if self._turn is not turn or turn.t_first_sentence is not None:
                return
            self._turn = None
        self._publish_stats(turn)

    def stop(self, why: str, *, mute: bool) -> None:
        """Drop everything of the current turn (the playing block finishes; nothing after it plays)."""
        with self._lock:
            self._epoch += 1
            self._muted = mute
            if mute:
                self.stopped_at.append(time.time())
            for q in (self._say, self._play):
                while True:
                    try:
                        q.get_nowait()
                    except queue.Empty:
                        break
        if mute:
            self.get_logger().info(f"speech stopped ({why})")

    def _current(self, epoch: int) -> bool:
        return epoch == self._epoch

    # ---- the threads -----------------------------------------------------------------------------------------
    def _synthesize_loop(self, stopping) -> None:
        from bolt_ros.voice.tts import TtsError
        while not stopping.is_set():
            try:
                epoch, text = self._say.get(timeout=0.1)
            except queue.Empty:
                continue
            if not self._current(epoch):
                continue
            try:
                pcm = self._cached.get(text) or self.tts.synthesize(text)
            except TtsError as e:
                self._event(AudioEvent.ERROR, f"cannot say {text[:40]!r}: {e}")
                continue
            self.counts["sentences"] += 1
            self._keep(text, pcm)
            while not stopping.is_set() and self._current(epoch):
                try:
                    self._play.put((epoch, text, pcm), timeout=0.1)
                    break
                except queue.Full:
                    continue

    def _keep(self, text: str, pcm: Pcm) -> None:
        """Short lines come back (a move's "Looking left.", "Sure!"): their audio is kept, so the next time plays at
        once instead of after its synthesis (0.1-0.4 s of Piper on 2 loaded cores; issue 33)."""
        if text in self._cached:
            self.counts["cached"] += 1
            self._cached.move_to_end(text)
        elif len(text) <= CACHED_CHARS and self.config.keep_lines:
            self._cached[text] = pcm
            while len(self._cached) > self.config.keep_lines:
                self._cached.popitem(last=False)

    def _play_loop(self, stopping) -> None:
        while not stopping.is_set():
            try:
                epoch, text, pcm = self._play.get(timeout=0.1)
            except queue.Empty:
                continue
            if self._current(epoch):
                self._play_sentence(epoch, text, pcm, stopping)

    def _play_sentence(self, epoch: int, text: str, pcm: Pcm, stopping) -> None:
        n = max(1, int(pcm.rate * self.config.block_ms / 1000))
        s = pcm.samples
        # One clock per utterance: each block is stamped where the one before it ends, as a speaker driver plays
        # them, back to back. Stamping "the later of the schedule and now" put ~80 % of the blocks ~0.5 ms late and
        # drifted ~175 ms from what a driver plays over a 7 s reply (issue 36), and the echo gate aligns by these
        # stamps. A sentence that comes while the one before still plays goes on its clock; one after a gap
        # starts a new one. A block later than a driver's one block of buffer is an underrun: the driver ran dry
        # and plays it when it comes, so the clock starts again there, and the underrun is counted.
        slack = self.config.block_ms / 1000
        t_next = self._clock if time.time() - self._clock <= slack else time.time()
        self._event(AudioEvent.PLAYBACK_START, text)
        for i in range(0, len(s), n):
            if stopping.is_set() or not self._current(epoch):
                self.counts["stopped"] += 1
                self._event(AudioEvent.PLAYBACK_STOPPED, text)
                if self.speaker is not None:
                    self.speaker.stop()
                return
            block = s[i:i + n]
            if (now := time.time()) - t_next > slack:
                self.counts["underruns"] += 1
                self.get_logger().warning(f"playback underrun: a block {1e3 * (now - t_next):.0f} ms late",
                                          throttle_duration_sec=5.0)
                t_next = now
            self._playback_pub.publish(chunk_msg(block, pcm.rate, t_next))
            if i == 0:
                self._first_audio(t_next)
            if self.speaker is not None:
                self.speaker.write(block)        # blocks while the device buffer is full: the pace
            t_next += len(block) / pcm.rate
            self._clock = t_next
            if self.speaker is None and (wait := t_next - time.time()) > 0:
                stopping.wait(wait)              # the robot's speaker plays at this pace
        self.counts["played"] += 1
        self._event(AudioEvent.PLAYBACK_END, text)

    def _first_audio(self, t: float) -> None:
        with self._lock:
            turn = self._turn
            if turn is None or turn.t_first_audio is not None:
                return
            turn.t_first_audio = t
        self._publish_stats(turn)

    def _publish_stats(self, turn: TurnTimes) -> None:
        if turn.end_of_speech is not None:
            stats = turn.stats_msg()
            self._stats_pub.publish(stats)
            self.get_logger().info(
                f"turn latency after end of speech: end of turn {stats.end_of_turn_ms:.0f} ms, transcript "
                f"{stats.transcript_ms:.0f} ms, first token {stats.first_token_ms:.0f} ms, first sentence "
                f"{stats.first_sentence_ms:.0f} ms, first audio {stats.first_audio_ms:.0f} ms")

    def _event(self, kind: int, text: str = "") -> None:
        msg = AudioEvent(type=kind, text=text)
        msg.header.stamp = msg.audio_time = to_stamp(time.time())
        self._events_pub.publish(msg)
        if kind == AudioEvent.ERROR:
            self.get_logger().warning(text)

    # ---- shutdown --------------------------------------------------------------------------------------------
    def close(self) -> None:
        for loop in getattr(self, "_loops", []):
            loop.stop()
        if getattr(self, "speaker", None) is not None:
            self.speaker.close()
            self.speaker = None

    def destroy_node(self) -> None:
        self.close()
        super().destroy_node()


def make_nodes(**node_kwargs) -> list[Node]:
    return [SpeechSynthesizer(**node_kwargs)]


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(make_nodes, args))


if __name__ == "__main__":
    main()
