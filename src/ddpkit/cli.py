"""The `ddpkit` command: run | check | lint | env | plot."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

__all__ = ["main", "parse_run_args"]

# Subcommands implemented in their own modules, imported only when used (keeps startup cheap).
_DELEGATED = {
    "lint": ("ddpkit.lint", "static checks of a training script (no execution)"),
    "env": ("ddpkit.envreport", "report versions, devices, network and launch settings"),
    "plot": ("ddpkit.plot", "write PNG plots from a run directory's metrics.jsonl"),
    "check": ("ddpkit.check", "run a script on CPU ranks and verify the DDP invariants"),
}


def _run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddpkit run",
        description="Launch SCRIPT on every device of this machine (or several machines) through torchrun.",
    )
    p.add_argument("--nproc-per-node", "--nproc_per_node", default=None,
                   help="ranks on this node: a number, 'auto' (every visible GPU, else up to 4 CPU ranks), 'gpu' or 'cpu'")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="restart all ranks up to N times after a failure (resume from your last checkpoint)")
    p.add_argument("--nnodes", default=None,
                   help="number of nodes, or MIN:MAX for elastic membership (default 1, or from SLURM/Kubeflow)")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank (multi-node): node 0 holds global ranks 0..nproc-1; without "
                   "it the rendezvous orders the nodes")
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT every node can reach (multi-node)")
    p.add_argument("--rdzv-id", default=None, help="job id shared by all nodes (multi-node)")
    p.add_argument("--local-addr", default=None, help="address this node advertises to the others (multi-node)")
    p.add_argument("--iface", default=None,
                   help="network interface for the ranks' traffic (multi-node; default: the one routing to the endpoint)")
    p.add_argument("--rdzv-timeout", type=float, default=300.0,
                   help="seconds a node waits for the others to join before the run fails (multi-node)")
    p.add_argument("--connect-timeout", type=float, default=30.0,
                   help="seconds a node keeps trying to reach --rdzv-endpoint before failing (multi-node)")
    p.add_argument("--hang-timeout", type=float, default=None, metavar="SECONDS",
                   help="a rank blocked this long in a collective reports its stack and call site, and the run "
                        "fails with one line per rank instead of hanging (default: off)")
    # torchrun's own flags, handed on unchanged (refused where the installed torch lacks one)
    p.add_argument("--log-dir", default=None, help="torchrun: directory for the ranks' log files (DIR/RUN_ID/attempt_N/LOCAL_RANK/)")
    p.add_argument("--redirects", "-r", default=None, help="torchrun: redirect ranks' output to the log files: 0 none, "
                   "1 stdout, 2 stderr, 3 both, or per local rank, e.g. 0:3,1:1")
    p.add_argument("--tee", "-t", default=None, help="torchrun: like --redirects, and also to the console")
    p.add_argument("--local-ranks-filter", default=None, help="torchrun: local ranks whose output the console shows, e.g. 0")
    p.add_argument("--signals-to-handle", default=None,
                   help="torchrun: signals it catches and forwards to the ranks (default SIGTERM,SIGINT,SIGHUP,SIGQUIT,"
                        "SIGUSR1; SIGTERM and SIGUSR1 make ranks stop at a step boundary, see ctx.should_stop)")
    p.add_argument("--shutdown-timeout", default=None,
                   help="torchrun: seconds the ranks get to exit after a signal before SIGKILL (torch's default 30)")
    p.add_argument("--numa-binding", default=None, help="torchrun: bind each rank to its GPU's NUMA node (e.g. node)")
    p.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module, like python -m")
    p.add_argument("target", metavar="SCRIPT", help="training script path (or module name with -m)")
    p.add_argument("target_args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the script unchanged")
    return p


def parse_run_args(argv: list[str], *, num_gpus: int | None = None, num_cpus: int | None = None,
                   environ=None, available_flags: frozenset[str] | None = None):
    """`ddpkit run` argv -> RunConfig, validated (raises LaunchError with the fix).

    Inside SLURM (`srun ddpkit run`) or a Kubeflow PyTorchJob pod, node count, node rank and endpoint
    come from `environ` (default os.environ) unless given as flags. `available_flags`: the torchrun flags the
    installed torch has (default: read from its parser, `ddpkit.launch.torchrun_flags`).
    """
    from ddpkit.launch import (
        DEFAULT_SIGNALS_TO_HANDLE, PASSTHROUGH_FLAGS, LaunchError, RunConfig, _num_cpus, _visible_gpus, check_target,
        check_torchrun_flags, resolve_nodes, resolve_nproc_per_node, torchrun_flags,
    )

    args = _run_parser().parse_args(argv)
    check_target(args.target, module=args.module)
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts {args.max_restarts} must be >= 0")
    for flag, value in (("--rdzv-timeout", args.rdzv_timeout), ("--connect-timeout", args.connect_timeout)):
        if not value > 0:
            raise LaunchError(f"{flag} {value:g} must be > 0 seconds, e.g. {flag} 60")
    if args.hang_timeout is not None and not args.hang_timeout > 0:
        raise LaunchError(f"--hang-timeout {args.hang_timeout:g} must be > 0 seconds, e.g. --hang-timeout 300 "
                          "(longer than your slowest step or evaluation)")
    given = tuple((flag, getattr(args, flag[2:].replace("-", "_"))) for flag in PASSTHROUGH_FLAGS)
    options = tuple((flag, str(value)) for flag, value in given if value is not None)
    available = torchrun_flags() if available_flags is None else available_flags
    check_torchrun_flags(options, available=available)
    if args.signals_to_handle is None and "--signals-to-handle" in available:
        options += (("--signals-to-handle", DEFAULT_SIGNALS_TO_HANDLE),)
    nodes = resolve_nodes(nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
                          rdzv_id=args.rdzv_id, nproc_per_node=args.nproc_per_node,
                          environ=os.environ if environ is None else environ)
    if args.iface is not None and nodes["rdzv_endpoint"] is None:
        raise LaunchError(f"--iface {args.iface} applies to multi-node runs; one node always uses loopback, "
                          "drop --iface or pass --nnodes and --rdzv-endpoint")
    nproc = resolve_nproc_per_node(
        nodes.pop("nproc_per_node"),
        num_gpus=_visible_gpus() if num_gpus is None else num_gpus,
        num_cpus=_num_cpus() if num_cpus is None else num_cpus,
    )
    return RunConfig(
        target=args.target, target_args=tuple(args.target_args), module=args.module,
        nproc_per_node=nproc, max_restarts=args.max_restarts, local_addr=args.local_addr,
        iface=args.iface, rdzv_timeout=args.rdzv_timeout, connect_timeout=args.connect_timeout,
        hang_timeout_s=args.hang_timeout, torchrun_options=options, **nodes,
    )


def _cmd_run(argv: list[str]) -> int:
    from ddpkit.launch import LaunchError, launch

    try:
        cfg = parse_run_args(argv)
    except LaunchError as e:
        print(f"ddpkit run: error: {e}", file=sys.stderr)
        return 2
    return launch(cfg)


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddpkit", description="Correct, fast DistributedDataParallel training.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("run", help="launch a training script on all devices (torchrun)", add_help=False)
    for name, (_, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "run":
        return _cmd_run(argv[1:])
    if argv and argv[0] in _DELEGATED:
        module = importlib.import_module(_DELEGATED[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    parser = _top_parser()
    args = parser.parse_args(argv[:1])
    if args.version:
        from ddpkit import __version__

        print(__version__)
        return 0
    parser.print_help()
    return 0 if not argv else 2


if __name__ == "__main__":
    sys.exit(main())
