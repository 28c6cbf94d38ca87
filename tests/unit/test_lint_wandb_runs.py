"""DDP008 for `wandb.init` on every rank: each process opens its own run of the one job; a rank check, a `group=`
(deliberate per-rank runs) or a `mode=` (which may switch the other ranks off) is no finding."""

from __future__ import annotations

from ddpkit.lint import lint_sources

_PROGRAM = '''import os

import torch
import torch.distributed as dist
import wandb


def main(config):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if config["enable_wandb"]:
        run = wandb.init(project="demo", config=config)
    dist.destroy_process_group()
'''


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP008"]


def test_a_run_started_on_every_rank_is_reported_where_it_starts():
    assert _lines(_PROGRAM) == [13]


def test_a_run_started_on_rank_zero_grouped_or_with_a_mode_is_no_finding():
    assert _lines(_PROGRAM.replace('if config["enable_wandb"]:', 'if config["enable_wandb"] and rank == 0:')) == []
    assert _lines(_PROGRAM.replace("config=config)", "config=config, group='ddp')")) == []
    assert _lines(_PROGRAM.replace("config=config)", "config=config, mode=None if rank == 0 else 'disabled')")) == []


def test_a_run_started_in_a_logger_class_is_left_to_who_builds_it():
    """`WandbLogger(cfg) if rank == 0 else None`: the class's own method does not show the rank check of its
    construction, so no finding rests on it."""
    source = _PROGRAM.replace("def main(config):", "class Logger:\n    def __init__(self, config):\n"
                              "        self.run = wandb.init(project='demo', config=config)\n\n\ndef main(config):")
    source = source.replace('        run = wandb.init(project="demo", config=config)',
                            "        logger = Logger(config) if rank == 0 else None")
    assert _lines(source) == []
