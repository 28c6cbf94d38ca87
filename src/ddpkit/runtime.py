"""Set up a rank (device, process group, seeds) in one call and tear it down cleanly."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ddpkit.device import select_device
from ddpkit.env import LaunchEnv, read_env
from ddpkit.preemption import StopFlag
from ddpkit.rng import check_seed, rank_seed, seed_everything

if TYPE_CHECKING:
    import torch

__all__ = ["Context", "init", "exit_with_launcher"]

_MAX_TIMEOUT_S = 1e9
"""About 32 years: a finite bound that any timedelta and torch's millisecond timeouts hold."""


@dataclass(eq=False)
class Context:
    """What a rank knows about itself after `ddpkit.init()`; pass it to the other ddpkit calls."""

    env: LaunchEnv
    """The launcher's contract, read once."""
    device: torch.device
    """This rank's device: cuda:{local_rank} or cpu."""
    backend: str
    """Process-group backend: 'nccl' on CUDA, 'gloo' on CPU."""
    seed: int
    """The job's base seed (the data order uses it as is; generators use rank_seed(seed, rank))."""
    timeout_s: float = 600.0
    """How long a collective may wait for a peer (init's timeout_s)."""
    profile: bool = False
    """Measure where each optimizer step's time goes (ddpkit.profile); rank 0 reports at close()."""
    profile_json: str | None = None
    """Where rank 0 writes the profile as JSON at close(); None: the printed table only."""
    profiler: Any = field(default=None, repr=False)
    """This rank's ddpkit.profile.StepProfiler, once a loop helper started it; None when not profiling."""
    _at_close: list[Callable[[], Any]] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    _stop: StopFlag = field(default_factory=StopFlag, repr=False)
    _watchdog: Any = field(default=None, repr=False)
    """The hang watchdog init started (close and abort stop it); None when there is none or it was already running."""
    owns_group: bool = True
    """False when init adopted a process group its launcher created (Ray Train, Lightning, your own
    `init_process_group`): close and abort then leave that group to its creator."""

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that writes files and prints."""
        return self.env.rank == 0

    @property
    def distributed(self) -> bool:
        """True when a process group exists (world size > 1); collectives are trivial otherwise."""
        return self.env.distributed

    def should_stop(self) -> bool:
        """True once any rank has caught SIGTERM or SIGUSR1 (a preemption notice): stop at this step.

        Every rank must call it at the same points (a collective at world size > 1); `ddpkit.loader`
        calls it at every optimizer step's end and ends its loop early when it is True, so a loop over
        a loader only needs `if ctx.should_stop(): save a checkpoint, then exit`. Every rank gets True
        at the same step; after that it stays True and issues no collective. See ddpkit.preemption.
        """
        return self._stop.agree(distributed=self.distributed, device=self.device) is not None

    @property
    def stop_signal(self) -> int | None:
        """The signal number the ranks agreed to stop for (15 SIGTERM, 10 SIGUSR1), or None."""
        return self._stop.agreed

    def close(self) -> None:
        """Tear down the process group; every rank must call it (it synchronises). Idempotent.

        An adopted group (`owns_group` False) is left as it is, for the launcher that created it.
        """
        if self._closed:
            return
        self._closed = True
        try:
            for fn in self._at_close:
                fn()
        finally:
            self._stop.uninstall()
            self._stop_watchdog()
            if self.owns_group:
                _teardown(barrier_key=f"ddpkit/close/{self.env.restart_count}")

    def at_close(self, fn: Callable[[], Any]) -> None:
        """Call `fn()` when `close()` begins, while the process group still exists (not on `abort()`).
        A collective there must be registered on every rank, as close() itself is called on every rank."""
        self._at_close.append(fn)

    def abort(self, exc: BaseException | None = None) -> None:
        """Leave after an error without waiting for other ranks (they may be dead or stuck).

        The process group is aborted, not destroyed: `destroy_process_group` waits for collectives
        still in flight (under NCCL since torch 2.6), which on this path may never finish.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.uninstall()
        if exc is not None:
            _record_error(exc)
        self._stop_watchdog()
        if self.owns_group:  # an adopted group's creator decides its end (Ray Train restarts its workers)
            _abort_group()

    def _stop_watchdog(self) -> None:
        """Stop the watchdog init started; the last listener out restores torch.distributed's functions."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def __enter__(self) -> Context:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
        else:
            self.abort(exc)


def init(
    *,
    seed: int = 0,
    device: str = "auto",
    timeout_s: float = 600.0,
    init_method: str | None = None,
    env: LaunchEnv | None = None,
    hang_timeout_s: float | None = None,
    profile: bool = False,
    profile_json: str | os.PathLike[str] | None = None,
) -> Context:
    """Set up this rank: device, process group, per-rank seeds. Use as `with ddpkit.init() as ctx:`.

    Under `ddpkit run` / torchrun every rank calls it; under plain `python script.py` it sets up
    world size 1 (no process group, trivial collectives) and the same code runs unchanged.

    When a default process group already exists (Ray Train's TorchTrainer, Lightning, a custom
    launcher or a notebook created it), init adopts it: rank and world size are the group's (a
    launcher variable that disagrees, e.g. RANK, is a one-line ValueError naming both), local rank
    and node from the launcher's variables (without any: one machine, local rank = rank), the
    backend is the group's, and `device='auto'` follows it (cuda with nccl, cpu with gloo).
    `close()` and `abort()` then leave the group to its creator; init_method is refused (the group
    exists), and the flight recorder (set when a group is created) does not apply. See
    docs/multi-node.md.

    Args:
        seed: base seed; rank r seeds python/numpy/torch with `rank_seed(seed, r)`.
        device: 'auto' (cuda:{local_rank} when GPUs are visible, else cpu), 'cuda' or 'cpu'.
        timeout_s: how long a collective may wait for a peer before the job fails (instead of hanging).
        init_method: rendezvous URL (e.g. 'file:///shared/store'); default reads MASTER_ADDR/PORT.
        env: the launcher's contract; default `read_env()` of this process.
        hang_timeout_s: start a hang watchdog: a rank blocked this long in a collective (or in
            DDP's backward) without progress prints its stack and the collective's call site, and
            exits (see ddpkit.hang.watchdog). It wraps torch.distributed's collectives process-wide
            until `close()`; None (the default) leaves torch.distributed untouched. If a watchdog
            already runs in this process (`ddpkit run --hang-timeout`, `ddpkit check`), it takes
            this timeout from now on, with a warning when that changes it.
        profile: measure, on every rank, where each optimizer step of ddpkit's loop helpers goes
            (data, compute, exposed communication, optimizer, other); at `close()` rank 0 prints one
            table, the straggler and suggestions (see ddpkit.profile; `ddpkit run --profile` does the same).
        profile_json: also write that report as JSON to this path (implies profile=True).

    Every argument is checked before anything else happens: a bad value raises a one-line
    TypeError/ValueError, and no process group exists.
    """
    seed = _check_init_args(seed=seed, device=device, timeout_s=timeout_s, init_method=init_method, env=env,
                            hang_timeout_s=hang_timeout_s)
    profile_json = _check_profile_args(profile, profile_json)
    env = read_env() if env is None else env
    group = _existing_group()
    if group is not None:
        if init_method is not None:
            raise ValueError(f"ddpkit.init: init_method={init_method!r} but a default process group already exists "
                             f"(rank {group[0]} of {group[1]}, {group[2]}); drop init_method to adopt that group, or "
                             "call ddpkit.init before anything else creates one")
        env = _adopted_env(env, *group[:2])
    if env.launcher == "torchrun":
        exit_with_launcher()
    if group is not None:
        dev, backend = _adopted_device(env, device=device, backend=group[2])
    else:
        dev, backend = select_device(env, device=device)
    if env.distributed and group is None:
        import torch.distributed as dist

        if init_method is None:
            if env.master_port is None:
                raise ValueError(
                    f"WORLD_SIZE={env.world_size} but MASTER_ADDR/MASTER_PORT are not set; launch with "
                    "`ddpkit run` or torchrun, which set them, or pass init_method= to ddpkit.init"
                )
            init_method = "env://"
        kwargs: dict[str, Any] = {"device_id": dev} if dev.type == "cuda" else {}
        if hang_timeout_s is not None:
            from ddpkit.hang.flightrecorder import enable

            enable()  # torch reads the recorder's switches when the group is created (NCCL's and gloo's)
        dist.init_process_group(
            backend,
            init_method=init_method,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
    watchdog = None
    if hang_timeout_s is not None and env.distributed:
        from ddpkit.hang.watchdog import running_watchdog, start_watchdog

        started_here = running_watchdog() is None
        watchdog = start_watchdog(timeout_s=hang_timeout_s, rank=env.rank, world_size=env.world_size)
        watchdog = watchdog if started_here else None
    seed_everything(rank_seed(seed, env.rank))
    ctx = Context(env=env, device=dev, backend=backend, seed=seed, timeout_s=timeout_s, _watchdog=watchdog,
                  owns_group=group is None,
                  profile=profile or profile_json is not None, profile_json=profile_json)
    ctx._stop.install()
    if env.distributed and group is None:
        _abort_on_uncaught(ctx)
    return ctx


def _check_init_args(*, seed: Any, device: Any, timeout_s: Any, init_method: Any, env: Any,
                     hang_timeout_s: Any) -> int:
    """init()'s arguments checked (the seed returned as an int), before any process group or device exists."""
    checked = check_seed(seed, "ddpkit.init")
    if not isinstance(device, str):
        raise TypeError(f"ddpkit.init: device={device!r} must be 'auto', 'cuda' or 'cpu'")
    for name, value, example in (("timeout_s", timeout_s, 600), ("hang_timeout_s", hang_timeout_s, 300)):
        if value is None and name == "hang_timeout_s":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"ddpkit.init: {name}={value!r} must be a number of seconds, e.g. {name}={example}")
        if not (value > 0 and math.isfinite(value) and value <= _MAX_TIMEOUT_S):
            off = " (or None: no watchdog)" if name == "hang_timeout_s" else ""
            raise ValueError(f"ddpkit.init: {name}={value} must be a number of seconds > 0 and at most "
                             f"{_MAX_TIMEOUT_S:.0e}{off}, e.g. {name}={example}")
    if init_method is not None and not isinstance(init_method, str):
        raise TypeError(f"ddpkit.init: init_method={init_method!r} must be a rendezvous URL string such as "
                        "'file:///shared/store' or 'tcp://host:port', or None to read MASTER_ADDR/MASTER_PORT")
    if env is not None and not isinstance(env, LaunchEnv):
        raise TypeError(f"ddpkit.init: env={type(env).__name__} must be a ddpkit.LaunchEnv (from ddpkit.read_env()) "
                        "or None to read this process's environment")
    return checked


