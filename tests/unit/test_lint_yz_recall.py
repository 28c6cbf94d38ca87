"""Mistakes the linter used to miss on every rank: tensors placed by the global rank, output of project helpers,
identical seeds."""

from __future__ import annotations

from lint_markers import check_program as _check


def test_tensors_placed_on_the_gpu_numbered_by_the_global_rank():
    """`.to(dist.get_rank())`, `.cuda(dist.get_rank())` and `device=dist.get_rank()` index the node's GPUs by the
    global rank, as `set_device(rank)` does (DDP012)."""
    _check("global_rank_placement")
