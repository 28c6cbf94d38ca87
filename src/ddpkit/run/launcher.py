"""`ddpkit run`: argv -> RunConfig (`config_from_args`) -> torchrun argv (pure), then torchrun runs the ranks."""

from __future__ import annotations

import argparse
import math
import os
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ddpkit.run.nodes import (MAX_DEFAULT_CPU_RANKS, ClusterError, cpu_rank_limit, default_nproc_per_node, is_single_node,
                              resolve_nodes, threads_per_rank,
                              usable_cpus, visible_gpus, available_memory)

__all__ = [
    "RunConfig",
    "LaunchError",
    "run_parser",
    "config_from_args",
    "main",
    "build_torchrun_argv",
    "default_nproc_per_node",
    "resolve_nproc_per_node",
    "threads_per_rank",
    "last_call_timeout",
    "check_target",
    "check_profile_json",
    "check_torchrun_flags",
    "torchrun_flags",
    "DEFAULT_SIGNALS_TO_HANDLE",
    "visible_gpus",
    "usable_cpus",
    "run_torchrun",
]

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
    """Start ranks under ddpkit's hang watchdog (ddpkit.bootstrap): a rank blocked this long in a
    collective reports where and exits, so the run fails with a summary instead of hanging. None: off."""
    hang_report_dir: str | None = None
    """Where the watchdogs write their per-rank reports; `launch` picks a temporary directory when None."""
    torchrun_options: tuple[tuple[str, str], ...] = ()
    """torchrun flags passed through unchanged, as (flag, value) pairs from PASSTHROUGH_FLAGS, e.g.
    (("--log-dir", "logs"), ("--tee", "3")); `check_torchrun_flags` has checked the installed torch has them."""
    profile: bool = False
    """Start ranks that profile each optimizer step of ddpkit's loop helpers (ddpkit.profile); rank 0
    prints the table, the straggler and suggestions when the script closes its Context."""
    profile_json: str | None = None
    """Where rank 0 also writes that report as JSON (an absolute path); None: the table only."""
    cpu_ranks: bool = False
    """Run the ranks on the CPU even where GPUs are visible (--nproc-per-node cpu): the rank bootstrap
    hides the GPUs from each rank before the script starts, so ddpkit.init and torch both see none."""

    @property
    def single_node(self) -> bool:
        return is_single_node(self.nnodes, self.rdzv_endpoint)


def resolve_nproc_per_node(value: str, *, num_gpus: int, num_cpus: int, environ: Mapping[str, str],
                           oversubscribe: bool = False, memory_bytes: int | None = None) -> int:
    """Parse --nproc-per-node ('auto', 'gpu', 'cpu' or a positive int) against what is visible.

    CPU ranks beyond `cpu_rank_limit` (cores, or memory when `memory_bytes` is given) are refused
    unless `oversubscribe` (the --oversubscribe flag) says the user means it.
    """
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
    if num_gpus == 0 and not oversubscribe:
        limit, why = cpu_rank_limit(num_cpus, memory_bytes)
        if n > limit:
            raise LaunchError(f"--nproc-per-node {n} asks for {n} CPU ranks but {why}; pass --nproc-per-node "
                              f"{min(n, limit)} or auto, or add --oversubscribe to start them anyway")
    if num_gpus > 0 and n > num_gpus:
        visible = environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise LaunchError(
            f"--nproc-per-node {n} asks for {n} GPUs but {num_gpus} are visible{shown}; "
            f"pass --nproc-per-node {num_gpus} or auto"
        )
    return n


