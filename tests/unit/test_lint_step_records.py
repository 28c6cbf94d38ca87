"""Recall of the AC+AD round (DDP006): rank 0's batch loss written step by step into a run's record (tensorboard)
is rank 0's curve shown as the run's, even where the epoch figure built from the same loss is reduced."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import os

    import torch
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        writer = SummaryWriter("runs") if rank == 0 else None
        step = 0
        for epoch in range(3):
            running = 0.0
            for _ in range(10):
                loss = model(torch.randn(8, 4).cuda()).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                running += loss.item()
                step += 1
                if rank == 0:
                    writer.add_scalar("train/loss_step", loss.item(), step)
                    print(f"step {step} loss {loss.item():.3f}")
            total = torch.tensor([running, 10.0]).cuda()
            dist.all_reduce(total)
            if rank == 0:
                print(f"epoch {epoch} loss {total[0] / total[1]:.3f}")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
""")


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP006"]


def test_a_step_curve_of_rank_zero_s_loss_is_reported_beside_a_reduced_epoch_figure():
    """The per-step `add_scalar` is rank 0's curve; the console progress line beside it and the reduced epoch
    figure are not reported."""
    assert _lines(_TRAIN) == [next(i for i, line in enumerate(_TRAIN.splitlines(), 1) if "add_scalar" in line)]


def test_a_progress_line_alone_stays_unreported():
    alone = "\n".join(line for line in _TRAIN.splitlines() if "add_scalar" not in line)
    assert _lines(alone) == []
