"""`ddpkit run`'s node settings: ranks this node can hold (cores, GPUs, memory), and the node flags, else a cluster's environment (SLURM, SkyPilot, Kubeflow TrainJob/PyTorchJob), validated."""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from ddpkit.env import SLURM_PORT_BASE, SLURM_PORT_SPAN, ClusterError, parse_hostlist, slurm_port, tasks_per_node

__all__ = ["MAX_DEFAULT_CPU_RANKS", "default_nproc_per_node", "usable_cpus", "visible_gpus", "available_memory", "cpu_rank_limit", "threads_per_rank",
           "ClusterLaunch", "Nodes", "detect_cluster", "is_single_node", "from_kubeflow", "from_skypilot", "from_slurm", "resolve_nodes", "skypilot_port"]
"""SLURM's host lists, task counts and port rule are read on the rank side too, so they live in ddpkit.env."""


@dataclass(frozen=True, kw_only=True)
class ClusterLaunch:
    """What a cluster's environment says about this launcher's place in a multi-node job."""

    source: str
    """'slurm', 'skypilot' or 'kubeflow': where the values came from (shown in messages)."""
    nnodes: str
    """Node count, or MIN:MAX (Kubeflow's elastic PET_NNODES)."""
    node_rank: int
    """This node's rank, 0 .. nnodes-1."""
    rdzv_endpoint: str | None
    """HOST:PORT of the c10d rendezvous; None when the job has one node (loopback then)."""
    rdzv_id: str | None
    """Job id shared by every node (SLURM_JOB_ID); None lets the nodes agree on the endpoint alone."""
    nproc_per_node: str | None = None
    """Ranks per node as the cluster states it (GPUs on the node, PET_NPROC_PER_NODE), or None."""


