"""How a DDP model's gradients are averaged: `ddpkit.wrap(..., comm=...)`.

None (the default) is PyTorch's own DDP all-reduce, with no communication hook: the gradient path
every GPU user runs. The others are opt-in DDP communication hooks: "fp16"/"bf16" all-reduce 16-bit
gradients (half the bytes, rounded); "shm" averages float32 gradients of CPU ranks on one host
through shared memory (ddpkit.parallel.shm). A comm= hook holds DDP's one hook slot; to register a hook of
your own, wrap with comm=None.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["COMM_CHOICES", "check_comm", "register_comm"]

COMM_CHOICES = (None, "fp16", "bf16", "shm")
"""Values of `ddpkit.wrap(..., comm=...)`; None (the default) is PyTorch's all-reduce."""


def check_comm(comm: Any, ctx: Context | None = None, *, stacklevel: int = 2) -> str | None:
    """Validate a `comm=` value (and, for 'shm', that `ctx` is CPU ranks on one host); returns it.

    'auto', the default of earlier releases, is accepted as a deprecated spelling of None with a
    FutureWarning (`stacklevel` points it at the caller's line).
    """
    if isinstance(comm, str) and comm == "auto":
        warnings.warn(
            "wrap(comm='auto') is deprecated: the default is now comm=None, PyTorch's own DDP all-reduce, on "
            "every device; drop comm='auto', or pass comm='shm' to keep the shared-memory exchange of CPU ranks",
            FutureWarning, stacklevel=stacklevel + 1)
        return None
    if comm not in COMM_CHOICES:
        raise ValueError(
            f"wrap(comm={comm!r}) is not a gradient communication option; use None (the default: PyTorch's "
            "all-reduce), 'fp16' or 'bf16' (half the all-reduce bytes, gradients rounded to 16 bits), "
            "or 'shm' (CPU ranks on one host: average through shared memory)"
        )
    if comm == "shm" and ctx is not None and ctx.distributed:
        from ddpkit.parallel.shm import shm_unsupported

        reason = shm_unsupported(ctx)
        if reason:
            raise ValueError(f"wrap(comm='shm') {reason}; use comm=None (PyTorch's all-reduce) or comm='bf16'")
    return comm


def register_comm(model: torch.nn.Module, comm: str | None, *, timeout_s: float = 600.0) -> None:
    """Register the communication hook for `comm` on a DistributedDataParallel model (None: nothing).

    A collective for 'shm' (every rank maps the shared segment); the 16-bit hooks and None are not.
    The hook holds DDP's one slot: DDP then refuses another `register_comm_hook`.
    `timeout_s`: how long the shm exchange waits for a peer before raising (init's timeout_s).
    """
    import torch

    if comm is None:
        return
    if comm == "shm":
        from ddpkit.parallel.shm import register_shm_exchange

        register_shm_exchange(model, timeout_s=timeout_s)
        return
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[comm]
    # torch's own bf16_compress_hook refuses gloo; gloo all-reduces bf16 fine, so ddpkit has its own.
    model.register_comm_hook(None, _compress_hook(dtype))


def _compress_hook(dtype: torch.dtype):
    """A comm hook: bucket -> 16-bit average over ranks -> back into the float32 bucket.

    It divides by the world size before rounding to 16 bits (an average cannot overflow where a
    sum might). DDP inspects a hook's signature and rejects annotations other than its own, so the
    hook itself is left unannotated.
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
