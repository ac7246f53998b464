"""Where the engine runs: `device: auto | cpu | cuda[:N]` resolved once, and what that device implies.

The model is one definition whatever the device (model.py calls `bolt_ros.kernels.ops`, which picks Triton or torch
per tensor). The device decides two things about the data it is given:
  * weights (`weight_policy`): on the CPU "fast" means torch's packed int4/int8 CPU kernels; on any other device the
    GGUF blocks themselves, multiplied by the fused dequant-matmul (Triton, or its torch form on the same device), so
    no CPU-only op and no host-side row ever meets a device tensor;
  * KV caches (`kernels_on`): where the Triton kernels run, every layer's cache is position-indexed (slot p =
    position p), since the kernels take spans as ints; the CPU keeps rings on sliding layers.
`kernels_on` defers to `kernels.backend.use_triton` (`BOLT_KERNELS=auto|triton|torch`, auto = Triton on CUDA only).
Nothing here imports Triton unless the switch is on, so CPU-only installs never load it.
"""
from __future__ import annotations

import os

import torch


def resolve_device(spec: str) -> torch.device:
    """`auto` -> the first CUDA device when torch sees one, else the CPU; `cpu`, `cuda`, `cuda:N` as given, checked
    (a CUDA device that is not there is a clear error, not a late one inside the first matmul)."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as e:
        raise ValueError(f"unknown device {spec!r} (auto, cpu, cuda or cuda:N)") from e
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {spec!r} (auto, cpu, cuda or cuda:N)")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {spec!r}: no CUDA device available (torch.cuda.is_available() is False)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA device(s)")
    return device


def kernels_on(device: torch.device | str) -> bool:
    """True when a model on `device` runs the Triton kernels."""
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device}: no CUDA device available (torch.cuda.is_available() is False)")
    if device.type != "cuda" and os.environ.get("BOLT_KERNELS", "auto").strip().lower() in ("", "auto", "torch"):
        return False  # the common CPU case, decided without importing Triton
    from bolt_ros.kernels.backend import use_triton
    return use_triton(device)


def weight_policy(policy: str, device: torch.device | str) -> str:
    """The WeightStore policy to use: "fast" means the GGUF blocks for the fused kernels off the CPU (and wherever
    the Triton kernels are forced on), the packed CPU forms on the CPU; "exact" stays dense fp32."""
    if policy != "fast":
        return policy
    return "gguf" if torch.device(device).type != "cpu" or kernels_on(device) else policy
