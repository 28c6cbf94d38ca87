"""DDP006 for rank 0's own loss shown through a builtins.print swap: after `setup_for_distributed(rank == 0)` a bare
print shows on rank 0 alone, as one under a rank check does, so the epoch loss it prints is rank 0's shard's; a
line per batch inside the step loop is a progress line, not the run's figure."""

from __future__ import annotations

from ddpkit.lint import lint_sources

_PROGRAM = '''import builtins
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from data import make_loader
from net import Net


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        if is_master or kwargs.pop("force", False):
            builtin_print(*args, **kwargs)

    builtins.print = print


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    setup_for_distributed(rank == 0)
    model = DDP(Net().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters())
    loader = make_loader(rank)
    for epoch in range(10):
        loader.sampler.set_epoch(epoch)
        epoch_loss = []
        for i, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss.append(loss.item())
            if i % 10 == 0:
                print(f"step {i} loss {loss.item():.4f}")
        epoch_loss = sum(epoch_loss) / len(epoch_loss)
        print(f"epoch {epoch} loss: {epoch_loss}")
    dist.destroy_process_group()
'''


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP006"]


def test_the_epoch_loss_printed_after_the_swap_is_rank_zeros_own():
    """(the per-batch line in the step loop, line 41, is a progress line: no finding)"""
    assert _lines(_PROGRAM) == [43]


def test_an_epoch_loss_reduced_first_is_no_rank_zero_loss():
    reduced = _PROGRAM.replace("        epoch_loss = sum(epoch_loss) / len(epoch_loss)\n",
                               "        epoch_loss = torch.tensor(sum(epoch_loss) / len(epoch_loss), device='cuda')\n"
                               "        dist.all_reduce(epoch_loss)\n        epoch_loss = epoch_loss.item()\n")
    assert _lines(reduced) == []


def test_a_line_per_batch_of_a_step_without_a_literal_backward_is_a_progress_line():
    """(`loss_scaler(loss, optimizer)` runs backward inside a helper; the loop's `zero_grad()` marks the step)"""
    source = _PROGRAM.replace("            loss.backward()\n", "            scaler(loss, optimizer)\n").replace(
        '                print(f"step {i} loss {loss.item():.4f}")',
        '                print(f"step {i} loss {loss.item():.4f}")\n                print("Loss is", loss.item())')
    assert _lines(source) == [44]


def test_an_option_named_like_a_loss_is_a_setting():
    source = _PROGRAM.replace("    model = DDP(", "    print('criterion: norm_pix_loss={}'.format(args.norm_pix_loss))\n"
                                               "    model = DDP(").replace(
        "def main():\n", "def main():\n    parser = argparse.ArgumentParser()\n"
                         "    parser.add_argument('--norm_pix_loss', default=1, type=int)\n"
                         "    args = parser.parse_args()\n").replace("import builtins\n", "import argparse\nimport builtins\n")
    assert _lines(source) == [48]
