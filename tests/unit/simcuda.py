"""A CUDA device simulated on CPU for tests: what a code path would make the host wait for.

Tensors created "on cuda" are CPU tensors marked as device memory (their values are real, so the
code under test computes as it would on a GPU); results of operations on them are marked too.
Every step that makes the host wait for the GPU on CUDA is recorded in `SimCuda.syncs`:

- a device value read on the host: `.item()`, `bool(t)`, `float(t)`, `int(t)`, `.tolist()`,
  `.cpu()`, `.numpy()`, a copy into a host tensor unless it is pinned and non-blocking (not
  `.to("cpu")`: torch's own code moves tensors to devices its C++ side named, which say cpu here);
- a host-to-device copy from pageable memory: `torch.tensor(data, device="cuda")`,
  `.to("cuda")`/`.cuda()`/`copy_` of a host tensor that is not pinned or not non-blocking.

`torch.full(..., device="cuda")`, `fill_` with a Python number, and kernels on device tensors are
launched without waiting, as on CUDA. A device tensor's `.device` says `cuda:0`. `FakeEvent` stands
in for `torch.cuda.Event`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_READS = {"item", "__bool__", "__int__", "__float__", "__index__", "tolist", "cpu", "numpy"}
_FROM_DATA = {"tensor", "as_tensor", "asarray"}


def _on_device(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and getattr(t, "_simcuda", False)


def _is_cuda(device: Any) -> bool:
    try:
        return device is not None and torch.device(device).type == "cuda"
    except (RuntimeError, TypeError):
        return False


def _mark(out: Any, flag: str) -> Any:
    if isinstance(out, torch.Tensor):
        setattr(out, flag, True)
    elif isinstance(out, (list, tuple)):
        for o in out:
            _mark(o, flag)
    return out


class SimCuda(TorchFunctionMode):
    """`with SimCuda() as sim:` ... `sim.syncs` lists ("read"|"h2d", op name) in order."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", str(func))
        if name == "__get__" and args and _on_device(args[0]):
            attr = getattr(getattr(func, "__self__", None), "__name__", "")
            if attr == "device":  # code that asks where a device tensor lives is told cuda:0
                return torch.device("cuda", 0)
            if attr == "is_cuda":
                return True
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
        nested = [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        device_in = any(_on_device(t) for t in tensors + nested)
        to_cuda = _is_cuda(kwargs.get("device"))
        if to_cuda:
            kwargs["device"] = "cpu"
        pin = bool(kwargs.pop("pin_memory", False))
        if name in ("to", "cuda") and args and isinstance(args[0], torch.Tensor):
            positional = [i for i, a in enumerate(args[1:], 1) if isinstance(a, (str, torch.device)) or
                          (name == "cuda" and isinstance(a, int))]
            target = args[positional[0]] if positional else ("cuda" if name == "cuda" else kwargs.get("device"))
            if name == "cuda" or _is_cuda(target):
                args = tuple(a for i, a in enumerate(args) if i not in positional)
                kwargs.pop("device", None)
                if not _on_device(args[0]):
                    if not (getattr(args[0], "_simpinned", False) and kwargs.get("non_blocking")):
                        self.syncs.append(("h2d", name))
                    out = func(*args, **kwargs)
                    out = out.clone() if out is args[0] else out
                    return _mark(out, "_simcuda")
                return func(*args, **kwargs)
            if target is not None and torch.device(target).type == "cpu" and _on_device(args[0]):
                # not counted: torch's own code moves tensors to devices its C++ side named, which
                # say cpu here (clip_grad_norm_'s `.to(device)`); the tensor stays on the device
                return _mark(func(*args, **kwargs), "_simcuda")
        if name == "copy_" and len(args) >= 2:
            dst, src = args[0], args[1]
            non_blocking = kwargs.get("non_blocking", args[2] if len(args) > 2 else False)
            if _on_device(src) and not _on_device(dst):
                if not (getattr(dst, "_simpinned", False) and non_blocking):
                    self.syncs.append(("read", name))
                return func(*args, **kwargs)
            if _on_device(dst) and not _on_device(src):
                if not (getattr(src, "_simpinned", False) and non_blocking):
                    self.syncs.append(("h2d", name))
                return func(*args, **kwargs)
        if name in _READS and device_in:
            self.syncs.append(("read", name))
            out = func(*args, **kwargs)
            return out.clone() if name == "cpu" and isinstance(out, torch.Tensor) else out
        if name in _FROM_DATA and to_cuda:
            self.syncs.append(("h2d", name))
        out = func(*args, **kwargs)
        if pin or name == "pin_memory":
            _mark(out, "_simpinned")
        if (to_cuda or device_in) and name not in ("__get__", "__set__"):
            _mark(out, "_simcuda")
        return out


class FakeEvent:
    """Stands in for `torch.cuda.Event`: records when it was recorded and every host wait on it."""

    made: list[FakeEvent] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.recorded = 0
        self.synchronized = 0
        self.queried = 0
        FakeEvent.made.append(self)

    def record(self, stream: Any = None) -> None:
        self.recorded += 1

    def synchronize(self) -> None:
        self.synchronized += 1

    def query(self) -> bool:
        self.queried += 1
        return True

    def wait(self, stream: Any = None) -> None:
        pass
