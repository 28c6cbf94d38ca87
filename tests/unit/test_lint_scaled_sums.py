"""Figures reported at the wrong scale or from one rank (DDP006): the training loss all-reduced with SUM and never
divided, a sum divided by the GPU count of one machine, a loss logged where only rank 0 shows INFO lines."""

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


def test_a_running_loss_logged_where_only_rank_0_shows_info_lines_is_rank_0s_own():
    """`basicConfig(level=INFO if local_rank in (-1, 0) else WARN)`: a `logger.info` of the running loss, with no
    rank check of its own, shows rank 0's loss alone as the run's (DDP006)."""
    check_program("rank_levelled_loss")


def test_a_running_loss_logged_where_every_rank_shows_info_lines_is_left_to_ddp008():
    source = (PROGRAMS / "rank_levelled_loss" / "train.py").read_text()
    source = source.replace("logging.INFO if local_rank in (-1, 0) else logging.WARN", "logging.INFO")
    assert _lines(source) == []


def test_a_device_count_the_program_passes_as_the_world_size_is_the_world_size():
    """The program starts one process per GPU it counts and tells init_process_group so (`world_size=args.nprocs`):
    dividing by that count is dividing by the world size."""
    source = (PROGRAMS / "scaled_sums" / "train.py").read_text()
    fixed = source.replace('dist.init_process_group("nccl")',
                           'dist.init_process_group("nccl", rank=local_rank, world_size=args.nprocs)')
    assert _lines(fixed) == [37]
