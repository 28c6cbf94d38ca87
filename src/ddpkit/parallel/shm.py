"""The opt-in shared-memory gradient exchange, `ddpkit.wrap(..., comm="shm")`, and what it stands on.

CPU ranks that all share one host average their gradients through one POSIX shared-memory segment
instead of gloo's loopback TCP. The exchange is a DDP communication hook registered through DDP's
public `register_comm_hook`, so it owns DDP's one hook slot like any hook a user registers. A rank
that waits for a peer that died, or that skipped a backward, raises instead of hanging.
"""

from __future__ import annotations

import os
import platform
import time
from typing import TYPE_CHECKING

from ddpkit.hang.tracer import traced

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["HEADER_LINE", "PIECE_BYTES", "shm_unsupported", "map_segment", "ShmBarrier", "register_shm_exchange"]

_SHM_DIR = "/dev/shm"
HEADER_LINE = 64
"""Bytes per rank in a segment's header (one cache line): barrier counter byte, then the pid."""
_TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
"""x86 keeps stores in program order, so a rank that sees a peer's flag also sees the data written before it."""
PIECE_BYTES = 1 << 19
"""Gradients cross the segment in pieces of at most this many bytes, so its size does not grow with the
model. Read when the exchange is registered."""


def shm_unsupported(ctx: Context) -> str | None:
    """Why 'shm' cannot serve these ranks (None: it can)."""
    if ctx.device.type != "cpu":
        return f"sums gradients in host shared memory, so it needs CPU ranks, but this rank runs on {ctx.device}"
    if ctx.env.local_world_size != ctx.world_size:
        return (f"needs every rank on one host, but LOCAL_WORLD_SIZE={ctx.env.local_world_size} "
                f"!= WORLD_SIZE={ctx.world_size}")
    if not os.path.isdir(_SHM_DIR):
        return f"needs POSIX shared memory at {_SHM_DIR} (Linux)"
    return None


def map_segment(payload_bytes: int, *, what: str, fix: str) -> tuple[str, torch.Tensor]:
    """Create (rank 0) and map (every rank) a shared segment; collective over the default group.

    Returns (name, arena): a uint8 tensor over the mapping, world_size header lines (rank r's
    barrier byte at 64r, its pid at 64r + 8; see `ShmBarrier`) and then `payload_bytes` of zeros
    at offset `world_size * 64`. The name is unlinked before this returns: the mapping lives as
    long as `arena`'s storage and nothing is ever left in /dev/shm. A failure is agreed on by every
    rank: they all raise (`what` failed ...; `fix`).
    """
    import secrets
    from multiprocessing import shared_memory

    import torch
    import torch.distributed as dist

    rank, world_size = dist.get_rank(), dist.get_world_size()
    nbytes = world_size * HEADER_LINE + payload_bytes
    token = secrets.token_bytes(8)
    shm, name, error = None, [None, token], ""
    if rank == 0:
        stat = os.statvfs(_SHM_DIR)
        if stat.f_bavail * stat.f_frsize < 2 * nbytes:  # a full tmpfs answers writes with SIGBUS, not an error
            error = f"{_SHM_DIR} has {stat.f_bavail * stat.f_frsize} bytes free, the segment needs {nbytes}"
        else:
            try:  # an error here must still reach the broadcast below, or the other ranks wait forever
                shm = shared_memory.SharedMemory(name=f"ddpkit-{secrets.token_hex(8)}", create=True, size=nbytes)
                shm.buf[16:24] = token  # rank 0's pid goes to bytes 8:16, its counter to byte 0
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
        if bytes(arena[16:24].tolist()) != name[1]:
            raise RuntimeError(f"{path} is not rank 0's segment")
        arena[rank * HEADER_LINE:(rank + 1) * HEADER_LINE].view(torch.int64)[1] = os.getpid()
    except (OSError, RuntimeError) as e:
        error = f"{type(e).__name__}: {e}"
    failed = torch.tensor([float(bool(error))])
    # Every rank must have mapped the segment and written its pid (or given up) before rank 0
    # unlinks the name; after the unlink the mappings stay valid and a killed rank leaves nothing.
    dist.all_reduce(failed)
    if shm is not None:
        shm.close()
        shm.unlink()
    if failed.item():
        raise RuntimeError(
            f"{what}: {int(failed.item())} rank(s) could not map rank 0's shared-memory segment "
            f"{name[0]!r}{' (' + error + ')' if error else ''}; are all ranks on one host? {fix}")
    return name[0], arena


