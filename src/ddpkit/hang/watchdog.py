"""Turn a silent hang into a report: which rank waits where, and which collective it still waits for.

A daemon thread per rank watches progress (a collective returned, an optimizer stepped, a batch
was fetched). It also keeps the collectives this rank issued that have not finished yet: the Work
handle of an `async_op=True` call, or, for a collective on CUDA tensors (NCCL returns as soon as
it has enqueued the kernel), a CUDA event recorded right after it. A rank can then block far from
the collective that will never complete - at `work.wait()`, `.item()`, `.cpu()` or a barrier - and
the report still names that collective's op, shapes and the line that issued it.

Collectives Python never issues - DDP's gradient all-reduces (its C++ reducer), FSDP2's all-gathers
and reduce-scatters - are seen through torch's flight recorder (on when `ddpkit run --hang-timeout`
or `ddpkit.init(hang_timeout_s=...)` starts the ranks): its oldest unfinished entry counts as an
unfinished collective too. On NCCL these return at once and the rank blocks later (`.item()`, the
optimizer step), where Python sees no collective at all.

When the rank has made no progress for `timeout_s` while blocked - inside a collective, inside
backward (DDP all-reduces gradients there), or with an unfinished collective at least that old -
it writes a JSON report (the oldest unfinished collective, where the main thread waits now, its
Python stack, and on NCCL the flight recorder's summary of this rank) to `report_dir`, drops a
marker there so that the other ranks of this node write theirs too, and exits the process with
HANG_EXIT_CODE, so the launcher tears the job down instead of waiting for the process-group
timeout. `collect_reports` and `summarize` turn the reports into one line per rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from ddpkit.hang import tracer
from ddpkit.hang.flightrecorder import read_oldest_unfinished

__all__ = ["Watchdog", "start_watchdog", "running_watchdog", "HANG_EXIT_CODE", "collect_reports", "summarize",
           "describe"]

HANG_EXIT_CODE = 124
"""Exit status of a rank stopped by the watchdog (the same as coreutils `timeout`)."""

_MARKER = "hang-declared"
_MAX_PENDING = 4096
"""Unfinished collectives kept per rank; past this, finished ones are dropped from the middle too."""
_BACKWARD_FILES = (os.sep + os.path.join("torch", "_tensor.py"), os.sep + os.path.join("torch", "autograd", "__init__.py"))


class Watchdog:
    """Watches this rank; see the module docstring. `start()` it once; it never issues a collective."""

    def __init__(self, *, timeout_s: float, rank: int, world_size: int, report_dir: str | None = None,
                 poll_s: float | None = None, grace_s: float = 3.0,
                 on_hang: Callable[[dict[str, Any]], None] | None = None):
        if not timeout_s > 0:
            raise ValueError(f"hang timeout {timeout_s!r} must be > 0 seconds, e.g. 300")
        self.timeout_s = float(timeout_s)
        self.rank, self.world_size = rank, world_size
        self.report_dir = None if report_dir is None else Path(report_dir)
        self.poll_s = poll_s if poll_s is not None else min(1.0, self.timeout_s / 5)
        self.grace_s = grace_s
        self.on_hang = on_hang
        """Called with the report instead of writing it and exiting (`ddpkit test` injects a hang and goes on)."""
        self.last_progress = time.monotonic()
        self.current: tracer.Call | None = None
        self.pending: deque[tuple[tracer.Call, Any]] = deque()
        """Issued, not yet finished collectives of the main thread, oldest first: (call, Work or CUDA event)."""
        self._pending_lock = threading.Lock()
        self._main = threading.main_thread()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._hooks: list[Any] = []
        self._expected_waits = 0

    # tracer.Listener
    def enter(self, call: tracer.Call) -> None:
        if threading.current_thread() is self._main:
            self.current = call
        self.beat()

    def exit(self, call: tracer.Call) -> None:
        if self.current is call:
            self.current = None
            handle = _completion_handle(call)
            if handle is not None:
                with self._pending_lock:
                    self._prune()
                    self.pending.append((call, handle))
                    if len(self.pending) > _MAX_PENDING:
                        self.pending = deque(item for item in self.pending if not _finished(item[1]))
        self.beat()

    def _prune(self) -> None:
        while self.pending and _finished(self.pending[0][1]):
            self.pending.popleft()

    def oldest_unfinished(self) -> tracer.Call | None:
        """The oldest collective this rank issued that has not finished (finished ones are forgotten)."""
        with self._pending_lock:
            self._prune()
            return self.pending[0][0] if self.pending else None

    def num_unfinished(self) -> int:
        with self._pending_lock:
            return sum(not _finished(handle) for _, handle in self.pending)

    def beat(self, *_: Any) -> None:
        """Record progress now (also usable as an optimizer hook)."""
        self.last_progress = time.monotonic()

    def start(self) -> Watchdog:
        import torch.optim.optimizer as optim

        tracer.install(self)
        self._hooks.append(optim.register_optimizer_step_post_hook(self.beat))
        if self.report_dir is not None:
            self.report_dir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="ddpkit-hang-watchdog", daemon=True)
        self._thread.start()
        return self

    def set_timeout(self, timeout_s: float) -> None:
        """Declare a hang after `timeout_s` without progress from now on (polling at least as often as it needs)."""
        if not timeout_s > 0:
            raise ValueError(f"hang timeout {timeout_s!r} must be > 0 seconds, e.g. 300")
        self.timeout_s = float(timeout_s)
        self.poll_s = min(self.poll_s, self.timeout_s / 5)

    def stop(self) -> None:
        if self in _active:
            _active.remove(self)
        self._stop.set()
        tracer.uninstall(self)
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()

    @contextlib.contextmanager
    def expected_wait(self) -> Iterator[None]:
        """A wait that is not a hang however long it lasts: the clock stops inside and restarts after.

        For a rank that waits on purpose for another's long work, e.g. the barrier after rank 0 writes
        a checkpoint (a large one takes minutes). A rank that dies meanwhile ends the job through its
        launcher; another rank that declares a hang still makes this one report.
        """
        self._expected_waits += 1
        try:
            yield
        finally:
            self._expected_waits -= 1
            self.beat()

    def blocked(self) -> str | None:
        """What the main thread waits in: a collective's name, 'backward', 'unfinished <op>', or None."""
        if self.current is not None:
            return self.current.op
        frame = sys._current_frames().get(self._main.ident)
        while frame is not None:
            if frame.f_code.co_name == "backward" and frame.f_code.co_filename.endswith(_BACKWARD_FILES):
                return "backward"
            frame = frame.f_back
        oldest = self.oldest_unfinished()
        if oldest is not None and time.monotonic() - oldest.start > self.timeout_s:
            # e.g. waiting at work.wait() or .item() for a collective a peer never joined
            return f"unfinished {oldest.op}"
        native = read_oldest_unfinished()
        if native is not None and native["waiting_s"] > self.timeout_s:
            # issued from C++ (DDP's reducer, FSDP): on NCCL the rank now waits at .item() or the step
            return f"unfinished {native['op']}"
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.poll()

    def poll(self) -> None:
        """One look, as the watchdog thread takes every `poll_s`: declare a hang if there is one."""
        if self.report_dir is not None and (self.report_dir / _MARKER).exists():
            self._fire("another rank declared a hang")
            return
        if self._expected_waits:
            self.beat()  # an expected wait (see expected_wait): the clock does not run
            return
        idle = time.monotonic() - self.last_progress
        if idle > self.timeout_s and self.blocked() is not None:
            if self.report_dir is not None:
                (self.report_dir / _MARKER).write_text(str(self.rank))
            self._fire(f"no progress for {idle:.1f} s (hang timeout {self.timeout_s:g} s)")

    def report(self, reason: str) -> dict[str, Any]:
        """This rank's report now: the collective in flight, the user's line, the main thread's stack."""
        from ddpkit.hang.flightrecorder import read_summary

        frame = sys._current_frames().get(self._main.ident)
        call = self.current
        oldest = _call_json(self.oldest_unfinished())
        if oldest is None:
            native = read_oldest_unfinished()
            if native is not None:
                oldest = {"op": native["op"], "shapes": native["shapes"], "site": None, "index": -1,
                          "waiting_s": native["waiting_s"], "from": "flight recorder"}
        user = tracer.user_frame(frame)
        return {
            "rank": self.rank, "world_size": self.world_size, "pid": os.getpid(), "reason": reason,
            "blocked_in": self.blocked(),
            "collective": _call_json(call),
            "unfinished": oldest,
            "num_unfinished": self.num_unfinished(),
            "site": tracer.format_site(user.f_code.co_filename, user.f_lineno) if user is not None else None,
            "stack": traceback.format_stack(frame) if frame is not None else [],
            "flight_recorder": read_summary(),
        }

    def _fire(self, reason: str) -> None:
        rep = self.report(reason)
        if self.on_hang is not None:
            self._stop.set()
            self.on_hang(rep)
            return
        line = describe(rep)
        if self.report_dir is not None:
            tmp = self.report_dir / f".rank-{self.rank}.json.tmp"
            tmp.write_text(json.dumps(rep, indent=1))
            os.replace(tmp, self.report_dir / f"rank-{self.rank}.json")
            if rep["reason"].startswith("no progress"):
                # Let the other ranks of this node write their reports before the launcher,
                # seeing this rank exit, terminates them.
                deadline = time.monotonic() + self.grace_s
                while time.monotonic() < deadline and len(list(self.report_dir.glob("rank-*.json"))) < self.world_size:
                    time.sleep(0.05)
        sys.stderr.write(f"ddpkit hang watchdog: {line} ({reason})\n{''.join(rep['stack'])}")
        sys.stderr.flush()
        os._exit(HANG_EXIT_CODE)


