"""The `ddpkit` command: dispatch to run | check | lint | env | plot | test | port, each parsed by its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["main", "SUBCOMMANDS"]

SUBCOMMANDS = {
    "run": ("ddpkit.run.launcher", "launch a training script on all devices (torchrun)"),
    "lint": ("ddpkit.lint", "static checks of a training script (no execution)"),
    "env": ("ddpkit.run.envreport", "report versions, devices, network and launch settings"),
    "plot": ("ddpkit.metrics.plot", "write PNG plots from a run directory's metrics.jsonl"),
    "check": ("ddpkit.check", "run a script on CPU ranks and verify the DDP invariants"),
    "test": ("ddpkit.selftest.command", "check this machine's GPUs (or CPU ranks), backend and DDP path in under a minute"),
    "port": ("ddpkit.port", "rewrite a single-device training script into a ddpkit script"),
}
"""Subcommand -> (the module whose `main(argv)` implements it, imported only when used; its help line)."""


def _top_parser() -> argparse.ArgumentParser:
    from ddpkit.version import __version__

    p = argparse.ArgumentParser(prog="ddpkit", description="Correct, fast DistributedDataParallel training.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    p.add_argument("--version", action="version", version=__version__,
                   help="print the version and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    parser = _top_parser()
    try:
        parser.parse_args(argv[:1])
    except SystemExit as e:  # --version, --help, or an unknown command (argparse has printed why)
        return int(e.code or 0)
    parser.print_help()
    return 0 if not argv else 2


if __name__ == "__main__":
    sys.exit(main())
