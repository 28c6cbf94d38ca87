"""DDP001 where set_epoch is called but cannot take effect: the loader over the shuffling DistributedSampler is
materialised once with list(...), so its order is drawn when the list is built (AG+AH round)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    class Trainer:
        def __init__(self, epochs):
            self.epochs = epochs
            data = TensorDataset(torch.randn(64, 4))
            self.sampler = DistributedSampler(data)
            self.batches = list(DataLoader(data, batch_size=8, sampler=self.sampler))

        def train(self, model):
            for epoch in range(self.epochs):
                self.sampler.set_epoch(epoch)
                for (x,) in self.batches:
                    model(x).sum().backward()


    def main():
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        Trainer(3).train(model)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
""")


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP001"]


def test_a_loader_materialised_once_makes_set_epoch_reorder_nothing():
    assert _lines(_TRAIN) == [12]


def test_a_loader_iterated_anew_or_an_unshuffled_sampler_is_no_finding():
    assert _lines(_TRAIN.replace("list(DataLoader(", "(DataLoader(")) == []
    assert _lines(_TRAIN.replace("DistributedSampler(data)", "DistributedSampler(data, shuffle=False)")) == []
