"""CPU stand-ins for the CUDA device names `ddpkit check` maps: torch.device(index), torch.accelerator, SyncBatchNorm.

Each stand-in answers as a one-GPU-per-rank machine would (a CUDA device, the index the script made
current), so the script takes its GPU path; the tensors it places there are then kept on the CPU by
ddpkit.check.cpumap. Only calls from the user's code are answered so: torch's own code still sees
a machine without an accelerator (its DataLoader, for one, then does not try to pin memory).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["device_class", "accelerator_patches", "local_batchnorm_class", "called_from_user"]

_DDPKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def called_from_user(depth: int = 2) -> bool:
    """True when the caller `depth` frames up, past ddpkit's own wrappers, is the user's code (not torch's)."""
    from ddpkit.hang import tracer

    frame = sys._getframe(depth)
    while frame is not None and frame.f_code.co_filename.startswith(_DDPKIT_DIR):
        frame = frame.f_back
    return frame is not None and tracer.user_frame(frame) is frame


def device_class(note: Callable[[str], None]) -> type:
    """A stand-in for `torch.device` whose `torch.device(i)` is cuda:i (torch resolves a bare index against
    the current accelerator and raises without one); everything else is torch.device itself, and
    isinstance(x, torch.device) keeps working."""
    import torch

    real = torch.device

    class _DeviceMeta(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, real)

        def __subclasscheck__(cls, sub: type) -> bool:
            return issubclass(sub, real)

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            if len(args) == 1 and not kwargs and isinstance(args[0], int) and not isinstance(args[0], bool):
                note(f"torch.device({args[0]}) -> cuda:{args[0]} (then cpu)")
                return real("cuda", args[0])
            return real(*args, **kwargs)

    class device(metaclass=_DeviceMeta):  # noqa: N801 (torch's own spelling)
        __doc__ = real.__doc__

    return device


def accelerator_patches(mapping: Any) -> dict[str, Callable]:
    """torch.accelerator functions answering, to the user's code, as a machine with one CUDA device per rank."""
    import torch

    acc = torch.accelerator
    originals = {name: getattr(acc, name) for name in ("current_accelerator", "is_available", "device_count",
                                                        "set_device_index", "set_device_idx", "current_device_index",
                                                        "current_device_idx", "synchronize") if hasattr(acc, name)}

    def answer(name: str, fake: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not called_from_user():
                return originals[name](*args, **kwargs)
            return fake(*args, **kwargs)
        call.__name__ = name
        call.__doc__ = originals[name].__doc__
        return call

    def current_accelerator(check_available: bool = False) -> Any:
        mapping.note("torch.accelerator.current_accelerator() -> cuda (then cpu)")
        return torch.device("cuda")

    def is_available() -> bool:
        mapping.note("torch.accelerator.is_available() -> True (then cpu)")
        return True

    def device_count() -> int:
        count = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        mapping.note(f"torch.accelerator.device_count() -> {count} (one per rank, then cpu)")
        return count

    def set_device_index(device: Any) -> None:
        mapping.device_index = device if isinstance(device, int) else (torch.device(device).index or 0)
        mapping.note("torch.accelerator.set_device_index() skipped")

    def current_device_index() -> int:
        mapping.note(f"torch.accelerator.current_device_index() -> {mapping.device_index} (then cpu)")
        return mapping.device_index

    def synchronize(device: Any = None) -> None:
        mapping.note("torch.accelerator.synchronize() skipped")

    fakes = {"current_accelerator": current_accelerator, "is_available": is_available, "device_count": device_count,
             "set_device_index": set_device_index, "set_device_idx": set_device_index,
             "current_device_index": current_device_index, "current_device_idx": current_device_index,
             "synchronize": synchronize}
    return {name: answer(name, fakes[name]) for name in originals}


def local_batchnorm_class(note: Callable[[str], None]) -> type:
    """A stand-in for `torch.nn.SyncBatchNorm` on CPU ranks: BatchNorm over this rank's batch only.

    PyTorch's SyncBatchNorm refuses CPU modules (DDP raises "SyncBatchNorm layers only work with GPU
    modules"). The stand-in keeps the same parameters and buffers (a state_dict loads either way),
    accepts any input of 2 or more dimensions like SyncBatchNorm, and its `convert_sync_batchnorm`
    returns the model unchanged. Cross-rank statistics are not checked, and the note says so.
    """
    import torch
    import torch.nn.functional as F

    class SyncBatchNorm(torch.nn.BatchNorm1d):
        """BatchNorm with per-rank statistics, standing in for nn.SyncBatchNorm on CPU ranks."""

        def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                     track_running_stats: bool = True, process_group: Any = None, device: Any = None,
                     dtype: Any = None) -> None:
            note("nn.SyncBatchNorm -> BatchNorm (per-rank statistics: cross-rank synchronisation not checked)")
            super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
            self.process_group = process_group

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            if input.dim() < 2:
                raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")
            factor = 0.0 if self.momentum is None else self.momentum
            if self.training and self.track_running_stats and self.num_batches_tracked is not None:
                self.num_batches_tracked.add_(1)
                if self.momentum is None:  # a cumulative moving average
                    factor = 1.0 / float(self.num_batches_tracked)
            use_batch_stats = self.training or (self.running_mean is None and self.running_var is None)
            keep = not self.training or self.track_running_stats
            return F.batch_norm(input, self.running_mean if keep else None, self.running_var if keep else None,
                                self.weight, self.bias, use_batch_stats, factor, self.eps)

        @classmethod
        def convert_sync_batchnorm(cls, module: torch.nn.Module, process_group: Any = None) -> torch.nn.Module:
            note("SyncBatchNorm.convert_sync_batchnorm() skipped (BatchNorm keeps per-rank statistics: "
                 "cross-rank synchronisation not checked)")
            return module

    return SyncBatchNorm