def _check_profile_args(profile: Any, profile_json: Any) -> str | None:
    """init()'s profile settings checked; the JSON path returned as an absolute str (or None)."""
    if not isinstance(profile, bool):
        raise TypeError(f"ddpkit.init: profile={profile!r} must be True or False")
    if profile_json is None:
        return None
    if not isinstance(profile_json, (str, os.PathLike)):
        raise TypeError(f"ddpkit.init: profile_json={profile_json!r} must be a file path (str) or None")
    path = os.path.abspath(os.fspath(profile_json))
    if not os.path.isdir(os.path.dirname(path)):
        raise ValueError(f"ddpkit.init: profile_json={os.fspath(profile_json)!r} is in a directory that does not "
                         f"exist ({os.path.dirname(path)}); create it first or pass another path")
    return path


def _abort_on_uncaught(ctx: Context) -> None:
    """Without `with ddpkit.init()`, an exception that ends the script still reaches the launcher's
    summary and tears the process group down (left to interpreter exit, gloo's threads can abort
    the process with "terminate called without an active exception", hiding the cause)."""
    import sys

    previous = sys.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        previous(exc_type, exc, tb)  # the traceback first, as always
        if not ctx._closed and isinstance(exc, Exception):
            ctx.abort(exc)

    sys.excepthook = excepthook


