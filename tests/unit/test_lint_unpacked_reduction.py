"""DDP006 follows a reduction through a tensor that packs several figures and is unpacked again
(`metrics = torch.tensor([accuracy, f1]); all_reduce(metrics); accuracy, f1 = metrics.tolist()`): each name
unpacked holds the run's figure."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_PACKED = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    def evaluate(model, loader, world_size, rank):
        correct, seen = 0, 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum().item()
            seen += len(y)
        accuracy = correct / seen
        f1 = (correct + 1) / (seen + 1)
        metrics = torch.tensor([accuracy, f1])
        dist.all_reduce(metrics, op=dist.ReduceOp.SUM)
        accuracy, f1 = metrics.tolist()
        accuracy /= world_size
        f1 /= world_size
        if rank == 0:
            print("accuracy {} f1 {}".format(accuracy, f1))


    def main():
        dist.init_process_group("gloo")
        data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        sampler = DistributedSampler(data, shuffle=False)
        loader = DataLoader(data, batch_size=8, sampler=sampler, drop_last=True)
        model = DDP(torch.nn.Linear(4, 2))
        evaluate(model, loader, dist.get_world_size(), dist.get_rank())
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _ddp006(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": textwrap.dedent(source)}) if f.rule == "DDP006"]


def test_figures_unpacked_from_a_reduced_tensor_are_the_runs():
    assert _ddp006(_PACKED) == []
    assert _ddp006(_PACKED.replace("accuracy, f1 = metrics.tolist()", "[accuracy, f1] = metrics.tolist()")) == []


def test_a_figure_left_out_of_the_packed_tensor_is_still_this_ranks():
    assert _ddp006(_PACKED.replace("accuracy, f1 = metrics.tolist()", "accuracy = metrics.tolist()[0]")) == [22]
