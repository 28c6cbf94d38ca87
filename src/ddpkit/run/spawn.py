"""Start ranks of a Python function from Python or a notebook, through torch's elastic launcher API."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["RankFailedError", "launch"]

# What torch's agent installs handlers for while it runs (TORCHELASTIC_SIGNALS_TO_HANDLE's default).
_AGENT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")




class RankFailedError(RuntimeError):
    """A rank ended without an exception that could be brought back (killed, crashed, unpicklable error)."""


class RemoteTraceback(Exception):
    """The traceback text of a rank's exception, chained as the cause of the one re-raised in the caller."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def launch(fn: Callable[..., Any], *args: Any, nproc_per_node: int = 1, max_restarts: int = 0,
           monitor_interval: float = 0.1, log_dir: str | os.PathLike[str] | None = None,
           redirects: str = "0", tee: str = "0", local_ranks_filter: set[int] | None = None,
           rdzv_timeout: float = 300.0) -> list[Any]:
    """Run `fn(*args)` on `nproc_per_node` ranks of this machine and return their results in rank order.

    The ranks are started the way `torchrun` starts them, by torch's own elastic agent
    (`torch.distributed.launcher.api`) in this process, with its start method (spawn): each rank is a
    fresh interpreter with RANK, WORLD_SIZE, MASTER_ADDR, ... set, so `fn` calls `ddpkit.init()` as a
    script would. Loopback only, on a free port.

    What must be picklable: `fn`, `args` and each rank's return value. With cloudpickle installed
    (it ships with many notebook stacks; `pip install cloudpickle`) functions and classes defined in
    a notebook cell or `__main__` travel by value, everything importable by reference; without it
    they must be importable (defined in a module, not a cell). Modules a cell's function uses must be
    importable in the ranks (the same environment).

    A rank that raises makes this raise the same exception type in the caller (the first rank that
    failed), chained from a RemoteTraceback holding the rank's traceback text; a rank that dies
    without one raises RankFailedError. Ctrl+C (KeyboardInterrupt) and errors stop every rank
    before this returns: no rank process is left behind.

    Options, as torchrun's flags: `max_restarts`, `monitor_interval` (seconds), `log_dir` (per-rank
    logs), `redirects`/`tee` ("0" none, "1" stdout, "2" stderr, "3" both, or "0:3,1:1" per local
    rank), `local_ranks_filter` (local ranks whose output is shown), `rdzv_timeout` (seconds).
    """
    if not callable(fn):
        raise TypeError(f"launch(fn={fn!r}): fn must be a function to run on every rank, e.g. launch(train, cfg)")
    if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"launch(nproc_per_node={nproc_per_node!r}): pass the number of ranks, an int >= 1")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"launch(max_restarts={max_restarts!r}): pass an int >= 0")
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not hasattr(main, "__file__") and not _has_cloudpickle():
        raise TypeError(f"launch(fn={getattr(fn, '__name__', fn)!r}): a function defined in a notebook cell cannot "
                        "be pickled by reference into the ranks; pip install cloudpickle, or move it into a module")
    payload = _dumps((fn, args))
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ddpkit.run import netcheck, rendezvous
    from ddpkit.run.nodes import threads_per_rank, usable_cpus

    rendezvous.register()
    logs = DefaultLogsSpecs(log_dir=None if log_dir is None else str(log_dir), redirects=Std.from_str(redirects),
                            tee=Std.from_str(tee), local_ranks_filter=local_ranks_filter)
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc_per_node, logs_specs=logs, run_id=uuid.uuid4().hex[:12],
        rdzv_backend=rendezvous.BACKEND, rdzv_endpoint="127.0.0.1:0", local_addr="127.0.0.1",
        rdzv_configs={"join_timeout": max(1, round(rdzv_timeout)), "bind_addr": "127.0.0.1", "is_host": True},
        max_restarts=max_restarts, monitor_interval=monitor_interval, start_method="spawn",
    )
    # gloo's sockets on loopback too (they otherwise bind the address the hostname resolves to)
    rank_env = netcheck.socket_env(netcheck.loopback_interface(), os.environ)
    rank_env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nproc_per_node, usable_cpus())))
    saved_handlers = {name: signal.getsignal(getattr(signal, name)) for name in _AGENT_SIGNALS}
    saved_env = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
    with tempfile.TemporaryDirectory(prefix="ddpkit-launch-") as errors:
        try:
            outputs = elastic_launch(config, _run_rank)(payload, rank_env, errors)
        except ChildFailedError as e:
            exc = _rank_exception(e, Path(errors))
            raise exc from exc.__cause__
        except SignalException as e:
            if e.sigval == signal.SIGINT:  # the agent turned Ctrl+C into its own exception
                raise KeyboardInterrupt from None
            raise
        finally:
            # the agent leaves its handlers installed (a notebook's Ctrl+C would stay torch's) and its
            # signal list in the environment
            for name, handler in saved_handlers.items():
                signal.signal(getattr(signal, name), handler if handler is not None else signal.SIG_DFL)
            if saved_env is None:
                os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
            else:
                os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = saved_env
    return [_loads(outputs[rank]) for rank in range(nproc_per_node)]


