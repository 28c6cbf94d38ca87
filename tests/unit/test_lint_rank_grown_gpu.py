"""DDP012 for a GPU index grown from the global rank (`range(rank * n, ...)`), reported where the global rank is
stored for it when that is another function (`args.local_rank = dist.get_rank()`)."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS, check_program

_SOURCE = (PROGRAMS / "rank_range_gpus" / "train.py").read_text()


def _ddp012(old: str, new: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": _SOURCE.replace(old, new)}) if f.rule == "DDP012"]


def test_a_gpu_range_started_at_the_global_rank_is_reported_where_that_rank_is_stored():
    check_program("rank_range_gpus")


def test_an_index_wrapped_into_the_nodes_gpus_or_built_from_the_local_rank_is_no_finding():
    assert _ddp012("args.local_rank * per_process, (args.local_rank + 1) * per_process",
                   "args.local_rank % torch.cuda.device_count(), args.local_rank % torch.cuda.device_count() + 1") == []
    assert _ddp012("dist.get_rank()", 'int(os.environ["LOCAL_RANK"])').count(24) == 0


def test_the_store_in_the_same_function_is_reported_at_the_index():
    inline = _SOURCE.replace("    args.local_rank = dist.get_rank()  # lint-expect: DDP012 error\n", "").replace(
        "    per_process =", "    args.local_rank = dist.get_rank()\n    per_process =")
    assert [f.line for f in lint_sources({"train.py": inline}) if f.rule == "DDP012"] == [15, 16]
