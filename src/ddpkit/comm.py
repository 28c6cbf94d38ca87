"""Gradient communication options for a DDP model: exact float32 (default) or 16-bit compression."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["COMM_CHOICES", "check_comm", "register_comm"]

COMM_CHOICES = (None, "fp16", "bf16")
"""Values of `ddpkit.wrap(..., comm=...)`: None sends gradients as they are (exact DDP)."""


def check_comm(comm: Any) -> str | None:
    """Validate a `comm=` value; returns it."""
    if comm not in COMM_CHOICES:
        raise ValueError(
            f"wrap(comm={comm!r}) is not a gradient communication option; use None (exact, the default), "
            "'fp16' or 'bf16' (half the all-reduce bytes, gradients rounded to 16 bits)"
        )
    return comm


def register_comm(model: torch.nn.Module, comm: str | None) -> None:
    """Install the communication hook for `comm` on a DistributedDataParallel model (None: nothing).

    The hook runs inside backward on every rank, once per gradient bucket, and issues one
    all-reduce of that bucket: a collective, like DDP's own. It divides by the world size before
    rounding to 16 bits (an average cannot overflow where a sum might), all-reduces the 16-bit
    copy and writes the result back into the float32 bucket. DDP allows one hook per model, so a
    model wrapped with `comm` cannot also take `register_comm_hook`.
    """
    import torch

    if check_comm(comm) is None:
        return
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[comm]
    # torch's own bf16_compress_hook refuses gloo; gloo all-reduces bf16 fine, so ddpkit has its own.
    model.register_comm_hook(None, _compress_hook(dtype))


def _compress_hook(dtype: torch.dtype):
    """A comm hook: bucket -> 16-bit average over ranks -> back into the float32 bucket.

    DDP inspects a hook's signature and rejects annotations other than its own, so the hook
    itself is left unannotated.
    """
    import torch.distributed as dist

    def hook(state, bucket):
        group = state if state is not None else dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(dist.get_world_size(group))
        fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

        def decompress(f):
            buffer.copy_(f.value()[0])
            return buffer

        return fut.then(decompress)

    hook.__name__ = f"ddpkit_{str(dtype).rsplit('.', 1)[-1]}_compress_hook"
    return hook
