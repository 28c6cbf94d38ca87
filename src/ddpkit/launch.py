"""`ddpkit run`: argv -> RunConfig -> torchrun argv (pure), then torchrun runs the ranks."""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass, field

__all__ = [
    "RunConfig",
    "LaunchError",
    "build_torchrun_argv",
    "default_nproc_per_node",
    "resolve_nproc_per_node",
    "threads_per_rank",
    "launch",
]

MAX_DEFAULT_CPU_RANKS = 4


class LaunchError(ValueError):
    """A `ddpkit run` setting that cannot work; the message names the fix."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything `ddpkit run` passes to torchrun."""

    target: str
    """The training script's path, or a module name when `module` is True."""
    target_args: tuple[str, ...] = ()
    """Arguments for the script, passed through untouched."""
    module: bool = False
    """Run `target` as `python -m target`."""
    nproc_per_node: int = 1
    """Ranks started on this node."""
    max_restarts: int = 0
    """Elastic restarts of the whole worker group after a rank fails."""
    nnodes: str = "1"
    """Node count, or MIN:MAX for elastic membership."""
    node_rank: int | None = None
    """This node's rank for a static multi-node rendezvous; None lets c10d assign it."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous for multi-node runs; None for one node (loopback, free port)."""
    rdzv_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    """Job id shared by all nodes of one run."""
    monitor_interval: float = 0.1
    """Seconds between torchrun's health checks of the ranks (how fast a crash is noticed)."""
    local_addr: str | None = None
    """Address this node advertises to the others (multi-node)."""

    @property
    def single_node(self) -> bool:
        return self.nnodes in ("1", "1:1") and self.rdzv_endpoint is None


def default_nproc_per_node(num_gpus: int | None = None, num_cpus: int | None = None) -> int:
    """Every visible GPU; on a CPU-only machine up to 4 ranks (one per core)."""
    if num_gpus is None:
        num_gpus = _visible_gpus()
    if num_gpus > 0:
        return num_gpus
    if num_cpus is None:
        num_cpus = _num_cpus()
    return max(1, min(num_cpus, MAX_DEFAULT_CPU_RANKS))


def resolve_nproc_per_node(value: str, *, num_gpus: int, num_cpus: int) -> int:
    """Parse --nproc-per-node ('auto', 'gpu', 'cpu' or a positive int) against what is visible."""
    if value == "auto":
        return default_nproc_per_node(num_gpus, num_cpus)
    if value == "gpu":
        if num_gpus == 0:
            raise LaunchError("--nproc-per-node gpu but no GPU is visible; pass --nproc-per-node auto or a number")
        return num_gpus
    if value == "cpu":
        return max(1, num_cpus)
    try:
        n = int(value)
    except ValueError:
        raise LaunchError(
            f"--nproc-per-node {value!r} is not a number; pass a positive integer, 'auto', 'gpu' or 'cpu'"
        ) from None
    if n < 1:
        raise LaunchError(f"--nproc-per-node {n} must be at least 1; pass a positive integer or 'auto'")
    if num_gpus > 0 and n > num_gpus:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise LaunchError(
            f"--nproc-per-node {n} asks for {n} GPUs but {num_gpus} are visible{shown}; "
            f"pass --nproc-per-node {num_gpus} or auto"
        )
    return n


def threads_per_rank(nproc_per_node: int, num_cpus: int) -> int:
    """Intra-op threads per rank so that the ranks together do not oversubscribe the cores."""
    return max(1, num_cpus // max(1, nproc_per_node))


def build_torchrun_argv(cfg: RunConfig) -> list[str]:
    """The arguments of `torch.distributed.run` for `cfg` (a pure function)."""
    argv = [f"--nproc-per-node={cfg.nproc_per_node}", f"--max-restarts={cfg.max_restarts}",
            f"--monitor-interval={cfg.monitor_interval}"]
    if cfg.single_node:
        # c10d on port 0: the OS picks a free port when the store binds, so two jobs on one
        # machine never collide and nothing probes a port and releases it (a race).
        argv += ["--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0",
                 f"--rdzv-id={cfg.rdzv_id}", "--local-addr=127.0.0.1"]
    else:
        if cfg.rdzv_endpoint is None:
            raise LaunchError(f"--nnodes {cfg.nnodes} needs --rdzv-endpoint HOST:PORT (the node all others reach)")
        argv += [f"--nnodes={cfg.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={cfg.rdzv_endpoint}",
                 f"--rdzv-id={cfg.rdzv_id}"]
        if cfg.node_rank is not None:
            argv.append(f"--node-rank={cfg.node_rank}")
        if cfg.local_addr is not None:
            argv.append(f"--local-addr={cfg.local_addr}")
    if cfg.module:
        argv.append("-m")
    argv.append(cfg.target)
    argv.extend(cfg.target_args)
    return argv


def launch(cfg: RunConfig) -> int:
    """Run torchrun in this process; return the exit code. A failed rank's traceback is printed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import parse_args, run

    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_rank(cfg.nproc_per_node, _num_cpus())))
    args = parse_args(build_torchrun_argv(cfg))
    try:
        run(args)
    except ChildFailedError as e:
        _print_failures(e)
        return 1
    except SignalException as e:
        print(f"ddpkit run: stopped by {e.sigval.name}; all ranks were terminated", file=sys.stderr)
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        print("ddpkit run: interrupted; all ranks were terminated", file=sys.stderr)
        return 130
    return 0


def _print_failures(e) -> None:
    """One line per failed rank; the rank's own traceback is already on stderr above it."""
    for rank, failure in sorted(e.failures.items()):
        where = f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid})"
        if failure.exitcode < 0:
            why = f"was killed by {failure.signal_name()}"
        else:
            why = f"failed with exit code {failure.exitcode}"
            data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
            message = (data.get("message") or {}).get("message") if isinstance(data.get("message"), dict) else None
            if message:
                why += f": {message.strip().splitlines()[-1]}"
        print(f"ddpkit run: {where} {why}", file=sys.stderr)


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _num_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
