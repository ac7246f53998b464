"""The speech_recognizer node: audio in (a ROS topic, the microphone or a WAV file), VAD turn segmenting, ASR,
`speech/transcript` out; voice-activity events on `speech/events`, and `speech/barge_in` when the person starts
speaking while the robot speaks.

Callbacks only queue audio. One thread runs VAD, the echo gate and the segmenter frame by frame (32 ms), so
onsets and barge-ins are decided while an ASR runs on the ASR thread. The ASR starts speculatively at the first
pause of `vad.pause_ms`; if the silence goes on to `vad.end_of_turn_ms` that transcript is the turn's, so most of
the ASR time is off the end-of-speech -> transcript path. Bad audio (an impossible rate, a ragged block) is
dropped with an error event and a warning; the node goes on.
"""
from __future__ import annotations

import queue
import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from rclpy.node import Node
from std_msgs.msg import String

from bolt_ros.msg import AudioChunk, AudioEvent
from bolt_ros.nodes.common import NodeLoop, declare_config, run_nodes
from bolt_ros.nodes.speech_common import chunk_samples, from_stamp, to_stamp
from bolt_ros.voice.audio import MODEL_RATE, AudioError, Resampler, check_format, resample, to_mono_float
from bolt_ros.voice.config import RecognizerConfig
from bolt_ros.voice.continuation import CONTINUES, Continuation
from bolt_ros.voice.echo import EchoGate
from bolt_ros.voice.echo_suppress import EchoSuppressor
from bolt_ros.voice.turn_end import reads_unfinished
from bolt_ros.voice.vad import EndOfTurn, Framer, Onset, Pause, Resume, SileroVad, TurnSegmenter

BLOCK_MS = 32            # microphone / WAV blocks
MAX_QUEUED_S = 5.0       # audio waiting for the VAD beyond this is dropped (the node fell behind)
# no audio for this long: the source stopped, and a turn in its silence ends whatever its words (a driver late by a
# block under load is no stop: 0.1 s ended a turn before its words were in, in test_turn_end on a loaded machine)
IDLE_END_S = 1.0