def _call_json(call: tracer.Call | None) -> dict[str, Any] | None:
    if call is None:
        return None
    return {"op": call.op, "shapes": call.shapes, "site": call.site, "index": call.index,
            "waiting_s": round(time.monotonic() - call.start, 1)}


def _completion_handle(call: tracer.Call) -> Any:
    """What tells when `call` has really finished: its Work (async_op=True), a CUDA event recorded
    after it (NCCL returns once the kernel is enqueued), or None when it finished on return (gloo)."""
    if callable(getattr(call.result, "is_completed", None)):
        return call.result
    if call.on_cuda:
        import torch

        if torch.cuda.is_current_stream_capturing():  # inside a CUDA graph: replayed later, not run now
            return None
        event = torch.cuda.Event()
        event.record()  # on the current stream, which NCCL's stream is joined to when the call returns
        return _CudaDone(event, torch.cuda.current_device())
    return None


class _CudaDone:
    """A CUDA event with the device it was recorded on. The watchdog thread queries it on that device:
    a new thread's current device is cuda:0, and a CUDA call there would make every rank create a
    context (hundreds of MB) on GPU 0."""

    __slots__ = ("event", "device")

    def __init__(self, event: Any, device: int) -> None:
        self.event, self.device = event, device

    def query(self) -> bool:
        import torch

        if threading.current_thread() is not threading.main_thread() and torch.cuda.current_device() != self.device:
            torch.cuda.set_device(self.device)  # this thread is ddpkit's own: nothing else runs on it
        return bool(self.event.query())