class ShmBarrier:
    """A barrier over the W header lines of a mapped segment (see `map_segment`).

    On x86 through one flag byte per rank (a few microseconds); elsewhere a one-element gloo
    all-reduce, whose syscalls order memory. A peer that died is noticed within a second, one that
    stalls after `timeout_s`; `waiting` ("in X for rank {peer}'s Y") and `skipped` word the error.
    """

    def __init__(self, arena: torch.Tensor, rank: int, world_size: int, timeout_s: float, waiting: str,
                 skipped: str) -> None:
        import ctypes

        import torch

        header = world_size * HEADER_LINE
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.waiting, self.skipped = waiting, skipped
        self._flags = (ctypes.c_uint8 * header).from_address(arena.data_ptr())
        self._pids = arena[:header].view(torch.int64)[1::HEADER_LINE // 8].tolist()
        self._count = 0
        self._tick = torch.zeros(1)

    def wait(self) -> None:
        """Return once every rank has called wait() as often as this one."""
        if not _TSO:
            import torch.distributed as dist

            dist.all_reduce(self._tick)
            return
        self._count += 1
        k = self._count & 0xFF
        flags = self._flags
        flags[self.rank * HEADER_LINE] = k
        for s in range(self.world_size):
            # a peer is at most one barrier ahead: it waits in the next one for this rank
            if s == self.rank or (flags[s * HEADER_LINE] - k) & 0xFF <= 1:
                continue
            self._wait(s, k)

    def _wait(self, s: int, k: int) -> None:
        flags, line = self._flags, s * HEADER_LINE
        for _ in range(2000):
            if (flags[line] - k) & 0xFF <= 1:
                return
        start = time.monotonic()
        check_at = start + 1.0
        while (flags[line] - k) & 0xFF > 1:
            now = time.monotonic()
            if now < start + 0.01:
                os.sched_yield()  # several ranks per core: let the peer run
                continue
            time.sleep(0.0002)
            if now >= check_at:
                check_at = now + 1.0
                self._check_peer(s, now - start)

    def _check_peer(self, s: int, waited: float) -> None:
        where = self.waiting.format(peer=s)
        if not _alive(self._pids[s]):
            raise RuntimeError(f"rank {s} (pid {self._pids[s]}) exited while rank {self.rank} waited {where}; "
                               f"see rank {s}'s error")
        if waited > self.timeout_s:
            raise RuntimeError(f"rank {self.rank} waited {waited:.0f} s {where}; rank {s} is stuck or {self.skipped}")


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def register_shm_exchange(model: torch.nn.Module, *, timeout_s: float) -> None:
    """Average `model`'s gradients through shared memory: map the segment, register the DDP hook.

    A collective over the default group (every rank maps rank 0's segment); raises on every rank if
    any rank cannot map it. `model` is a DistributedDataParallel model with no comm hook yet; the
    hook then holds DDP's one slot (DDP refuses a second `register_comm_hook`). `timeout_s`: how
    long a rank waits in backward for a peer before raising (init's timeout_s).
    """
    import torch.distributed as dist

    world_size = dist.get_world_size()
    name, arena = map_segment((world_size + 1) * PIECE_BYTES, what="wrap(comm='shm')",
                              fix="use comm=None (PyTorch's all-reduce) otherwise")
    model.register_comm_hook(_ShmState(name, arena, dist.get_rank(), world_size, timeout_s), _shm_hook)


class _ShmState:
    """The hook's state: a mapped segment of world_size + 1 piece-sized slots and a flag line per rank.

    Layout: `world_size` header lines (rank r's barrier counter at byte 64r, its pid at 64r + 8),
    then one slot per rank (its contribution: a piece of its bucket, divided by the world size),
    then the result slot (each rank writes the sum of its share of the piece there). The mapping
    belongs to `arena`'s storage and is unmapped when the DDP model, which holds this state, is
    freed; the segment's name is unlinked at setup, so nothing is ever left in /dev/shm.
    """

    def __init__(self, name: str, arena: torch.Tensor, rank: int, world_size: int, timeout_s: float) -> None:
        self.name = name
        self.arena = arena
        self.rank = rank
        self.world_size = world_size
        header = world_size * HEADER_LINE
        self.piece_bytes = (arena.numel() - header) // (world_size + 1)
        self._slot_offsets = [header + s * self.piece_bytes for s in range(world_size + 1)]
        self._plans: dict[tuple, list[tuple]] = {}
        self.barrier = ShmBarrier(arena, rank, world_size, timeout_s, "in backward() for rank {peer}'s gradients",
                                  "skipped a backward() (every rank must run the same number of backward passes "
                                  "through the DDP model)").wait

    def plan(self, buffer: torch.Tensor) -> list[tuple]:
        """Per piece of `buffer`: (its start and stop in the flat buffer, its slot, the slots' views of
        this rank's share, the share's place in the result slot, the result for the piece).

        Cached by size and dtype, and made of views of the segment only: a view of the bucket itself
        would keep DDP's first-step buckets (a gradient-sized buffer) alive after DDP rebuilds them.
        """
        key = (buffer.numel(), buffer.dtype)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        views = [self.arena[o:o + self.piece_bytes].view(buffer.dtype) for o in self._slot_offsets]
        slots, result = views[:-1], views[-1]
        numel, per, plan = buffer.numel(), result.numel(), []
        for start in range(0, numel, per):
            m = min(per, numel - start)
            share = -(-m // self.world_size)
            lo, hi = min(self.rank * share, m), min((self.rank + 1) * share, m)
            terms = [slot[lo:hi] for slot in slots] if lo < hi else None
            plan.append((start, start + m, slots[self.rank][:m], terms, result[lo:hi], result[:m]))
        self._plans[key] = plan
        return plan


def _shm_hook(state, bucket):
    """A comm hook: average the bucket over ranks through the shared segment, piece by piece.

    For each piece: every rank writes piece/world_size into its slot; barrier; rank r sums share r
    of every slot in rank order into the result slot; barrier; every rank copies the result back
    into its bucket. The same summation order everywhere gives bit-identical replicas; on 2 ranks
    it is the same a/2 + b/2 PyTorch's all-reduce computes. Sparse or strided buckets take
    PyTorch's all-reduce. Unannotated: DDP rejects annotations other than its own on a hook.
    """
    buffer = bucket.buffer()
    if buffer.is_sparse or not buffer.is_contiguous():
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        return allreduce_hook(None, bucket)
    return _exchange(state, buffer)


def _exchange_impl(state: _ShmState, buffer: torch.Tensor):
    import torch

    world, flat = state.world_size, buffer.view(-1)
    for start, stop, mine, terms, out, result in state.plan(buffer):
        piece = flat[start:stop]
        torch.div(piece, world, out=mine)
        state.barrier()
        if terms is not None:
            torch.add(terms[0], terms[1], out=out)
            for term in terms[2:]:
                out.add_(term)
        state.barrier()
        piece.copy_(result)
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


_exchange = traced("shm_all_reduce", _exchange_impl)
"""The exchange as hang forensics and `ddpkit check` see it: a collective named shm_all_reduce."""
