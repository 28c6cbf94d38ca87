"""A helper that all-reduces a new tensor it builds from its argument (`t = torch.tensor([loss])`, not only
`loss.clone()`) reduces a copy: a call that drops its return value leaves the caller's figure rank 0's own
(DDP006), while the returned value is the reduced one (AO+AP round)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_HELPERS = textwrap.dedent("""
    import torch
    import torch.distributed as dist


    def sync_loss(loss, device):
        t = [loss]
        t = torch.tensor(t, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        return t[0]
""")

_TRAIN = textwrap.dedent("""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler

    from helpers import sync_loss


    def main(dataset, epochs):
        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        sampler = DistributedSampler(dataset)
        loader = DataLoader(dataset, batch_size=8, sampler=sampler)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            avg_loss = 0.0
            for x, y in loader:
                loss = (model(x) - y).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                avg_loss += loss.item()
            avg_loss = avg_loss / len(loader)
            sync_loss(avg_loss, "cpu")
            if rank == 0:
                print("Train loss: {:.6f}".format(avg_loss))
        dist.destroy_process_group()
""")


def _ddp006(train: str) -> list[tuple[str, int]]:
    return [(f.path, f.line) for f in lint_sources({"train.py": train, "helpers.py": _HELPERS}) if f.rule == "DDP006"]


def _line(text: str) -> int:
    return next(i for i, line in enumerate(_TRAIN.splitlines(), 1) if text in line)


def test_a_reduction_of_a_new_tensor_whose_result_is_dropped_leaves_the_figure_rank_zeros():
    assert _ddp006(_TRAIN) == [("train.py", _line('print("Train loss'))]


def test_the_returned_reduced_value_is_the_whole_runs_figure():
    kept = _TRAIN.replace("\n        sync_loss(avg_loss", "\n        avg_loss = sync_loss(avg_loss")
    assert kept != _TRAIN
    assert _ddp006(kept) == []


def _with_bar(loop: str) -> tuple[str, int]:
    train = _TRAIN.replace("import os", "import os\nfrom tqdm import tqdm").replace("        for x, y in loader:", loop)
    return train, next(i for i, line in enumerate(train.splitlines(), 1) if 'print("Train loss' in line)


def test_a_loop_over_the_shard_that_only_rank_zero_wraps_in_a_progress_bar_walks_the_shard():
    """`tqdm(loader) if rank == 0 else loader`, inline or under a name: both arms walk this rank's shard."""
    for loop in ("        for x, y in (tqdm(loader) if rank == 0 else loader):",
                 "        pbar = tqdm(loader) if rank == 0 else loader\n        for x, y in pbar:"):
        train, line = _with_bar(loop)
        found = [(f.path, f.line) for f in lint_sources({"train.py": train, "helpers.py": _HELPERS})
                 if f.rule == "DDP006"]
        assert found == [("train.py", line)], loop
