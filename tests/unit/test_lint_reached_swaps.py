"""What a rank runs decides what silences or guards a line: a builtins.print swap whose installing call no rank
reaches leaves print on every rank; a mode switch's other value starts no group; a condition every rank computes
alike (a figure computed on the rank's device, an `or` arm that passes on every rank) is no per-rank doubt; a
logger that prints on rank 0 alone and writes each rank's own file reports rank 0's loss as the run's."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _found(files: dict[str, str]) -> set[tuple[str, int, str]]:
    return {(f.path, f.line, f.rule) for f in lint_sources({k: textwrap.dedent(v) for k, v in files.items()})}


_HUSH = """
    import builtins
    import os

    import torch.distributed as dist


    def quiet_others(is_main):
        original = builtins.print

        def gated(*args, **kwargs):
            if is_main or kwargs.pop("force", False):
                original(*args, **kwargs)
        setattr(builtins, "print", gated)


    def start_dist(opts):
        opts.rank = int(os.environ["RANK"])
        dist.init_process_group("nccl")
        quiet_others(opts.rank == 0)
"""

_RUN = """
    import argparse

    import torch.distributed as dist

    import hush


    def main(opts):
        print("options", opts)
        dist.init_process_group("nccl")
        # hush.start_dist(opts)
        print("group up")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main(argparse.ArgumentParser().parse_args())
"""


def test_a_print_swap_whose_installer_is_never_called_silences_nothing():
    found = _found({"hush.py": _HUSH, "run.py": _RUN})
    assert {("run.py", 10, "DDP008"), ("run.py", 13, "DDP008")} <= found


def test_a_print_swap_installed_before_a_print_still_silences_it():
    run = _RUN.replace('dist.init_process_group("nccl")\n        # hush.start_dist(opts)', "hush.start_dist(opts)")
    found = _found({"hush.py": _HUSH, "run.py": run})
    assert ("run.py", 10, "DDP008") in found  # above the installing call: every rank
    assert not any(path == "run.py" and line > 10 and rule == "DDP008" for path, line, rule in found)


_UTIL = """
    import builtins

    import torch.distributed as dist


    def mute_workers(rank):
        if rank != 0:
            builtins.print = lambda *a, **k: None


    def selftest():
        dist.init_process_group("gloo")
        mute_workers(dist.get_rank())


    if __name__ == "__main__":
        selftest()
"""

_FIT = """
    import torch
    import torch.distributed as dist

    from util import mute_workers


    def fit():
        dist.init_process_group("gloo")
        model = torch.nn.Linear(2, 2)
        for epoch in range(3):
            print("epoch", epoch)
        dist.destroy_process_group()


    if __name__ == "__main__":
        fit()
"""


def test_a_print_swap_installed_only_by_a_helpers_own_main_block_silences_nothing():
    assert ("fit.py", 12, "DDP008") in _found({"util.py": _UTIL, "fit.py": _FIT})
    installed = _FIT.replace('dist.init_process_group("gloo")\n        model',
                             'dist.init_process_group("gloo")\n        mute_workers(dist.get_rank())\n        model')
    assert not any(rule == "DDP008" for _, _, rule in _found({"util.py": _UTIL, "fit.py": installed}))


_MODES = """
    import argparse
    import os

    import torch
    import torch.distributed as dist


    def run(cfg):
        model = torch.nn.Linear(4, 4)
        if cfg.launch == "local":
            torch.save(model.state_dict(), "single.pt")
            print("saved the one-process model")
        if cfg.launch == "cluster":
            dist.init_process_group("nccl")
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
            torch.save(model.state_dict(), "every_rank.pt")
            dist.destroy_process_group()


    if __name__ == "__main__":
        p = argparse.ArgumentParser()
        p.add_argument("--launch", default="local")
        run(p.parse_args())
