"""What `ddpkit run` prints when a job fails: one line per failed rank, lost nodes, hang reports, and one
line for a rendezvous that did not complete. The ranks' own tracebacks are already on stderr above.

Formats plain values (the run's settings as arguments, torch's exceptions); the launcher calls it."""

from __future__ import annotations

import sys

__all__ = ["print_failures", "failure_message", "print_hang_reports", "rendezvous_error"]


def rendezvous_error(e: Exception, *, endpoint: str | None, nnodes: str, rdzv_timeout: float,
                     single_node: bool) -> str:
    """One line for a failed rendezvous: what happened at which endpoint, what this node saw, the fix.

    The settings are the run's --rdzv-endpoint (None on one node), --nnodes and --rdzv-timeout.
    """
    from torch.distributed.elastic.rendezvous import (
        RendezvousClosedError, RendezvousConnectionError, RendezvousTimeoutError,
    )

    from ddpkit.run.rendezvous import NodeMismatchError

    where = endpoint or "127.0.0.1 (one node)"
    if isinstance(e, NodeMismatchError):
        return f"rendezvous at {where}: {e}"  # names both nodes' settings and the fix
    low, _, high = nnodes.partition(":")
    nodes = f"{low} nodes" if high in ("", low) else f"at least {low} nodes"
    same = (f"start every node with the same --nnodes {nnodes} and --rdzv-endpoint {where} (and --rdzv-id, "
            "if you pass it)")
    if single_node:
        same = "run it again, and if it fails again report it with the output of `ddpkit env`"
    seen = str(e).strip().splitlines()[0] if str(e).strip() else ""  # what this node saw, from ddpkit.run.rendezvous
    if isinstance(e, RendezvousTimeoutError):
        return (f"rendezvous at {where} timed out after --rdzv-timeout {rdzv_timeout:g} s: --nnodes "
                f"{nnodes} expects {nodes}{' and ' + seen if seen else ''}; {same}, all within --rdzv-timeout "
                "of each other (raise it if nodes start far apart)")
    if isinstance(e, RendezvousClosedError):
        return (f"rendezvous at {where} was closed by another node before {nodes} joined"
                f"{' (' + seen + ')' if seen else ''}: that node timed out, failed or finished (see its log); "
                f"{same}, then start them all again")
    if isinstance(e, RendezvousConnectionError):
        cause = str(e.__cause__).strip().splitlines()[0] if e.__cause__ and str(e.__cause__).strip() else seen
        return (f"lost the rendezvous store at {where}{' (' + cause + ')' if cause else ''}: the node hosting "
                "it (--node-rank 0, or the machine that holds that address) stopped or cannot be reached; "
                f"check its log, then {same}")
    return f"rendezvous at {where} failed ({type(e).__name__}{': ' + seen if seen else ''}); {same}"


def print_hang_reports(report_dir: str | None, *, hang_timeout_s: float | None) -> None:
    """After a failure: the watchdogs' one line per rank, if they declared a hang in `report_dir`."""
    if report_dir is None:
        return
    from ddpkit.hang.watchdog import collect_reports, summarize

    reports = collect_reports(report_dir)
    if reports:
        print(f"ddpkit run: hang detected (--hang-timeout {hang_timeout_s:g} s); reports in {report_dir}",
              file=sys.stderr)
        for line in summarize(reports):
            print(f"ddpkit run:   {line}", file=sys.stderr)
    from pathlib import Path

    dumps = sorted(Path(report_dir).rglob("nccl-trace-rank-*"))
    if dumps:
        print(f"ddpkit run: NCCL flight recorder dumps of {len(dumps)} rank(s) in {dumps[0].parent} (read them with "
              "`python -m torch.distributed.flight_recorder.fr_trace`)", file=sys.stderr)


_SIGNAL_CAUSES = {
    "SIGABRT": (" (aborted from C++: an NCCL collective timed out or failed, and torch's NCCL watchdog ended the "
                "rank; run with --hang-timeout below init's timeout_s: its report names where each rank waited "
                "and the collective it waited for, DDP's gradient all-reduces and FSDP's included)"),
}
"""What a rank's death by a signal usually means, appended to its one line."""


def print_failures(e, *, multi_node: bool) -> None:
    """One line per failed rank; the rank's own traceback is already on stderr above it. On several
    nodes, also which node's ranks were lost (on one node a peer's closed connection is only the
    echo of the failure above)."""
    from ddpkit.run.netcheck import is_follow_on

    # The rank that failed first, with its own error, comes first: a rank that raises tears the
    # process group down and its peers then fail with a closed connection, sometimes a little sooner.
    ordered = sorted(e.failures.items(), key=lambda item: (is_follow_on(failure_message(item[1])),
                                                           getattr(item[1], "timestamp", 0), item[0]))
    for n, (rank, failure) in enumerate(ordered):
        first = "; the first to fail" if n == 0 and len(ordered) > 1 else ""
        where = f"rank {rank} (local rank {failure.local_rank}, pid {failure.pid}{first})"
        if failure.exitcode < 0:
            why = f"was killed by {failure.signal_name()}{_SIGNAL_CAUSES.get(failure.signal_name(), '')}"
        else:
            why = f"failed with exit code {failure.exitcode}"
            message = failure_message(failure)
            if message:
                why += f": {message.strip().splitlines()[-1]}"
        print(f"ddpkit run: {where} {why}", file=sys.stderr)
    if not multi_node:
        return
    from ddpkit.run.netcheck import lost_peer

    messages = filter(None, map(failure_message, e.failures.values()))
    lost = {lost_peer(message) for message in messages} - {None}
    for addr in sorted(lost):
        print(f"ddpkit run: lost the ranks at {addr}: that node's launcher, ranks or network stopped, so this "
              "node stopped too; check that node's log, then relaunch every node (or use --nnodes MIN:MAX with "
              "--max-restarts to continue without it)", file=sys.stderr)


def failure_message(failure) -> str | None:
    """The exception message a failed rank wrote to its torchrun error file, or None."""
    data = failure.error_file_data if isinstance(failure.error_file_data, dict) else {}
    message = data.get("message")
    if isinstance(message, dict) and message.get("message"):
        return str(message["message"])
    return None
