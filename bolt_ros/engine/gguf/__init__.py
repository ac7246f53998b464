"""GGUF files: the reader, ggml types, quant formats, and validation of everything a model file claims."""
