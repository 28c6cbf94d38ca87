"""DDP008 and the logging model: which ranks' log lines reach a console, following levels chosen by the rank
(also through a variable assigned under a rank check), propagation to the root logger, and set-up helpers."""

from __future__ import annotations

import pytest

from ddpkit.lint import lint_sources

_HEAD = """
import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
"""

_TAIL = """
model = DDP(nn.Linear(4, 1))
for step in range(10):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    log.info("finished step %d", step)
dist.destroy_process_group()
"""

SILENCED_ON_OTHER_RANKS = {
    "level assigned under a rank check": """
verbosity = logging.INFO
if dist.is_initialized() and not dist.get_rank() == 0:
    verbosity = logging.ERROR
logging.basicConfig(level=verbosity, format="%(message)s")
log = logging.getLogger()
""",
    "level chosen in the other order": """
lvl = logging.WARNING
if rank == 0:
    lvl = logging.INFO
logging.basicConfig(level=lvl)
log = logging.getLogger("train")
""",
    "level chosen in the call": """
logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARN)
log = logging.getLogger(__name__)
""",
    "named logger's level chosen by the rank": """
logging.basicConfig(level=logging.INFO)
log = logging.getLogger("train")
log.setLevel(logging.INFO if rank == 0 else logging.ERROR)
""",
    "root console on rank 0 only": """
root = logging.getLogger()
root.setLevel(logging.INFO)
if rank == 0:
    root.addHandler(logging.StreamHandler())
log = logging.getLogger("train")
""",
    "the console handler's level raised on the other ranks": """
root = logging.getLogger()
root.setLevel(logging.INFO)
console = logging.StreamHandler()
root.addHandler(console)
if rank != 0:
    console.setLevel(logging.WARNING)
log = logging.getLogger("train")
""",
    "logging disabled on the others": """
logging.basicConfig(level=logging.INFO)
if rank != 0:
    logging.disable(logging.CRITICAL)
log = logging.getLogger("train")
""",
}

SHOWN_ON_EVERY_RANK = {
    "named logger's handler on rank 0, root console everywhere": """
logging.basicConfig(level=logging.INFO)
log = logging.getLogger("train")
if rank == 0:
    log.addHandler(logging.FileHandler("train.log"))
""",
    "named logger's level set on rank 0 only": """
logging.basicConfig(level=logging.DEBUG)
log = logging.getLogger("train")
if rank == 0:
    log.setLevel(logging.INFO)
""",
    "the root given a file handler on rank 0, its console everywhere": """
logging.basicConfig(level=logging.INFO)
if rank == 0:
    logging.getLogger().addHandler(logging.FileHandler("train.log"))
log = logging.getLogger()
""",
    "a helper that only adds a file handler, called on rank 0, root console everywhere": """
def log_to_file(path, name=None):
    if name is not None:
        lg = logging.getLogger(name)
    else:
        lg = logging.getLogger()
    fh = logging.FileHandler(path)
    fh.setLevel(logging.INFO)
    lg.addHandler(fh)


logging.basicConfig(level=logging.INFO)
if rank == 0:
    log_to_file("train.log")
log = logging
""",
    "a logger fetched under a rank check configures nothing": """
logging.basicConfig(level=logging.INFO)
log = logging.getLogger("train")
if rank == 0:
    other = logging.getLogger("val")
""",
}


@pytest.mark.parametrize("setup", SILENCED_ON_OTHER_RANKS.values(), ids=SILENCED_ON_OTHER_RANKS)
def test_logging_silenced_on_the_other_ranks_is_not_repeated_output(setup):
    assert [f for f in lint_sources({"train.py": _HEAD + setup + _TAIL}) if f.rule == "DDP008"] == []


