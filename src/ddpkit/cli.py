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
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="auto",
                   help="ranks on this node: a number, 'auto' (every visible GPU, else up to 4 CPU ranks), 'gpu' or 'cpu'")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="restart all ranks up to N times after a failure (resume from your last checkpoint)")
    p.add_argument("--nnodes", default="1", help="number of nodes, or MIN:MAX for elastic membership")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank (multi-node; optional with c10d)")
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT every node can reach (multi-node)")
    p.add_argument("--rdzv-id", default=None, help="job id shared by all nodes (multi-node)")
    p.add_argument("--local-addr", default=None, help="address this node advertises to the others (multi-node)")
    p.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module, like python -m")
    p.add_argument("target", metavar="SCRIPT", help="training script path (or module name with -m)")
    p.add_argument("target_args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the script unchanged")
    return p


def parse_run_args(argv: list[str], *, num_gpus: int | None = None, num_cpus: int | None = None):
    """`ddpkit run` argv -> RunConfig, validated (raises LaunchError with the fix)."""
    from ddpkit.launch import LaunchError, RunConfig, _num_cpus, _visible_gpus, resolve_nproc_per_node

    args = _run_parser().parse_args(argv)
    if not args.module and not os.path.isfile(args.target):
        raise LaunchError(f"script {args.target!r} does not exist; pass the path of a .py file (or -m MODULE)")
    if args.max_restarts < 0:
        raise LaunchError(f"--max-restarts {args.max_restarts} must be >= 0")
    nproc = resolve_nproc_per_node(
        args.nproc_per_node,
        num_gpus=_visible_gpus() if num_gpus is None else num_gpus,
        num_cpus=_num_cpus() if num_cpus is None else num_cpus,
    )
    kwargs = {}
    if args.rdzv_id is not None:
        kwargs["rdzv_id"] = args.rdzv_id
    return RunConfig(
        target=args.target, target_args=tuple(args.target_args), module=args.module,
        nproc_per_node=nproc, max_restarts=args.max_restarts, nnodes=args.nnodes,
        node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint, local_addr=args.local_addr, **kwargs,
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
    args = _top_parser().parse_args(argv[:1])
    if args.version:
        from ddpkit import __version__

        print(__version__)
        return 0
    _top_parser().print_help()
    return 0 if not argv else 2


if __name__ == "__main__":
    sys.exit(main())
