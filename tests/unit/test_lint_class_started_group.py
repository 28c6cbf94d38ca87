"""DDP008 in an entry script whose process group is started by a class of the program (its `__init__` calls
init_process_group), and through a logger the caller hands to such a class."""

from __future__ import annotations

from ddpkit.lint import lint_sources

_MODEL = '''import os

import torch
import torch.distributed as dist
from torch import nn


class Runner:
    def __init__(self, logger, local_rank=-1):
        self.logger = logger
        if local_rank != -1:
            torch.cuda.set_device(local_rank)
            dist.init_process_group(backend="nccl")
        self.model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1).cuda())

    def fit(self, data):
        for x in data:
            self.model(x).sum().backward()
        self.logger.info("finished training")
'''

_TRAIN = '''import argparse
import logging

import torch

from runner import Runner


def main(logger, args):
    logger.info("batch size %d", args.batch_size)
    runner = Runner(logger, args.local_rank)
    runner.fit([torch.randn(8, 4)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--local_rank", type=int, default=-1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    logger = LOGGER
    main(logger, args)
'''


def _found(logger: str) -> list[tuple[str, int]]:
    sources = {"train.py": _TRAIN.replace("LOGGER", logger), "runner.py": _MODEL}
    return sorted((f.path, f.line) for f in lint_sources(sources) if f.rule == "DDP008")


def test_a_script_whose_group_a_class_of_the_program_starts_runs_on_every_rank():
    """`Runner(logger, args.local_rank)` runs init_process_group in its own `__init__`: train.py, which names
    nothing of torch.distributed, runs on every rank, so its `logger.info` (INFO shown by basicConfig on every rank)
    repeats world_size times; and `self.logger`, which every construction fills with the caller's parameter that
    every call of main fills with `logging.getLogger(...)`, is that logger too."""
    assert _found("logging.getLogger(__name__)") == [("runner.py", 19), ("train.py", 10)]


def test_a_handed_object_of_unknown_make_is_not_taken_for_a_logger():
    """The same program handing main an object of unknown make: `logger.info` is its method, not logging's."""
    assert _found("Recorder()") == []
