"""Sums over the ranks reported at the wrong scale (DDP006): the training loss all-reduced with SUM and never
divided, a sum divided by the GPU count of one machine."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS, check_program


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP006"]


def test_a_summed_loss_and_a_sum_divided_by_the_device_count_are_reported():
    check_program("scaled_sums")


def test_a_summed_loss_divided_by_the_world_size_is_not_reported():
    source = (PROGRAMS / "scaled_sums" / "train.py").read_text()
    fixed = source.replace("        dist.all_reduce(reported)  # lint-expect: DDP006 warning\n",
                           "        dist.all_reduce(reported)\n        reported /= dist.get_world_size()\n")
    assert _lines(fixed) == [39]


def test_a_count_of_processes_stored_from_the_launcher_is_not_the_device_count():
    source = (PROGRAMS / "scaled_sums" / "train.py").read_text()
    fixed = source.replace("args.nprocs = torch.cuda.device_count()", "args.nprocs = int(os.environ['WORLD_SIZE'])")
    assert _lines(fixed) == [37]
