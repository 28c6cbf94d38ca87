"""DDP006 on what a shard figure decides or where it goes: the checkpoint rank 0's shard picks, a helper that
reduces a copy, a loader factory left unsharded by its defaults, mlflow's log_metric."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _ddp006(files: dict[str, str]) -> set[tuple[str, int]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line) for f in found if f.rule == "DDP006"}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


_BEST_ON_SHARD = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    def reduce_tensor(tensor):
        rt = tensor.clone()
        dist.all_reduce(rt)
        rt /= dist.get_world_size()
        return rt


    def validate(model, loader):
        total = 0.0
        for x, y in loader:
            total += torch.nn.functional.mse_loss(model(x), y)
        return total / len(loader)


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        val_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=False))
        best = float("inf")
        best_reduced = float("inf")
        for epoch in range(3):
            with torch.no_grad():
                val_loss = validate(model, val_loader)
            reduced = reduce_tensor(val_loss)
            if rank == 0:
                if val_loss < best:
                    torch.save(model.module.state_dict(), "best.pt")
                    best = val_loss
                if reduced < best_reduced:
                    torch.save(model.module.state_dict(), "best_reduced.pt")
                    best_reduced = reduced
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_shard_figure_choosing_the_checkpoint_on_rank_0_is_reported_at_the_comparison() -> None:
    found = _ddp006({"train.py": _BEST_ON_SHARD})
    # reduce_tensor all-reduces a clone: val_loss itself stays rank 0's shard figure
    assert ("train.py", _line(_BEST_ON_SHARD, "if val_loss < best:")) in found
    assert ("train.py", _line(_BEST_ON_SHARD, "if reduced < best_reduced:")) not in found  # trap: reduced


def test_a_checkpoint_choice_on_a_figure_the_function_also_reports_is_one_finding() -> None:
    code = _BEST_ON_SHARD.replace("            if rank == 0:\n",
                                  "            if rank == 0:\n                print(f'val {val_loss:.3f}')\n")
    found = _ddp006({"train.py": code})
    assert ("train.py", _line(code, "print(f'val")) in found
    assert ("train.py", _line(code, "if val_loss < best:")) not in found


_FACTORY = """
    from torch.utils.data import DataLoader, DistributedSampler


    def get_loader(data, batch_size=8, rank=-1, world_size=-1):
        sampler = None
        if rank >= 0 and world_size >= 0:
            sampler = DistributedSampler(data, rank=rank, num_replicas=world_size)
        return DataLoader(data, batch_size=batch_size, sampler=sampler), data
"""

_USES_FACTORY = """
    import torch
    import torch.distributed as dist
    from loaders import get_loader


    def main():
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        train_loader, _ = get_loader(data, rank=rank, world_size=world)
        valid_loader, _ = get_loader(data)
        for epoch in range(3):
            for x, y in train_loader:
                torch.nn.functional.mse_loss(model(x), y).backward()
            if rank == 0:
                valid_loss = 0.0
                with torch.no_grad():
                    for x, y in valid_loader:
                        valid_loss += torch.nn.functional.mse_loss(model.module(x), y).item()
                print(f"valid loss {valid_loss / len(valid_loader):.3f}")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_loader_factory_called_without_the_rank_it_shards_by_makes_a_whole_set_loader() -> None:
    # get_loader shards only when given a rank; the validation loader is the whole set on rank 0
    found = _ddp006({"loaders.py": _FACTORY, "train.py": _USES_FACTORY})
    assert ("train.py", _line(_USES_FACTORY, 'print(f"valid loss')) not in found


_MLFLOW = """
    import mlflow
    import torch
    import torch.distributed as dist


    def main():
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            epoch_loss = 0.0
            for step in range(10):
                loss = model(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                epoch_loss += loss.item()
            if dist.get_rank() == 0:
                mlflow.log_metric(key="train/loss", value=epoch_loss / 10, step=epoch)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_mlflow_log_metric_of_rank_0s_own_loss_is_reported() -> None:
    assert ("train.py", _line(_MLFLOW, "mlflow.log_metric")) in _ddp006({"train.py": _MLFLOW})


_SEQUENTIAL_SHARDS = """
    import math

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, Sampler


    class ChunkSampler(Sampler):
        def __init__(self, dataset):
            self.dataset = dataset
            self.rank = dist.get_rank()
            self.num = math.ceil(len(dataset) / dist.get_world_size())

        def __iter__(self):
            indices = list(range(len(self.dataset)))
            return iter(indices[self.rank * self.num:(self.rank + 1) * self.num])

        def __len__(self):
            return self.num


    class Runner:
        def __init__(self, data):
            self.model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
            self.loaders = {}
            self.loaders["train"] = list(DataLoader(data, batch_size=8, sampler=DistributedSampler(data)))
            self.loaders["test"] = DataLoader(data, batch_size=8, sampler=ChunkSampler(data))

        def evaluate(self, names=("test",)):
            for name in names:
                losses = []
                with torch.no_grad():
                    for x, y in self.loaders[name]:
                        losses.append(torch.nn.functional.mse_loss(self.model(x), y).item())
                mean_loss = np.mean(losses)
                if dist.get_rank() == 0:
                    print("eval loss", mean_loss)


    if __name__ == "__main__":
        dist.init_process_group("gloo")
        Runner(torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))).evaluate()
        dist.destroy_process_group()
"""


def test_a_project_sampler_cutting_indices_by_rank_read_through_a_dict_of_loaders_shards() -> None:
    # ChunkSampler gives each rank its own chunk; every loader kept in self.loaders is sharded
    assert ("train.py", _line(_SEQUENTIAL_SHARDS, 'print("eval loss"')) in _ddp006({"train.py": _SEQUENTIAL_SHARDS})


_EVERY_RANK_WRITER = """
    import os

    import torch
    import torch.distributed as dist
    from torch.utils.tensorboard import SummaryWriter


    def main(out_dir):
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        writer = SummaryWriter(os.path.join(out_dir, "runs"))
        for step in range(100):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            writer.add_scalar("loss", loss.item(), global_step=step)
        writer.close()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main("out")
"""


def test_every_rank_recording_its_own_loss_into_the_runs_one_log_is_reported() -> None:
    assert ("train.py", _line(_EVERY_RANK_WRITER, "writer.add_scalar")) in _ddp006({"train.py": _EVERY_RANK_WRITER})
    # trap: a log directory of each rank's own keeps the ranks' curves apart
    own = _EVERY_RANK_WRITER.replace('"runs")', 'f"runs{dist.get_rank()}")')
    assert ("train.py", _line(own, "writer.add_scalar")) not in _ddp006({"train.py": own})
