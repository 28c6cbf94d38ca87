"""Findings the program itself answers: a device list built from the local rank and handed on by keyword, ...
each beside a twin that is still reported."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _found(files: dict[str, str]) -> set[tuple[str, str, str]]:
    """(path, stripped line, rule) of every finding."""
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, sources[f.path].splitlines()[f.line - 1].strip(), f.rule) for f in lint_sources(sources)}


_HEADS = """
    import torch
    import torch.nn as nn


    class MarginHead(nn.Module):
        def __init__(self, dim, classes, device_id=None):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(classes, dim))
            self.device_id = device_id

        def forward(self, x):
            weight = self.weight.cuda(self.device_id[0])
            return x.cuda(self.device_id[0]) @ weight.t()
"""

_HEAD_TRAIN = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import heads


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        head = getattr(heads, "MarginHead")(8, 4, device_id=[local_rank]).cuda()
        head = DDP(head, device_ids=[local_rank])
        head(torch.randn(2, 8)).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_device_list_holding_the_local_rank_passed_by_keyword_is_the_ranks_own_gpu():
    """`Head(..., device_id=[local_rank])` stored as `self.device_id`: `device_id[0]` is each rank's own GPU."""
    found = _found({"train.py": _HEAD_TRAIN, "heads.py": _HEADS})
    assert not [f for f in found if f[2] == "DDP012"]
    fixed = _HEAD_TRAIN.replace("device_id=[local_rank]", "device_id=[0]")
    assert ("heads.py", "weight = self.weight.cuda(self.device_id[0])", "DDP012") in _found(
        {"train.py": fixed, "heads.py": _HEADS})


_LOGGED = """
    import os
    import numpy as np
    import torch
    import torch.distributed as dist
    import wandb
    from torch.nn.parallel import DistributedDataParallel as DDP


    def mean_over_ranks(tensor):
        total = tensor.clone()
        dist.all_reduce(total)
        return total / dist.get_world_size()


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(8, 1).cuda(), device_ids=[local_rank])
        for step in range(10):
            loss = model(torch.randn(4, 8).cuda()).pow(2).mean()
            loss.backward()
            reduced_loss = mean_over_ranks(loss.detach()).item()
            if dist.get_rank() == 0:
                wandb.log({"train/loss": reduced_loss, "train/log_loss": np.log(reduced_loss)}, step=step)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_reduced_loss_shown_on_another_scale_is_still_reduced():
    """`np.log(reduced_loss)` of a loss averaged over the ranks is the run's figure on a log scale (no DDP006)."""
    assert not [f for f in _found({"train.py": _LOGGED}) if f[2] == "DDP006"]
    own = _LOGGED.replace("reduced_loss = mean_over_ranks(loss.detach()).item()", "reduced_loss = loss.item()")
    assert [f[1] for f in _found({"train.py": own}) if f[2] == "DDP006"] == [
        'wandb.log({"train/loss": reduced_loss, "train/log_loss": np.log(reduced_loss)}, step=step)']


_GATHERED = """
    import os
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    from scores import Tally


    def validate(model, loader, rank):
        tally = Tally()
        for x, y in loader:
            tally.add(model(x).argmax(1), y)
        every = Tally.all_gather_tallies(tally)
        f1 = every.f1()
        if rank == 0:
            print("F1 SCORE: {}".format(str(f1)))


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        val_loader = DataLoader(data, sampler=DistributedSampler(data, shuffle=False, drop_last=True))
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
        validate(model, val_loader, rank)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_metric_computed_from_what_a_library_gathered_is_the_runs():
    """`every = Tally.all_gather_tallies(tally)`; `f1 = every.f1()` shown on rank 0: the figure of every rank's
    shard (no DDP006), where the same line of rank 0's own tally is reported."""
    assert not [f for f in _found({"train.py": _GATHERED}) if f[2] == "DDP006"]
    own = _GATHERED.replace("every = Tally.all_gather_tallies(tally)", "every = tally")
    assert [f[1] for f in _found({"train.py": own}) if f[2] == "DDP006"] == ['print("F1 SCORE: {}".format(str(f1)))']


_TRAINER = """
    import argparse
    import os
    import shutil
    import torch
    import torch.distributed as dist


    def import_class(name):
        parts = name.split(".")
        mod = __import__(parts[0])
        for part in parts[1:]:
            mod = getattr(mod, part)
        return mod


    class Processor:
        def __init__(self, arg):
            self.arg = arg
            if os.path.isdir(arg.work_dir):
                answer = "y"
                if answer == "y":
                    shutil.rmtree(arg.work_dir)
                else:
                    print("kept", arg.work_dir)
            self.model = import_class(arg.model)()

        def profile(self, x):
            print("profiling", x.shape)

        def start(self):
            print("start", self.arg.work_dir)


    def main(arg):
        dist.init_process_group("gloo")
        Processor(arg).start()
        dist.destroy_process_group()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--work-dir", default="runs")
        parser.add_argument("--model", default="nets.Net")
        main(parser.parse_args())
"""


def test_an_arm_a_local_constant_rules_out_and_a_method_nothing_names_never_run():
    """`answer = "y"` then `if answer == "y": ... else: print(...)`: the `else` never runs; a method no code names
    (its call commented out) never runs, although `getattr(mod, part)` walks a dotted module path (DDP008 on
    neither, where the method that runs is still reported)."""
    prints = {f[1] for f in _found({"train.py": _TRAINER}) if f[2] == "DDP008"}
    assert prints == {'print("start", self.arg.work_dir)'}
    both = _TRAINER.replace('answer = "y"', 'answer = input("delete? ")').replace(
        "Processor(arg).start()", "proc = Processor(arg)\n        proc.start()\n        proc.profile(torch.zeros(1))")
    assert {f[1] for f in _found({"train.py": both}) if f[2] == "DDP008"} == {
        'print("start", self.arg.work_dir)', 'print("kept", arg.work_dir)', 'print("profiling", x.shape)'}

