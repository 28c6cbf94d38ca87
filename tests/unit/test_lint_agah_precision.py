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


_ABORTS = """
    import os
    import torch
    import torch.distributed as dist


    def main():
        dist.init_process_group("gloo")
        model = torch.nn.Linear(4, 1)
        for step in range(10):
            try:
                loss = model(torch.randn(2, 4)).pow(2).mean()
                losses = {"loss": loss, "l1-value": loss.abs()}
                if torch.isnan(loss):
                    for key, value in losses.items():
                        if "-value" in key:
                            print(key, value)
                    exit()
                loss.backward()
            except RuntimeError as e:
                print(e)
                path = "model_error.pt"
                print("model saved to {}".format(path))
                torch.save(model.state_dict(), path)
                exit(0)
        print("done")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_messages_a_rank_prints_on_its_own_way_out_are_not_repeated_output():
    """The values dumped by a loop of prints before `exit()`, and the prints of an `except` block that ends in
    `exit(0)`: the failing rank's diagnostics (no DDP008); the normal end's message is still every rank's."""
    assert {f[1] for f in _found({"train.py": _ABORTS}) if f[2] == "DDP008"} == {'print("done")'}
    # (a test of the step, not of the rank's own values for NaN, whose messages are that rank's: see
    # test_lint_anomaly_messages.py)
    kept = _ABORTS.replace("                    exit()\n", "").replace("                exit(0)\n", "").replace(
        "if torch.isnan(loss):", "if step == 5:")
    assert {f[1] for f in _found({"train.py": kept}) if f[2] == "DDP008"} == {
        'print("done")', "print(key, value)", 'print("model saved to {}".format(path))'}
    # (`print(e)` in an `except` block that goes on shows the caught exception: only the failing rank prints it,
    # see test_lint_failure_hints.py)


_WHOLE_VAL = """
    import os
    import torch
    import torch.distributed as dist
    import tqdm
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from torch.utils.tensorboard import SummaryWriter


    def main():
        dist.init_process_group("gloo")
        is_logger = dist.get_rank() == 0
        writer = SummaryWriter("runs") if is_logger else None
        train_set = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        val_set = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
        train_loader = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set))
        val_loader = DataLoader(val_set, batch_size=8, shuffle=False)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        for epoch in range(2):
            train_loader.sampler.set_epoch(epoch)
            pbar = tqdm.tqdm(train_loader) if is_logger else train_loader
            for idx, (x, y) in enumerate(pbar):
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
            pbar = tqdm.tqdm(val_loader) if is_logger else val_loader
            with torch.no_grad():
                for idx, (x, y) in enumerate(pbar):
                    loss = (model(x) - y).pow(2).mean()
                    if is_logger:
                        writer.add_scalar("Loss/validation", loss.item(), epoch * len(val_loader) + idx)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_loss_over_an_unsharded_loader_behind_a_progress_bar_is_the_whole_sets():
    """`pbar = tqdm(val_loader) if is_logger else val_loader` over a loader with no sampler: rank 0's validation
    loss is the whole set's (no DDP006); the same line over the sharded training loader is rank 0's own."""
    assert not [f for f in _found({"train.py": _WHOLE_VAL}) if f[2] == "DDP006"]
    sharded = _WHOLE_VAL.replace("val_loader = DataLoader(val_set, batch_size=8, shuffle=False)",
                                 "val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set))")
    assert ('train.py', 'writer.add_scalar("Loss/validation", loss.item(), epoch * len(val_loader) + idx)',
            'DDP006') in _found({"train.py": sharded})


_CPU_ARMS = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        model = torch.nn.Linear(4, 1).cuda()
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            model.cuda(local_rank)
        else:
            print("using CPU, this will be slow")
        model = DDP(model, device_ids=[local_rank])
        dist.destroy_process_group()


    def spare():
        local_rank = int(os.environ["LOCAL_RANK"])
        model = torch.nn.Linear(4, 1)
        if torch.cuda.is_available():
            torch.cuda.set_device(local_rank)
            model = DDP(model.cuda(), device_ids=[local_rank])
        else:
            model = DDP(model)
        return model


    if __name__ == "__main__":
        main()
        spare()
"""