def exit_with_launcher() -> None:
    """Die when this rank's launcher dies (Linux): a SIGKILLed `ddpkit run` leaves no orphan ranks.

    torchrun starts each rank in its own session, so nothing else reaches them when the launcher is
    killed; the surviving nodes then see this node's ranks vanish and fail fast instead of training on.
    """
    import sys

    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no prctl (unusual libc): keep running without the lifeline
        return
    if os.getppid() != parent:  # the launcher died before the lifeline was set
        os.kill(os.getpid(), signal.SIGKILL)


def _teardown(*, barrier_key: str | None) -> None:
    """Destroy the process group; with a store key, first wait for every rank (a clean close)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    if barrier_key is not None:
        # Nobody may free its sockets while a peer still waits on them: a rank that destroys the
        # group while another is inside its last collective leaves that peer hung or aborting.
        # The gloo barrier drains the data channel; the store barrier then proves every rank has
        # returned from it before any rank destroys anything.
        dist.barrier()
        _store_barrier(dist, barrier_key)
    dist.destroy_process_group()


def _abort_group() -> None:
    """Drop the process group without waiting for its in-flight work (destroy only where torch cannot abort)."""
    import torch.distributed as dist

    from ddpkit.torchinternals import abort_process_group

    if not (dist.is_available() and dist.is_initialized()):
        return
    if not abort_process_group():
        dist.destroy_process_group()


def _store_barrier(dist: Any, key: str) -> None:
    """Wait until every rank has reached `key`, through the rendezvous store (no gloo traffic)."""
    from ddpkit.torchinternals import default_store

    store = default_store()  # type: ignore[no-untyped-call, unused-ignore]
    if store is None:
        return  # the gloo barrier above is then the only synchronisation
    world_size = dist.get_world_size()
    if store.add(key, 1) == world_size:
        store.set(key + "/done", "1")
    store.wait([key + "/done"])


def _record_error(exc: BaseException) -> None:
    """Write the traceback where torchrun looks for it, so its failure summary shows the cause.

    The file appears whole or not at all: torch's writer truncates it first, and the agent SIGTERMs
    this rank as soon as another rank has died, so a rank killed mid-write (its SIGTERM handler is
    back to the default by then) left an empty file, on which torch's agent crashed with a
    JSONDecodeError instead of restarting the job. Torch writes a temporary file here (its own
    format), which is then renamed into place.
    """
    target = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not target:
        return
    partial = f"{target}.{os.getpid()}.partial"
    try:
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        os.environ["TORCHELASTIC_ERROR_FILE"] = partial
        try:
            ErrorHandler().record_exception(exc)
        finally:
            os.environ["TORCHELASTIC_ERROR_FILE"] = target
        os.replace(partial, target)
    except Exception:  # reporting must never mask the user's own exception
        with contextlib.suppress(OSError):
            os.remove(partial)


def _existing_group() -> tuple[int, int, str] | None:
    """(rank, world size, backend) of a default process group someone else created, or None."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist.get_rank(), dist.get_world_size(), str(dist.get_backend())