def run_parser() -> argparse.ArgumentParser:
    """The flags of `ddpkit run`, torchrun's names where torchrun has the setting."""
    p = argparse.ArgumentParser(
        prog="ddpkit run",
        description="Launch SCRIPT on every device of this machine (or several machines) through torchrun.",
    )
    p.add_argument("--nproc-per-node", "--nproc_per_node", default=None,
                   help="ranks on this node: a number, 'auto' (every visible GPU, else up to 4 CPU ranks), "
                        "'gpu' or 'cpu'")
    p.add_argument("--oversubscribe", action="store_true",
                   help="start more CPU ranks than this machine's cores or memory hold (refused otherwise)")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="restart all ranks up to N times after a failure (resume from your last checkpoint)")
    p.add_argument("--nnodes", default=None,
                   help="number of nodes, or MIN:MAX for elastic membership (default 1, or from "
                        "SLURM/SkyPilot/Kubeflow)")
    p.add_argument("--node-rank", type=int, default=None,
                   help="this node's rank (multi-node): node 0 holds global ranks 0..nproc-1; without it the "
                        "rendezvous orders the nodes")
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT every node can reach (multi-node)")
    p.add_argument("--rdzv-id", default=None, help="job id shared by all nodes (multi-node)")
    p.add_argument("--local-addr", default=None, help="address this node advertises to the others (multi-node)")
    p.add_argument("--iface", default=None,
                   help="network interface for the ranks' traffic (multi-node; default: the one routing to the "
                        "endpoint)")
    p.add_argument("--rdzv-timeout", type=float, default=300.0,
                   help="seconds a node waits for the others to join before the run fails (multi-node)")
    p.add_argument("--connect-timeout", type=float, default=30.0,
                   help="seconds a node keeps trying to reach --rdzv-endpoint before failing (multi-node)")
    p.add_argument("--hang-timeout", type=float, default=None, metavar="SECONDS",
                   help="a rank blocked this long in a collective reports its stack and call site, and the run "
                        "fails with one line per rank instead of hanging (default: off)")
    p.add_argument("--profile", action="store_true",
                   help="measure where each rank's step time goes (data, compute, exposed communication, "
                        "optimizer, other); rank 0 prints a table, the straggler and suggestions at the end")
    p.add_argument("--profile-json", default=None, metavar="PATH",
                   help="also write the profile as JSON to PATH (implies --profile)")
    # torchrun's own flags, handed on unchanged (refused where the installed torch lacks one)
    p.add_argument("--log-dir", default=None,
                   help="torchrun: directory for the ranks' log files (DIR/RUN_ID/attempt_N/LOCAL_RANK/)")
    p.add_argument("--redirects", "-r", default=None, help="torchrun: redirect ranks' output to the log files: "
                   "0 none, 1 stdout, 2 stderr, 3 both, or per local rank, e.g. 0:3,1:1")
    p.add_argument("--tee", "-t", default=None, help="torchrun: like --redirects, and also to the console")
    p.add_argument("--local-ranks-filter", default=None,
                   help="torchrun: local ranks whose output the console shows, e.g. 0")
    p.add_argument("--signals-to-handle", default=None,
                   help="torchrun: signals it catches and forwards to the ranks (default SIGTERM,SIGINT,SIGHUP,"
                        "SIGQUIT,SIGUSR1; SIGTERM and SIGUSR1 make ranks stop at a step boundary, see ctx.should_stop)")
    p.add_argument("--shutdown-timeout", default=None,
                   help="torchrun: seconds the ranks get to exit after a signal before SIGKILL (torch's default 30)")
    p.add_argument("--numa-binding", default=None, help="torchrun: bind each rank to its GPU's NUMA node (e.g. node)")
    p.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module, like python -m")
    p.add_argument("target", metavar="SCRIPT", help="training script path (or module name with -m)")
    p.add_argument("target_args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the script unchanged")
    return p


