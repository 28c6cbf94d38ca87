"""Run a script written for CUDA/NCCL on CPU ranks with gloo, noting every call that was mapped.

Mapped: init_process_group's 'nccl' backend (and device_id=); torch.cuda.set_device/synchronize/
current_device; torch.accelerator's device calls (current_accelerator() is 'cuda', set_device_index
is remembered); DistributedDataParallel's device_ids/output_device; every way a CUDA device is named
to torch: 'cuda[:i]' strings, integer indices (`model.to(gpu_id)`, `x.to(local_rank)`,
`torch.device(local_rank)`, `device=0`) and torch.device('cuda', i), as `device=` arguments and
Tensor.to/.cuda and Module.to targets (through a TorchFunctionMode, PyTorch's own hook for every
torch call); torch.load's map_location. SyncBatchNorm becomes BatchNorm with per-rank statistics
(PyTorch's SyncBatchNorm runs on GPUs only). CUDA autocast and GradScaler switch themselves off
without CUDA; each is noted (its steps ran in float32, unscaled, so mixed precision is not
checked). Anything else a script needs CUDA for fails as it would on any CPU machine, and `ddpkit
check` reports that failure instead of guessing.

Under an NCCL process group every tensor given to a collective must be on a GPU. The mapping
tracks the tensors that would stay on the CPU in the real run (made without a device, from host
data only, or moved with .cpu()) and reports each such tensor given to a collective, with its line.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from collections.abc import Callable
from typing import Any

from ddpkit.hang import tracer
from ddpkit.check.devicemap import accelerator_patches, called_from_user, device_class, local_batchnorm_class

__all__ = ["CpuMapping", "TENSOR_COLLECTIVES", "cpu_backend"]

TENSOR_COLLECTIVES = (
    "all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "gather", "scatter",
    "send", "recv", "isend", "irecv",
)
"""torch.distributed calls whose tensors NCCL needs on the GPU."""


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


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
    """True for what names a CUDA device: torch.device('cuda', ...), 'cuda[:i]'."""
    import torch

    if isinstance(value, torch.device):
        return value.type == "cuda"
    return isinstance(value, str) and value.split(":")[0] == "cuda"


def _names_cuda(value: Any) -> bool:
    """`_is_cuda`, or an integer index, which torch reads as a device of the current accelerator."""
    return _is_cuda(value) or _is_index(value)


class _TensorSet:
    """Tensors by identity, held weakly (a tensor's == is elementwise, so no WeakSet)."""

    def __init__(self) -> None:
        self._refs: dict[int, Any] = {}

    def add(self, t: Any) -> None:
        key = id(t)
        if key not in self._refs:
            self._refs[key] = weakref.ref(t, lambda _, key=key: self._refs.pop(key, None))

    def discard(self, t: Any) -> None:
        self._refs.pop(id(t), None)

    def __contains__(self, t: Any) -> bool:
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t


def _tensors(args: tuple, kwargs: dict) -> list[Any]:
    import torch

    out = []
    for value in (*args, *kwargs.values()):
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if isinstance(item, torch.Tensor):
                out.append(item)
    return out


class CpuMapping:
    """Installs the mappings; `note(what, site)` is told about each one the first time it happens, and
    `host_tensor(op, site, shapes)` about each collective of an NCCL script given a tensor that would be on
    the CPU in the real run."""

    def __init__(self, note: Callable[[str, str], None],
                 host_tensor: Callable[[str, str, list[str]], None] | None = None):
        self._note_fn = note
        self._host_fn = host_tensor
        self._seen: set[tuple[str, str]] = set()
        self._restore: list[tuple[Any, str, Any]] = []
        self._mode = None
        self.host = _TensorSet()
        """Tensors that would be in host memory on the GPU machine too."""
        self.nccl_only = False
        """The script's default process group is NCCL alone (not 'cpu:gloo,cuda:nccl')."""
        self.group_nccl_only: dict[int, bool] = {}
        """id(group) -> whether a group the script made with new_group is NCCL alone on GPUs."""
        self.device_index = 0
        """The device the script made current (torch.cuda.set_device, torch.accelerator.set_device_index)."""

    def note(self, what: str, depth: int = 2) -> None:
        site = tracer.user_site(sys._getframe(depth))
        if (what, site) not in self._seen:
            self._seen.add((what, site))
            self._note_fn(what, site)

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
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
                # A CPU tensor works under a mixed 'cpu:gloo,cuda:nccl' group, not under NCCL alone.
                mapping.nccl_only = not any(part.strip().lower().startswith("cpu:") for part in backend.split(","))
                mapping.note(f"init_process_group backend {backend!r} -> {replacement!r}")
                backend = replacement
            if kwargs.pop("device_id", None) is not None:
                mapping.note("init_process_group device_id dropped")
            return init_pg(backend, *args, **kwargs)

        new_group_original = c10d.new_group

        def new_group(*args, **kwargs):
            bound = inspect.signature(new_group_original).bind_partial(*args, **kwargs)
            backend = bound.arguments.get("backend")
            replacement = cpu_backend(backend)
            if replacement is not None:
                bound.arguments["backend"] = replacement
                mapping.note(f"new_group backend {backend!r} -> {replacement!r}")
            group = new_group_original(*bound.args, **bound.kwargs)
            # on GPUs the group's backend is the one given, or the default group's when none is
            mapping.group_nccl_only[id(group)] = (
                mapping.nccl_only if backend is None else
                replacement is not None and not any(p.strip().lower().startswith("cpu:") for p in backend.split(",")))
            return group

        def cuda_noop(name):
            def noop(*args, **kwargs):
                if name == "set_device" and args and (_is_index(args[0]) or _is_cuda(args[0])):
                    mapping.device_index = args[0] if _is_index(args[0]) else (torch.device(args[0]).index or 0)
                mapping.note(f"torch.cuda.{name}() skipped")
            return noop

        def current_device():
            mapping.note(f"torch.cuda.current_device() -> {mapping.device_index} (then cpu)")
            return mapping.device_index

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
            if _names_cuda(map_location) or isinstance(map_location, dict):
                mapping.note("torch.load map_location -> 'cpu'")
                map_location = "cpu"
            return load(f, map_location, *args, **kwargs)

        module_to = torch.nn.Module.to

        def module_to_cpu(module, *args, **kwargs):
            # An integer index is resolved against the current accelerator before any tensor moves,
            # which fails without one; as a CUDA device it is mapped by Tensor.to below.
            if args and _is_index(args[0]):
                mapping.note(f"Module.to({args[0]}) -> cpu")
                args = (torch.device("cuda", args[0]), *args[1:])
            if _is_index(kwargs.get("device")):
                mapping.note(f"Module.to(device={kwargs['device']}) -> cpu")
                kwargs["device"] = torch.device("cuda", kwargs["device"])
            return module_to(module, *args, **kwargs)

        host = self.host

        class ToCpu(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func is torch.Tensor.cuda:
                    mapping.note("Tensor.cuda() -> stays on cpu")
                    host.discard(args[0])  # on the GPU in the real run
                    return args[0]
                mapped = False
                if _names_cuda(kwargs.get("device")):
                    mapping.note(f"device={kwargs['device']!s} -> cpu")
                    kwargs["device"], mapped = "cpu", True
                if func is torch.Tensor.to and len(args) > 1 and _names_cuda(args[1]):
                    mapping.note(f"Tensor.to({args[1]!s}) -> cpu")
                    args, mapped = (args[0], "cpu", *args[2:]), True
                out = func(*args, **kwargs)
                if mapped:
                    if func is torch.Tensor.to:
                        host.discard(args[0])  # Module.to moves parameters in place: theirs is the GPU
                    return out
                inputs = _tensors(args, kwargs)
                device = kwargs.get("device", args[1] if func is torch.Tensor.to and len(args) > 1 else None)
                if func is torch.Tensor.cpu or (isinstance(device, str) and device.split(":")[0] == "cpu"):
                    on_host = True
                elif device is not None:
                    on_host = False  # a device= taken from elsewhere (x.device): where it is in the real run is unknown
                else:
                    on_host = all(t in host for t in inputs)  # no tensor inputs: a factory, on the CPU
                if on_host:
                    for t in (out if isinstance(out, (list, tuple)) else (out,)):
                        if isinstance(t, torch.Tensor):
                            host.add(t)
                return out

        def checked(name, original):
            try:
                signature = inspect.signature(original)
            except (TypeError, ValueError):
                signature = None

            def nccl_only(args, kwargs) -> bool:
                group = kwargs.get("group")
                if group is None and signature is not None:
                    try:
                        group = signature.bind_partial(*args, **kwargs).arguments.get("group")
                    except TypeError:
                        group = None
                if group is None or group is dist.GroupMember.WORLD:
                    return mapping.nccl_only
                # a group the script made with new_group, else one made by torch (a DeviceMesh's): default's
                return mapping.group_nccl_only.get(id(group), mapping.nccl_only)

            def collective(*args, **kwargs):
                if mapping._host_fn is not None and nccl_only(args, kwargs) and called_from_user():
                    held = [t for t in _tensors(args, kwargs) if t in host]
                    if held:
                        site = tracer.user_site(sys._getframe(1))
                        if (name, site) not in mapping._seen:
                            mapping._seen.add((name, site))
                            mapping._host_fn(name, site, tracer.describe_tensors(tuple(held), {}))
                return original(*args, **kwargs)
            collective.__wrapped__ = original
            collective.__name__ = name
            collective.__doc__ = original.__doc__
            return collective

        for module in (dist, c10d):
            self._patch(module, "init_process_group", init_process_group)
            self._patch(module, "new_group", new_group)
            for name in TENSOR_COLLECTIVES:
                if hasattr(module, name):
                    self._patch(module, name, checked(name, getattr(module, name)))
        for name in ("set_device", "synchronize"):
            self._patch(torch.cuda, name, cuda_noop(name))
        self._patch(torch.cuda, "current_device", current_device)
        for name, replacement in accelerator_patches(self).items():
            self._patch(torch.accelerator, name, replacement)
        self._patch(torch, "device", device_class(self.note))
        self._patch(torch.nn, "SyncBatchNorm", local_batchnorm_class(self.note))
        self._patch(torch.nn.Module, "to", module_to_cpu)
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

