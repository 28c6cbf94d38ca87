"""`ddpkit run`: argv -> RunConfig -> torchrun argv (pure), then torchrun runs the ranks."""

from __future__ import annotations

import math
import os
import sys
import uuid
from dataclasses import dataclass, field, replace

__all__ = [
    "RunConfig",
    "LaunchError",
    "build_torchrun_argv",
    "default_nproc_per_node",
    "resolve_nodes",
    "resolve_nproc_per_node",
    "threads_per_rank",
    "last_call_timeout",
    "check_target",
    "check_torchrun_flags",
    "torchrun_flags",
    "DEFAULT_SIGNALS_TO_HANDLE",
    "launch",
]

MAX_DEFAULT_CPU_RANKS = 4
DEAD_NODE_S = 15
"""How long torch's c10d rendezvous takes to drop a node that stopped: 3 missed keep-alives 5 s apart."""


DEFAULT_SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""What `ddpkit run`'s torchrun catches and forwards to the ranks: torchrun's own list plus SIGUSR1,
the signal SLURM's `--signal=USR1@120` sends ahead of a time limit (see ddpkit.preemption)."""

PASSTHROUGH_FLAGS = ("--log-dir", "--tee", "--redirects", "--local-ranks-filter", "--signals-to-handle",
                     "--shutdown-timeout", "--numa-binding")
"""torchrun's flags that `ddpkit run` takes and hands on unchanged (those torch has: `torchrun_flags`)."""


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
    """This node's rank among the nodes: node 0 holds global ranks 0..nproc_per_node-1 (nodes are ordered by
    it in the rendezvous); None lets the rendezvous order the node (by address, then process id)."""
    rdzv_endpoint: str | None = None
    """HOST:PORT of the c10d rendezvous for multi-node runs; None for one node (loopback, free port)."""
    rdzv_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    """Job id shared by all nodes of one run."""
    monitor_interval: float = 0.1
    """Seconds between torchrun's health checks of the ranks (how fast a crash is noticed)."""
    local_addr: str | None = None
    """Address this node advertises to the others (multi-node)."""
    iface: str | None = None
    """Network interface for the ranks' collectives (multi-node); None: the one that routes to the endpoint."""
    rdzv_timeout: float = 300.0
    """Seconds a node waits for the others to join the rendezvous (at the start and after every restart)
    before the run fails. With MIN:MAX nodes it also bounds the last call, see `last_call_timeout`."""
    connect_timeout: float = 30.0
    """Seconds a non-host node keeps trying to reach --rdzv-endpoint before the run fails (pre-flight)."""
    hang_timeout_s: float | None = None
    """Start ranks under ddpkit's hang watchdog (ddpkit.check._bootstrap): a rank blocked this long in a
    collective reports where and exits, so the run fails with a summary instead of hanging. None: off."""
    hang_report_dir: str | None = None
    """Where the watchdogs write their per-rank reports; `launch` picks a temporary directory when None."""
    torchrun_options: tuple[tuple[str, str], ...] = ()
    """torchrun flags passed through unchanged, as (flag, value) pairs from PASSTHROUGH_FLAGS, e.g.
    (("--log-dir", "logs"), ("--tee", "3")); `check_torchrun_flags` has checked the installed torch has them."""

    @property
    def single_node(self) -> bool:
        return _is_single_node(self.nnodes, self.rdzv_endpoint)


def _is_single_node(nnodes: str, rdzv_endpoint: str | None) -> bool:
    return nnodes in ("1", "1:1") and rdzv_endpoint is None


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


