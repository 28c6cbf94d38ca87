"""Precision of the linter on flags that hold a rank test, loaders that are not sharded, and single-process paths."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


_SETUP = """
    import os
    import torch
    import torch.distributed as dist


    def setup(opts):
        opts.rank = int(os.environ["RANK"])
        dist.init_process_group("nccl", rank=opts.rank)
        if opts.rank % torch.cuda.device_count() == 0:
            opts.chatty = True
        else:
            opts.chatty = False
"""

_TRAIN = """
    import argparse
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from setup import setup


    def main():
        opts = argparse.ArgumentParser().parse_args()
        setup(opts)
        model = DDP(torch.nn.Linear(2, 2).cuda())
        for step in range(10):
            loss = model(torch.randn(4, 2).cuda()).sum()
            loss.backward()
            if opts.chatty:
                print("step", step)
        print("done")


    if __name__ == "__main__":
        main()
"""


def test_an_attribute_set_true_in_a_rank_branch_and_false_otherwise_is_a_rank_check_in_another_file():
    found = _lint({"setup.py": _SETUP, "train.py": _TRAIN})
    assert ("train.py", _line(_TRAIN, 'print("step"'), "DDP008") not in found
    assert ("train.py", _line(_TRAIN, 'print("done")'), "DDP008") in found  # the control: no check at all


_TAGGED = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        model = DDP(torch.nn.Linear(2, 2).cuda())
        for epoch in range(3):
            print(f"[GPU{torch.cuda.current_device()}] epoch {epoch}")
            print(f"epoch {epoch}")
            model(torch.randn(4, 2).cuda()).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_line_that_names_the_current_device_is_tagged_per_process():
    found = _lint({"train.py": _TAGGED})
    assert ("train.py", _line(_TAGGED, "[GPU{"), "DDP008") not in found
    assert ("train.py", _line(_TAGGED, 'print(f"epoch'), "DDP008") in found


_GROUPS = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    def main(groups, num_epochs):
        dist.init_process_group("nccl")
        model = torch.nn.Linear(2, 2)
        for epoch in range(num_epochs):
            for group in groups:
                sampler = DistributedSampler(group)
                loader = DataLoader(group, batch_size=4, sampler=sampler)
                sampler.set_epoch(epoch)
                for x in loader:
                    model(x).sum().backward()
        dist.destroy_process_group()
"""


def test_set_epoch_of_a_sampler_rebuilt_per_group_gets_the_outer_loops_epoch():
    assert not {f for f in _lint({"train.py": _GROUPS}) if f[2] == "DDP001"}
    # the control: a value no loop changes, handed to the rebuilt sampler
    fixed = _GROUPS.replace("sampler.set_epoch(epoch)", "sampler.set_epoch(num_epochs)")
    assert ("train.py", _line(fixed, "set_epoch(num_epochs)"), "DDP001") in _lint({"train.py": fixed})


_FIT = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def fit(net):
        dist.init_process_group("nccl")
        model = DDP(net.cuda())
        model(torch.randn(4, 2).cuda()).sum().backward()
        if dist.get_rank() == 0:
            torch.save(net.state_dict(), "net.pt")
        dist.destroy_process_group()
"""

_APP = """
    import os
    import torch
    from fit import fit


    def prepare():
        net = torch.nn.Linear(2, 2)
        if os.path.exists("net.pt"):
            net.load_state_dict(torch.load("net.pt"))
        else:
            fit(net)
            net.load_state_dict(torch.load("net.pt"))
        return net


    def main():
        net = prepare()
        print(net)


    if __name__ == "__main__":
        main()
"""


def test_a_load_on_the_arm_that_starts_no_process_group_is_one_process_s():
    found = {f for f in _lint({"fit.py": _FIT, "app.py": _APP}) if f[2] == "DDP005"}
    lines = [i for i, text in enumerate(textwrap.dedent(_APP).splitlines(), 1) if "torch.load(" in text]
    assert ("app.py", lines[0], "DDP005") not in found  # the arm without fit(): no group, one process
    assert ("app.py", lines[1], "DDP005") in found  # the control: after fit() started the group on every rank


_UNUSED_SAMPLER = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    def main(data):
        dist.init_process_group("nccl")
        loader = DataLoader(data, batch_size=4)
        sampler = DistributedSampler(data)
        model = torch.nn.Linear(2, 2)
        for epoch in range(3):
            for x in loader:
                model(x).sum().backward()
        dist.destroy_process_group()
"""


def test_a_sampler_no_loader_is_given_needs_no_set_epoch():
    assert not {f for f in _lint({"train.py": _UNUSED_SAMPLER}) if f[2] == "DDP001"}
    # the control: the same sampler given to the loader
    used = _UNUSED_SAMPLER.replace("        loader = DataLoader(data, batch_size=4)\n", "").replace(
        "        sampler = DistributedSampler(data)\n",
        "        sampler = DistributedSampler(data)\n        loader = DataLoader(data, batch_size=4, sampler=sampler)\n")
    assert ("train.py", _line(used, "DistributedSampler(data)"), "DDP001") in _lint({"train.py": used})