@pytest.mark.parametrize("setup", SHOWN_ON_EVERY_RANK.values(), ids=SHOWN_ON_EVERY_RANK)
def test_a_logger_that_reaches_the_root_console_on_every_rank_repeats(setup):
    found = [f for f in lint_sources({"train.py": _HEAD + setup + _TAIL}) if f.rule == "DDP008"]
    assert [f.line for f in found] == [(_HEAD + setup + _TAIL).splitlines().index(
        '    log.info("finished step %d", step)') + 1]


def test_a_helper_that_gives_the_root_a_console_only_when_asked():
    """`make_logger(None, console=True)` gives the root a console on every rank; without `console=True` it adds a
    file handler alone, and then the rank-0-only set-up of the "train" logger is all that shows its lines."""
    helper = '''
import logging


def make_logger(name, path, console=False):
    lg = logging.getLogger(name)
    lg.setLevel(logging.INFO)
    lg.addHandler(logging.FileHandler(path))
    if console:
        lg.addHandler(logging.StreamHandler())
'''
    def train(console: str) -> str:
        return _HEAD + f'''
from logsetup import make_logger

make_logger(None, "all.log"{console})
if rank == 0:
    make_logger("train", "train.log")
log = logging.getLogger("train")
''' + _TAIL
    shown = lint_sources({"logsetup.py": helper, "train.py": train(", console=True")})
    assert [f.rule for f in shown if f.path == "train.py"] == ["DDP008"]
    quiet = lint_sources({"logsetup.py": helper, "train.py": train("")})
    assert [f.rule for f in quiet if f.path == "train.py"] == []


def test_a_logger_named_by_the_rank_is_the_process_own():
    setup = """
log = logging.getLogger("worker_{}".format(rank))
log.propagate = False
log.addHandler(logging.StreamHandler())
log.setLevel(logging.INFO)
"""
    assert [f for f in lint_sources({"train.py": _HEAD + setup + _TAIL}) if f.rule == "DDP008"] == []


def test_propagation_switched_by_the_rank():
    setup = """
logging.basicConfig(level=logging.INFO)
log = logging.getLogger("train")
log.propagate = rank == 0
"""
    assert [f for f in lint_sources({"train.py": _HEAD + setup + _TAIL}) if f.rule == "DDP008"] == []


_IMPORT_TIME_CONFIG = '''
import logging

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

logging.basicConfig(level=logging.INFO)
log = logging.getLogger(__name__)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING{force})
    model = DDP(nn.Linear(4, 1))
    for step in range(10):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        log.info("finished step %d", step)


if __name__ == "__main__":
    main()
'''


def test_a_per_rank_basic_config_after_one_made_at_import_changes_nothing():
    """basicConfig does nothing once the root logger has a handler: the module's own call at import gave it one, so
    the later level chosen by the rank is never set and every rank shows the INFO lines. With force=True it is."""
    unheard = _IMPORT_TIME_CONFIG.format(force="")
    found = [f for f in lint_sources({"train.py": unheard}) if f.rule == "DDP008"]
    assert [f.line for f in found] == [unheard.splitlines().index('        log.info("finished step %d", step)') + 1]
    forced = _IMPORT_TIME_CONFIG.format(force=", force=True")
    assert [f for f in lint_sources({"train.py": forced}) if f.rule == "DDP008"] == []


@pytest.mark.parametrize("level, reported", [("logging.DEBUG", True), ("logging.INFO", False)])
def test_debug_lines_repeat_where_the_program_shows_debug(level, reported):
    """`logging.debug` lines are the program's log where its every basicConfig asks for DEBUG; at INFO they are
    not shown at all."""
    setup = f'logging.basicConfig(filename="run.log", level={level})\n'
    source = _HEAD.replace('dist.init_process_group("gloo")', setup + 'dist.init_process_group("gloo")') + '''
model = DDP(nn.Linear(4, 1))
for step in range(10):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    logging.debug("finished step %d", step)
'''
    found = [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP008"]
    assert found == ([source.splitlines().index('    logging.debug("finished step %d", step)') + 1] if reported else [])