def test_the_arms_that_run_without_a_gpu_are_not_judged_as_gpu_code():
    """The `else:` of `if torch.cuda.is_available():` after a `.cuda()` every path runs never runs (no DDP008);
    `DDP(model)` in the `else:` of `if torch.cuda.is_available():` wraps a CPU model (no DDP012)."""
    found = _found({"train.py": _CPU_ARMS})
    assert not [f for f in found if f[2] in ("DDP008", "DDP012")], found
    moved = _CPU_ARMS.replace("        model = torch.nn.Linear(4, 1).cuda()\n", "        model = torch.nn.Linear(4, 1)\n")
    assert ("train.py", 'print("using CPU, this will be slow")', "DDP008") in _found({"train.py": moved})
    flag = _CPU_ARMS.replace("if torch.cuda.is_available():", "if use_gpu:").replace(
        "    def main():\n", "    use_gpu = os.environ.get('USE_GPU') == '1'\n\n\n    def main():\n")
    assert ("train.py", "model = DDP(model)", "DDP012") in _found({"train.py": flag})


_RANK_FILLED = """
    import numpy as np
    import torch
    import torch.distributed as dist


    def score(texts):
        return {"length": float(len(texts))}


    def estimate(generate, times):
        results = dict()
        for _ in range(times):
            texts = generate()
            if dist.get_rank() == 0:
                scores = score(texts)
                for key in scores:
                    if key not in results:
                        results[key] = []
                    results[key].append(scores[key])
        for key in results:
            print(f"{key}: mean = {np.mean(results[key]):0.5f}")


    def main():
        dist.init_process_group("gloo")
        estimate(lambda: ["a", "b"], 3)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_loop_over_what_only_rank_0_filled_prints_on_rank_0_alone():
    """`results = dict()` filled only under `if dist.get_rank() == 0:`: the loop over it prints nothing on the other
    ranks (no DDP008); filled on every rank, every rank prints."""
    assert not [f for f in _found({"train.py": _RANK_FILLED}) if f[2] == "DDP008"]
    every = _RANK_FILLED.replace("            if dist.get_rank() == 0:\n                scores", "            if texts:\n"
                                 "                scores")
    assert ("train.py", 'print(f"{key}: mean = {np.mean(results[key]):0.5f}")', "DDP008") in _found(
        {"train.py": every})


_PLATEAU = """
    import torch
    import torch.distributed as dist
    from torch.optim.lr_scheduler import ReduceLROnPlateau


    def main():
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = ReduceLROnPlateau(optimizer, mode="min", patience=2, verbose=True)
        for epoch in range(3):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0:
                scheduler.step(loss.item())
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_verbose_plateau_scheduler_stepped_on_rank_0_alone_prints_there_alone():
    """ReduceLROnPlateau prints in step() only: stepped under a rank check, no DDP008; stepped on every rank, one."""
    assert not [f for f in _found({"train.py": _PLATEAU}) if f[2] == "DDP008"]
    every = _PLATEAU.replace("            if dist.get_rank() == 0:\n                scheduler.step",
                             "            scheduler.step")
    assert [f[1] for f in _found({"train.py": every}) if f[2] == "DDP008"] == [
        'scheduler = ReduceLROnPlateau(optimizer, mode="min", patience=2, verbose=True)']


_BAD_CALL = """
    import os
    import torch
    import torch.distributed as dist


    def save(model, path, score):
        torch.save({"model": model.state_dict(), "score": score}, path)


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.Linear(4, 1)
        try:
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            if rank == 0:
                save(model, "best.pt", loss.item())
        except RuntimeError:
            save(model, "error.pt")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_call_that_leaves_out_a_required_argument_runs_nothing():
    """`save(model, "error.pt")` of `def save(model, path, score)` raises TypeError before torch.save: the only
    call that runs the body is the guarded one (no DDP004); given its score, the unguarded call saves on every rank."""
    assert not [f for f in _found({"train.py": _BAD_CALL}) if f[2] == "DDP004"]
    given = _BAD_CALL.replace('save(model, "error.pt")', 'save(model, "error.pt", None)')
    assert [f[2] for f in _found({"train.py": given}) if f[2] == "DDP004"] == ["DDP004"]


_STAR_MAIN = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from loaders import *
    from helpers import *


    def main(rank, world_size):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        data = Small()()
        log(len(data))
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(main, args=(2,), nprocs=2)
"""

