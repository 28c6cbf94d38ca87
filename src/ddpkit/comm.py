"""Gradient communication options for a DDP model: exact float32 (default), 16-bit, or host shared memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["COMM_CHOICES", "check_comm", "register_comm"]

COMM_CHOICES = (None, "fp16", "bf16", "shm")
"""Values of `ddpkit.wrap(..., comm=...)`: None sends gradients as they are (exact DDP)."""

_SHM_DIR = "/dev/shm"
_HEADER = 64
"""Bytes before the slots: rank 0's token, which proves the other ranks mapped the same segment."""


def check_comm(comm: Any, ctx: Context | None = None) -> str | None:
    """Validate a `comm=` value (and, for 'shm', that `ctx` is CPU ranks on one host); returns it."""
    if comm not in COMM_CHOICES:
        raise ValueError(
            f"wrap(comm={comm!r}) is not a gradient communication option; use None (exact, the default), "
            "'fp16' or 'bf16' (half the all-reduce bytes, gradients rounded to 16 bits), "
            "or 'shm' (CPU ranks on one host: sum through shared memory)"
        )
    if comm == "shm" and ctx is not None and ctx.distributed:
        if ctx.device.type != "cpu":
            raise ValueError(f"wrap(comm='shm') sums gradients in host shared memory, so it needs CPU ranks, but "
                             f"this rank runs on {ctx.device}; use comm=None (exact DDP) or comm='bf16'")
        if ctx.env.local_world_size != ctx.world_size:
            raise ValueError(
                f"wrap(comm='shm') needs every rank on one host, but LOCAL_WORLD_SIZE={ctx.env.local_world_size} "
                f"!= WORLD_SIZE={ctx.world_size}; use comm=None (exact DDP over the network) or comm='bf16'")
        import os

        if not os.path.isdir(_SHM_DIR):
            raise ValueError(f"wrap(comm='shm') needs POSIX shared memory at {_SHM_DIR} (Linux); "
                             "use comm=None (exact DDP) on this system")
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
    if comm == "shm":
        model.register_comm_hook(_shm_state(model), _shm_hook)
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


class _ShmState:
    """The shm hook's state: the mapped segment (2 slot sets x world size slots), rank, which set is next.

    The mapping belongs to `arena`'s storage: it is unmapped when the DDP model, which holds this
    state, is freed. The segment's name is already unlinked, so nothing is left in /dev/shm.
    """

    def __init__(self, name: str, arena: torch.Tensor, slot_bytes: int, rank: int, world_size: int) -> None:
        import torch

        self.name = name
        """The segment's name in /dev/shm, unlinked once every rank has mapped it."""
        self.arena = arena
        self.slot_bytes = slot_bytes
        self.rank = rank
        self.world_size = world_size
        self.next_set = 0
        self.tick = torch.zeros(1)


def _shm_state(model: torch.nn.Module) -> _ShmState:
    """Create (rank 0) or map (the others) the shared segment; collective over the default group."""
    import os
    import secrets
    from multiprocessing import shared_memory

    import torch
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    # A slot holds all gradients: DDP's bucket sizes are its own business (they are rebuilt after
    # the first step and do not stay under bucket_cap_mb), and no bucket is larger than that.
    sizes = [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]
    slot_bytes = -(-max(sum(sizes), 1) // 64) * 64
    nbytes = _HEADER + 2 * world_size * slot_bytes
    token = secrets.token_bytes(16)
    shm, name, error = None, [None, token], ""
    if rank == 0:
        stat = os.statvfs(_SHM_DIR)
        if stat.f_bavail * stat.f_frsize < 2 * nbytes:  # a full tmpfs answers writes with SIGBUS, not an error
            error = f"{_SHM_DIR} has {stat.f_bavail * stat.f_frsize} bytes free, the segment needs {nbytes}"
        else:
            try:  # an error here must still reach the broadcast below, or the other ranks wait forever
                shm = shared_memory.SharedMemory(name=f"ddpkit-{secrets.token_hex(8)}", create=True, size=nbytes)
                shm.buf[:16] = token
                name[0] = shm.name
            except OSError as e:
                error = f"{type(e).__name__}: {e}"
    dist.broadcast_object_list(name, src=0)
    arena = None
    try:
        if name[0] is None:
            raise RuntimeError(error or "rank 0 could not create the segment")
        path = os.path.join(_SHM_DIR, name[0].lstrip("/"))
        if not os.path.exists(path):  # from_file would create an empty file instead of failing
            raise FileNotFoundError(path)
        storage = torch.UntypedStorage.from_file(path, shared=True, nbytes=nbytes)
        arena = torch.empty(0, dtype=torch.uint8).set_(storage)
        if bytes(arena[:16].tolist()) != name[1]:
            raise RuntimeError(f"{path} is not rank 0's segment")
    except (OSError, RuntimeError) as e:
        error = f"{type(e).__name__}: {e}"
    failed = torch.tensor([float(bool(error))])
    # Every rank must have mapped the segment (or given up) before rank 0 unlinks its name; after
    # the unlink the mappings stay valid and a killed rank can leave nothing behind in /dev/shm.
    dist.all_reduce(failed)
    if shm is not None:
        shm.close()
        shm.unlink()
    if failed.item():
        raise RuntimeError(
            f"wrap(comm='shm'): {int(failed.item())} rank(s) could not map rank 0's shared-memory segment "
            f"{name[0]!r}{' (' + error + ')' if error else ''}; are all ranks on one host? "
            "use comm=None (exact DDP) otherwise")
    return _ShmState(name[0], arena, slot_bytes, rank, world_size)


def _shm_hook(state, bucket):
    """A comm hook: every rank writes bucket/world_size into its slot, then sums the slots in rank order.

    The same order on every rank gives bit-identical replicas. Unannotated: DDP rejects others'
    annotations (see `_compress_hook`).
    """
    import torch
    import torch.distributed as dist

    buffer = bucket.buffer()
    nbytes = buffer.numel() * buffer.element_size()
    if nbytes > state.slot_bytes:  # same buckets on every rank, so every rank raises here: no hang
        raise RuntimeError(f"wrap(comm='shm'): a {nbytes}-byte gradient bucket exceeds the {state.slot_bytes}-byte "
                           "shared slot (parameters added after wrap()?); wrap the final model, or use comm=None")
    base = _HEADER + state.next_set * state.world_size * state.slot_bytes
    slots = [state.arena[base + r * state.slot_bytes:][:nbytes].view(buffer.dtype) for r in range(state.world_size)]
    torch.div(buffer, state.world_size, out=slots[state.rank])
    # Barrier: no rank may read the slots before every rank has written its own. Consecutive calls
    # alternate between two slot sets, and a rank reaches the next call's barrier only after
    # finishing its reads here, so a set is never overwritten while read: one barrier per bucket.
    dist.all_reduce(state.tick)
    state.next_set ^= 1
    torch.add(slots[0], slots[1], out=buffer)
    for slot in slots[2:]:
        buffer.add_(slot)
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut
