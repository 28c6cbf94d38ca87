"""The benchmark report's arithmetic: per-run summaries, medians and spreads, ratios, tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from stats import aggregate, format_table, ratio, spread_pct, summarise_run  # noqa: E402


def _record(rank, steps, **kw):
    base = {"rank": rank, "step_s": steps, "samples_per_step": 128, "start_to_first_step_s": 3.0,
            "launch_to_first_step_s": 4.0, "peak_rss_mb": 400.0, "import_s": 1.5, "final_loss": 2.0}
    return {**base, **kw}


def test_summarise_run_uses_rank0_clock_and_worst_rank_for_start_and_memory():
    records = [
        _record(1, [9.0, 9.0, 9.0], start_to_first_step_s=5.0, peak_rss_mb=450.0, final_loss=3.0),
        _record(0, [0.04, 0.05, 0.10]),
    ]
    s = summarise_run(records)
    assert s["step_ms"] == pytest.approx(50.0)  # median of rank 0's steps, not rank 1's
    assert s["samples_per_s"] == pytest.approx(128 / 0.05)
    assert s["start_s"] == 5.0 and s["peak_rss_mb"] == 450.0
    assert s["final_loss"] == pytest.approx(2.5)
    assert s["launch_s"] == 4.0


def test_summarise_run_refuses_empty_input():
    with pytest.raises(ValueError, match="at least one rank"):
        summarise_run([])
    with pytest.raises(ValueError, match="--steps"):
        summarise_run([_record(0, [])])


def test_spread_and_aggregate():
    assert spread_pct([10.0]) == 0.0
    assert spread_pct([9.0, 10.0, 11.0]) == pytest.approx(10.0)
    runs = [{"step_ms": v, "launch_s": None} for v in (30.0, 40.0, 35.0)]
    agg = aggregate(runs)
    assert agg["repeats"] == 3
    assert agg["step_ms"] == 35.0
    assert agg["step_ms_spread_pct"] == pytest.approx(50.0 * 10 / 35)
    assert agg["launch_s"] is None  # missing everywhere: no figure, not a zero


def test_ratio_handles_missing_values():
    assert ratio(38.0, 40.0) == pytest.approx(0.95)
    assert ratio(None, 40.0) is None and ratio(1.0, None) is None and ratio(1.0, 0.0) is None


def test_format_table_aligns_and_prints_missing_as_dash():
    text = format_table(["name", "ms"], [["a", "1.0"], ["longer", None]])
    lines = text.splitlines()
    assert lines[0] == "| name   | ms  |"
    assert lines[1] == "| ------ | --- |"
    assert lines[3] == "| longer | -   |"
    assert len({len(line) for line in lines}) == 1
