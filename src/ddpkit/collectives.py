"""All-rank helpers: sums and counts, exact means, unpadded gathers, joined lists, broadcast, barrier.

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
    "all_reduce_number",
    "reduce_mean",
    "reduce_means",
    "all_gather_object",
    "broadcast_object",
    "barrier",
    "gather_in_order",
    "gather_list",
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


def all_reduce_number(ctx: Context, value: float | int) -> float | int:
    """Sum a Python number over ranks: an int where every rank's value is an int, else a float.

    Collective (one all-reduce, the flag riding with the value). A sum a script starts at the int `0` and adds
    floats to (`total += loss.item()`) is still the int `0` on a rank that saw no batch of an uneven shard;
    rebuilding the total with that rank's own type (`int(total)`) would cut the run's figure there, and ranks would
    disagree on it (an early stop taken on one rank alone hangs the others). Ints sum exactly up to 2**53.
    """
    import torch

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"all_reduce_number takes an int or a float, not {type(value).__name__}: sum tensors "
                        "with all_reduce_sum(ctx, value)")
    pair = torch.tensor([float(value), 0.0 if isinstance(value, int) else 1.0], dtype=torch.float64)
    total, floats = all_reduce_sum(ctx, pair).tolist()
    return float(total) if floats else int(round(total))


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


def gather_list(ctx: Context, xs: Any) -> Any:
    """Every rank's `xs` joined in rank order, on every rank: a list as one list, a tensor or a numpy array
    concatenated along its first dimension.

    Made for what an evaluation loop collects over `ddpkit.eval_loader`, whose shards are contiguous and unpadded:
    per-sample entries (`preds.extend(out.argmax(1).tolist())`, `acc = torch.cat([acc, out])`) joined in rank
    order are exactly the single-process list, and per-batch entries (`losses.append(loss.item())`) cover the
    whole set once (each shard's last batch may be smaller than the script's). Over a padded training shard the
    result holds duplicates.

    Tensors travel on the CPU (detached): one that was on an accelerator on its rank comes back on this rank's
    `ctx.device`, one that was on the CPU stays there, at any depth of lists, tuples and dicts; a joined tensor
    comes back on the device `xs` is on. Pickled as they are, CUDA tensors would unpickle onto the sending rank's
    GPU index. This rank's own entries are returned as they are (the same objects). The tests run CPU ranks
    only, where that move is simulated: that another rank's CUDA tensor lands on this rank's GPU, not the
    sender's, only a run on GPUs confirms.

    Collective: every rank must call it, in the same order, after its loop (evaluation shards may differ by a
    batch, so never inside it), or the job hangs. At world size 1 it returns `xs` itself.
    """
    kind = _joinable(xs)
    if not ctx.distributed:
        return xs
    if kind == "list":
        parts = all_gather_object(ctx, _to_host(xs))
        out: list[Any] = []
        for rank, part in enumerate(parts):
            out.extend(xs if rank == ctx.rank else _from_host(part, ctx.device))
        return out
    if xs.ndim == 0:
        raise ValueError(f"gather_list(ctx, xs) got a 0-d {kind}, which has no entries to join; collect the values "
                         "in a list, or concatenate along a first dimension")
    local = xs.detach().cpu() if kind == "tensor" else xs
    # An empty shard's value (often the script's start, a bare torch.tensor([]) or np.array([]), float) must not
    # change the others' dtype or shape: only non-empty parts are joined, and nothing where all are empty.
    filled = [p for p in all_gather_object(ctx, local) if len(p)]
    if not filled:
        return xs
    if kind == "tensor":
        import torch

        return torch.cat(filled).to(xs.device)
    import numpy as np

    return np.concatenate(filled)


def _joinable(xs: Any) -> str:
    """'list', 'tensor' or 'numpy array': what gather_list joins; anything else is a TypeError."""
    import sys

    if isinstance(xs, list):
        return "list"
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")  # an instance implies its module is loaded
    if torch is not None and isinstance(xs, torch.Tensor):
        return "tensor"
    if np is not None and isinstance(xs, np.ndarray):
        return "numpy array"
    hint = "; pass list(xs)" if isinstance(xs, tuple) else (
        "; gather a list of its entries, or use ddpkit.collectives.all_gather_object for any other object")
    raise TypeError(f"gather_list(ctx, xs): xs must be a list, a torch tensor or a numpy array (what a loop collects "
                    f"into), got {type(xs).__name__}{hint}")


class _OnDevice:
    """A tensor that was on its rank's accelerator, sent on the CPU: it lands on the receiving rank's device."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: Any) -> None:
        self.tensor = tensor


def _to_host(obj: Any) -> Any:
    """`obj` with every tensor detached on the CPU, those from an accelerator marked as such."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t if t.device.type == "cpu" else _OnDevice(t.cpu())
    return _rebuild(obj, _to_host)


def _from_host(obj: Any, device: Any) -> Any:
    if isinstance(obj, _OnDevice):
        return obj.tensor.to(device)
    return _rebuild(obj, lambda x: _from_host(x, device))


def _rebuild(obj: Any, each: Any) -> Any:
    """`obj` with `each` applied to the items of its lists, tuples (named ones too) and dicts; anything else as is."""
    if type(obj) is list:
        return [each(x) for x in obj]
    if isinstance(obj, tuple):
        items = [each(x) for x in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    if type(obj) is dict:
        return {k: each(v) for k, v in obj.items()}
    return obj
