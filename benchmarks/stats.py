"""Pure figures for the benchmark report: per-run summaries, medians and spreads, ratios, the table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["summarise_run", "aggregate", "ratio", "spread_pct", "format_table", "FIGURES"]

FIGURES = ("step_ms", "samples_per_s", "start_s", "launch_s", "peak_rss_mb", "import_s", "final_loss")
"""The figures of one run; `aggregate` gives each one's median over repeats and its spread."""


def summarise_run(records: Sequence[dict]) -> dict:
    """One run's figures from its ranks' records (ranks step in lockstep: rank 0's clock is used)."""
    if not records:
        raise ValueError("summarise_run needs the record of at least one rank")
    by_rank = sorted(records, key=lambda r: r["rank"])
    steps = by_rank[0]["step_s"]
    if not steps:
        raise ValueError("rank 0 timed no step: raise --steps above --warmup")
    step_s = statistics.median(steps)
    launch = [r["launch_to_first_step_s"] for r in by_rank if r.get("launch_to_first_step_s") is not None]
    return {
        "step_ms": 1000.0 * step_s,
        "samples_per_s": by_rank[0]["samples_per_step"] / step_s,
        "start_s": max(r["start_to_first_step_s"] for r in by_rank),
        "launch_s": max(launch) if launch else None,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in by_rank),
        "import_s": by_rank[0]["import_s"],
        "final_loss": statistics.fmean(r["final_loss"] for r in by_rank),
    }


def spread_pct(values: Sequence[float]) -> float:
    """Half the range of `values` as a percentage of their median (0 for a single value)."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return 0.0 if mid == 0 else 50.0 * (max(values) - min(values)) / abs(mid)


def aggregate(runs: Sequence[dict]) -> dict:
    """Median and spread of each figure over the repeats of one configuration (None values ignored)."""
    out: dict = {"repeats": len(runs)}
    for name in FIGURES:
        values = [r[name] for r in runs if r.get(name) is not None]
        out[name] = statistics.median(values) if values else None
        out[name + "_spread_pct"] = spread_pct(values) if values else None
    return out


def ratio(value: float | None, baseline: float | None) -> float | None:
    """value / baseline, or None when either is missing or the baseline is zero."""
    if value is None or baseline is None or baseline == 0:
        return None
    return value / baseline


def format_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-markdown table; numbers are already formatted by the caller, None prints as '-'."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in cells)])
