"""Read the launcher's contract (torchrun, SLURM, Kubeflow, or a plain process) into a frozen value."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LaunchEnv", "read_env", "EnvError", "ClusterError", "parse_hostlist", "tasks_per_node", "slurm_port",
           "SLURM_PORT_BASE", "SLURM_PORT_SPAN"]


class EnvError(ValueError):
    """The launcher's environment variables are inconsistent or malformed."""


class ClusterError(EnvError):
    """A cluster variable is malformed or describes a launch `ddpkit run` cannot do."""


SLURM_PORT_BASE = 20000
"""Rendezvous ports derived from SLURM_JOB_ID lie in [SLURM_PORT_BASE, SLURM_PORT_BASE + SLURM_PORT_SPAN):
below Linux's ephemeral range (32768+), so no outgoing connection already holds the port."""
SLURM_PORT_SPAN = 10000



def parse_hostlist(hostlist: str) -> list[str]:
    """Expand SLURM's compressed host list: 'node[01-03,07],gpu5' -> node01 node02 node03 node07 gpu5.

    Several bracket groups in one name expand as a product ('r[1-2]n[1-2]' -> r1n1 r1n2 r2n1 r2n2);
    zero padding of a range is kept ('[08-10]' -> 08 09 10).
    """
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        hosts.extend(_expand(item, hostlist))
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
        if depth not in (0, 1):
            raise ClusterError(f"host list {text!r} has unbalanced brackets; expected e.g. 'node[01-03,07],gpu5'")
    if depth != 0:
        raise ClusterError(f"host list {text!r} has unbalanced brackets; expected e.g. 'node[01-03,07],gpu5'")
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def _expand(item: str, whole: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        return [item]
    prefix, rest = item[: match.start()], item[match.end():]
    tails = _expand(rest, whole)
    out = []
    for part in match.group(1).split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ClusterError(f"host list {whole!r}: range {part!r} is not N or N-M; expected e.g. 'node[01-03,07]'")
        if not sep:
            out.extend(prefix + lo + tail for tail in tails)
            continue
        if int(hi) < int(lo):
            raise ClusterError(f"host list {whole!r}: range {part!r} runs backwards; write it as {hi}-{lo}")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(prefix + str(n).zfill(width) + tail for n in range(int(lo), int(hi) + 1) for tail in tails)
    return out


def tasks_per_node(spec: str, node_id: int) -> int:
    """Tasks on node `node_id` from SLURM's '2(x3),1' form of SLURM_TASKS_PER_NODE."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise ClusterError(f"SLURM_TASKS_PER_NODE={spec!r} is not of the form '2(x3),1'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    if not 0 <= node_id < len(counts):
        raise ClusterError(f"SLURM_NODEID={node_id} is outside SLURM_TASKS_PER_NODE={spec!r}")
    return counts[node_id]


def slurm_port(job_id: str) -> int:
    """The rendezvous port every node of SLURM job `job_id` computes alike (no communication needed)."""
    digits = re.sub(r"\D", "", job_id)  # array jobs: '1234_7'
    if not digits:
        raise ClusterError(f"SLURM_JOB_ID={job_id!r} has no digits to derive a port from; pass --rdzv-endpoint")
    return SLURM_PORT_BASE + int(digits) % SLURM_PORT_SPAN



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
    gpus_bound_per_task: bool = False
    """SLURM bound GPUs to each task (`--gpus-per-task`, or `--gpu-bind` other than none: srun sets
    SLURM_GPUS_PER_TASK or SLURM_GPU_BIND): each task sees only its own GPUs, numbered from 0."""

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
        gpus_bound_per_task=bool(environ.get("SLURM_GPUS_PER_TASK")) or
        environ.get("SLURM_GPU_BIND", "none").split(",")[0].split(":")[0] not in ("none", ""),
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