_STAR_LOADERS = """
    import torch
    from torchvision import datasets


    class Small:
        def __call__(self):
            data = torch.utils.data.TensorDataset(torch.randn(4, 2))
            return torch.utils.data.DataLoader(data, sampler=torch.utils.data.DistributedSampler(data, shuffle=False))


    class SkippingFolder(datasets.ImageFolder):
        def __getitem__(self, index):
            try:
                return super().__getitem__(index)
            except OSError:
                print("skipping", index)
                return None


    class Large:
        def __call__(self):
            return SkippingFolder("large/")
"""

_STAR_HELPERS = """
    def log(value):
        print("items", value)
"""


def test_a_class_of_the_first_of_two_star_imported_modules_that_nothing_builds_never_runs():
    """`from loaders import *` then `from helpers import *`: loaders.py is imported (not a library linted alongside),
    so its `Large` that nothing builds runs nothing, nor the dataset only it builds (no DDP008), while the helper that runs is still reported."""
    found = _found({"train.py": _STAR_MAIN, "loaders.py": _STAR_LOADERS, "helpers.py": _STAR_HELPERS})
    assert {(f[0], f[1]) for f in found if f[2] == "DDP008"} == {("helpers.py", 'print("items", value)')}


_BANK = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    def train(model, loader, optimizer):
        for (x,) in loader:
            model(x).sum().backward()
            optimizer.step()


    def test(model, bank_loader):
        with torch.no_grad():
            bank = [model(x) for (x,) in bank_loader]
            for (x,) in bank_loader:
                bank.append(model(x))
        return bank


    def main():
        dist.init_process_group("gloo")
        data = TensorDataset(torch.randn(64, 4))
        train_sampler = DistributedSampler(data)
        bank_sampler = DistributedSampler(data)
        train_loader = DataLoader(data, batch_size=8, sampler=train_sampler)
        bank_loader = DataLoader(data, batch_size=8, sampler=bank_sampler)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            train_sampler.set_epoch(epoch)
            train(model, train_loader, optimizer)
            test(model, bank_loader)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_sampler_whose_loader_only_feeds_a_no_grad_pass_needs_no_set_epoch():
    """The feature bank's loader is read only under `torch.no_grad()` (in the function it is handed to): its order
    trains nothing (no DDP001); read by the training function, it is reported."""
    assert not [f for f in _found({"train.py": _BANK}) if f[2] == "DDP001"]
    trained = _BANK.replace("            test(model, bank_loader)\n", "            train(model, bank_loader, optimizer)\n")
    assert [f[2] for f in _found({"train.py": trained}) if f[2] == "DDP001"] == ["DDP001"]


_BEST_ITEM = """
    import logging
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    logger = logging.getLogger(__name__)


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        data = TensorDataset(torch.randn(64, 4))
        loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        best = torch.load("best.pt")["mae"]
        for epoch in range(3):
            loader.sampler.set_epoch(epoch)
            avg_losses = {}
            for (x,) in loader:
                losses = {"loss": model(x).pow(2).mean()}
                losses["loss"].backward()
                for key, value in losses.items():
                    avg_losses.setdefault(f"train/{key}", []).append(value.item())
            if rank == 0:
                with torch.no_grad():
                    for (x,) in DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=8):
                        losses = {"mae": model.module(x).abs().mean()}
                        for key, value in losses.items():
                            avg_losses.setdefault(f"val/{key}", []).append(value.item())
                for key, value in avg_losses.items():
                    avg_losses[key] = sum(value) / len(value)
                if best > avg_losses["val/mae"]:
                    best = avg_losses["val/mae"]
                    logger.warning(f"best model so far, with mae {best}")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_best_so_far_taken_from_an_evaluation_item_is_not_the_training_loss():
    """`best = avg_losses["val/mae"]` right before the report: the evaluation's figure, not rank 0's training loss
    (no DDP006); `best = avg_losses["train/loss"]` is."""
    assert not [f for f in _found({"train.py": _BEST_ITEM}) if f[2] == "DDP006"]
    trained = _BEST_ITEM.replace('best = avg_losses["val/mae"]', 'best = avg_losses["train/loss"]')
    assert [f[1] for f in _found({"train.py": trained}) if f[2] == "DDP006"] == [
        'logger.warning(f"best model so far, with mae {best}")']