class SpeechRecognizer(Node):
    def __init__(self, config: RecognizerConfig | None = None, *, vad: SileroVad | None = None,
                 transcriber=None, **node_kwargs):
        super().__init__(node_kwargs.pop("node_name", "speech_recognizer"), **node_kwargs)
        try:
            self.config = cfg = declare_config(self, config or RecognizerConfig())
        except ValueError:
            self.destroy_node()
            raise
        if cfg.source == "wav" and (cfg.echo.enabled or cfg.echo.suppress):
            # a file hears no speaker: the gate expected the robot's voice in it at its played level and took the
            # person's words over a long reply for that echo (a WAV demo's "Turn your head to the right, please."
            # came out "Please."); taking out a voice that isn't there only distorts the person's
            self.config = cfg = cfg.model_copy(update={"echo": cfg.echo.model_copy(update={"enabled": False,
                                                                                          "suppress": False})})
        from bolt_ros.voice.asr import Transcriber  # faster-whisper: imported only where it runs
        self.vad = vad or SileroVad()
        self.asr = transcriber or Transcriber(cfg.asr)
        self.gate = EchoGate(cfg.echo)
        self.suppressor = EchoSuppressor(cfg.echo)
        self.segmenter = TurnSegmenter(cfg.vad)
        self.segmenter.wait_for_words = True   # the pause's speculative words decide an early end (turn_end.py)
        self.continuation = Continuation(cfg.vad.continue_ms)   # ... and a person who goes on takes it back
        self._framer, self._resampler = Framer(), None
        t = cfg.topics
        self._transcript_pub = self.create_publisher(String, t.transcript, 10)
        self._events_pub = self.create_publisher(AudioEvent, t.events, 50)
        self._barge_pub = self.create_publisher(String, t.barge_in, 10)
        self._spec_pub = self.create_publisher(String, t.speculative, 10)
        self.create_subscription(AudioChunk, t.playback, self._on_playback, 100)
        if cfg.source == "topic":
            self.create_subscription(AudioChunk, t.audio_in, self._on_audio, 100)
        self._blocks: queue.Queue[tuple[np.ndarray, int, float]] = queue.Queue()
        self._queued_s = 0.0
        self._asr_pool = ThreadPoolExecutor(1, thread_name_prefix="asr")
        self._spec: Future | None = None       # the speculative ASR of the current turn, started at its pause
        self._prompt = True                    # the current turn's ASR gets the vocabulary prompt (not a barge-in)
        self._turns_in_asr = 0                 # ended turns whose transcript is not out yet
        self._turn_id = 0                      # ended turns, counted; a continued one's transcript is not published
        self._continued: set[int] = set()
        self._feeding = False                  # the audio thread is on a block
        self._t_audio = time.monotonic()       # when the audio thread last had a block
        self.counts = {"blocks": 0, "transcripts": 0, "empty": 0, "barge_ins": 0, "bad_blocks": 0, "dropped_s": 0.0,
                       "late_reference_frames": 0, "speculative": 0, "unfinished": 0, "continued": 0}
        self._loop = NodeLoop(self._process, "speech-recognizer").start()
        self._source = None
        try:
            self._source = self._open_source()
        except Exception:
            self.destroy_node()
            raise
        self.get_logger().info(f"speech recognizer ready: source {cfg.source}, end of turn after "
                               f"{cfg.vad.end_of_turn_ms} ms of silence ({cfg.vad.unfinished_end_ms} ms after "
                               f"unfinished words), barge-in {'on' if cfg.barge_in else 'off'}")

    def _open_source(self):
        cfg = self.config
        from bolt_ros.voice.devices import DeviceError, Microphone, WavSource
        try:
            if cfg.source == "microphone":
                return Microphone(cfg.sample_rate, BLOCK_MS, self.push, cfg.device)
            if cfg.source == "wav":
                return WavSource(cfg.wav_path, BLOCK_MS, self.push, cfg.wav_realtime)
        except (DeviceError, AudioError, OSError) as e:
            raise ValueError(f"node {self.get_name()!r}: {e}") from e
        return None

    # ---- inputs (executor / device threads: quick) -----------------------------------------------------------
    def _on_audio(self, msg: AudioChunk) -> None:
        self.push(chunk_samples(msg), msg.sample_rate, msg.channels, from_stamp(msg.header.stamp))

    def push(self, samples: np.ndarray, rate: int, channels: int, t_start: float) -> bool:
        """Queue interleaved int16 audio whose first sample was captured at t_start; False when it is refused."""
        self.counts["blocks"] += 1
        try:
            check_format(rate, channels, len(samples))
        except AudioError as e:
            self.counts["bad_blocks"] += 1
            self._error(f"dropped an audio block: {e}")
            return False
        seconds = len(samples) / channels / rate
        if self._queued_s + seconds > MAX_QUEUED_S:
            self.counts["dropped_s"] += seconds
            self.get_logger().warning("dropped audio: the VAD is more than "
                                      f"{MAX_QUEUED_S:.0f} s behind", throttle_duration_sec=5.0)
            return False
        self._queued_s += seconds
        self._blocks.put((to_mono_float(samples, channels), rate, t_start))
        return True

    def _on_playback(self, msg: AudioChunk) -> None:
        try:
            check_format(msg.sample_rate, msg.channels, len(msg.data))
        except AudioError as e:
            self._error(f"dropped a playback (echo reference) block: {e}")
            return
        x, t = to_mono_float(chunk_samples(msg), msg.channels), from_stamp(msg.header.stamp)
        # levels need no band-limited resampling: every 16 kHz frame's worth of samples at the source rate
        step = msg.sample_rate / 16000
        self.gate.add_reference(x[(np.arange(int(len(x) / step)) * step).astype(int)], t)
        if self.gate.late_frames > self.counts["late_reference_frames"]:
            self.counts["late_reference_frames"] = self.gate.late_frames
            self.get_logger().warning(f"the echo reference came late: {self.gate.late_frames} frames so far were let "
                                      "through as speech before the playback under them arrived (a busy executor)",
                                      throttle_duration_sec=5.0)
        if self.config.echo.suppress:   # spectra do: a whole-block resample has no stream delay to misalign them
            self.suppressor.add_reference(resample(x, msg.sample_rate), t)

    # ---- the audio thread ------------------------------------------------------------------------------------
    def _process(self, stopping) -> None:
        while not stopping.is_set():
            try:
                x, rate, t = self._blocks.get(timeout=0.1)
            except queue.Empty:   # no audio for a while (a WAV ended, a driver stopped): a silent turn may end
                if time.monotonic() - self._t_audio >= IDLE_END_S:
                    for ev in self.segmenter.poll(idle=True):
                        self._on_segment_event(ev)
                continue
            self._feeding = True
            try:
                if x is None:   # the pause's words are in (_on_speculative): the turn may end before the next frame
                    for ev in self.segmenter.poll():
                        self._on_segment_event(ev)
                    continue
                self._queued_s = max(0.0, self._queued_s - len(x) / rate)
                self._t_audio = time.monotonic()
                self.feed(x, rate, t)
            except Exception as e:  # never let the audio thread die: report and go on with the next block
                self._error(f"audio processing failed: {type(e).__name__}: {e}")
            finally:
                self._feeding = False

    def feed(self, x: np.ndarray, rate: int, t_start: float) -> None:
        """Mono float audio at `rate` through the resampler, VAD, echo gate and segmenter."""
        if self._resampler is None or self._resampler.in_rate != rate:
            self._resampler, self._framer = Resampler(rate), Framer()
        for frame, t_end in self._framer.push(self._resampler(x), t_start):
            prob = self.vad(frame)
            echo = self.gate.is_echo(frame, t_end, prob, self.segmenter.in_speech)
            for ev in self.segmenter.push(frame, prob, echo, t_end):
                self._on_segment_event(ev)

    def _on_segment_event(self, ev) -> None:
        if isinstance(ev, Onset):
            self._event(AudioEvent.SPEECH_START, audio_time=ev.t_start)
            if self.continuation.onset(ev.t_start, self.gate.voice_since(self.continuation.last_end())):
                # the last turn was not over: what the robot began on it stops, and this turn joins it
                self.counts["continued"] += 1
                self._continued = {i for i in self._continued if i > self._turn_id - 8} | {self._turn_id}
                if self.config.barge_in:   # barge-in off: nothing the robot does is stopped by speech
                    self._barge_pub.publish(String(data=CONTINUES))
                self.get_logger().info("the person goes on: the last turn continues")
            barge_in = self.config.barge_in and self.gate.robot_speaking(ev.t_start)
            # Over the robot's voice the words get a barge-in's ASR (no prompt, the stop-phrase check: asr.py). A
            # reply begun in the half second after the robot's last word is still a barge-in (its echo may linger,
            # and the stop is cheap) but its words are clean: with the barge-in's ASR, 6 of 8 bench_voice turns
            # waited 1.1-1.2 s for their words and "Please nod." came out "Please not." (issue 33).
            over_voice = barge_in and self.gate.voice_reaches(ev.t_start)
            self._prompt = not over_voice or self.config.asr.vocabulary_on_barge_in
            if barge_in:
                self.counts["barge_ins"] += 1
                self._barge_pub.publish(String(data="speech onset"))   # first: the stop must not wait
                self._event(AudioEvent.BARGE_IN, audio_time=ev.t_start)
                self.get_logger().info("barge-in: the person speaks over the robot")
        elif isinstance(ev, Pause):
            audio = self.continuation.joined(ev.audio, ev.t_end - len(ev.audio) / MODEL_RATE)
            self._spec = fut = self._asr_pool.submit(self._transcribe, audio, ev.t_end, self._prompt)
            fut.add_done_callback(self._on_speculative)
        elif isinstance(ev, Resume):
            if self._spec is not None:
                self._spec.cancel()   # stale: the person went on
                self._spec = None
        elif isinstance(ev, EndOfTurn):
            self._event(AudioEvent.SPEECH_END, audio_time=ev.t_end_of_speech)
            audio = self.continuation.joined(ev.audio, ev.t_decision - len(ev.audio) / MODEL_RATE)
            self.continuation.ended(audio, ev.t_decision)
            fut, self._spec = (self._spec or self._asr_pool.submit(self._transcribe, audio, ev.t_decision,
                                                                   self._prompt)), None
            seconds = len(audio) / MODEL_RATE
            self._turns_in_asr += 1
            self._turn_id += 1
            turn = self._turn_id
            fut.add_done_callback(lambda f: self._publish_transcript(f, seconds, turn))

    def _on_speculative(self, fut: Future) -> None:
        """The ASR thread: the pause's words are in while the turn is still open: the segmenter may end it early if
        they read finished (turn_end.py), and the assistant may start on them (speech/speculative)."""
        if fut.cancelled() or fut is not self._spec or fut.exception() is not None:
            return
        text = fut.result()
        unfinished = reads_unfinished(text)
        self.counts["unfinished"] += unfinished
        self.segmenter.words_finished = not unfinished
        self._blocks.put((None, 0, 0.0))   # the audio thread decides at once, not at the next frame
        if text and fut is self._spec:
            self.counts["speculative"] += 1
            self._spec_pub.publish(String(data=text))

    def _transcribe(self, audio: np.ndarray, t_end: float, prompt: bool) -> str:
        """The ASR thread: a turn's audio (ending at t_end) with the robot's voice taken out, to words."""
        cfg = self.config.echo
        if cfg.enabled and cfg.suppress:
            audio = self.suppressor.suppress(audio, t_end - len(audio) / MODEL_RATE, *self.gate.path())
        # a turn without the prompt is a barge-in's: checked against the phrases people stop a robot with (asr.py)
        return self.asr.transcribe(audio, prompt=prompt, known_phrases=not prompt)

    def busy(self) -> bool:
        """Audio waiting, a turn in progress, or a turn's transcript not out yet."""
        return self._feeding or not self._blocks.empty() or self.segmenter.in_speech or self._turns_in_asr > 0

    def _publish_transcript(self, fut: Future, seconds: float, turn: int) -> None:
        try:
            if turn in self._continued:   # the person went on before its words were out: the joined turn's come
                self._continued.discard(turn)
                return
            self._publish_result(fut, seconds)
        finally:
            self._turns_in_asr -= 1

    def _publish_result(self, fut: Future, seconds: float) -> None:
        if fut.cancelled():
            return
        try:
            text = fut.result()
        except Exception as e:
            self._error(f"ASR failed: {type(e).__name__}: {e}")
            return
        if not text:
            self.counts["empty"] += 1
            self.get_logger().info(f"no words in {seconds:.1f} s of sound")
            return
        self.counts["transcripts"] += 1
        self._transcript_pub.publish(String(data=text))
        self.get_logger().info(f"heard: {text!r}")

    def _event(self, kind: int, text: str = "", audio_time: float | None = None) -> None:
        msg = AudioEvent(type=kind, text=text)
        now = time.time()
        msg.header.stamp = to_stamp(now)
        msg.audio_time = to_stamp(audio_time if audio_time is not None else now)
        self._events_pub.publish(msg)

    def _error(self, text: str) -> None:
        self.get_logger().warning(text, throttle_duration_sec=2.0)
        self._event(AudioEvent.ERROR, text)

    # ---- shutdown --------------------------------------------------------------------------------------------
    def close(self) -> None:
        if getattr(self, "_source", None) is not None:
            self._source.close()
            self._source = None
        if hasattr(self, "_loop"):
            self._loop.stop()
            self._asr_pool.shutdown(wait=False, cancel_futures=True)

    def destroy_node(self) -> None:
        self.close()
        super().destroy_node()


def make_nodes(**node_kwargs) -> list[Node]:
    return [SpeechRecognizer(**node_kwargs)]


def main(args: list[str] | None = None) -> None:
    raise SystemExit(run_nodes(make_nodes, args))


if __name__ == "__main__":
    main()
