"""All-rank helpers: sums and counts, exact means, unpadded gathers, broadcast, barrier.

Every function here is a collective unless it says otherwise: all ranks must call it, in the same
order, with same-shaped tensors, or the job hangs until the process-group timeout. At world size 1
they return their input (no process group exists).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = [
    "all_reduce_sum",
    "reduce_mean",
    "reduce_means",
    "all_gather_object",
    "broadcast_object",
    "barrier",
    "gather_in_order",
]


def barrier(ctx: Context) -> None:
    """Block until every rank arrives. Collective: all ranks must call it."""
    if ctx.distributed:
        import torch.distributed as dist

        dist.barrier()


def all_reduce_sum(ctx: Context, value: torch.Tensor | float | int) -> torch.Tensor:
    """Sum `value` over ranks; returns a new float64 tensor on this rank's device.

    Collective: every rank must call it with the same shape. float64 keeps sums of many
    per-sample losses exact enough that the result does not depend on the world size.
    """
    import torch

    t = torch.as_tensor(value).detach().to(dtype=torch.float64).clone()
    if not ctx.distributed:
        return t
    import torch.distributed as dist

    # Reduce on the rank's own device: the group's backend for it (nccl or any successor on CUDA,
    # gloo on CPU) is chosen with the device, so the device decides, never the backend's name.
    t = t.to(ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def reduce_mean(ctx: Context, total: torch.Tensor | float, count: torch.Tensor | int) -> float:
    """Global mean from each rank's sum and count: sum(totals) / sum(counts).

    Collective. Never ReduceOp.AVG: averaging per-rank means is wrong when ranks hold different
    numbers of samples (uneven eval shards), and gloo lacks AVG on older releases.
    """
    import torch

    pair = []
    for name, value in (("total", total), ("count", count)):
        t = torch.as_tensor(value, dtype=torch.float64).detach().cpu()
        if t.numel() != 1:
            raise ValueError(f"reduce_mean({name}=...) must be one number (this rank's {name}), got a tensor of shape "
                             f"{tuple(t.shape)}; sum it first, or use reduce_means for several means")
        pair.append(t.reshape(()))
    both = all_reduce_sum(ctx, torch.stack(pair))
    total_sum, count_sum = both.tolist()
    if count_sum == 0:
        raise ValueError("reduce_mean over 0 samples on all ranks; the dataset (or eval shard set) is empty")
    return float(total_sum / count_sum)


def reduce_means(ctx: Context, sums: Mapping[str, Any], count: Any) -> dict[str, float]:
    """Several global means at once (one all-reduce): {name: sum over ranks / count over ranks}.

    Collective; every rank must pass the same keys.
    """
    import torch

    keys = sorted(sums)
    vec = torch.tensor([float(sums[k]) for k in keys] + [float(count)], dtype=torch.float64)
    out = all_reduce_sum(ctx, vec).tolist()
    if out[-1] == 0:
        raise ValueError("reduce_means over 0 samples on all ranks; the dataset (or eval shard set) is empty")
    return {k: v / out[-1] for k, v in zip(keys, out[:-1])}


def all_gather_object(ctx: Context, obj: Any) -> list[Any]:
    """Every rank's picklable `obj`, as a list indexed by rank, on every rank. Collective."""
    if not ctx.distributed:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(ctx: Context, obj: Any, src: int = 0) -> Any:
    """Rank `src`'s picklable `obj` on every rank. Collective."""
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < ctx.world_size:
        raise ValueError(f"broadcast_object(src={src!r}) must be a rank, 0..{ctx.world_size - 1}")
    if not ctx.distributed:
        return obj
    import torch.distributed as dist

    box = [obj if ctx.rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_in_order(ctx: Context, local: torch.Tensor, indices: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Per-sample outputs of all ranks, on every rank, in dataset order, without duplicates.

    `local` holds this rank's outputs (first dim = samples) and `indices` their dataset indices,
    as yielded by an eval loader. Shards may be uneven. Collective.
    """
    import torch

    if not isinstance(local, torch.Tensor):
        raise TypeError(f"gather_in_order(ctx, local, indices): local must be a tensor of this rank's outputs "
                        f"(one row per sample), got {type(local).__name__}")
    idx = torch.as_tensor(indices, dtype=torch.long).cpu()
    if idx.numel() != local.shape[0]:
        raise ValueError(
            f"gather_in_order got {local.shape[0]} outputs but {idx.numel()} indices; pass one index per output row"
        )
    parts = all_gather_object(ctx, (idx, local.detach().cpu()))
    all_idx = torch.cat([p[0] for p in parts])
    # An empty shard's outputs (often a bare torch.tensor([]), float32) must not promote the others' dtype.
    filled = [p[1] for p in parts if p[1].numel()]
    dtype = filled[0].dtype if filled and all(t.dtype == filled[0].dtype for t in filled) else local.dtype
    all_out = torch.cat([p[1].to(dtype) for p in parts])
    if torch.unique(all_idx).numel() != all_idx.numel():
        raise ValueError("gather_in_order saw a dataset index on two ranks; shard eval data with ddpkit.eval_loader")
    order = torch.argsort(all_idx)
    return all_out[order].to(local.device)