def resolve_nodes(*, nnodes: str | None, node_rank: int | None, rdzv_endpoint: str | None,
                  rdzv_id: str | None, nproc_per_node: str | None, environ) -> dict:
    """Multi-node settings: explicit flags, else the cluster's environment (SLURM, Kubeflow), validated.

    Returns RunConfig keyword values (nnodes, node_rank, rdzv_endpoint, rdzv_id when decided) and the
    --nproc-per-node string to resolve. A pure function of its arguments.
    """
    from ddpkit.cluster import ClusterError, detect_cluster
    from ddpkit.netcheck import NetworkError, split_endpoint

    try:
        found = detect_cluster(environ)
    except ClusterError as e:
        raise LaunchError(str(e)) from None
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
        raise LaunchError(f"--nnodes {nnodes!r} is not N or MIN:MAX with 1 <= MIN <= MAX; pass e.g. 2, or 2:4 "
                          "for elastic membership")
    if node_rank is not None and not 0 <= node_rank < int(high):
        raise LaunchError(f"--node-rank {node_rank} with --nnodes {nnodes}: node ranks are 0..{int(high) - 1}; "
                          f"pass --node-rank 0 on the rendezvous node and 1..{int(high) - 1} on the others")
    out = {"nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": rdzv_endpoint,
           "nproc_per_node": nproc_per_node or "auto"}
    if _is_single_node(nnodes, rdzv_endpoint):
        out["node_rank"] = None
        if rdzv_id is not None:
            out["rdzv_id"] = rdzv_id
        return out
    if rdzv_endpoint is None:
        raise LaunchError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT, the address of node 0 that every "
                          "node can reach, e.g. --rdzv-endpoint node0:29400")
    try:
        host, port = split_endpoint(rdzv_endpoint)
    except NetworkError as e:
        raise LaunchError(str(e)) from None
    if port == 0:
        raise LaunchError(f"--rdzv-endpoint {rdzv_endpoint}: port 0 cannot be shared by several nodes; "
                          f"pass a fixed free port, e.g. {host}:29400")
    # Every node must name the same rendezvous: derive the id from the endpoint, never a per-node uuid.
    out["rdzv_id"] = rdzv_id or f"ddpkit-{host}-{port}"
    return out


def check_target(target: str, *, module: bool) -> None:
    """Refuse a script path, or a module, that does not exist before any process starts."""
    if not module and not os.path.isfile(target):
        raise LaunchError(f"script {target!r} does not exist; pass the path of a .py file (or -m MODULE)")
    if module and not _module_exists(target):
        raise LaunchError(f"module {target!r} is not importable from {os.getcwd()} (nor from the installed packages); "
                          "check its name, or run from the directory that holds its package")


def _module_exists(name: str) -> bool:
    """Whether `python -m name` would find the module, looked up on the path without importing anything
    (importing a package runs its __init__, which can be slow or have side effects)."""
    import importlib.machinery
    import importlib.util
    import sys

    parts = name.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    # python -m puts the current directory first on the path; every finder is asked (editable installs
    # have their own), and a top-level name is looked up without importing anything
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path.pop(0)
    if spec is None:
        return False
    for part in parts[1:]:
        locations = spec.submodule_search_locations
        if not locations:
            return False  # a plain module has no submodules
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
        if spec is None:
            return False
    return True


def torchrun_flags() -> frozenset[str]:
    """The PASSTHROUGH_FLAGS the installed torch's torchrun accepts, read from its own parser's help."""
    import re

    from torch.distributed.run import get_args_parser

    text = get_args_parser().format_help()
    return frozenset(flag for flag in PASSTHROUGH_FLAGS if re.search(rf"(?<![\w-]){flag}(?![\w-])", text))


def check_torchrun_flags(options: tuple[tuple[str, str], ...], *, available: frozenset[str]) -> None:
    """Refuse a passed-through torchrun flag the installed torch lacks (a pure function of its arguments)."""
    for flag, value in options:
        if flag == "--shutdown-timeout" and not (value.isdigit()):
            raise LaunchError(f"--shutdown-timeout {value} must be a whole number of seconds >= 0, e.g. "
                              "--shutdown-timeout 60 (time the ranks get to save and exit after a signal)")
        if flag not in available:
            raise LaunchError(f"{flag} {value}: the installed torch's torchrun has no {flag} flag; upgrade torch "
                              f"to a release that has it, or drop {flag}")


