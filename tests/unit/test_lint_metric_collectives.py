"""DDP010 for a torchmetrics metric's compute() on rank 0 alone: it all-gathers every rank's state (sync_on_compute
is on by default), so it is a collective, also reached through a function the metric is handed to."""

from __future__ import annotations

from ddpkit.lint import lint_sources

_PROGRAM = '''import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torchmetrics.classification import MulticlassAccuracy

from net import Net


def evaluate(model, loader, metric):
    metric.reset()
    with torch.no_grad():
        for x, y in loader:
            metric.update(model(x.cuda()), y.cuda())
    return metric.compute().item()


def main(loader, test_loader):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = DDP(Net().cuda(), device_ids=[local_rank])
    metric = MulticlassAccuracy(num_classes=10).to(local_rank)
    for step, (x, y) in enumerate(loader):
        metric.update(model(x.cuda()), y.cuda())
        if step % 100 == 0 and rank == 0:
            print("acc", metric.compute().item())
    if rank == 0:
        print("test", evaluate(model, test_loader, metric))
    dist.destroy_process_group()
'''


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP010"]


def test_compute_on_rank_zero_directly_or_through_a_function_is_a_collective_the_others_skip():
    assert _lines(_PROGRAM) == [29, 31]


def test_a_metric_whose_sync_is_off_or_computed_on_every_rank_is_no_finding():
    off = _PROGRAM.replace("MulticlassAccuracy(num_classes=10)", "MulticlassAccuracy(num_classes=10, sync_on_compute=False)")
    assert _lines(off) == []
    every = _PROGRAM.replace('        if step % 100 == 0 and rank == 0:\n            print("acc", metric.compute().item())\n',
                             '        acc = metric.compute().item()\n').replace(
        '    if rank == 0:\n        print("test", evaluate(model, test_loader, metric))\n',
        '    acc = evaluate(model, test_loader, metric)\n')
    assert _lines(every) == []
