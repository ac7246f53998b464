"""The model: typed config from GGUF metadata, the one transformer, its KV cache, weights and quantized linears."""