def _adopted_env(env: LaunchEnv, rank: int, world_size: int) -> LaunchEnv:
    """The launcher's variables checked against the group it created; without any, one machine."""
    import dataclasses

    if env.launcher == "none" and env.world_size == 1:  # nothing describes the job but the group
        return dataclasses.replace(env, rank=rank, world_size=world_size, local_rank=rank,
                                   local_world_size=world_size)
    if (env.rank, env.world_size) != (rank, world_size):
        names = ("SLURM_PROCID", "SLURM_NTASKS") if env.launcher == "slurm" else ("RANK", "WORLD_SIZE")
        raise ValueError(
            f"ddpkit.init: the existing process group has rank {rank} of world size {world_size} but the "
            f"environment says {names[0]}={env.rank} {names[1]}={env.world_size}; the launcher that created "
            f"the group and these variables disagree: unset them, or pass env=ddpkit.env.LaunchEnv(rank={rank}, "
            f"world_size={world_size}, ...)"
        )
    return env


def _adopted_device(env: LaunchEnv, *, device: str, backend: str) -> tuple[torch.device, str]:
    """An adopted group's rank device: 'auto' follows the group's backend; a device the launcher
    made current (one GPU visible per worker, as Ray Train gives) is kept."""
    import torch

    import torch.distributed as dist

    # the group's backends ("gloo", or "cpu:gloo,cuda:nccl") and the devices each serves, as torch lists them
    names = [part.rpartition(":")[2] for part in backend.split(",")]
    serves = [set(dist.Backend.backend_capability.get(name, ())) for name in names]
    cuda_group = any(devices == {"cuda"} for devices in serves)  # a GPU-only backend: the job runs on GPUs
    if device == "auto":
        device = "cuda" if cuda_group and torch.cuda.is_available() else "cpu"
    if device == "cpu" and not any("cpu" in devices for devices in serves):
        raise ValueError(f"ddpkit.init: device='cpu' but the existing process group's backend is {backend}, "
                         "which has no CPU path; pass device='cuda' (or 'auto'), or create the group with gloo")
    if device == "cuda" and torch.cuda.is_available() and env.local_rank >= torch.cuda.device_count():
        return torch.device("cuda", torch.cuda.current_device()), backend
    return select_device(env, device=device)[0], backend
