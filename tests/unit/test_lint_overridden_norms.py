"""DDP013 on a BatchNorm class named only as a parameter's default that every construction overrides (judged wrong
on AQ+AR: `NLayerDiscriminator(..., norm_layer=nn.InstanceNorm2d)` of a `norm_layer=nn.BatchNorm2d` default)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_MODELS = """
    import torch.nn as nn


    class Discriminator(nn.Module):
        def __init__(self, channels, norm_layer=nn.BatchNorm2d):
            super(Discriminator, self).__init__()
            self.net = nn.Sequential(nn.Conv2d(channels, 8, 3), norm_layer(8), nn.LeakyReLU(0.2))

        def forward(self, x):
            return self.net(x)
"""

_TRAIN = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from models import Discriminator


    def main():
        dist.init_process_group("gloo")
        model = DDP(Discriminator({args}))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in [torch.randn(2, 3, 8, 8)]:
            optimizer.zero_grad()
            model(x).mean().backward()
            optimizer.step()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _notes(args: str) -> list[tuple[str, int]]:
    files = {"models.py": textwrap.dedent(_MODELS), "train.py": textwrap.dedent(_TRAIN.format(args=args))}
    return [(f.path, f.line) for f in lint_sources(files) if f.rule == "DDP013"]


def test_the_batchnorm_default_is_reported_where_a_construction_keeps_it():
    assert _notes("3") != []


def test_a_default_every_construction_overrides_with_another_norm_builds_no_batchnorm():
    assert _notes("3, norm_layer=torch.nn.InstanceNorm2d") == []
    assert _notes("3, torch.nn.GroupNorm") == []  # by position


def test_a_construction_that_passes_batchnorm_itself_still_has_it():
    assert _notes("3, norm_layer=torch.nn.BatchNorm2d") != []


def test_one_construction_that_keeps_the_default_keeps_the_batchnorm():
    # a second model built with the default: the class still builds BatchNorm layers somewhere
    files = {"models.py": textwrap.dedent(_MODELS),
             "train.py": textwrap.dedent(_TRAIN.format(args="3, norm_layer=torch.nn.InstanceNorm2d")).replace(
                 "optimizer = torch", "critic = DDP(Discriminator(3))\n    optimizer = torch")}
    assert [f for f in lint_sources(files) if f.rule == "DDP013"] != []