def _finished(handle: Any) -> bool:
    try:
        return bool(handle.is_completed() if hasattr(handle, "is_completed") else handle.query())
    except Exception:  # an aborted or failed Work: it will not complete, and it is not ours to raise
        return False


_active: list[Watchdog] = []


def start_watchdog(*, timeout_s: float, rank: int, world_size: int, report_dir: str | None = None) -> Watchdog:
    """Start this process's watchdog, or return the running one (e.g. started by `ddpkit run --hang-timeout`).

    A running watchdog takes `timeout_s` from then on (the latest request is honoured), with a
    warning when that changes its timeout; it keeps its report directory.
    """
    if not _active:
        _active.append(Watchdog(timeout_s=timeout_s, rank=rank, world_size=world_size, report_dir=report_dir).start())
        return _active[0]
    running = _active[0]
    if float(timeout_s) != running.timeout_s:
        import warnings

        warnings.warn(f"hang_timeout_s={timeout_s:g}: this process's hang watchdog (started by `ddpkit run "
                      f"--hang-timeout`, `ddpkit check` or an earlier ddpkit.init) now declares a hang after "
                      f"{timeout_s:g} s instead of {running.timeout_s:g} s", stacklevel=3)
        running.set_timeout(timeout_s)
    return running


def running_watchdog() -> Watchdog | None:
    """This process's running watchdog, if any."""
    return _active[0] if _active else None