def _run_rank(payload: bytes, rank_env: dict[str, str], errors: str) -> bytes:
    """One rank (in its own process): run the function, return its pickled result or save its exception."""
    for key, value in rank_env.items():
        os.environ.setdefault(key, value)
    fn, args = _loads(payload)
    try:
        value = fn(*args)
    except BaseException as exc:
        raised_ns, text = time.time_ns(), traceback.format_exc()
        try:
            blob: bytes | None = _dumps(exc)
            _loads(_dumps(exc))  # only what the caller can rebuild
        except Exception:  # the exception's type or fields do not pickle: the caller gets its text only
            blob = None
        rank = os.environ.get("RANK", "0")
        part = Path(errors) / f"rank-{rank}.part"
        part.write_bytes(pickle.dumps((raised_ns, int(rank), text, blob)))
        part.rename(part.with_suffix(".pkl"))
        raise  # torch's elastic error handler records it too, for its own summary
    return _dumps(value)


def _rank_exception(error: Any, errors: Path) -> BaseException:
    """The exception of the rank that raised first (the others usually fail because it left), chained
    from its traceback text; a RankFailedError when no rank raised (killed, crashed)."""
    raised = [pickle.loads(path.read_bytes()) for path in errors.glob("rank-*.pkl")]
    # A rank that raises tears its process group down, and its peers then fail in their next
    # collective: those errors come second even when they were caught a little sooner.
    from ddpkit.run.netcheck import is_follow_on

    raised.sort(key=lambda r: (is_follow_on(r[2]), r[0]))
    if raised:
        _, rank, text, blob = raised[0]
        exc: BaseException | None = None
        if blob is not None:
            try:
                exc = _loads(blob)
            except Exception:
                exc = None
        if exc is None:
            exc = RankFailedError(f"rank {rank} raised an exception that cannot be brought back; its traceback:")
        exc.__cause__ = RemoteTraceback(f"\n\nrank {rank} raised:\n{text.rstrip()}")
        return exc
    rank, failure = error.get_first_failure()
    how = (f"signal {-failure.exitcode} ({failure.signal_name()})" if failure.exitcode < 0
           else f"exit code {failure.exitcode}")
    return RankFailedError(f"rank {rank} (pid {failure.pid}) ended with {how} without raising an exception "
                           "(killed, out of memory, or a crash in native code); see its output above")


def _dumps(obj: Any) -> bytes:
    try:
        import cloudpickle  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        cloudpickle = None
    try:
        if cloudpickle is not None:
            return bytes(cloudpickle.dumps(obj))
        return pickle.dumps(obj)
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        hint = "" if cloudpickle is not None else (
            "; functions defined in a notebook cell or __main__ need cloudpickle (pip install cloudpickle), "
            "or move the function into a module")
        raise TypeError(f"launch(): cannot pickle {type(obj).__name__} for the ranks ({e}){hint}") from None


def _has_cloudpickle() -> bool:
    import importlib.util

    return importlib.util.find_spec("cloudpickle") is not None


def _loads(blob: bytes) -> Any:
    return pickle.loads(blob)  # cloudpickle's output is ordinary pickle data


if sys.platform == "win32":  # pragma: no cover - torch's elastic agent is POSIX-first
    _AGENT_SIGNALS = ("SIGTERM", "SIGINT")
