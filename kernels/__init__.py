"""Triton kernels of the bolt_ros engine, each beside the torch reference it is tested against.

Use `bolt_ros.kernels.ops` from model code; `backend.use_triton(device)` is the single switch between the two.
Modules: qmatmul (fused GGUF dequant + GEMV / small-M / GEMM), attention (decode, causal prefill, DFlash block),
norm (RMSNorm, fused residual adds), rope (NEOX full / partial / proportional), activation (GELU-tanh gating),
logits (softcap + argmax), quant_ref (block layouts and the torch dequantizer).
"""
