"""DDP008 through loggers the linter used to lose on the way: a root logger handed to a project object that keeps it
(`self.logger = logger`), and the logging module bound to another name (`logger = logging`)."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS, check_program


def _lines(name: str, edits: dict[str, tuple[str, str]]) -> list[tuple[str, int]]:
    sources = {}
    for path in sorted((PROGRAMS / name).glob("*.py")):
        old, new = edits.get(path.name, ("", ""))
        sources[path.name] = path.read_text().replace(old, new)
    return [(f.path, f.line) for f in lint_sources(sources) if f.rule == "DDP008"]


def test_a_root_logger_kept_by_a_project_object_logs_on_every_rank():
    check_program("handed_logger")


def test_an_object_handed_something_else_or_a_rank_chosen_level_is_no_finding():
    assert _lines("handed_logger", {"train.py": ("StepScheduler(optimizer, logger)",
                                                 "StepScheduler(optimizer, print_fn)")}) == []
    ranked = ("level=logging.INFO)", "level=logging.INFO if dist.get_rank() == 0 else logging.WARNING)")
    assert _lines("handed_logger", {"train.py": ranked}) == []


def test_the_logging_module_under_another_name_logs_on_every_rank():
    check_program("logging_alias")


def test_a_name_also_bound_to_something_else_than_a_logger_is_no_finding():
    rebound = ("logger = logging\n", "logger = logging\nif torch.cuda.device_count() > 8:\n    logger = None\n")
    assert _lines("logging_alias", {"ckpt.py": rebound}) == []
