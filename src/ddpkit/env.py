"""Read the launcher's contract (torchrun, SLURM, Kubeflow, or a plain process) into a frozen value."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LaunchEnv", "read_env", "EnvError"]


class EnvError(ValueError):
    """The launcher's environment variables are inconsistent or malformed."""


@dataclass(frozen=True, kw_only=True)
class LaunchEnv:
    """Where this process sits in the job, as its launcher described it."""

    rank: int = 0
    """Global rank of this process, 0 .. world_size-1."""
    local_rank: int = 0
    """Rank of this process on its node; selects the GPU."""
    world_size: int = 1
    """Number of processes in the job."""
    local_world_size: int = 1
    """Number of processes on this node."""
    node_rank: int = 0
    """Rank of this node (torchrun's GROUP_RANK)."""
    master_addr: str = "127.0.0.1"
    """Host of the rendezvous store."""
    master_port: int | None = None
    """Port of the rendezvous store; None when there is no store (world size 1)."""
    restart_count: int = 0
    """How many times torchrun has restarted this worker group (elastic restarts)."""
    launcher: str = "none"
    """Who set the variables: 'torchrun', 'env' (RANK/WORLD_SIZE set by hand), 'slurm' or 'none'."""

    @property
    def distributed(self) -> bool:
        """True when more than one process takes part; the one place this is decided."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(
            f"environment variable {name}={raw!r} is not an integer; "
            f"unset it or let the launcher (ddpkit run / torchrun) set it"
        ) from None


def _slurm_env(environ: Mapping[str, str]) -> LaunchEnv | None:
    """One task per process under `srun` (no torchrun inside): read SLURM's own variables."""
    if "SLURM_PROCID" not in environ or "SLURM_NTASKS" not in environ:
        return None
    if "SLURM_STEP_ID" not in environ and "SLURM_STEPID" not in environ:
        return None  # inside sbatch but not in an srun step: a single process
    world_size = _int(environ, "SLURM_NTASKS")
    if world_size is None or world_size <= 1:
        return None
    from ddpkit.cluster import ClusterError, parse_hostlist, slurm_port, tasks_per_node

    node_rank = _int(environ, "SLURM_NODEID", 0)
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if environ.get("MASTER_ADDR") is None and (nodelist is None or job_id is None):
        raise EnvError(
            "running as one srun task per rank needs MASTER_ADDR and MASTER_PORT (or SLURM_JOB_ID and "
            "SLURM_STEP_NODELIST); set them in the batch script, or run `srun --ntasks-per-node 1 ddpkit "
            "run SCRIPT` to let torchrun start the ranks"
        )
    try:
        # Every task computes the same store address: the step's first host, a port from the job id.
        master_addr = environ.get("MASTER_ADDR") or parse_hostlist(nodelist)[0]
        master_port = _int(environ, "MASTER_PORT", None) or (slurm_port(job_id) if job_id else 29500)
        local_world_size = tasks_per_node(per_node, node_rank) if per_node else _int(environ, "SLURM_NTASKS_PER_NODE", 1)
    except ClusterError as e:
        raise EnvError(str(e)) from None
    return LaunchEnv(
        rank=_int(environ, "SLURM_PROCID"),
        local_rank=_int(environ, "SLURM_LOCALID", 0),
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        launcher="slurm",
    )


def read_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """Read the launcher's variables once; pass the result down instead of reading os.environ again.

    torchrun (and Kubeflow's PyTorchJob, which sets the same names) provide RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RESTART_COUNT.
    With none of them set the process is a plain single process (world size 1).
    """
    environ = os.environ if environ is None else environ
    if "RANK" not in environ and "WORLD_SIZE" not in environ:
        slurm = _slurm_env(environ)
        return slurm if slurm is not None else LaunchEnv()

    world_size = _int(environ, "WORLD_SIZE", 1)
    rank = _int(environ, "RANK", 0)
    if world_size < 1:
        raise EnvError(f"WORLD_SIZE={world_size} must be >= 1; launch with `ddpkit run` or torchrun")
    if not 0 <= rank < world_size:
        raise EnvError(
            f"RANK={rank} is outside 0..{world_size - 1} (WORLD_SIZE={world_size}); "
            "the launcher's variables are inconsistent, relaunch with `ddpkit run` or torchrun"
        )
    local_rank = _int(environ, "LOCAL_RANK", None)
    local_world_size = _int(environ, "LOCAL_WORLD_SIZE", None)
    node_rank = _int(environ, "GROUP_RANK", None)
    if local_rank is None:
        # Kubeflow's PyTorchJob sets RANK/WORLD_SIZE per pod with one process each: the pod is the node.
        local_rank, local_world_size = 0, local_world_size or 1
        node_rank = rank if node_rank is None else node_rank
    if local_world_size is None:
        local_world_size = world_size
    if not 0 <= local_rank < local_world_size:
        raise EnvError(
            f"LOCAL_RANK={local_rank} is outside 0..{local_world_size - 1} "
            f"(LOCAL_WORLD_SIZE={local_world_size}); relaunch with `ddpkit run` or torchrun"
        )
    master_port = _int(environ, "MASTER_PORT", None)
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in environ or "GROUP_RANK" in environ else "env"
    return LaunchEnv(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank if node_rank is not None else _int(environ, "NODE_RANK", 0),
        master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
        master_port=master_port,
        restart_count=_int(environ, "TORCHELASTIC_RESTART_COUNT", 0),
        launcher=launcher,
    )
