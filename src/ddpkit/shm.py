"""Host shared memory for the ranks of one host: a segment every rank maps, and a barrier through it.

ddpkit.comm sends gradients through such a segment (wrap's "shm" exchange).
"""

from __future__ import annotations

import os
import platform
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["HEADER_LINE", "shm_unsupported", "map_segment", "ShmBarrier"]

_SHM_DIR = "/dev/shm"
HEADER_LINE = 64
"""Bytes per rank in a segment's header (one cache line): barrier counter byte, then the pid."""
_TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
"""x86 keeps stores in program order, so a rank that sees a peer's flag also sees the data written before it."""


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


def map_segment(payload_bytes: int, *, required: bool, what: str, fix: str) -> tuple[str, torch.Tensor] | None:
    """Create (rank 0) and map (every rank) a shared segment; collective over the default group.

    Returns (name, arena): a uint8 tensor over the mapping, world_size header lines (rank r's
    barrier byte at 64r, its pid at 64r + 8; see `ShmBarrier`) and then `payload_bytes` of zeros
    at offset `world_size * 64`. The name is unlinked before this returns: the mapping lives as
    long as `arena`'s storage and nothing is ever left in /dev/shm. A failure is agreed on by every
    rank: with `required` they all raise (`what` failed ...; `fix`), else they all return None.
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
        if not required:
            return None
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
