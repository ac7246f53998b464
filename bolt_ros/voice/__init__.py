"""Hearing and speaking, without ROS: VAD turn segmenting (silero), ASR (faster-whisper), TTS (Piper, espeak-ng),
the echo gate, and audio from devices or WAV files. bolt_ros/nodes/speech_*.py are thin ROS nodes over it."""
