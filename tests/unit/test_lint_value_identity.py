"""What a value is, read from where it comes from rather than from its name: a mode setting's other values, a
parameter filled with a local rank, the rank a process joins the group as, a store of the value every rank holds,
reductions through comprehensions and refilled meters, values built and never used, re-exports reached through
`from package import *`."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


# ---- a mode setting: the values under which no process group starts are one process --------------------------
_MODE_STRING = """
    import os
    import torch
    import torch.distributed as dist


    def run(opts):
        net = torch.nn.Linear(4, 4)
        if opts.parallel == "single":
            torch.save(net.state_dict(), "solo.pt")  # one process
            print("saved")
        if opts.parallel == "multi":
            dist.init_process_group("nccl")
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            if dist.get_rank() == 0:
                torch.save(net.state_dict(), "multi.pt")
            dist.destroy_process_group()
"""

_MODE_ENUM = """
    import os
    import torch
    import torch.distributed as dist
    from modes import Launch


    def start(kind):
        if kind in (Launch.TORCHRUN, Launch.SLURM):
            dist.init_process_group(backend="nccl")
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


    def run(kind):
        start(kind)
        net = torch.nn.Linear(4, 4)
        if kind != Launch.LOCAL:
            if dist.get_rank() == 0:
                torch.save(net.state_dict(), "net.pt")
        else:
            torch.save(net.state_dict(), "net.pt")  # the local mode: one process
"""


def test_the_values_of_a_mode_setting_that_start_no_group_are_one_process() -> None:
    found = _lint({"run.py": _MODE_STRING})
    assert not {f for f in found if f[2] in ("DDP004", "DDP008")}, found


def test_a_mode_setting_compared_with_enum_members_and_tuples() -> None:
    found = _lint({"run.py": _MODE_ENUM, "modes.py": "class Launch:\n    LOCAL = 0\n    TORCHRUN = 1\n    SLURM = 2\n"})
    assert not {f for f in found if f[2] == "DDP004"}, found


def test_a_value_that_also_starts_the_group_elsewhere_is_not_one_process() -> None:
    # the group also starts outside any test of the setting: no value of it is a one-process run
    code = _MODE_STRING.replace('    if opts.parallel == "multi":\n', '    if True:\n')
    found = _lint({"run.py": code.replace('torch.save(net.state_dict(), "solo.pt")',
                                          'dist.init_process_group("gloo"); torch.save(net.state_dict(), "solo.pt")')})
    assert ("run.py", _line(_MODE_STRING, '"solo.pt"'), "DDP004") in found


# ---- a parameter holds what its callers give it, whatever its name ----------------------------------------------
_LOCAL_AS_RANK = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def fit(rank, size):
        net = torch.nn.Linear(4, 4).to(f"cuda:{rank}")
        net = DDP(net, device_ids=[rank])
        if rank == 0:
            torch.save(net.state_dict(), "/shared/net.pt")


    if __name__ == "__main__":
        dist.init_process_group("nccl")
        gpu = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(gpu)
        fit(gpu, dist.get_world_size())
        dist.destroy_process_group()
"""


def test_a_parameter_named_rank_that_every_call_fills_with_the_local_rank() -> None:
    found = _lint({"train.py": _LOCAL_AS_RANK})
    assert not {f for f in found if f[2] == "DDP012"}, found  # cuda:{rank} is the local GPU
    # and `if rank == 0:` there is a local-rank check: one writer per node
    assert ("train.py", _line(_LOCAL_AS_RANK, '"/shared/net.pt"'), "DDP004") in found


_JOINED = """
    import os
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def worker(dev, args):
        me = args.node * args.per_node + dev
        dist.init_process_group("nccl", init_method=args.url, world_size=args.world, rank=me)
        torch.cuda.set_device(dev)
        net = torch.nn.Linear(4, 4).cuda(dev)
        if me == 0:
            torch.save(net.state_dict(), "net.pt")
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(worker, nprocs=2, args=(None,))
"""


def test_what_a_process_joins_the_group_as_is_its_global_rank() -> None:
    found = _lint({"train.py": _JOINED})
    assert not {f for f in found if f[2] == "DDP004"}, found