def threads_per_rank(nproc_per_node: int, num_cpus: int) -> int:
    """Intra-op threads per rank so that the ranks together do not oversubscribe the cores."""
    return max(1, num_cpus // max(1, nproc_per_node))


def last_call_timeout(rdzv_timeout: float) -> int:
    """Seconds an elastic (MIN:MAX) rendezvous waits for more nodes once MIN have joined.

    The round must complete within --rdzv-timeout, but torch waits 30 s by default whatever the
    join timeout, so below 30 s a group smaller than MAX could never form. After a node is lost, a
    survivor first waits up to DEAD_NODE_S for the rendezvous to drop it, then the last call, then a
    few seconds of store polling: the last call is a third of what DEAD_NODE_S leaves, between 1 s
    and torch's 30 s (1 s at --rdzv-timeout 20, 15 s at 60, 30 s from 105 on, e.g. the default 300).
    """
    return max(1, min(30, (math.ceil(rdzv_timeout) - DEAD_NODE_S) // 3))


def build_torchrun_argv(cfg: RunConfig, *, rdzv_backend: str = "c10d", bind_addr: str | None = None,
                        is_host: bool | None = None) -> list[str]:
    """The arguments of `torch.distributed.run` for `cfg` (a pure function).

    `launch` passes ddpkit's own backend (`ddpkit.rendezvous.BACKEND`, c10d whose stores listen on
    `bind_addr` only) and whether this node hosts the rendezvous store, which it learns at run time.
    """
    argv = [f"--nproc-per-node={cfg.nproc_per_node}", f"--max-restarts={cfg.max_restarts}",
            f"--monitor-interval={cfg.monitor_interval}"]
    # Bounded waits: a node whose peers never join (or whose store stops answering) fails
    # after these many seconds instead of torchrun's 600 s default join timeout (whole seconds:
    # torch parses them as integers).
    conf = [f"join_timeout={max(1, math.ceil(cfg.rdzv_timeout))}",
            f"last_call_timeout={last_call_timeout(cfg.rdzv_timeout)}",
            f"read_timeout={max(1, round(min(cfg.rdzv_timeout, 60)))}"]
    if bind_addr is not None:
        conf.append(f"bind_addr={bind_addr}")
    if is_host is not None:
        conf.append(f"is_host={str(is_host).lower()}")
    if cfg.single_node:
        # c10d on port 0: the OS picks a free port when the store binds, so two jobs on one
        # machine never collide and nothing probes a port and releases it (a race).
        argv += ["--nnodes=1", f"--rdzv-backend={rdzv_backend}", "--rdzv-endpoint=127.0.0.1:0",
                 f"--rdzv-id={cfg.rdzv_id}", "--local-addr=127.0.0.1"]
    else:
        if cfg.rdzv_endpoint is None:
            raise LaunchError(f"--nnodes {cfg.nnodes} needs --rdzv-endpoint HOST:PORT (the node all others reach)")
        argv += [f"--nnodes={cfg.nnodes}", f"--rdzv-backend={rdzv_backend}", f"--rdzv-endpoint={cfg.rdzv_endpoint}",
                 f"--rdzv-id={cfg.rdzv_id}"]
        if cfg.node_rank is not None:
            # torchrun uses --node-rank only with its static backend; ddpkit's orders the nodes by it
            argv.append(f"--node-rank={cfg.node_rank}")
            conf.append(f"node_rank={cfg.node_rank}")
        if cfg.local_addr is not None:
            argv.append(f"--local-addr={cfg.local_addr}")
    argv.append("--rdzv-conf=" + ",".join(conf))
    argv += [f"{flag}={value}" for flag, value in cfg.torchrun_options]
    if cfg.hang_timeout_s is not None:
        # ddpkit's settings reach the ranks as arguments of its rank bootstrap, which then runs the
        # script unchanged as __main__ (no environment variables of our own).
        argv += ["-m", "ddpkit.check._bootstrap", f"--hang-timeout={cfg.hang_timeout_s:g}"]
        if cfg.hang_report_dir is not None:
            argv += ["--report-dir", cfg.hang_report_dir]
    if cfg.module:
        argv.append("-m")
    argv.append(cfg.target)
    argv.extend(cfg.target_args)
    return argv


def launch(cfg: RunConfig) -> int:
    """Run torchrun in this process; return the exit code. A failed rank's traceback is printed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.run import parse_args, run

    from ddpkit import rendezvous, runreport
    from ddpkit.netcheck import NetworkError
    from ddpkit.preemption import STOP_SIGNALS

    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_rank(cfg.nproc_per_node, _num_cpus())))
    try:
        socket_env, cfg, net_kwargs = _plan_network(cfg)
    except NetworkError as e:
        print(f"ddpkit run: error: {e}", file=sys.stderr)
        return 2
    os.environ.update(socket_env)  # the ranks inherit this process's environment
    if cfg.hang_timeout_s is not None and cfg.hang_report_dir is None:
        import tempfile

        cfg = replace(cfg, hang_report_dir=tempfile.mkdtemp(prefix="ddpkit-hang-"))
    rendezvous.register()
    args = parse_args(build_torchrun_argv(cfg, rdzv_backend=rendezvous.BACKEND, **net_kwargs))
    # torchrun warns that it ignores --node-rank with any backend but its static one; ours reads it
    # from --rdzv-conf, so the warning would be wrong
    args.node_rank = 0
    try:
        run(args)
    except ChildFailedError as e:
        codes = {failure.exitcode for failure in e.failures.values()}
        if codes and codes <= {128 + int(sig) for sig in STOP_SIGNALS}:
            # every failed rank ended itself after a preemption signal (ddpkit.preemption's convention)
            print(f"ddpkit run: the ranks stopped at a step boundary after a signal (exit code {max(codes)}); "
                  "rerun the same command to resume from their checkpoint", file=sys.stderr)
            return max(codes)
        runreport.print_failures(e, multi_node=not cfg.single_node)
        runreport.print_hang_reports(cfg)
        return 1
    except RendezvousError as e:
        print(f"ddpkit run: error: {runreport.rendezvous_error(e, cfg)}", file=sys.stderr)
        return 1
    except SignalException as e:
        # torchrun's agent has forwarded the signal to every rank and waited for them (up to its
        # shutdown timeout, then SIGKILL): ranks that check ctx.should_stop() have saved and exited
        print(f"ddpkit run: stopped by {e.sigval.name}; every rank was given {e.sigval.name} and has exited",
              file=sys.stderr)
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        print("ddpkit run: interrupted; all ranks were terminated", file=sys.stderr)
        return 130
    return 0


def _plan_network(cfg: RunConfig) -> tuple[dict[str, str], RunConfig, dict]:
    """Socket variables for the ranks, the config to run, and the store binding (may raise NetworkError).

    One node: everything on loopback, including gloo's sockets, which otherwise bind the address the
    hostname resolves to. Several nodes: the interface the user names (--iface) or the one that routes
    to the endpoint, and a pre-flight connect so a wrong endpoint fails now instead of hanging.
    """
    from ddpkit import netcheck

    if cfg.single_node:
        env = netcheck.socket_env(netcheck.loopback_interface(), os.environ)
        return env, cfg, {"bind_addr": "127.0.0.1", "is_host": True}
    host, port = netcheck.split_endpoint(cfg.rdzv_endpoint or "")
    plan = netcheck.plan_network(host, port, iface=cfg.iface, node_rank=cfg.node_rank, environ=os.environ)
    if not plan.is_host:
        netcheck.probe_endpoint(host, port, iface=plan.iface, timeout_s=cfg.connect_timeout)
    kwargs: dict = {}
    if cfg.iface is not None:
        # The user named the network: the stores this node hosts listen there only, and the node
        # advertises its address on it (where rank 0's node puts the ranks' store).
        cfg = replace(cfg, local_addr=cfg.local_addr or plan.address)
        kwargs = {"bind_addr": plan.address, "is_host": plan.is_host}
    elif cfg.node_rank is not None:
        kwargs = {"is_host": plan.is_host}
    return plan.env, cfg, kwargs


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _num_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
