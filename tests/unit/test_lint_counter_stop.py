"""DDP010 is not asked of a stop on a step counter (`self.it += 1`) that the loss is computed from (`T =
self.t_fn(self.it)`): the counter is the same on every rank. A stop on a figure of the batch still is."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_COUNTER = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Trainer:
        def __init__(self):
            self.model = DDP(torch.nn.Linear(4, 1))
            self.it = 0

        def temperature(self, it):
            return max(0.1, 1.0 - it / 1000)

        def train(self, loader, max_iter):
            for x, y in loader:
                if self.it > max_iter:
                    break
                t = self.temperature(self.it)
                loss = ((self.model(x) - y) / t).pow(2).mean()
                loss.backward()
                self.it += 1


    dist.init_process_group("gloo")
    Trainer().train([(torch.randn(8, 4), torch.randn(8, 1))] * 10, 5)
    dist.destroy_process_group()
"""


def _ddp010(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": textwrap.dedent(source)}) if f.rule == "DDP010"]


def test_a_stop_on_a_step_counter_the_loss_reads_is_no_hang():
    assert _ddp010(_COUNTER) == []


def test_a_stop_on_a_figure_of_the_batch_still_is():
    figure = _COUNTER.replace("                if self.it > max_iter:\n                    break\n", "").replace(
        "                loss.backward()\n",
        "                loss.backward()\n                if loss.item() < 1e-3:\n                    break\n")
    assert _ddp010(figure) == [21]
