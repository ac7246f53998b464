"""llama.cpp as our reference runtime, for the benches and tests that import it from bench/: see
bolt_ros/devtools/llamacpp.py (binaries, crash reports, llama-server) and llamacpp_referee.py (setup's check)."""
from bolt_ros.devtools.llamacpp import LlamaCppFailure, LlamaServer, llama_bin_dir, recorded_args  # noqa: F401
