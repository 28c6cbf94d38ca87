"""PyTorch's NCCL flight recorder for hang reports: turn it on for the ranks, and summarise one rank's buffer.

The recorder is torch's own ring buffer of the collectives each NCCL process group issued, with
their state (scheduled, started, completed): it sees what Python never calls, such as DDP's bucket
all-reduces issued from C++. Its switches are torch's environment variables, read when a process
group is created, so they are set in the rank's own process before `init_process_group`.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Any

__all__ = ["recorder_env", "enable", "summarize_record", "read_summary", "BUFFER_ENTRIES", "oldest_unfinished",
           "read_oldest_unfinished"]

BUFFER_ENTRIES = 2000
"""Collectives the recorder keeps per process; torch's own default is the same (2000 from 2.11 to 2.15, the
recorder on), set explicitly so hang reports do not depend on a release's default."""


def recorder_env(dump_dir: str | None = None) -> dict[str, str]:
    """torch's variables that turn the recorder on (old and new names), dumping to `dump_dir` on an NCCL timeout."""
    env = {"TORCH_FR_BUFFER_SIZE": str(BUFFER_ENTRIES), "TORCH_NCCL_TRACE_BUFFER_SIZE": str(BUFFER_ENTRIES),
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    if dump_dir is not None:
        prefix = os.path.join(dump_dir, "nccl-trace-rank-")
        env.update({"TORCH_FR_DUMP_TEMP_FILE": prefix, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix})
    return env


def enable(dump_dir: str | None = None, environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the recorder's variables in this process unless the user set them; returns the ones set."""
    environ = os.environ if environ is None else environ
    added = {k: v for k, v in recorder_env(dump_dir).items() if k not in environ}
    environ.update(added)
    return added


def _op(entry: dict[str, Any]) -> str:
    name = str(entry.get("profiling_name") or "?")
    return name.split(":", 1)[1] if ":" in name else name


def summarize_record(record: dict[str, Any] | None) -> dict[str, Any] | None:
    """One rank's view from its buffer: the last completed collective and the first one not completed."""
    if not record:
        return None
    entries = [e for e in record.get("entries", []) if isinstance(e, dict) and not e.get("is_p2p")]
    done = [e for e in entries if e.get("state") == "completed"]
    pending = [e for e in entries if e.get("state") != "completed"]
    first = min(pending, key=lambda e: e.get("collective_seq_id", 0)) if pending else None
    last = max(done, key=lambda e: e.get("collective_seq_id", 0)) if done else None
    out: dict[str, Any] = {
        "entries": len(entries),
        "last_completed": None if last is None else {"op": _op(last), "seq": last.get("collective_seq_id")},
        "first_pending": None if first is None else {
            "op": _op(first), "seq": first.get("collective_seq_id"), "state": first.get("state"),
            "sizes": first.get("input_sizes"), "process_group": first.get("process_group")},
    }
    if first is not None:
        out["line"] = f"{_op(first)} #{first.get('collective_seq_id')} {first.get('state')}, sizes {first.get('input_sizes')}"
    elif last is not None:
        out["line"] = f"all {len(done)} recorded collectives completed (last {_op(last)} #{last.get('collective_seq_id')})"
    else:
        out["line"] = "no collectives recorded"
    if last is not None and first is not None:
        out["line"] += f" (last completed #{last.get('collective_seq_id')})"
    return out


def read_summary() -> dict[str, Any] | None:
    """`summarize_record` of this process's buffer now; None without NCCL or with the recorder off."""
    from ddpkit.torchinternals import nccl_flight_record

    try:
        return summarize_record(nccl_flight_record())
    except Exception:  # a report must still be written when the recorder cannot be read
        return None


_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}
"""The recorder's dtype names (c10's) as the tracer writes them (torch's)."""


def oldest_unfinished(records: list[dict[str, Any]], now_ns: int) -> dict[str, Any] | None:
    """The oldest collective in the recorders' `records` that has not finished (neither completed nor
    retired; point-to-point sends and receives left out, as in `summarize_record`), as {"op",
    "shapes", "seq", "process_group", "waiting_s"}; None when all finished.

    This sees what Python never issues: DDP's gradient all-reduces (its C++ reducer) and FSDP2's
    all-gathers and reduce-scatters. Age is from the entry's creation time (`time_created_ns`, torch's
    CLOCK_REALTIME) to `now_ns` (time.time_ns()).
    """
    pending = [e for r in records for e in (r.get("entries") or [])
               if isinstance(e, dict) and not e.get("is_p2p") and e.get("state") != "completed"
               and not e.get("retired") and isinstance(e.get("time_created_ns"), int)]
    if not pending:
        return None
    first = min(pending, key=lambda e: e["time_created_ns"])
    dtypes = [_DTYPES.get(str(d), str(d).lower()) for d in first.get("input_dtypes") or []]
    shapes = [f"{dtypes[i] if i < len(dtypes) else '?'}{list(size)}"
              for i, size in enumerate(first.get("input_sizes") or [])]
    return {"op": _op(first), "shapes": shapes, "seq": first.get("collective_seq_id"),
            "process_group": first.get("process_group"),
            "waiting_s": round(max(0, now_ns - first["time_created_ns"]) / 1e9, 1)}


def read_oldest_unfinished() -> dict[str, Any] | None:
    """`oldest_unfinished` of this process's recorders now; None with the recorder off or unreadable."""
    import time

    from ddpkit.torchinternals import flight_records

    try:
        return oldest_unfinished(flight_records(), time.time_ns())
    except Exception:  # a hang report must still be written when the recorder cannot be read
        return None