def _get(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value not in (None, ""):
            return value
    return None


def _as_int(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ClusterError(f"{name}={value!r} is not an integer; the cluster's variables are malformed") from None


def from_slurm(environ: Mapping[str, str]) -> ClusterLaunch | None:
    """`srun ddpkit run SCRIPT` with one launcher task per node: nodes, node rank and endpoint from SLURM.

    Returns None outside an srun step (e.g. in the batch script itself). The endpoint is the step's
    first host at a port derived from SLURM_JOB_ID (`slurm_port`), or MASTER_ADDR/MASTER_PORT when set.
    """
    job_id = _get(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    if job_id is None or _get(environ, "SLURM_STEP_ID", "SLURM_STEPID") is None:
        return None
    raw_nodes = _get(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    nnodes = _as_int(raw_nodes, "SLURM_NNODES") if raw_nodes else 1
    node_rank = _as_int(_get(environ, "SLURM_NODEID") or "0", "SLURM_NODEID")
    ntasks = _get(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if ntasks is not None and _as_int(ntasks, "SLURM_NTASKS") > nnodes:
        raise ClusterError(
            f"srun started SLURM_NTASKS={ntasks} tasks on {nnodes} node(s), but `ddpkit run` starts the "
            f"ranks itself and needs one task per node; run `srun --ntasks-per-node=1 ddpkit run SCRIPT`"
        )
    gpus = _get(environ, "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE")
    nproc = gpus.rsplit(":", 1)[-1] if gpus else None  # SLURM_GPUS_PER_NODE may read 'a100:4'
    if nproc is not None and (not nproc.isdigit() or int(nproc) == 0):
        nproc = None
    if nnodes == 1:
        return ClusterLaunch(source="slurm", nnodes="1", node_rank=0, rdzv_endpoint=None, rdzv_id=job_id,
                             nproc_per_node=nproc)
    nodelist = _get(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    host = _get(environ, "MASTER_ADDR")
    if host is None:
        if nodelist is None:
            raise ClusterError("SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are unset; pass --rdzv-endpoint HOST:PORT")
        host = parse_hostlist(nodelist)[0]
    port = _get(environ, "MASTER_PORT") or str(slurm_port(job_id))
    return ClusterLaunch(source="slurm", nnodes=str(nnodes), node_rank=node_rank,
                         rdzv_endpoint=f"{host}:{port}", rdzv_id=job_id, nproc_per_node=nproc)


def skypilot_port(task_id: str) -> int:
    """The rendezvous port every node of SkyPilot task `task_id` computes alike (no communication needed),
    in the range SLURM's ports use: below Linux's ephemeral ports."""
    return SLURM_PORT_BASE + zlib.crc32(task_id.encode()) % SLURM_PORT_SPAN


def from_skypilot(environ: Mapping[str, str]) -> ClusterLaunch | None:
    """`ddpkit run SCRIPT` as a SkyPilot task's `run:` command: nodes, node rank and endpoint from SkyPilot.

    SkyPilot runs the command once per node with SKYPILOT_NUM_NODES, SKYPILOT_NODE_RANK,
    SKYPILOT_NODE_IPS (one address a line, the head first) and SKYPILOT_NUM_GPUS_PER_NODE. The endpoint
    is the head's address at MASTER_PORT when set, else at a port derived from SKYPILOT_TASK_ID
    (`skypilot_port`), which every node of the task shares.
    """
    if _get(environ, "SKYPILOT_NODE_RANK") is None or _get(environ, "TORCHELASTIC_RUN_ID", "LOCAL_RANK") is not None:
        return None
    nnodes = _as_int(_get(environ, "SKYPILOT_NUM_NODES") or "1", "SKYPILOT_NUM_NODES")
    node_rank = _as_int(_get(environ, "SKYPILOT_NODE_RANK") or "0", "SKYPILOT_NODE_RANK")
    gpus = _get(environ, "SKYPILOT_NUM_GPUS_PER_NODE")
    nproc = gpus if gpus is not None and gpus.isdigit() and int(gpus) > 0 else None  # '0' on CPU nodes: auto
    task_id = _get(environ, "SKYPILOT_TASK_ID")
    if nnodes == 1:
        return ClusterLaunch(source="skypilot", nnodes="1", node_rank=0, rdzv_endpoint=None, rdzv_id=None,
                             nproc_per_node=nproc)
    ips = (_get(environ, "SKYPILOT_NODE_IPS") or "").split()
    if len(ips) != nnodes:
        raise ClusterError(f"SKYPILOT_NODE_IPS lists {len(ips)} address(es) but SKYPILOT_NUM_NODES={nnodes}; "
                           "run `ddpkit run` as the task's run command, where SkyPilot sets both")
    port = _get(environ, "MASTER_PORT")
    if port is None and task_id is None:
        raise ClusterError("SKYPILOT_TASK_ID is unset, so the nodes cannot derive a shared port; set MASTER_PORT "
                           "in the task's envs (e.g. MASTER_PORT: 29400) or pass --rdzv-endpoint HOST:PORT")
    return ClusterLaunch(source="skypilot", nnodes=str(nnodes), node_rank=node_rank,
                         rdzv_endpoint=f"{ips[0]}:{port or skypilot_port(task_id or '')}", rdzv_id=task_id,
                         nproc_per_node=nproc)


def from_kubeflow(environ: Mapping[str, str]) -> ClusterLaunch | None:
    """`ddpkit run SCRIPT` as the command of a Kubeflow TrainJob (Trainer v2) or PyTorchJob pod: nodes,
    node rank and endpoint from Kubeflow.

    Trainer v2's torch runtime and the training operator's torchrun-style policy set PET_NNODES,
    PET_NPROC_PER_NODE (a number or 'auto': every GPU, else CPU ranks as `--nproc-per-node auto`),
    PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT; the operator's plain policy sets WORLD_SIZE
    (= pods), RANK (= this pod) and MASTER_ADDR/MASTER_PORT. The PET_ values win where both are present.
    """
    if _get(environ, "TORCHELASTIC_RUN_ID", "LOCAL_RANK") is not None:
        return None  # a rank already started by torchrun, not a launcher
    if _get(environ, "PET_NNODES") is None and _get(environ, "KUBERNETES_SERVICE_HOST") is None:
        return None  # WORLD_SIZE/MASTER_ADDR in a shell outside a pod are not a PyTorchJob
    nnodes = _get(environ, "PET_NNODES", "WORLD_SIZE")
    addr = _get(environ, "PET_MASTER_ADDR", "MASTER_ADDR")
    if nnodes is None or addr is None:
        return None
    port = _get(environ, "PET_MASTER_PORT", "MASTER_PORT")
    if port is None:
        raise ClusterError(f"MASTER_ADDR={addr} is set but MASTER_PORT is not; set it in the PyTorchJob spec")
    node_rank = _as_int(_get(environ, "PET_NODE_RANK", "RANK") or "0", "PET_NODE_RANK")
    single = nnodes in ("1", "1:1")
    return ClusterLaunch(source="kubeflow", nnodes=nnodes, node_rank=node_rank,
                         rdzv_endpoint=None if single else f"{addr}:{port}", rdzv_id=None,
                         nproc_per_node=_get(environ, "PET_NPROC_PER_NODE"))


def detect_cluster(environ: Mapping[str, str]) -> ClusterLaunch | None:
    """The cluster this launcher runs in, SLURM first, then SkyPilot, then Kubeflow; None on a plain machine."""
    return from_slurm(environ) or from_skypilot(environ) or from_kubeflow(environ)


@dataclass(frozen=True, kw_only=True)
class Nodes:
    """The node settings of one run, from flags and the cluster's environment (`resolve_nodes`)."""

    nnodes: str
    """Node count, or MIN:MAX."""
    node_rank: int | None
    """This node's --node-rank; None on one node, or when the rendezvous orders the nodes."""
    rdzv_endpoint: str | None
    """HOST:PORT of the rendezvous; None on one node."""
    rdzv_id: str | None
    """Job id shared by all nodes; None on one node without --rdzv-id (each run then draws its own)."""
    nproc_per_node: str
    """--nproc-per-node as given ('auto', 'gpu', 'cpu' or a number), resolved later against the devices."""

    @property
    def single_node(self) -> bool:
        return is_single_node(self.nnodes, self.rdzv_endpoint)


def is_single_node(nnodes: str, rdzv_endpoint: str | None) -> bool:
    """Whether a run with these settings is one node on loopback (no rendezvous endpoint of its own)."""
    return nnodes in ("1", "1:1") and rdzv_endpoint is None


def resolve_nodes(*, nnodes: str | None, node_rank: int | None, rdzv_endpoint: str | None,
                  rdzv_id: str | None, nproc_per_node: str | None, environ: Mapping[str, str]) -> Nodes:
    """Node settings: the explicit flags, else the cluster's environment, validated (raises ClusterError
    naming the flag and the fix). A pure function of its arguments."""
    from ddpkit.run.netcheck import NetworkError, split_endpoint

    found = detect_cluster(environ)
    if found is not None:
        nnodes = nnodes if nnodes is not None else found.nnodes
        node_rank = node_rank if node_rank is not None else (found.node_rank if found.rdzv_endpoint else None)
        rdzv_endpoint = rdzv_endpoint or found.rdzv_endpoint
        rdzv_id = rdzv_id or (found.rdzv_id if rdzv_endpoint else None)
        nproc_per_node = nproc_per_node or found.nproc_per_node
    nnodes = nnodes or "1"
    low, _, high = nnodes.partition(":")
    high = high or low
    if not (low.isdigit() and high.isdigit() and 1 <= int(low) <= int(high)) or nnodes.count(":") > 1:
        raise ClusterError(f"--nnodes {nnodes!r} is not N or MIN:MAX with 1 <= MIN <= MAX; pass e.g. 2, or 2:4 "
                           "for elastic membership")
    if node_rank is not None and not 0 <= node_rank < int(high):
        raise ClusterError(f"--node-rank {node_rank} with --nnodes {nnodes}: node ranks are 0..{int(high) - 1}; "
                           f"pass --node-rank 0 on the rendezvous node and 1..{int(high) - 1} on the others")
    nproc_per_node = nproc_per_node or "auto"
    if is_single_node(nnodes, rdzv_endpoint):
        return Nodes(nnodes=nnodes, node_rank=None, rdzv_endpoint=None, rdzv_id=rdzv_id,
                     nproc_per_node=nproc_per_node)
    if rdzv_endpoint is None:
        raise ClusterError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, the address of node 0 that every "
                           "node can reach, e.g. --rdzv-endpoint node0:29400")
    try:
        host, port = split_endpoint(rdzv_endpoint)
    except NetworkError as e:
        raise ClusterError(str(e)) from None
    if port == 0:
        raise ClusterError(f"--rdzv-endpoint {rdzv_endpoint}: port 0 cannot be shared by several nodes; "
                           f"pass a fixed free port, e.g. {host}:29400")
    # Every node must name the same rendezvous: derive the id from the endpoint, never a per-node uuid.
    return Nodes(nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint,
                 rdzv_id=rdzv_id or f"ddpkit-{host}-{port}", nproc_per_node=nproc_per_node)


MAX_DEFAULT_CPU_RANKS = 4
"""`--nproc-per-node auto` on a machine without GPUs: one rank per core, at most this many."""

CPU_RANKS_PER_CORE = 2
"""CPU ranks refused past this many per core (and never below 4 in all): beyond it each rank gets a
sliver of a core, every collective waits for the slowest, and a typo (--nproc-per-node 99) would
start a process per number."""

RANK_MEMORY_BYTES = 512 * 2**20
"""The least memory a CPU rank needs (the torch import and gloo alone take about this much)."""


def visible_gpus() -> int:
    """GPUs this process can see (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask), which a container or `taskset` can narrow."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def available_memory() -> int | None:
    """Memory this machine has available now (bytes), or None where /proc/meminfo cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cpu_rank_limit(num_cpus: int, memory_bytes: int | None = None) -> tuple[int, str]:
    """(the most CPU ranks started without --oversubscribe, the reason in words naming the number behind it)."""
    by_cores = max(4, CPU_RANKS_PER_CORE * max(1, num_cpus))
    why = f"this machine has {num_cpus} usable core{'s' if num_cpus != 1 else ''} (at most {by_cores} CPU ranks)"
    if memory_bytes is not None:
        by_memory = max(1, memory_bytes // RANK_MEMORY_BYTES)
        if by_memory < by_cores:
            return by_memory, (f"this machine has {memory_bytes / 2**30:.1f} GiB of memory available "
                               f"(at most {by_memory} CPU ranks of {RANK_MEMORY_BYTES // 2**20} MiB)")
    return by_cores, why


def threads_per_rank(nproc_per_node: int, num_cpus: int) -> int:
    """Intra-op threads per rank so that the ranks together do not oversubscribe the cores."""
    return max(1, num_cpus // max(1, nproc_per_node))


def default_nproc_per_node(num_gpus: int | None = None, num_cpus: int | None = None) -> int:
    """Every visible GPU; on a CPU-only machine up to 4 ranks (one per core)."""
    if num_gpus is None:
        num_gpus = visible_gpus()
    if num_gpus > 0:
        return num_gpus
    if num_cpus is None:
        num_cpus = usable_cpus()
    return max(1, min(num_cpus, MAX_DEFAULT_CPU_RANKS))
