"""The strategy of a wrapped model, read in one place: DDP, FSDP2 or none, through torch.compile wrappers.

Every other module asks here (`strategy_of`, `find_ddp`, `find_fsdp`, `is_dtensor`) instead of matching
types or class names of its own, so the answer cannot differ between `accumulate`, checkpoints and
`Precision`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["strategy_of", "unwrap", "find_ddp", "find_fsdp", "is_sharded", "is_dtensor", "full_tensor", "local_numel"]


def strategy_of(model: Any) -> str | None:
    """'ddp', 'fsdp', or None (a plain module) for what `ddpkit.wrap` returned, compiled or not."""
    if find_ddp(model) is not None:
        return "ddp"
    if find_fsdp(model) is not None:
        return "fsdp"
    return None


def is_dtensor(tensor: Any) -> bool:
    """Whether `tensor` is a DTensor (an FSDP2 shard), without importing torch.distributed.tensor first."""
    import sys

    module = sys.modules.get("torch.distributed.tensor")
    cls = getattr(module, "DTensor", None) if module is not None else None
    return cls is not None and isinstance(tensor, cls)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's own module inside DDP and/or torch.compile wrappers (for saving and evaluation).

    Its state_dict has no `module.` or `_orig_mod.` prefixes. FSDP shards the module in place, so
    for strategy='fsdp' this is the user's module with DTensor shards as parameters: its
    state_dict holds this rank's shards; `ddpkit.export_state_dict` writes the full one.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"unwrap() needs a torch.nn.Module (what ddpkit.wrap returned), got {type(model).__name__}")
    from ddpkit.torchinternals import compiled_inner

    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            inner = model.module
        else:
            inner = compiled_inner(model)
        if inner is None:
            return model
        model = inner


def find_ddp(model: Any):
    """The DistributedDataParallel module inside `model` and its torch.compile wrappers (None: not DDP)."""
    import torch

    from ddpkit.torchinternals import compiled_inner

    while model is not None:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model
        model = compiled_inner(model)
    return None


def find_fsdp(model: Any):
    """The root FSDP module inside torch.compile wrappers, or None when `model` is not sharded."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch < 2.6: nothing can be sharded
        return None
    from ddpkit.torchinternals import compiled_inner

    while model is not None:
        if isinstance(model, FSDPModule):
            return model
        model = compiled_inner(model)
    return None


def is_sharded(model: Any) -> bool:
    """Whether `model` (or the module inside its torch.compile wrapper) holds FSDP-sharded parameters."""
    return find_fsdp(model) is not None


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor behind a DTensor shard (an all-gather: a collective), or `tensor` itself."""
    gather = getattr(tensor, "full_tensor", None)
    return gather() if callable(gather) and is_dtensor(tensor) else tensor


def local_numel(tensor: torch.Tensor) -> int:
    """Elements this rank holds of `tensor` (its shard for a DTensor)."""
    local = getattr(tensor, "to_local", None)
    return local().numel() if callable(local) and is_dtensor(tensor) else tensor.numel()