def _op(call: dict[str, Any]) -> str:
    return call["op"] + (f" ({', '.join(call['shapes'])})" if call.get("shapes") else "")


def describe(report: dict[str, Any]) -> str:
    """One line for one rank's report, e.g. 'rank 1 waiting in all_reduce at train.py:88 for 300 s'.

    With an unfinished earlier collective: '...; oldest unfinished: all_reduce (float32[4]) issued at
    train.py:80 301 s ago'; with NCCL's flight recorder, its view of the rank is appended.
    """
    rank = report["rank"]
    call = report.get("collective")
    site = report.get("site") or "<unknown>"
    if call:
        line = f"rank {rank} waiting in {_op(call)} at {call['site']} for {call['waiting_s']:g} s"
    elif report.get("blocked_in") == "backward":
        line = f"rank {rank} waiting in backward (DDP's gradient all-reduce) at {site}"
    elif report.get("unfinished"):
        line = f"rank {rank} waiting at {site}"
    else:
        line = f"rank {rank} at {site}, not in a collective"
    oldest = report.get("unfinished")
    if oldest and oldest.get("site") is None:
        line += (f"; oldest unfinished: {_op(oldest)} issued from C++, not Python (DDP's gradient all-reduce or "
                 f"FSDP's collectives; seen by the flight recorder) {oldest['waiting_s']:g} s ago")
    elif oldest and not (call and oldest["index"] == call["index"]):
        line += f"; oldest unfinished: {_op(oldest)} issued at {oldest['site']} {oldest['waiting_s']:g} s ago"
    recorder = report.get("flight_recorder")
    if recorder and recorder.get("line"):
        line += f"; NCCL flight recorder: {recorder['line']}"
    return line


def collect_reports(report_dir: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """The reports the watchdogs wrote under `report_dir`, by rank (empty when none).

    Ranks write into `attempt-N` subdirectories (N = torchrun's restart count); the last attempt wins.
    """
    attempts = sorted(Path(report_dir).glob("attempt-*"), key=lambda p: int(p.name.split("-")[1]))
    folder = attempts[-1] if attempts else Path(report_dir)
    out = {}
    for path in sorted(folder.glob("rank-*.json")):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        out[int(report["rank"])] = report
    return out


def summarize(reports: dict[int, dict[str, Any]], world_size: int | None = None) -> list[str]:
    """One line per rank; ranks without a report are named as such (they exited or were killed)."""
    if not reports:
        return []
    world_size = world_size or max(r["world_size"] for r in reports.values())
    lines = []
    for rank in range(world_size):
        if rank in reports:
            lines.append(describe(reports[rank]))
        else:
            lines.append(f"rank {rank} wrote no report (it had exited, or runs on another node)")
    return lines