def config_from_args(argv: list[str], *, environ: Mapping[str, str], num_gpus: int, num_cpus: int,
                     available_flags: frozenset[str] | None = None, memory_bytes: int | None = None) -> RunConfig:
    """`ddpkit run` argv -> RunConfig, validated against what this machine has (raises LaunchError naming the fix).

    Inside SLURM (`srun ddpkit run`), a SkyPilot task or a Kubeflow TrainJob/PyTorchJob pod, node count,
    node rank and endpoint come from `environ` unless given as flags. `available_flags`: the
    PASSTHROUGH_FLAGS the installed torchrun has (default `torchrun_flags()`, read from its parser). A pure function of its arguments,
    the file system and the installed torch.
    """
    args = run_parser().parse_args(argv)
    check_target(args.target, module=args.module)
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts {args.max_restarts} must be >= 0")
    for flag, value in (("--rdzv-timeout", args.rdzv_timeout), ("--connect-timeout", args.connect_timeout)):
        if not value > 0:
            raise LaunchError(f"{flag} {value:g} must be > 0 seconds, e.g. {flag} 60")
    if args.hang_timeout is not None and not args.hang_timeout > 0:
        raise LaunchError(f"--hang-timeout {args.hang_timeout:g} must be > 0 seconds, e.g. --hang-timeout 300 "
                          "(longer than your slowest step or evaluation)")
    profile_json = check_profile_json(args.profile_json)
    given = tuple((flag, getattr(args, flag[2:].replace("-", "_"))) for flag in PASSTHROUGH_FLAGS)
    options = tuple((flag, str(value)) for flag, value in given if value is not None)
    available = torchrun_flags() if available_flags is None else available_flags
    check_torchrun_flags(options, available=available)
    if args.signals_to_handle is None and "--signals-to-handle" in available:
        options += (("--signals-to-handle", DEFAULT_SIGNALS_TO_HANDLE),)
    try:
        nodes = resolve_nodes(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                              rdzv_id=args.rdzv_id, nproc_per_node=args.nproc_per_node, environ=environ)
    except ClusterError as e:
        raise LaunchError(str(e)) from None
    if args.iface is not None and nodes.rdzv_endpoint is None:
        raise LaunchError(f"--iface {args.iface} applies to multi-node runs; one node always uses loopback, "
                          "drop --iface or pass --nnodes and --rdzv-endpoint")
    nproc = resolve_nproc_per_node(nodes.nproc_per_node, num_gpus=num_gpus, num_cpus=num_cpus, environ=environ,
                                   oversubscribe=args.oversubscribe, memory_bytes=memory_bytes)
    cfg = RunConfig(
        target=args.target, target_args=tuple(args.target_args), module=args.module,
        nproc_per_node=nproc, max_restarts=args.max_restarts, nnodes=nodes.nnodes, node_rank=nodes.node_rank,
        rdzv_endpoint=nodes.rdzv_endpoint, local_addr=args.local_addr, iface=args.iface,
        rdzv_timeout=args.rdzv_timeout, connect_timeout=args.connect_timeout, hang_timeout_s=args.hang_timeout,
        cpu_ranks=nodes.nproc_per_node == "cpu", torchrun_options=options,
        profile=args.profile or profile_json is not None, profile_json=profile_json,
    )
    # no id decided (one node, no --rdzv-id): the fresh one RunConfig draws for every run
    return cfg if nodes.rdzv_id is None else replace(cfg, rdzv_id=nodes.rdzv_id)


def main(argv: list[str]) -> int:
    """`ddpkit run ARGV`: resolve the settings on this machine, then launch; 2 for a setting that cannot work."""
    try:
        cfg = config_from_args(argv, environ=os.environ, num_gpus=visible_gpus(), num_cpus=usable_cpus(),
                               memory_bytes=available_memory())
    except LaunchError as e:
        print(f"ddpkit run: error: {e}", file=sys.stderr)
        return 2
    return run_torchrun(cfg)


def check_profile_json(path: str | None) -> str | None:
    """--profile-json PATH as an absolute path, refused when its directory does not exist."""
    if path is None:
        return None
    full = os.path.abspath(path)
    if not os.path.isdir(os.path.dirname(full)):
        raise LaunchError(f"--profile-json {path}: directory {os.path.dirname(full)} does not exist; create it "
                          "or pass a path in an existing directory")
    return full


