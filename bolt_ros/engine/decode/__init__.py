"""Decoding: the engine (load, prefill, stream), sampling, decoders (plain, CUDA graph, DFlash), chat sessions."""
