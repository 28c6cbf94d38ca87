"""Run a script written for CUDA/NCCL on CPU ranks with gloo, noting every call that was mapped.

Mapped: init_process_group's 'nccl' backend (and device_id=), torch.cuda.set_device/synchronize,
DistributedDataParallel's device_ids/output_device, `device=` arguments and Tensor.to/.cuda
targets that name CUDA (through a TorchFunctionMode, PyTorch's own hook for every torch call),
and torch.load's map_location. CUDA autocast and GradScaler switch themselves off without CUDA;
each is noted (its steps ran in float32, unscaled, so mixed precision is not checked). Anything
else a script needs CUDA for fails as it would on any CPU machine, and `ddpkit check` reports that
failure instead of guessing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ddpkit import tracer

__all__ = ["CpuMapping", "cpu_backend"]


def cpu_backend(backend: Any) -> str | None:
    """The backend to use on CPU ranks instead of `backend`, or None when it already runs on the CPU.

    Decided by the devices torch says each backend serves (`Backend.backend_capability`), never by
    its name: 'nccl', 'NCCL', 'xccl', a newer 'nccl2' and 'cuda:nccl' have no CPU path and become
    'gloo'; in a per-device string such as 'cpu:gloo,cuda:nccl' the CPU entry is kept.
    """
    if not isinstance(backend, str):
        return None
    import torch.distributed as dist

    capability = dist.Backend.backend_capability
    entries = [part.strip().lower() for part in backend.split(",") if part.strip()]
    cpu_entries = [e.split(":", 1)[1] for e in entries if e.startswith("cpu:")]
    if cpu_entries:
        return None if len(entries) == 1 else cpu_entries[0]
    names = [e.split(":", 1)[-1] for e in entries]
    if names and all("cpu" in capability.get(name, ()) for name in names) and all(":" not in e for e in entries):
        return None
    return "gloo"


def _is_cuda(value: Any) -> bool:
    import torch

    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":")[0] == "cuda"


class CpuMapping:
    """Installs the mappings; `note(what, site)` is told about each one the first time it happens."""

    def __init__(self, note: Callable[[str, str], None]):
        self._note_fn = note
        self._seen: set[tuple[str, str]] = set()
        self._restore: list[tuple[Any, str, Any]] = []
        self._mode = None

    def note(self, what: str, depth: int = 2) -> None:
        site = tracer.user_site(sys._getframe(depth))
        if (what, site) not in self._seen:
            self._seen.add((what, site))
            self._note_fn(what, site)

    def _patch(self, owner: Any, name: str, replacement: Callable) -> None:
        self._restore.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def install(self) -> None:
        import torch
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel
        from torch.overrides import TorchFunctionMode

        mapping = self
        init_pg = c10d.init_process_group

        def init_process_group(backend=None, *args, **kwargs):
            replacement = cpu_backend(backend)
            if replacement is not None:
                mapping.note(f"init_process_group backend {backend!r} -> {replacement!r}")
                backend = replacement
            if kwargs.pop("device_id", None) is not None:
                mapping.note("init_process_group device_id dropped")
            return init_pg(backend, *args, **kwargs)

        def cuda_noop(name):
            def noop(*args, **kwargs):
                mapping.note(f"torch.cuda.{name}() skipped")
            return noop

        ddp_init = DistributedDataParallel.__init__

        def ddp_init_cpu(module, inner, *args, **kwargs):
            for key in ("device_ids", "output_device"):
                if kwargs.get(key) is not None:
                    mapping.note(f"DistributedDataParallel {key}= dropped (CPU)")
                    kwargs[key] = None
            if args and args[0] is not None:  # device_ids passed positionally
                mapping.note("DistributedDataParallel device_ids dropped (CPU)")
                args = (None, *args[1:])
            return ddp_init(module, inner, *args, **kwargs)

        # CUDA autocast and GradScaler switch themselves off on a machine without CUDA (a warning on
        # stderr, nothing else): the steps then run in float32 with an unscaled loss. Say so, since
        # the fp16 paths (overflow skips, unscale before clipping) were not exercised.
        autocast_init = torch.amp.autocast_mode.autocast.__init__

        def autocast_cpu(ctx, device_type, *args, **kwargs):
            autocast_init(ctx, device_type, *args, **kwargs)
            if _is_cuda(device_type) and (args[1] if len(args) > 1 else kwargs.get("enabled", True)):
                dtype = str(ctx.fast_dtype).removeprefix("torch.")
                mapping.note(f"torch.autocast('cuda', {dtype}) -> off (ran in float32: mixed precision not checked)")

        scaler_init = torch.amp.GradScaler.__init__

        def scaler_cpu(scaler, *args, **kwargs):
            scaler_init(scaler, *args, **kwargs)
            device = args[0] if args else kwargs.get("device", "cuda")  # GradScaler's default device is cuda
            if _is_cuda(device) and (args[5] if len(args) > 5 else kwargs.get("enabled", True)):
                mapping.note("GradScaler('cuda') -> disabled (loss not scaled: loss scaling not checked)")

        load = torch.load

        def load_cpu(f, map_location=None, *args, **kwargs):
            if _is_cuda(map_location) or isinstance(map_location, int):
                mapping.note("torch.load map_location -> 'cpu'")
                map_location = "cpu"
            return load(f, map_location, *args, **kwargs)

        class ToCpu(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is torch.Tensor.cuda:
                    mapping.note("Tensor.cuda() -> stays on cpu")
                    return args[0]
                if _is_cuda(kwargs.get("device")):
                    mapping.note(f"device={kwargs['device']!s} -> cpu")
                    kwargs["device"] = "cpu"
                if func is torch.Tensor.to and len(args) > 1 and (_is_cuda(args[1]) or type(args[1]) is int):
                    mapping.note(f"Tensor.to({args[1]!s}) -> cpu")
                    args = (args[0], "cpu", *args[2:])
                return func(*args, **kwargs)

        for module in (dist, c10d):
            self._patch(module, "init_process_group", init_process_group)
        for name in ("set_device", "synchronize"):
            self._patch(torch.cuda, name, cuda_noop(name))
        self._patch(DistributedDataParallel, "__init__", ddp_init_cpu)
        self._patch(torch, "load", load_cpu)
        self._patch(torch.amp.autocast_mode.autocast, "__init__", autocast_cpu)
        self._patch(torch.amp.GradScaler, "__init__", scaler_cpu)
        self._mode = ToCpu()
        self._mode.__enter__()

    def uninstall(self) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        for owner, name, original in reversed(self._restore):
            setattr(owner, name, original)
        self._restore.clear()
