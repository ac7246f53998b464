"""Where the model gets its tensors: GGUF bytes -> norm vectors, packed linears and row-gather embeddings.

Tensors go to the store's device one at a time: GGUF blocks are copied from the mmap straight to device memory (no
host copy of the model, which matters where host and GPU share memory, as on a Jetson). The policy decides how
matrices are held: "fast" keeps them packed for the CPU matmul path (and means "gguf", the raw
blocks for the fused Triton kernels, where device.kernels_on), "exact" dequantizes to fp32 (numerical references).
Embedding tables stay in their GGUF blocks and dequantize only looked-up rows, so a tied table serves both the lookup
and the output head without an fp32 copy.
"""
from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from tqdm import tqdm

from bolt_ros.engine.device import kernels_on, weight_policy
from bolt_ros.engine.gguf.quants import dequantize
from bolt_ros.engine.gguf.reader import GGUFError, GGUFFile, torch_shape
from bolt_ros.engine.gguf.validate import has_nonfinite
from bolt_ros.engine.model.linear import QuantEmbedding, QuantLinear

Policy = Literal["fast", "exact", "gguf"]


class WeightStore:
    def __init__(self, gf: GGUFFile, policy: Policy = "fast", device: str | torch.device = "cpu",
                 progress: bool = False):
        if policy not in ("fast", "exact", "gguf"):
            raise ValueError(f"unknown weight policy {policy!r} (fast, exact or gguf)")
        self.gf, self.device = gf, torch.device(device)
        self.kernels = kernels_on(self.device)  # the device switch: models built from this store follow it
        self.policy = weight_policy(policy, self.device)
        self.used: set[str] = set()
        self.bar = tqdm(total=len(gf.tensors), desc=f"loading {gf.path.name}", unit="tensor", leave=False,
                        disable=not progress)

    def has(self, name: str) -> bool:
        return name in self.gf.tensors

    def _info(self, name: str):
        if name not in self.used:
            self.used.add(name)
            self.bar.update()
        return self.gf.info(name)

    def _built(self, name: str, build):
        """build(info), with a ValueError of the dequantizers/packers (type, byte count, shape rules) as a GGUFError
        naming the file and the tensor. config_from_gguf has checked every tensor against the config already
        (validate.check_model_tensors); this keeps a tensor read outside that plan just as clear."""
        info = self._info(name)
        try:
            return build(info)
        except GGUFError:
            raise
        except ValueError as e:
            raise GGUFError(f"{self.gf.path.name}: tensor {name!r}: {e}") from None

    def vector(self, name: str) -> torch.Tensor:
        def build(info):
            t = dequantize(self.gf.raw(name), info.ggml_type, torch_shape(info))
            if not torch.isfinite(t).all():
                raise GGUFError(f"{self.gf.path.name}: tensor {name!r} has non-finite values")
            return t.reshape(-1).to(self.device)
        return self._built(name, build)

    def linear(self, name: str, role: str = "matrix") -> QuantLinear:
        def build(info):
            self._two_d(name, info)
            self._finite(name, info)
            q = QuantLinear(np.asarray(self.gf.raw(name)), info.ggml_type, torch_shape(info),
                            policy=self.policy, role=role, device=self.device).to(self.device)
            if q.holds_copy:  # the file's pages of it are read again only to refine a head's candidates
                self.gf.release(name)
            return q
        return self._built(name, build)

    def embedding(self, name: str) -> QuantEmbedding:
        def build(info):
            self._two_d(name, info)
            self._finite(name, info)
            return QuantEmbedding(np.asarray(self.gf.raw(name)), info.ggml_type, torch_shape(info)).to(self.device)
        return self._built(name, build)

    def _two_d(self, name: str, info) -> None:
        if len(info.shape) != 2:
            raise GGUFError(f"{self.gf.path.name}: tensor {name!r} should be 2-D, has shape {info.shape}")

    def _finite(self, name: str, info) -> None:
        if has_nonfinite(self.gf.raw(name), info.ggml_type):
            raise GGUFError(f"{self.gf.path.name}: tensor {name!r} has non-finite values (or scales)")