"""


def test_another_value_of_the_switch_that_starts_the_group_is_one_process():
    for source in (_MODES, _MODES.replace('if cfg.launch == "local":', 'if cfg.launch != "cluster":')):
        found = _found({"job.py": source})
        assert ("job.py", 17, "DDP004") in found
        assert not {("job.py", 12, "DDP004"), ("job.py", 13, "DDP008")} & found


def test_a_value_no_start_of_the_group_names_is_one_process_however_many_values_start_it():
    source = _MODES.replace('if cfg.launch == "local":',
                            'if cfg.launch == "slurm":\n            dist.init_process_group("nccl")\n'
                            '        if cfg.launch == "local":')
    found = _found({"job.py": source})
    # every init_process_group sits under `launch == "slurm"` or `launch == "cluster"`: `local` starts none
    assert ("job.py", 14, "DDP004") not in found
    assert ("job.py", 19, "DDP004") in found


_SPAWNED = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader, TensorDataset


    def evaluate(net, loader, dev):
        right = 0
        for x, y in loader:
            right += (net(x.cuda(dev)).argmax(1) == y.to(dev)).sum().item()
        return right / len(loader.dataset)


    def worker(idx, world):
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29500", rank=idx, world_size=world)
        torch.cuda.set_device(idx)
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 3).cuda(idx), device_ids=[idx])
        held_out = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,))), batch_size=16)
        top = 0.0
        for epoch in range(5):
            score = evaluate(net, held_out, idx)
            if score > top:
                top = score
                torch.save(net.module.state_dict(), "best.pt")
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(worker, args=(2,), nprocs=2)
"""


def test_a_figure_computed_on_the_ranks_device_is_no_per_rank_doubt():
    assert ("fit.py", 25, "DDP004") in _found({"fit.py": _SPAWNED})


def test_a_figure_that_reads_the_device_index_itself_is_still_doubted():
    source = _SPAWNED.replace("return right / len(loader.dataset)", "return right / len(loader.dataset) + dev")
    assert not any(rule == "DDP004" for _, _, rule in _found({"fit.py": source}))


_EITHER = """
    import torch
    import torch.distributed as dist


    def train(model, loader, opt, total):
        best = 0.0
        step = 0
        for x, y in loader:
            step += 1
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if dist.get_rank() == 0 and step % 100 == 0 or step == total:
                acc = (model(x).argmax(1) == y).float().mean().item()
                if acc > best:
                    best = acc
                    torch.save(model.state_dict(), "best.pt")


    def main():
        dist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 3))
        loader = [(torch.randn(4, 8), torch.randint(0, 3, (4,)))] * 10
        train(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), 10)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_value_made_under_an_or_whose_other_arm_passes_on_every_rank_is_made_on_every_rank():
    assert ("loop.py", 19, "DDP004") in _found({"loop.py": _EITHER})
    # rank 0 alone makes it: the save is doubted (or guarded), never reported as every rank's
    assert not any(rule == "DDP004" for _, _, rule in _found({"loop.py": _EITHER.replace(" or step == total", "")}))


_LOGGER = """
    import sys


    class Console:
        def __init__(self, folder, rank="0"):
            self.rank = rank
            self.handle = open(folder + f"/log_{rank}.txt", "a")

        def write(self, text):
            if self.rank == "0":
                print(text)
            print(text, file=self.handle)
"""

_LOGGED = """
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from console import Console


    def main():
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        out = Console("logs", rank=os.environ["RANK"] if "RANK" in os.environ else "0")
        model = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[int(os.environ["LOCAL_RANK"])])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            loss_terms = [model(torch.randn(2, 4).cuda()).sum()]
            loss = sum(loss_terms)
            opt.zero_grad()
            loss.backward()
            opt.step()
            text = ""
            for term in loss_terms:
                text += "%f " % term.item()
            out.write("step %d: %s" % (step, text))
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_logger_that_shows_rank_zero_alone_and_files_the_rest_reports_rank_zeros_loss():
    assert ("train.py", 26, "DDP006") in _found({"console.py": _LOGGER, "train.py": _LOGGED})


def test_a_logger_that_also_prints_to_the_console_on_every_rank_is_no_rank_zero_report():
    every = _LOGGER.replace("file=self.handle", "file=sys.stderr")
    assert not any(rule == "DDP006" for _, _, rule in _found({"console.py": every, "train.py": _LOGGED}))


_BY_TASK = """
    import argparse

    import torch.distributed as dist


    def fit():
        dist.init_process_group("gloo")
        dist.destroy_process_group()


    def check():
        print("checking")
        dist.init_process_group("gloo")
        print("checked")
        dist.destroy_process_group()


    if __name__ == "__main__":
        task = argparse.ArgumentParser().parse_args().task
        if task == "fit":
            fit()
        else:
            check()
"""


def test_a_switch_whose_else_starts_the_group_too_leaves_the_else_every_ranks():
    assert ("tasks.py", 15, "DDP008") in _found({"tasks.py": _BY_TASK})