# ---- a store under a rank check of the value every rank already holds --------------------------------------------
_SAME_STORE = """
    import torch
    import torch.distributed as dist


    def main(cfg):
        dist.init_process_group("gloo")
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
        first = 1
        if cfg.resume:
            first = torch.load(cfg.resume, map_location="cpu")["epoch"]
        else:
            if dist.get_rank() == 0:
                print("fresh start (rank 0)")
                first = 1
        for epoch in range(first, cfg.epochs):
            net(torch.randn(2, 4)).sum().backward()
        dist.destroy_process_group()
"""


def test_a_guarded_store_of_the_value_every_rank_holds_leaves_the_loop_alike() -> None:
    assert not {f for f in _lint({"train.py": _SAME_STORE}) if f[2] == "DDP010"}


def test_a_guarded_store_of_another_value_still_makes_the_loop_differ() -> None:
    code = _SAME_STORE.replace("                first = 1", "                first = 5")
    assert ("train.py", _line(code, "for epoch in range"), "DDP010") in _lint({"train.py": code})


# ---- values built and never used -------------------------------------------------------------------------------
_DROPPED = """
    import os
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import datasets, transforms


    def loaders(root):
        train = datasets.MNIST(root, train=True)
        holdout = datasets.MNIST(root, train=False)
        dev_loader = DataLoader(holdout, batch_size=8, sampler=DistributedSampler(holdout))
        train_loader = DataLoader(train, batch_size=8, sampler=DistributedSampler(train))
        return train_loader, dev_loader


    def main():
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.manual_seed(0)
        flip = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor()])
        train_loader, unused_loader = loaders("/data")
        for epoch in range(3):
            train_loader.sampler.set_epoch(epoch)
            for x, y in train_loader:
                pass
        dist.destroy_process_group()


    main()
"""


def test_a_loader_returned_and_dropped_and_an_unused_transform_are_not_reported() -> None:
    found = _lint({"train.py": _DROPPED})
    assert not {f for f in found if f[2] in ("DDP006", "DDP014")}, found


def test_a_used_augmentation_with_one_seed_is_still_reported() -> None:
    code = _DROPPED.replace("datasets.MNIST(root, train=True)", "datasets.MNIST(root, train=True, transform=aug)") \
        .replace("def loaders(root):", "def loaders(root, aug):").replace('loaders("/data")', 'loaders("/data", flip)')
    assert ("train.py", _line(code, "torch.manual_seed(0)"), "DDP014") in _lint({"train.py": code})


# ---- reductions the report goes through ---------------------------------------------------------------------------
_COMPREHENSION = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    class Runner:
        def __init__(self, net, loader, writer):
            self.net, self.loader, self.writer, self.steps, self.history = net, loader, writer, 0, []

        def collect(self, value):
            parts = [torch.zeros_like(value) for _ in range(dist.get_world_size())]
            dist.all_gather(parts, value)
            return torch.stack(parts)

        def evaluate(self):
            logs = {"loss": torch.zeros(()), "acc": torch.zeros(())}
            for x, y in self.loader:
                logs["loss"] += self.net(x).sum()
            logs = {key: self.collect(val).mean() for key, val in logs.items()}
            return logs

        def epoch(self, opt):
            for x, y in self.loader:
                loss = self.net(x).sum()
                loss.backward()
                opt.step()
                self.history.append(loss.item())
                self.steps += 1
            results = self.evaluate()
            if dist.get_rank() == 0:
                self.writer.add_scalars("val", results, self.steps)


    def build(net, data, writer):
        return Runner(net, DataLoader(data, batch_size=4, sampler=DistributedSampler(data, drop_last=True)), writer)
