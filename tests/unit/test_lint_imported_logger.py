"""Output on every rank the linter used to take as silenced (DDP008): a logger imported from the project's own
module, a library's logger quietened per rank taken for the program's set-up, progress bars `disable`d only by a
flag the run does not pass or by `False`, a project progress bar that writes sys.stdout itself."""

from __future__ import annotations

from ddpkit.lint import lint_sources

from lint_markers import PROGRAMS, check_program


def _lines(train: str) -> list[int]:
    common = (PROGRAMS / "imported_logger" / "common.py").read_text()
    return [f.line for f in lint_sources({"train.py": train, "common.py": common}) if f.rule == "DDP008"]


def test_output_on_every_rank_through_an_imported_logger_and_flag_disabled_bars_is_reported():
    check_program("imported_logger")


def test_the_programs_own_logger_set_up_by_the_rank_silences_its_lines():
    source = (PROGRAMS / "imported_logger" / "train.py").read_text()
    source = source.replace('logging.getLogger("transformers.modeling_utils").setLevel(logging.WARN)',
                            "logging.getLogger().setLevel(logging.WARN)")
    assert _lines(source) == [29, 31, 36]


def test_a_bar_disabled_by_the_rank_or_a_flag_on_by_default_is_not_reported():
    source = (PROGRAMS / "imported_logger" / "train.py").read_text()
    source = source.replace("disable=False", "disable=local_rank != 0").replace(
        'action="store_true"', 'action="store_true", default=True')
    assert _lines(source) == [28, 36]


def test_a_project_bar_built_and_called_under_a_rank_check_is_not_reported():
    source = (PROGRAMS / "imported_logger" / "train.py").read_text()
    source = source.replace("        bar(step)  # lint-expect: DDP008 warning\n",
                            "        if local_rank == 0:\n            bar(step)\n")
    assert _lines(source) == [28, 29, 31]


_ENGINE = '''def fit(model, data, logger, epochs=3):
    logger.info("start training")
    for epoch in range(epochs):
        for x in data:
            model(x).pow(2).mean().backward()
'''

_HANDING = '''import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from engine import fit


def make_logger(name):
    log = logging.getLogger(name)
    log.setLevel(logging.INFO)
    log.addHandler(logging.StreamHandler())
    return log


def main():
    dist.init_process_group("gloo")
    logger = LOGGER
    model = DDP(nn.Linear(4, 1))
    fit(model, [torch.randn(8, 4)], logger)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def test_a_logger_handed_to_a_function_of_another_file_logs_on_every_rank():
    """`fit(model, data, logger)` where every call hands it a logger the caller made (`make_logger("train")`, set up
    the same on every rank): `logger.info` in engine.py repeats on every rank. A parameter some call fills with
    something else (an object of unknown make) is not taken for a logger."""
    def found(logger: str) -> list[tuple[str, int]]:
        train = _HANDING.replace("LOGGER", logger)
        return [(f.path, f.line) for f in lint_sources({"train.py": train, "engine.py": _ENGINE}) if f.rule == "DDP008"]

    assert found('make_logger("train")') == [("engine.py", 2)]
    assert found("Recorder()") == []


def test_a_logger_handed_on_through_a_dispatching_function_is_still_that_logger():
    """`run(model, data, logger)` hands its own `logger` parameter on to `fit(...)`: every call of `run` fills it
    with a logger the caller made, so `fit`'s line repeats on every rank."""
    engine = _ENGINE + """

def run(model, data, logger):
    fit(model, data, logger)
"""
    train = _HANDING.replace("LOGGER", 'make_logger("train")').replace("from engine import fit", "from engine import run")
    train = train.replace("    fit(model, [torch.randn(8, 4)], logger)", "    run(model, [torch.randn(8, 4)], logger)")
    found = [(f.path, f.line) for f in lint_sources({"train.py": train, "engine.py": engine}) if f.rule == "DDP008"]
    assert found == [("engine.py", 2)]
