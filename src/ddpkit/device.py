"""This rank's device: chosen together with the process-group backend, and batches moved onto it
(tensors inside any batch object; host memory pinned for asynchronous copies)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ddpkit.env import LaunchEnv

if TYPE_CHECKING:
    import torch

__all__ = ["select_device", "plan_device",
           "to_device", "pin_host_tensors", "HostPinnedCollate", "HostBatch", "unwrap_host_batch"]

_CHOICES = ("auto", "cpu", "cuda")


def plan_device(env: LaunchEnv, *, device: str, num_gpus: int) -> tuple[str, str]:
    """Pure decision: (device string, backend) for this rank, given how many GPUs are visible.

    CUDA ranks use `cuda:{local_rank}` and nccl; CPU ranks use gloo (nccl has no CPU path). Under
    srun with one task per rank, SLURM may bind GPUs per task (--gpus-per-task, --gpu-bind): each
    task then sees only its own GPU(s), numbered from 0, and uses cuda:0. Without such a binding
    every task of a node sees the same GPUs, and fewer GPUs than tasks is refused on every task
    (ranks would share a GPU).
    """
    if device not in _CHOICES:
        raise ValueError(f"device={device!r} is not one of {_CHOICES}; pass device='auto' to use GPUs when visible")
    if device == "cpu" or (device == "auto" and num_gpus == 0):
        return "cpu", "gloo"
    if num_gpus == 0:
        raise ValueError(
            "device='cuda' but no GPU is visible (torch.cuda.is_available() is False); "
            "pass device='auto' or 'cpu' to train on the CPU with gloo"
        )
    if env.launcher == "slurm" and env.gpus_bound_per_task:
        return "cuda:0", "nccl"  # this task's own GPU, bound by SLURM: local rank 3 sees it as device 0
    if env.launcher == "slurm" and num_gpus < env.local_world_size:
        # refused on every task alike (not only those beyond the count), so no rank waits for the others
        raise ValueError(
            f"SLURM runs {env.local_world_size} tasks on this node and each sees the same {num_gpus} GPU(s) "
            f"(no GPU bound per task: SLURM_GPUS_PER_TASK and SLURM_GPU_BIND unset), so ranks would share a "
            f"GPU; run srun with --gpus-per-task=1 (or --ntasks-per-node {num_gpus})"
        )
    if env.local_rank >= num_gpus:
        raise ValueError(
            f"local rank {env.local_rank} needs GPU {env.local_rank} but only {num_gpus} are visible; "
            f"launch with --nproc-per-node {num_gpus} (or auto), or check CUDA_VISIBLE_DEVICES"
        )
    return f"cuda:{env.local_rank}", "nccl"


def select_device(env: LaunchEnv, *, device: str = "auto") -> tuple[torch.device, str]:
    """Return (device, backend) and make the device current before any process group exists.

    `torch.cuda.set_device` must run before `init_process_group`, or every rank's NCCL
    communicator and default allocations land on cuda:0.
    """
    import torch

    num_gpus = torch.cuda.device_count() if device != "cpu" and torch.cuda.is_available() else 0
    name, backend = plan_device(env, device=device, num_gpus=num_gpus)
    dev = torch.device(name)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev, backend


def _map_batch(batch: Any, fn: Any) -> Any:
    """`batch` rebuilt with `fn` applied to each element of its containers (dicts, namedtuples, lists,
    tuples, dataclasses); None when `batch` is no such container."""
    import dataclasses

    if isinstance(batch, Mapping):
        items = {k: fn(v) for k, v in batch.items()}
        try:
            return type(batch)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that cannot be built from a dict (defaultdict, ...)
            return items
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(fn(v) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(fn(v) for v in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{f.name: fn(getattr(batch, f.name))
                                             for f in dataclasses.fields(batch) if f.init})
    return None


def _accepts_non_blocking(method: Any) -> bool:
    import inspect

    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return any(p.name == "non_blocking" or p.kind is p.VAR_KEYWORD for p in params)


def to_device(batch: Any, device: torch.device, *, non_blocking: bool = False) -> Any:
    """Move the tensors of a batch to `device`; values that hold no tensor pass through.

    Tensors; objects with their own `.to(device)` (PyG `Batch`, HF `BatchEncoding`, your classes),
    called with `non_blocking` when their `.to` accepts it; and, element by element, dicts,
    namedtuples, lists, tuples and dataclasses (rebuilt as the same type).
    """
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    to = getattr(batch, "to", None)
    if callable(to) and not isinstance(batch, type):
        moved = to(device, non_blocking=non_blocking) if _accepts_non_blocking(to) else to(device)
        return batch if moved is None else moved  # some .to() methods move in place and return None
    mapped = _map_batch(batch, lambda v: to_device(v, device, non_blocking=non_blocking))
    return batch if mapped is None else mapped


def pin_host_tensors(batch: Any) -> Any:
    """`batch` with its CPU tensors in pinned (page-locked) memory, for asynchronous copies to the GPU.

    Tensors already on a GPU (a dataset held in device memory) are left as they are: pinning them
    raises. Containers are walked as `to_device` walks them; objects with a `pin_memory()` method
    of their own (PyG `Batch`) pin themselves.
    """
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.pin_memory() if batch.device.type == "cpu" and not batch.is_pinned() else batch
    mapped = _map_batch(batch, pin_host_tensors)
    if mapped is not None:
        return mapped
    pin = getattr(batch, "pin_memory", None)
    return pin() if callable(pin) and not isinstance(batch, type) else batch


class HostPinnedCollate:
    """A collate_fn whose batches torch's pin-memory thread pins with `pin_host_tensors` (CPU tensors
    only), in the background as usual: the DataLoader calls the batch's own `pin_memory()`."""

    def __init__(self, collate_fn: Any = None):
        self.collate_fn = collate_fn

    def __call__(self, items: list[Any]) -> HostBatch:
        import torch

        collate = self.collate_fn or torch.utils.data.default_collate
        return HostBatch(collate(items))


class HostBatch:
    """A collated batch on its way through torch's pin-memory thread (which calls its `pin_memory()`)."""

    def __init__(self, batch: Any):
        self.batch = batch

    def pin_memory(self, device: Any = None) -> Any:
        return pin_host_tensors(self.batch)


def unwrap_host_batch(batch: Any) -> Any:
    """The batch itself: a HostBatch arrives unwrapped only when torch pinned nothing (no accelerator)."""
    return batch.batch if isinstance(batch, HostBatch) else batch