_WEIGHT = """
    import argparse
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    parser = argparse.ArgumentParser()
    parser.add_argument("--aux_loss", type=float, default=0.1)
    args = parser.parse_args()
    aux_loss = args.aux_loss


    def main():
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(2, 2).cuda())
        if dist.get_rank() == 0:
            print("aux weight", aux_loss)
        for epoch in range(3):
            main_loss = model(torch.randn(4, 2).cuda()).sum()
            (main_loss * (1 + aux_loss)).backward()
            if dist.get_rank() == 0:
                print("loss", main_loss.item())
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_loss_weight_read_from_the_command_line_is_a_setting_not_a_figure():
    found = _lint({"train.py": _WEIGHT})
    assert ("train.py", _line(_WEIGHT, 'print("aux weight"'), "DDP006") not in found
    assert ("train.py", _line(_WEIGHT, 'print("loss"'), "DDP006") in found  # the control: rank 0's own loss


_REPORT = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler


    def write_summary(path, final_loss):
        with open(path, "w") as f:
            f.write(f"loss {final_loss:.4f}")


    def evaluate(model, val_loader, path):
        total = 0.0
        with torch.no_grad():
            for x, y in val_loader:
                total += torch.nn.functional.mse_loss(model(x), y).item()
        final_loss = total / len(val_loader)
        print(f"final loss {final_loss:.4f}")
        write_summary(path, final_loss)


    def main(train_set, val_set):
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        model = DDP(torch.nn.Linear(2, 2).cuda())
        sampler = DistributedSampler(train_set)
        train_loader = DataLoader(train_set, batch_size=8, sampler=sampler)
        val_loader = DataLoader(val_set, batch_size=8, sampler=DistributedSampler(val_set, shuffle=False))
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for x, y in train_loader:
                torch.nn.functional.mse_loss(model(x), y).backward()
            for x, y in val_loader:
                model(x)
        if rank == 0:
            full_loader = DataLoader(val_set, batch_size=64)
            evaluate(model.module, full_loader, "summary.txt")
        dist.destroy_process_group()
"""


def test_a_figure_over_a_loader_built_without_a_sampler_is_the_whole_sets():
    found = {f for f in _lint({"train.py": _REPORT}) if f[2] == "DDP006"}
    assert ("train.py", _line(_REPORT, 'print(f"final loss'), "DDP006") not in found
    assert ("train.py", _line(_REPORT, 'f.write(f"loss'), "DDP006") not in found
    # the control: rank 0 evaluates the sharded validation loader instead
    sharded = _REPORT.replace("evaluate(model.module, full_loader,", "evaluate(model.module, val_loader,")
    assert ("train.py", _line(sharded, 'print(f"final loss'), "DDP006") in _lint({"train.py": sharded})


_BEST = """
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def evaluate(model, loader):
        return sum(model(x).sum().item() for x in loader)


    def main(train_loader, val_loader):
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(2, 2).cuda())
        best_loss = np.inf
        for epoch in range(3):
            for x in train_loader:
                model(x).sum().backward()
            if dist.get_rank() == 0:
                val_loss = evaluate(model.module, val_loader)
                if val_loss < best_loss:
                    best_loss = val_loss
                print(f"best {best_loss:.4f}")
                loss_info = {"auc": val_loss / 2, "acc": val_loss / 3}
                for tag, value in loss_info.items():
                    print(tag, value)
        dist.destroy_process_group()
"""


def test_a_best_so_far_copy_and_a_dict_of_evaluation_figures_are_the_evaluations():
    found = {f for f in _lint({"train.py": _BEST}) if f[2] == "DDP006"}
    assert ("train.py", _line(_BEST, 'print(f"best'), "DDP006") not in found
    assert ("train.py", _line(_BEST, "print(tag, value)"), "DDP006") not in found
    # the same names for what rank 0 computed from its own training batches: reported
    trained = _BEST.replace("val_loss = evaluate(model.module, val_loader)", "val_loss = model(x).sum().item()")
    assert ("train.py", _line(trained, 'print(f"best'), "DDP006") in _lint({"train.py": trained})


_MODES = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler


    class Loaders:
        def __init__(self, data, mode):
            if mode == "train":
                self.data = DataLoader(data, sampler=DistributedSampler(data, shuffle=False))
            elif mode == "eval":
                self.data = DataLoader(data)
            else:
                print("unknown mode", mode)


    def main(data):
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(2, 2).cuda())
        train = Loaders(data, "train").data
        test = Loaders(data, "eval").data
        for x in train:
            model(x).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main(torch.randn(64, 2))
"""


def test_the_last_else_of_a_chain_every_call_passes_a_tested_value_never_runs():
    assert ("train.py", _line(_MODES, 'print("unknown mode"'), "DDP008") not in _lint({"train.py": _MODES})
    # the control: a call with another value reaches the else
    other = _MODES.replace('Loaders(data, "eval")', 'Loaders(data, "predict")')
    assert ("train.py", _line(other, 'print("unknown mode"'), "DDP008") in _lint({"train.py": other})
