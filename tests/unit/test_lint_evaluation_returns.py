"""DDP006 for a figure an evaluation method returns over this rank's shard (`valid_rmse = self._eval()`), printed by
every rank as the run's: it is an evaluation's figure, as the figures of that method's own loop are."""

from __future__ import annotations

from ddpkit.lint import lint_sources

_PROGRAM = '''import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from data import make_sets
from net import Net


class Trainer:
    def __init__(self, model, rank, train_loader, valid_loader):
        self.model = DDP(model, device_ids=[rank])
        self.optimizer = torch.optim.Adam(self.model.parameters())
        self.train_loader = train_loader
        self.valid_loader = valid_loader

    def train(self, epochs):
        for epoch in range(epochs):
            self.train_loader.sampler.set_epoch(epoch)
            self._train()
            valid_rmse = self._eval()
            print(f"{epoch} epoch | Valid RMSE: {valid_rmse:.4f}")

    def _train(self):
        for x, y in self.train_loader:
            loss = torch.nn.functional.mse_loss(self.model(x.cuda()), y.cuda())
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()

    def _eval(self):
        total, count = 0.0, 0
        with torch.no_grad():
            for x, y in self.valid_loader:
                total += torch.nn.functional.mse_loss(self.model(x.cuda()), y.cuda(), reduction="sum").item()
                count += len(x)
        return (total / count) ** 0.5


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    train_set, valid_set = make_sets()
    train_loader = DataLoader(train_set, batch_size=32, sampler=DistributedSampler(train_set))
    valid_loader = DataLoader(valid_set, batch_size=32, sampler=DistributedSampler(valid_set, shuffle=False,
                                                                                    drop_last=True))
    Trainer(Net().cuda(), rank, train_loader, valid_loader).train(10)
    dist.destroy_process_group()
'''


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP006"]


def test_an_evaluation_methods_shard_figure_printed_by_every_rank_is_reported():
    assert _lines(_PROGRAM) == [25]


def test_the_same_figure_reduced_first_is_no_finding():
    reduced = _PROGRAM.replace("        return (total / count) ** 0.5\n",
                               "        both = torch.tensor([total, count], device='cuda')\n"
                               "        dist.all_reduce(both)\n"
                               "        return (both[0] / both[1]).item() ** 0.5\n")
    assert _lines(reduced) == []
