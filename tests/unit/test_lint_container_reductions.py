"""DDP006: a reduction followed through containers: names zipped with reduced values, and dicts of losses reduced
key by key or by a helper that returns the reduced dict, each beside an unreduced twin that is still reported."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_source

_HEAD = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.tensorboard import SummaryWriter

    dist.init_process_group("gloo")
    torch.manual_seed(int(os.environ["RANK"]))
    model = DDP(torch.nn.Linear(4, 1))
    writer = SummaryWriter() if dist.get_rank() == 0 else None
    for step in range(10):
        out = model(torch.randn(8, 4))
        loss_dict = {"l1": out.abs().mean(), "l2": out.pow(2).mean()}
        loss = sum(loss_dict.values())
        loss.backward()
"""


def _findings(body: str) -> list[str]:
    code = textwrap.dedent(_HEAD) + textwrap.indent(textwrap.dedent(body), "    ") + "dist.destroy_process_group()\n"
    return [code.splitlines()[f.line - 1].strip() for f in lint_source(code, "train.py") if f.rule == "DDP006"]


def test_names_zipped_into_a_dict_with_reduced_values_are_reduced():
    """`dict(zip(names, all_losses.tolist()))` after `dist.all_reduce(all_losses)`: each value is reduced."""
    assert _findings("""
        names = list(loss_dict.keys())
        all_losses = torch.stack(list(loss_dict.values()))
        dist.all_reduce(all_losses)
        loss_log = dict(zip(names, all_losses.tolist()))
        if dist.get_rank() == 0:
            for k, v in loss_log.items():
                writer.add_scalar(k, v, step)
    """) == []


def test_names_zipped_with_unreduced_values_are_still_reported():
    assert _findings("""
        names = list(loss_dict.keys())
        all_losses = torch.stack(list(loss_dict.values()))
        loss_log = dict(zip(names, all_losses.tolist()))
        if dist.get_rank() == 0:
            for k, v in loss_log.items():
                writer.add_scalar(k, v, step)
    """) == ["writer.add_scalar(k, v, step)"]
