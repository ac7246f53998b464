"""A simulated accelerator for CPU-only machines: tensors that live on a device of their own ("sim", PyTorch's
PrivateUse1 slot) while their values are computed by the CPU, with CUDA's placement rules enforced on every op.

CUDA refuses an op that mixes device and host tensors (except 0-dim host scalars and explicit copies); so does this
device: any other op with a host tensor of one or more dimensions among device operands raises `CrossDevice`. Unlike
FakeTensorMode (which checks placement too but has no values, and on a CPU-only torch build cannot even index-assign a
fake `cuda` tensor), values are real, so a whole generation - token choices, sampling, DFlash acceptance - runs.

A test double for hardware (a GPU), used only by tests: `with sim_device() as dev: engine = Engine.load(...,
device=dev)`. `torch.tensor(data, device=dev)` is served by building on the host and copying (torch.tensor's C++ path
allocates without dispatching).
"""
from __future__ import annotations

import contextlib

import torch
import torch.utils.backend_registration as backend_registration
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "sim"
backend_registration._setup_privateuseone_for_python_backend(NAME)  # once per process: the device and its guard
DEVICE = torch.device(NAME, 0)


class CrossDevice(RuntimeError):
    """An op mixed device and host tensors, which CUDA would refuse."""


class SimTensor(torch.Tensor):
    """A device tensor whose storage is the host tensor `inner` (views of it alias as on a real device)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, strides=inner.stride(),
                                                   storage_offset=inner.storage_offset(), dtype=inner.dtype,
                                                   device=DEVICE, requires_grad=False)

    def __init__(self, inner: torch.Tensor):
        self.inner = inner

    def tolist(self):  # a device -> host read, like .item()
        return self.inner.tolist()

    def __repr__(self) -> str:
        return f"SimTensor({self.inner!r})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


_TRANSFERS = ("aten::to", "aten::_to_copy", "aten::copy_")
_METADATA = ("aten::_has_compatible_shallow_copy_type",)


def _on_device(d) -> bool:
    return d is not None and torch.device(d).type == NAME


def _run(func, args, kwargs):
    flat, _ = tree_flatten((args, kwargs))
    dev = [t for t in flat if isinstance(t, SimTensor)]
    host = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, SimTensor) and t.dim() > 0]
    name = func._schema.name
    if name in _METADATA:
        return False if dev and host else func(*args, **kwargs)
    if dev and host and name not in _TRANSFERS:
        shapes = ", ".join(str(tuple(t.shape)) for t in host)
        raise CrossDevice(f"{func}: device tensors mixed with host tensors of shape {shapes}")
    target = kwargs.get("device")
    if target is not None:
        kwargs = {**kwargs, "device": torch.device("cpu")}
    out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
    if name == "aten::_local_scalar_dense":  # .item(): a host scalar
        return out
    wrap = _on_device(target) if target is not None else bool(dev)
    if name == "aten::copy_":  # in place into its destination, wherever that is
        return args[0]
    if not wrap:
        return out
    if name.endswith("_") and dev and isinstance(out, torch.Tensor) and out is _unwrap(args[0]):
        return args[0]  # in-place ops return their own (device) argument
    return tree_map(lambda t: SimTensor(t) if type(t) is torch.Tensor else t, out)


def _unwrap(t):
    return t.inner if isinstance(t, SimTensor) else t


class _SimMode(TorchDispatchMode):
    """Factories asked for the sim device (torch.zeros(..., device=dev)) are built on the host and wrapped."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


@contextlib.contextmanager
def sim_device():
    """The simulated device, active for the block: yields torch.device("sim", 0)."""
    real_tensor = torch.tensor

    def tensor(data, *a, device=None, **kw):
        if _on_device(device):
            return real_tensor(data, *a, **kw).to(device)
        return real_tensor(data, *a, device=device, **kw)

    # wrapper tensors can't be inference tensors (views of them need version counters): the engine's
    # inference_mode runs as no_grad here, which computes the same values
    im = torch.autograd.grad_mode.inference_mode
    real_enter = im.__enter__

    def enter(self):
        self._inference_mode_context = torch._C._InferenceMode(False)
        self._inference_mode_context.__enter__()
        self._no_grad = torch.no_grad()
        self._no_grad.__enter__()

    real_exit = im.__exit__

    def exit_(self, *exc):
        self._no_grad.__exit__(*exc)
        self._inference_mode_context.__exit__(*exc)

    torch.tensor, im.__enter__, im.__exit__ = tensor, enter, exit_
    try:
        with _SimMode():
            yield DEVICE
    finally:
        torch.tensor, im.__enter__, im.__exit__ = real_tensor, real_enter, real_exit
