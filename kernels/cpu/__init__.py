"""CPU kernels in C, beside their torch reference in bolt_ros.engine.gguf.quants (see native.py)."""
