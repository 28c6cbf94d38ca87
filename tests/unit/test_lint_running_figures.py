"""Rank 0's own losses kept as a running figure by a helper of the program and written by a writer only rank 0
holds (DDP006, reported in the helper)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAINER = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler
    from torch.utils.tensorboard import SummaryWriter


    class Trainer:
        def __init__(self, rank, with_critic):
            data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
            self.loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
            self.model = DDP(torch.nn.Linear(4, 1))
            self.step = 0
            self.summary = {}
            self.main_writer = None
            self.critic_writer = None
            if rank == 0:
                if with_critic:
                    self.critic_writer = SummaryWriter("runs/critic")
                self.main_writer = SummaryWriter("runs/main")

        def add_summary(self, writer, name, val):
            self.summary[name] = self.summary.get(name, 0) + 0
            self.summary[name] += val
            if writer is not None and self.step % 10 == 0:
                writer.add_scalar(name, self.summary[name] / 10, self.step)
                self.summary[name] = 0

        def train(self):
            for x, y in self.loader:
                fit_loss = (self.model(x) - y).pow(2).mean()
                fit_loss.backward()
                self.step += 1
                self.add_summary(self.main_writer, "loss/fit", fit_loss.item())
                self.add_summary(self.critic_writer, "loss/critic", fit_loss.item() * 0.5)


    dist.init_process_group("gloo")
    Trainer(dist.get_rank(), True).train()
    dist.destroy_process_group()
"""


def _found(source: str) -> list[tuple[int, str]]:
    return [(f.line, f.rule) for f in lint_sources({"train.py": textwrap.dedent(source)}) if f.rule == "DDP006"]


def test_a_helper_keeping_a_running_loss_for_a_writer_only_rank_zero_holds_is_reported_in_the_helper():
    """The writers are made under `if rank == 0:` (one under an `if` inside it), so `writer is not None` picks rank
    0; the helper adds each call's `fit_loss.item()` into `self.summary` and writes the average: rank 0's batches."""
    assert _found(_TRAINER) == [(28, "DDP006")]


def test_a_running_figure_of_reduced_losses_is_not_reported():
    reduced = _TRAINER.replace('                self.add_summary(self.main_writer, "loss/fit", fit_loss.item())',
                               '                total = fit_loss.detach().clone()\n'
                               '                dist.all_reduce(total, op=dist.ReduceOp.AVG)\n'
                               '                self.add_summary(self.main_writer, "loss/fit", total.item())').replace(
        '                self.add_summary(self.critic_writer, "loss/critic", fit_loss.item() * 0.5)\n', "")
    assert _found(reduced) == []


_HANDED = """
    import logging

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    class Schedule:
        def __init__(self):
            self.logger = logging.getLogger("schedule")
            self.step = 0

        def add_observation(self, loss_dict):
            self.logger.info("step %d train loss %.3f", self.step, loss_dict["train_loss"])


    def train(rank):
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
        model = DDP(torch.nn.Linear(4, 1))
        schedule = Schedule()
        for x, y in loader:
            observation = {"loss": (model(x) - y).pow(2).mean()}
            observation["loss"].backward()
            if rank == 0:
                schedule.add_observation({"train_loss": observation["loss"].item()})


    dist.init_process_group("gloo")
    train(dist.get_rank())
    dist.destroy_process_group()
"""


def test_a_loss_handed_to_a_report_helper_under_a_rank_check_is_reported_at_the_call():
    """The helper shows what it is given (`loss_dict`), with no rank check of its own: the mistake is the caller's
    (rank 0 hands it its own batch loss, read under the key "loss"), fixed by reducing before the call."""
    assert _found(_HANDED) == [(29, "DDP006")]
