"""Rank checks written with the single-process case first (`if not distributed or rank == 0:`): in a distributed
run they pass on rank 0 alone (DDP010)."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS, check_program


def test_a_break_under_not_distributed_or_rank_0_leaves_the_loop_on_rank_0_alone():
    check_program("rank0_early_stop")


def test_a_break_under_a_test_every_rank_passes_is_not_reported():
    source = (PROGRAMS / "rank0_early_stop" / "train.py").read_text()
    source = source.replace("if not distributed or rank == 0:", "if not distributed or epoch > 0:")
    assert [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP010"] == []