"""


def test_a_counter_attribute_carries_only_what_is_stored_in_it() -> None:
    # `self.steps` holds a count, not the loss the object also keeps in `self.history`
    found = _lint({"runner.py": _COMPREHENSION})
    assert not {f for f in found if f[2] == "DDP006"}, found


def test_a_gather_through_a_handed_in_module_inside_a_comprehension_reduces_what_it_builds() -> None:
    # `self.comm` is torch.distributed handed to the object: the linter does not know it, but `collect` hands its
    # parameter to `all_gather`, and the comprehension's items are what `collect` returns
    code = _COMPREHENSION.replace("dist.all_gather(parts, value)", "self.comm.all_gather(parts, value)") \
        .replace("range(dist.get_world_size())", "range(self.comm.get_world_size())") \
        .replace("self.history = net, loader, writer, 0, []", "self.history = net, loader, writer, 0, []\n"
                 "            self.comm = comm").replace("def __init__(self, net, loader, writer):",
                                                       "def __init__(self, net, loader, writer, comm):") \
        .replace("sampler=DistributedSampler(data, drop_last=True)), writer)",
                 "sampler=DistributedSampler(data, drop_last=True)), writer, dist)")
    found = _lint({"runner.py": code})
    assert not {f for f in found if f[2] == "DDP006"}, found


_REFILLED = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    class Meter:
        def __init__(self):
            self.reset()

        def reset(self):
            self.total, self.count = 0.0, 0

        def update(self, value):
            self.total += value
            self.count += 1

        @property
        def avg(self):
            return self.total / max(self.count, 1)


    def mean_over_ranks(t):
        out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(out, t)
        return torch.stack(out).mean(0)


    def main(net, data):
        dist.init_process_group("gloo")
        loader = DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=False, drop_last=True))
        score = Meter()
        for x, y in loader:
            score.update(float((net(x).argmax(1) == y).float().mean()))
        overall = mean_over_ranks(torch.tensor([score.avg]))
        score.reset()
        score.update(overall[0].item())
        if dist.get_rank() == 0:
            best = score.avg
            print("accuracy", best)
        dist.destroy_process_group()
"""


def test_a_meter_emptied_and_refilled_with_a_gathered_mean_holds_the_runs_figure() -> None:
    found = _lint({"train.py": _REFILLED})
    assert not {f for f in found if f[2] == "DDP006"}, found


def test_a_meter_that_is_not_refilled_is_still_the_shards_figure() -> None:
    code = _REFILLED.replace("        score.reset()\n        score.update(overall[0].item())\n", "")
    assert ("train.py", _line(code, 'print("accuracy", best)'), "DDP006") in _lint({"train.py": code})


# ---- a function re-exported by a package, reached through `from package import *` -----------------------------
_STAR_TRAIN = """
    import os
    import torch
    import torch.distributed as dist
    from tools import *


    def main():
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        net = torch.nn.Linear(2, 2)
        if "RANK" not in os.environ or int(os.environ["RANK"]) == 0:
            store(net.state_dict(), "net.pt", note=None)
        dist.destroy_process_group()


    main()
"""

_STAR_IO = """
    import torch


    def store(state, path, note=None):
        torch.save(state, path)
        if note is None:
            print("stored", path)
"""


def test_a_helper_reexported_by_a_package_and_imported_with_a_star_keeps_its_callers_guard() -> None:
    found = _lint({"train.py": _STAR_TRAIN, "tools/__init__.py": "from .io import store\n", "tools/io.py": _STAR_IO})
    assert not {f for f in found if f[0] == "tools/io.py"}, found


_PROGRESS = """
    import os
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    def one_epoch(net, data, opt, epoch):
        rank = dist.get_rank()
        sampler = DistributedSampler(data)
        sampler.set_epoch(epoch)
        running, steps = 0.0, 0
        for step, (x, y) in enumerate(DataLoader(data, batch_size=8, sampler=sampler)):
            batch_loss = torch.nn.functional.mse_loss(net(x), y)
            opt.zero_grad()
            batch_loss.backward()
            opt.step()
            running += batch_loss.item()
            steps += 1
            if step % 50 == 0 and rank == 0:
                print(f"epoch {epoch} step {step}: {batch_loss.item():.4f}")
        stats = torch.tensor([running / steps], device=f"cuda:{os.environ['LOCAL_RANK']}")
        dist.all_reduce(stats)
        stats /= dist.get_world_size()
        if rank == 0:
            print(f"epoch {epoch}: mean {stats[0]:.4f}")
"""


def test_a_progress_line_of_the_batch_beside_a_reduced_epoch_figure_built_from_it() -> None:
    found = _lint({"train.py": _PROGRESS})
    assert not {f for f in found if f[2] == "DDP006"}, found


def test_a_batch_loss_line_with_no_reduced_figure_built_from_it_is_still_reported() -> None:
    code = _PROGRESS.replace("running / steps", "float(steps)")
    assert ("train.py", _line(code, 'print(f"epoch {epoch} step'), "DDP006") in _lint({"train.py": code})
