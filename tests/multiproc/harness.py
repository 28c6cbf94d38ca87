"""Start real gloo ranks on CPU for one test and collect what each rank returns."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import pickle
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

__all__ = ["RankInfo", "run_ranks"]


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    init_method: str
    """A file:// rendezvous private to this test: no ports, nothing shared between tests."""
    tmp: str
    """A directory shared by the ranks of this test."""

    def init(self, **kwargs: Any):
        import ddpkit

        return ddpkit.init(init_method=self.init_method, **kwargs)


def _child(fn: Callable, info: RankInfo, args: tuple, out: str, environ: dict[str, str]) -> None:
    # forked from the fork server, whose environment is the one it started with: take the test's
    os.environ.clear()
    os.environ.update(environ)
    os.environ.update({
        "RANK": str(info.rank), "WORLD_SIZE": str(info.world_size), "LOCAL_RANK": str(info.rank),
        "LOCAL_WORLD_SIZE": str(info.world_size), "OMP_NUM_THREADS": "1",
    })
    import torch

    torch.set_num_threads(1)
    try:
        result = ("ok", fn(info, *args))
    except BaseException:  # report every failure to the parent, which asserts on it
        result = ("error", traceback.format_exc())
    # written whole, then renamed: a rank's own watchdog may end the process (os._exit) at any moment,
    # and a half-written pickle must read as "no result", never as a file the parent cannot load
    with open(out + ".tmp", "wb") as f:
        pickle.dump(result, f)
    os.replace(out + ".tmp", out)
    # Exit without interpreter teardown of torch's threads: the test asserts on the pickle.
    os._exit(0)


@functools.cache
def _context() -> Any:
    """Ranks are forked from one fork server that has imported torch (its own clean process, never
    this one: pytest's process has run torch's thread pools, which a fork would inherit broken). A
    rank then starts in a fraction of a second instead of the seconds `import torch` takes."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "harness"])
    return ctx


def run_ranks(fn: Callable, world_size: int, *args: Any, timeout: float = 120.0) -> list[Any]:
    """Run `fn(info, *args)` on `world_size` new ranks; return their results by rank.

    `fn` must be a module-level function. A rank that raises fails the test with its traceback;
    ranks still running after `timeout` seconds are killed and the test fails naming them.
    """
    ctx = _context()
    with tempfile.TemporaryDirectory(prefix="ddpkit-ranks-") as tmp:
        init_method = "file://" + str(Path(tmp) / "rendezvous")
        procs = []
        for rank in range(world_size):
            info = RankInfo(rank, world_size, init_method, tmp)
            out = str(Path(tmp) / f"result-{rank}.pkl")
            p = ctx.Process(target=_child, args=(fn, info, args, out, dict(os.environ)), daemon=True)
            p.start()
            procs.append((p, out))
        deadline = time.monotonic() + timeout
        for p, _ in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [rank for rank, (p, _) in enumerate(procs) if p.is_alive()]
        for p, _ in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        results, errors = [], []
        for rank, (p, out) in enumerate(procs):
            if not os.path.exists(out):
                errors.append(f"rank {rank}: no result (exit code {p.exitcode})")
                results.append(None)
                continue
            with open(out, "rb") as f:
                status, value = pickle.load(f)
            if status == "error":
                errors.append(f"rank {rank} raised:\n{value}")
            results.append(value)
        if alive:
            raise TimeoutError(f"ranks {alive} still running after {timeout}s (killed)\n" + "\n".join(errors))
        if errors:
            raise AssertionError("\n".join(errors))
        return results
