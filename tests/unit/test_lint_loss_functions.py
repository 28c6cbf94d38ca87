"""DDP006 is not reported for a name like a loss that holds loss functions (`self.loss = [nn.CrossEntropyLoss()]`):
printed on rank 0, it shows the modules, not this rank's loss."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAINER = """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    class Trainer:
        def __init__(self, rank):
            self.rank = rank
            data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
            self.sampler = DistributedSampler(data)
            self.loader = DataLoader(data, batch_size=8, sampler=self.sampler)
            self.model = DDP(nn.Linear(4, 1))
            self.loss = []
            self.loss.append(nn.MSELoss())
            self.loss.append(nn.L1Loss())
            if self.rank == 0:
                print(self.loss)
                print(self.loss_func)

        def loss_func(self, out, y):
            return sum(f(out, y) for f in self.loss)

        def fit(self, epochs):
            for epoch in range(epochs):
                self.sampler.set_epoch(epoch)
                for x, y in self.loader:
                    out = self.model(x)
                    total = self.loss_func(out, y)
                    total.backward()


    dist.init_process_group("gloo")
    Trainer(dist.get_rank()).fit(2)
    dist.destroy_process_group()
"""


def _ddp006(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": textwrap.dedent(source)}) if f.rule == "DDP006"]


def test_a_list_of_loss_functions_printed_on_rank_zero_is_no_loss_figure():
    assert _ddp006(_TRAINER) == []
    assert _ddp006(_TRAINER.replace("self.loss = []\n            self.loss.append(nn.MSELoss())\n"
                                    "            self.loss.append(nn.L1Loss())",
                                    "self.loss = [nn.MSELoss(), nn.L1Loss()]")) == []
    assert _ddp006(_TRAINER.replace("                print(self.loss)\n", "")) == []  # the method itself


def test_a_loss_value_printed_on_rank_zero_is_still_reported():
    shown = _TRAINER.replace("                    total.backward()\n",
                             "                    total.backward()\n"
                             "                if self.rank == 0:\n"
                             "                    print(total.item())\n")
    assert _ddp006(shown) == [35]


_FACTORY = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from losses import get_loss_fn


    def fit(model, loss_fn):
        for step in range(3):
            x = torch.randn(8, 4)
            loss_fn(model(x), torch.zeros(8, 1)).backward()


    def train(rank):
        model = DDP(torch.nn.Linear(4, 1))
        loss_tr = get_loss_fn("mse")
        if rank == 0:
            print("train loss:", loss_tr)
        fit(model, loss_tr)


    dist.init_process_group("gloo")
    train(dist.get_rank())
    dist.destroy_process_group()
"""


def test_a_loss_function_made_by_a_factory_named_for_one_is_no_figure():
    assert _ddp006(_FACTORY) == []


def test_a_loss_computed_by_calling_the_loss_function_is_still_a_figure():
    computed = _FACTORY.replace('            print("train loss:", loss_tr)\n',
                                '            loss = loss_tr(model(torch.randn(8, 4)), torch.zeros(8, 1))\n'
                                '            print("train loss:", loss.item())\n')
    assert _ddp006(computed) == [20]
