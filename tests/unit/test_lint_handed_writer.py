"""DDP008: a SummaryWriter every rank makes and hands to a function of the program that records into it."""

from __future__ import annotations

from ddpkit.lint import lint_sources

_TRAIN = '''import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.tensorboard import SummaryWriter

from engine import fit


def main():
    dist.init_process_group("gloo")
    writer = SummaryWriter("runs/exp")
    model = DDP(nn.Linear(4, 1))
    fit(model, [torch.randn(8, 4)], writer)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''

_ENGINE = '''def log(logger, step, loss):
    logger.add_scalar("loss", loss, step)


def fit(model, data, writer):
    for step, x in enumerate(data):
        loss = model(x).pow(2).mean()
        loss.backward()
        RECORD
'''


def _found(record: str) -> list[tuple[str, int]]:
    sources = {"train.py": _TRAIN, "engine.py": _ENGINE.replace("RECORD", record)}
    return [(f.path, f.line) for f in lint_sources(sources) if f.rule == "DDP008"]


def test_a_writer_handed_to_a_function_that_records_into_it_is_reported_where_it_is_made():
    """`fit(model, data, writer)` records through its parameter (`writer.add_scalar`), or hands it on to `log`,
    which does: every rank's writer gets the same tags, reported once, at the SummaryWriter."""
    assert _found('writer.add_scalar("loss", loss.item(), step)') == [("train.py", 12)]
    assert _found("log(writer, step, loss.item())") == [("train.py", 12)]


def test_a_handed_writer_recorded_into_under_a_rank_check_is_not_reported():
    """The function records only under `if dist.get_rank() == 0:`: one rank writes, nothing to report."""
    assert _found('if dist.get_rank() == 0: writer.add_scalar("loss", loss.item(), step)') == []
