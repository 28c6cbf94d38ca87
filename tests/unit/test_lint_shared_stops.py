"""DDP010 on a NaN check of a value every rank already shares (judged wrong on AQ+AR): a loss all-reduced in place
before the check, by a collective or a project helper, and a figure a metric object's compute() reduces first."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _stops(code: str) -> list[int]:
    """Lines of the DDP010 findings of one file."""
    return [f.line for f in lint_sources({"train.py": textwrap.dedent(code)}) if f.rule == "DDP010"]


_PROGRAM = """
    import sys
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    {helpers}

    def train(model, loader, optimizer):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            {share}
            if not torch.isfinite(loss):
                sys.exit(1)


    def main():
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(2, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = [(torch.randn(4, 2), torch.randn(4, 1))]
        train(model, loader, optimizer)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""

_REDUCE_VALUE = """
    def reduce_value(value, average=True):
        world_size = dist.get_world_size()
        with torch.no_grad():
            dist.all_reduce(value)
            if average:
                value /= world_size
        return value
"""

_REDUCE_COPY = """
    def reduce_value(value, average=True):
        rt = value.clone()
        dist.all_reduce(rt)
        return rt / dist.get_world_size()
"""


def _program(share: str, helpers: str = "") -> str:
    return _PROGRAM.format(share=share, helpers=textwrap.indent(textwrap.dedent(helpers), "    ").strip())


def test_a_loss_of_this_rank_alone_still_stops_one_rank():
    assert _stops(_program("pass")) != []


def test_a_loss_all_reduced_in_place_before_the_check_is_every_ranks():
    assert _stops(_program("dist.all_reduce(loss)")) == []
    assert _stops(_program("dist.broadcast(loss, src=0)")) == []


def test_a_loss_reduced_to_rank_zero_alone_stays_this_ranks_own():
    # dist.reduce leaves the sum in dst's tensor only: the other ranks test their own value
    assert _stops(_program("dist.reduce(loss, dst=0)")) != []


def test_a_loss_handed_to_a_helper_that_all_reduces_that_parameter_in_place_is_every_ranks():
    assert _stops(_program("reduce_value(loss, average=True)", _REDUCE_VALUE)) == []


def test_a_helper_that_reduces_a_copy_leaves_the_loss_this_ranks_own():
    assert _stops(_program("reduce_value(loss, average=True)", _REDUCE_COPY)) != []


_EPOCHS = """
    import sys
    import torch
    import torch.distributed as dist
    import torchmetrics
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Metric:
        def __init__(self):
            self.total = torch.zeros(1)

        def update(self, value):
            self.total += value

        def synchronize(self):
            dist.all_reduce(self.total)

        def compute(self):
            self.synchronize()
            return self.total.item(), {{"total": self.total.item()}}


    def main():
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(2, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        metric = {metric}
        for epoch in range(3):
            for x, y in [(torch.randn(4, 2), torch.randn(4, 1))]:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.step()
                metric.update(loss.detach())
            {figure}
            if not torch.isfinite(torch.tensor(total_loss)):
                sys.exit(1)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_figure_from_a_metric_whose_compute_all_reduces_its_state_is_every_ranks():
    assert _stops(_EPOCHS.format(metric="Metric()", figure="total_loss, logs = metric.compute()")) == []
    # the same figure from this rank's own loss is still one rank's decision
    assert _stops(_EPOCHS.format(metric="Metric()", figure="total_loss = loss.item()")) != []


def test_a_torchmetrics_figure_is_every_ranks():
    assert _stops(_EPOCHS.format(metric="torchmetrics.MeanMetric()", figure="total_loss = metric.compute()")) == []