def check_target(target: str, *, module: bool) -> None:
    """Refuse a script path, or a module, that does not exist before any process starts."""
    if not module and not os.path.isfile(target):
        raise LaunchError(f"script {target!r} does not exist; pass the path of a .py file (or -m MODULE)")
    if not module:  # a syntax error is a usage error: no rank needs to start to find it
        try:
            with open(target, "rb") as f:
                compile(f.read(), target, "exec", dont_inherit=True)
        except SyntaxError as e:
            raise LaunchError(f"{target}:{e.lineno}: {e.msg} (a syntax error); fix that line, then run again") from None
        except (OSError, ValueError) as e:
            raise LaunchError(f"script {target!r} cannot be read ({e}); check the file") from None
    if module and not _module_exists(target):
        raise LaunchError(f"module {target!r} is not importable from {os.getcwd()} (nor from the installed packages); "
                          "check its name, or run from the directory that holds its package")


def _module_exists(name: str) -> bool:
    """Whether `python -m name` would find the module, looked up on the path without importing anything
    (importing a package runs its __init__, which can be slow or have side effects)."""
    import importlib.machinery
    import importlib.util

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

    `launch` passes ddpkit's own backend (`ddpkit.run.rendezvous.BACKEND`, c10d whose stores listen on
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
    if cfg.hang_timeout_s is not None or cfg.cpu_ranks or cfg.profile:
        # ddpkit's settings reach the ranks as arguments of its rank bootstrap, which then runs the
        # script unchanged as __main__ (no environment variables of our own).
        argv += ["-m", "ddpkit.bootstrap"]
        if cfg.hang_timeout_s is not None:
            argv.append(f"--hang-timeout={cfg.hang_timeout_s:g}")
            if cfg.hang_report_dir is not None:
                argv += ["--report-dir", cfg.hang_report_dir]
        if cfg.cpu_ranks:
            argv += ["--device", "cpu"]
        if cfg.profile:
            argv.append("--profile")
            if cfg.profile_json is not None:
                argv += ["--profile-json", cfg.profile_json]
    if cfg.module:
        argv.append("-m")
    argv.append(cfg.target)
    argv.extend(cfg.target_args)
    return argv


def run_torchrun(cfg: RunConfig) -> int:
    """Run torchrun in this process; return the exit code. A failed rank's traceback is printed."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.run import parse_args, run

    from ddpkit.run import rendezvous
    from ddpkit.run import report as runreport
    from ddpkit.preemption import STOP_SIGNALS
    from ddpkit.run.netcheck import NetworkError, launcher_network

    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_rank(cfg.nproc_per_node, usable_cpus())))
    try:
        net = launcher_network(cfg.rdzv_endpoint, single_node=cfg.single_node, iface=cfg.iface,
                               node_rank=cfg.node_rank, connect_timeout_s=cfg.connect_timeout, environ=os.environ)
    except NetworkError as e:
        print(f"ddpkit run: error: {e}", file=sys.stderr)
        return 2
    os.environ.update(net.env)  # the ranks inherit this process's environment
    if net.local_addr is not None:
        cfg = replace(cfg, local_addr=cfg.local_addr or net.local_addr)
    if cfg.hang_timeout_s is not None and cfg.hang_report_dir is None:
        import tempfile

        cfg = replace(cfg, hang_report_dir=tempfile.mkdtemp(prefix="ddpkit-hang-"))
    rendezvous.register()
    args = parse_args(build_torchrun_argv(cfg, rdzv_backend=rendezvous.BACKEND, bind_addr=net.bind_addr,
                                          is_host=net.is_host))
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
        runreport.print_hang_reports(cfg.hang_report_dir, hang_timeout_s=cfg.hang_timeout_s)
        return 1
    except RendezvousError as e:
        message = runreport.rendezvous_error(e, endpoint=cfg.rdzv_endpoint, nnodes=cfg.nnodes,
                                             rdzv_timeout=cfg.rdzv_timeout, single_node=cfg.single_node)
        print(f"ddpkit run: error: {message}", file=sys.stderr)
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
