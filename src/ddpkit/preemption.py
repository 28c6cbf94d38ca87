"""Preemption: SIGTERM or SIGUSR1 on any rank becomes a stop that every rank agrees on at one step."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Union

if TYPE_CHECKING:
    import torch

__all__ = ["STOP_SIGNALS", "StopFlag"]

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)
"""The signals a rank turns into a stop at the next step boundary: what clusters send before the end
(SLURM's `--signal=USR1@120`, Kubernetes' and SLURM's SIGTERM at preemption or time limit)."""

_Handler = Union[Callable[[int, "FrameType | None"], Any], int, None]


class StopFlag:
    """One rank's view of a stop request: the signal it caught and the agreement of all ranks.

    The handler only records the signal; nothing stops until every rank has agreed, in `agree`,
    on the same optimizer step. Until `agree` is first called (nothing in this process checks for
    a stop yet), the handler does what the signal did before: the default action ends the process,
    so a script that never asks still stops on SIGTERM. Once armed, a repeated signal (SLURM signals
    every process of the step, and torchrun's agent forwards what it got) changes nothing, and after
    an agreed stop it stays so until the process exits (see `uninstall`); a rank that does not reach
    the next step boundary in time is killed by its launcher.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        """The signal this rank caught (None: none)."""
        self.agreed: int | None = None
        """The signal all ranks agreed to stop for (the largest number any rank caught); None: keep going."""
        self._armed = False
        self._previous: dict[int, _Handler] = {}
        self._pending: tuple[Any, Any, Any] | None = None

    def install(self) -> None:
        """Catch STOP_SIGNALS in this process (main thread only; elsewhere signals cannot be caught)."""
        if threading.current_thread() is not threading.main_thread() or self._previous:
            return
        for sig in STOP_SIGNALS:
            self._previous[int(sig)] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Put the handlers found by `install` back, unless the ranks agreed to stop.

        After an agreed stop the process is on its way out with the stop's exit code, and a
        repeated stop signal is ignored until it exits: torchrun's agent SIGTERMs every rank still
        running once the first one has exited, and a rank that is still saving or leaving would
        otherwise die by that signal, and the run would read as failed, not stopped.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                if self.agreed is not None:
                    signal.signal(sig, _stopping)
                else:
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._armed:
            if self.received is None:
                self.received = signum
            return
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            # nothing here checks for a stop: the signal's own effect
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def agree(self, *, distributed: bool, device: torch.device) -> int | None:
        """Whether to stop now: the agreed signal's number, or None. All ranks must call it, at the same
        points (it is a collective at world size > 1); `ddpkit.loader` calls it at every step end.

        Once a stop is agreed it stays agreed and no more collectives are issued. At world size > 1
        each call starts a one-element MAX all-reduce of the caught signal and reads the one started
        by the previous call, whose result has long arrived: the stop lands one step boundary after a
        rank caught the signal, on every rank at the same step, and no step waits for the network (on
        CUDA the result is copied to pinned memory behind an event, so the host never waits for the
        current step's kernels; the flag is filled on the device, not copied from the host).
        """
        self._armed = True
        if self.agreed is not None:
            return self.agreed
        if not distributed or not _group_exists():  # world size 1 (or a Context built without a group)
            self.agreed = self.received
            return self.agreed
        if self._pending is not None:
            self.agreed = _finish(self._pending) or None
            self._pending = None
            if self.agreed is not None:
                return self.agreed
        self._pending = _start(self.received or 0, device)
        return None


def _stopping(signum: int, frame: FrameType | None) -> None:
    """The handler after an agreed stop: the process is already leaving. (A Python handler, not
    SIG_IGN, so that programs this process starts get the default action back.)"""


def _group_exists() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def _start(value: int, device: torch.device) -> tuple[Any, Any, Any]:
    import torch
    import torch.distributed as dist

    # torch.full launches a fill kernel with the value as its argument; torch.tensor([value],
    # device=cuda) would copy from pageable host memory, which waits for every kernel queued before
    # it: a host sync at every step end.
    flag = torch.full((1,), value, dtype=torch.int32, device=device)
    work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True)
    if device.type != "cuda":
        return work, flag, None
    work.wait()  # on CUDA: the current stream waits for the collective's, not the host
    host = torch.empty(1, dtype=torch.int32, pin_memory=True)
    host.copy_(flag, non_blocking=True)
    event = torch.cuda.Event()
    event.record()
    return None, host, event


def _finish(pending: tuple[Any, Any, Any]) -> int:
    work, flag, event = pending
    if work is not None:
        work.wait()
    if event is not None:
        event.synchronize()
    return int(flag.item())
