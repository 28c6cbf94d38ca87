"""Which ranks run a statement: a guard whose other arm holds only where no process group runs, a rank flag
handed to a project class's constructor, code no rank runs."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _lines(code: str, text: str) -> list[int]:
    return [i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line]


# ---- `rank is None or rank == 0` where None means no process group ---------------------------------------
_OPTIONS = """
    import argparse


    class Options:
        def __init__(self):
            self.parser = argparse.ArgumentParser()
            self.parser.add_argument("--local_rank", type=int, default=None)

        def parse(self):
            self.opt = self.parser.parse_args()
            lead = self.opt.local_rank is None or self.opt.local_rank == 0
            if lead:
                print("options:", vars(self.opt))
            return self.opt
"""

_GATED_BY_HELPER = """
    import torch
    import torch.distributed as dist
    from options import Options


    def join_group(rank_id):
        if rank_id is not None:
            dist.init_process_group(backend="nccl")
            torch.cuda.set_device(rank_id)


    def main():
        opt = Options().parse()
        rank_id = opt.local_rank
        join_group(rank_id)
        net = torch.nn.Linear(4, 4).cuda()
        if rank_id is not None:
            net = torch.nn.parallel.DistributedDataParallel(net, device_ids=[rank_id])
        for step in range(10):
            loss = net(torch.zeros(2, 4)).sum()
            loss.backward()
            if step % 5 == 0 and (None == rank_id or rank_id == 0):
                print("step done", step)
        if rank_id is None or rank_id == 0:
            torch.save(net.state_dict(), "net.pt")
            print("saved")


    if __name__ == "__main__":
        main()
"""

_RANK_GIVEN_TO_GROUP = """
    import argparse
    import torch
    import torch.distributed as dist


    class Runner:
        def __init__(self, net, proc_rank):
            self.net = net
            self.proc_rank = proc_rank

        def epoch(self):
            for _ in range(3):
                self.net(torch.zeros(1, 4)).sum().backward()
            if self.proc_rank is None or self.proc_rank == 0:
                print("epoch done")
                torch.save(self.net.state_dict(), "last.pt")


    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--distributed", action="store_true")
        p.add_argument("--local_rank", type=int, default=None)
        args = p.parse_args()
        if args.distributed:
            dist.init_process_group("nccl", init_method="env://", world_size=2, rank=args.local_rank)
            torch.cuda.set_device(args.local_rank)
        if args.local_rank is None or args.local_rank == 0:
            print("config", args)
        runner = Runner(torch.nn.Linear(4, 4), args.local_rank)
        runner.epoch()


    if __name__ == "__main__":
        main()
"""

_NOT_GATED = """
    import argparse
    import os
    import torch
    import torch.distributed as dist


    def main():
        p = argparse.ArgumentParser()
        p.add_argument("--local_rank", type=int, default=None)
        args = p.parse_args()
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        if args.local_rank is None or args.local_rank == 0:
            print("config", args)


    if __name__ == "__main__":
        main()
"""


def test_a_guard_whose_none_arm_is_the_run_without_a_process_group_is_a_rank_0_guard():
    found = lint_sources({"train.py": textwrap.dedent(_GATED_BY_HELPER), "options.py": textwrap.dedent(_OPTIONS)})
    prints = {("train.py", n) for n in _lines(_GATED_BY_HELPER, "print(")} | {("options.py", _lines(_OPTIONS, "print(")[0])}
    assert len(prints) == 3
    assert not [f for f in found if (f.path, f.line) in prints]
    save = _lines(_GATED_BY_HELPER, "torch.save(")[0]
    # a local-rank guard: local rank 0 of each node saves (the multi-node finding), not every rank
    assert [f.message for f in found if f.line == save and f.path == "train.py" and f.rule == "DDP004"] == [
        m for f in found if f.line == save for m in [f.message] if "local-rank check only" in m]


def test_a_rank_the_process_group_takes_is_never_none_where_the_group_runs():
    found = _lint({"train.py": _RANK_GIVEN_TO_GROUP})
    for line in _lines(_RANK_GIVEN_TO_GROUP, "print(") + _lines(_RANK_GIVEN_TO_GROUP, "torch.save("):
        assert not {r for _, n, r in found if n == line} & {"DDP008", "DDP004"}, line


def test_a_none_arm_that_holds_on_every_rank_still_leaves_the_print_unguarded():
    # torchrun passes no --local_rank: it stays None on every rank, and the group starts whatever it holds
    found = _lint({"train.py": _NOT_GATED})
    assert ("train.py", _lines(_NOT_GATED, "print(")[0], "DDP008") in found


# ---- a rank flag handed to a project class's constructor --------------------------------------------------
_CONSOLE = """
    import logging


    class Console:
        def __init__(self, tag, active=True):
            self.tag = tag
            self.shown = active
            self.say("console ready")

        def say(self, text):
            if self.shown:
                print(self.tag, text)
                logging.info(text)
"""

_BUILDS_CONSOLE = """
    import os
    import torch
    import torch.distributed as dist
    from console import Console


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        out = Console("train", active=(rank == 0))
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda())
        for step in range(3):
            net(torch.zeros(2, 4).cuda()).sum().backward()
        out.say("finished")
        extra = Console("eval", rank == 0)
        extra.say("eval finished")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_rank_flag_every_construction_gives_is_a_rank_check_on_the_attribute_it_is_stored_in():
    found = _lint({"train.py": _BUILDS_CONSOLE, "console.py": _CONSOLE})
    for line in _lines(_CONSOLE, "print(") + _lines(_CONSOLE, "logging.info("):
        assert ("console.py", line, "DDP008") not in found, line


def test_one_construction_without_the_flag_leaves_the_attribute_unguarded():
    every_rank = _BUILDS_CONSOLE.replace('Console("eval", rank == 0)', 'Console("eval")')
    found = _lint({"train.py": every_rank, "console.py": _CONSOLE})
    assert ("console.py", _lines(_CONSOLE, "print(")[0], "DDP008") in found


_SPLIT_NAME = """
    import importlib
    import torch
    import torch.distributed as dist


    def build_criterion(cfg, rank):
        module_name, loss_cls = cfg["criterion"].rsplit(".", 1)
        if rank == 0:
            print("criterion {} from {}".format(loss_cls, module_name))
        return getattr(importlib.import_module(module_name), loss_cls)()


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        crit = build_criterion({"criterion": "torch.nn.MSELoss"}, rank)
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda())
        loss = crit(net(torch.zeros(2, 4).cuda()), torch.zeros(2, 4).cuda())
        loss.backward()
        if rank == 0:
            print("loss", loss.item())
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_the_name_of_a_loss_cut_from_a_setting_string_is_no_figure():
    found = _lint({"train.py": _SPLIT_NAME})
    printed = _lines(_SPLIT_NAME, "print(")
    assert ("train.py", printed[0], "DDP006") not in found
    assert ("train.py", printed[1], "DDP006") in found  # the loss itself still is


# ---- a method reached only through objects of another class ---------------------------------------------
_METERS = """
    class RunningMean:
        def __init__(self):
            self.total, self.count = 0.0, 0

        def add(self, value):
            self.total, self.count = self.total + value, self.count + 1

        def show(self):
            print("mean", self.total / max(self.count, 1))


    class Board:
        def __init__(self, on):
            self.on = on

        def show(self, text):
            if self.on:
                print(text)
"""

_USES_METERS = """
    import torch
    import torch.distributed as dist
    from meters import Board, RunningMean


    def main():
        dist.init_process_group("nccl")
        board = Board(dist.get_rank() == 0)
        mean = RunningMean()
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda())
        for _ in range(3):
            loss = net(torch.zeros(2, 4).cuda()).sum()
            loss.backward()
            mean.add(1.0)
        board.show("done")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_method_only_objects_of_another_class_are_asked_for_never_runs():
    found = _lint({"train.py": _USES_METERS, "meters.py": _METERS})
    assert ("meters.py", _lines(_METERS, 'print("mean"')[0], "DDP008") not in found


def test_a_method_asked_of_an_object_of_unknown_class_still_runs():
    unknown = _USES_METERS.replace('board.show("done")', 'for thing in (board, mean):\n            thing.show()')
    found = _lint({"train.py": unknown, "meters.py": _METERS})
    assert ("meters.py", _lines(_METERS, 'print("mean"')[0], "DDP008") in found


# ---- a branch only the calls that leave a switch off take ---------------------------------------------------
_SWITCH = """
    import torch
    import torch.distributed as dist


    def store(net, tag, final=False):
        blob = {"net": net.state_dict(), "tag": tag}
        if final:
            torch.save(blob, "final.pt")
        elif tag % 2 == 0:
            torch.save(blob, f"tag_{tag}.pt")
        else:
            print("skipped", tag)


    def main():
        dist.init_process_group("nccl")
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4).cuda())
        for epoch in range(4):
            net(torch.zeros(2, 4).cuda()).sum().backward()
            if dist.get_rank() == 0:
                store(net, epoch)
        store(net, 99, final=True)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_branch_only_calls_leaving_a_switch_off_reach_has_their_guard():
    found = _lint({"train.py": _SWITCH})
    saves = _lines(_SWITCH, "torch.save(")
    # the every-rank call turns `final` on: reported at that call, where the rank check goes
    assert ("train.py", _lines(_SWITCH, "store(net, 99, final=True)")[0], "DDP004") in found
    assert ("train.py", saves[0], "DDP004") not in found
    assert ("train.py", saves[1], "DDP004") not in found
    assert ("train.py", _lines(_SWITCH, "print(")[0], "DDP008") not in found


def test_a_call_that_may_turn_the_switch_on_or_off_keeps_both_branches_unguarded():
    maybe = _SWITCH.replace("store(net, 99, final=True)", "store(net, 99, final=epoch > 2)")
    found = _lint({"train.py": maybe})
    assert ("train.py", _lines(_SWITCH, "print(")[0], "DDP008") in found


def test_the_switch_is_followed_to_a_helper_of_another_file():
    helper = _SWITCH[:_SWITCH.index("    def main():")]
    caller = "\n    import torch\n    import torch.distributed as dist\n    from saving import store\n\n\n" + \
        _SWITCH[_SWITCH.index("    def main():"):]
    found = _lint({"train.py": caller, "saving.py": helper})
    assert ("saving.py", _lines(helper, "print(")[0], "DDP008") not in found
    assert ("train.py", _lines(caller, "store(net, 99, final=True)")[0], "DDP004") in found


# ---- a mode that starts no process group ----------------------------------------------------------------
_CACHE = """
    import torch
    from tqdm import tqdm


    class Corpus:
        def __init__(self, root):
            self.root = root
            self.items = self.scan()

        def scan(self):
            print("scanning", self.root)
            return [torch.zeros(3) for _ in tqdm(range(5))]

        def dump(self, target):
            torch.save(self.items, target)
            print("wrote", target)
"""

_MODES = """
    import argparse
    import torch
    import torch.distributed as dist
    from corpus import Corpus


    class Job:
        def __init__(self, opts):
            self.opts = opts

        def build_cache(self):
            corpus = Corpus(self.opts.root)
            corpus.dump("cache.pt")

        def fit(self):
            dist.init_process_group("nccl")
            net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3).cuda())
            for blob in torch.load("cache.pt", map_location="cpu"):
                net(blob.cuda()).sum().backward()
            if dist.get_rank() == 0:
                torch.save(net.module.state_dict(), "net.pt")
            dist.destroy_process_group()


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--mode", default="fit")
        parser.add_argument("--root", default="data")
        opts = parser.parse_args()
        job = Job(opts)
        if opts.mode == "cache":
            job.build_cache()
        elif opts.mode == "fit":
            job.fit()


    if __name__ == "__main__":
        main()
"""


def _cache_lines() -> set[tuple[str, int, str]]:
    return {("corpus.py", n, "DDP008") for n in _lines(_CACHE, "print(") + _lines(_CACHE, "tqdm(range")} | {
        ("corpus.py", _lines(_CACHE, "torch.save(")[0], "DDP004")}


def test_a_mode_that_starts_no_process_group_is_one_process():
    found = _lint({"train.py": _MODES, "corpus.py": _CACHE})
    assert not found & _cache_lines()


def test_a_mode_entered_after_the_group_started_runs_on_every_rank():
    started = _MODES.replace("        job = Job(opts)\n", "        job = Job(opts)\n        dist.init_process_group(\"nccl\")\n")
    found = _lint({"train.py": started, "corpus.py": _CACHE})
    assert _cache_lines() <= found


def test_a_mode_calling_what_the_program_does_not_pin_down_is_left_alone():
    unknown = _MODES.replace("            job.build_cache()", "            for step in opts.steps:\n                step.fit()\n"
                             "            job.build_cache()")
    found = _lint({"train.py": unknown, "corpus.py": _CACHE})
    assert _cache_lines() <= found


# ---- a per-sample load behind a helper -------------------------------------------------------------------
_SAMPLES = """
    import functools
    from multiprocessing import Pool

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, Dataset, DistributedSampler


    def read_blob(path, scale=1.0):
        return torch.load(path) * scale


    def blob_size(path, scale):
        return read_blob(path, scale).numel()


    class Blobs(Dataset):
        def __init__(self, paths):
            self.paths = paths
            with Pool(4) as pool:
                self.sizes = list(pool.imap(functools.partial(blob_size, scale=2.0), paths))

        def __len__(self):
            return len(self.paths)

        def __getitem__(self, i):
            return read_blob(self.paths[i])


    def main():
        dist.init_process_group("nccl")
        data = Blobs([f"{i}.pt" for i in range(8)])
        loader = DataLoader(data, sampler=DistributedSampler(data))
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3).cuda())
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            for x in loader:
                net(x.cuda()).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_load_in_a_helper_only_item_code_calls_is_per_sample():
    found = _lint({"train.py": _SAMPLES})
    assert ("train.py", _lines(_SAMPLES, "torch.load(")[0], "DDP005") not in found


def test_a_load_helper_the_training_code_also_calls_is_still_reported():
    also = _SAMPLES.replace("        data = Blobs(", "        start = read_blob(\"start.pt\")\n        data = Blobs(")
    found = _lint({"train.py": also})
    assert ("train.py", _lines(_SAMPLES, "torch.load(")[0], "DDP005") in found


# ---- module code of a script mp.spawn starts again in each worker ----------------------------------------
_SPAWNED = """
    import random

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    random.seed(7)
    torch.manual_seed(7)


    def worker(rank, world):
        dist.init_process_group("nccl", rank=rank, world_size=world)
        net = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3).cuda(rank), device_ids=[rank])
        net(torch.randn(2, 3).cuda(rank)).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(worker, args=(2,), nprocs=2)
"""


def test_a_seed_in_module_code_of_a_spawned_script_runs_in_every_worker():
    found = _lint({"train.py": _SPAWNED})
    assert not [f for f in found if f[2] == "DDP014"]


def test_a_seed_in_the_main_block_of_a_spawned_script_stays_in_the_parent():
    """The workers do not inherit the parent's generators: the ranks are not seeded alike, so no DDP014."""
    parent = _SPAWNED.replace("    torch.manual_seed(7)\n", "").replace(
        "        mp.spawn(", "        torch.manual_seed(7)\n        mp.spawn(")
    found = _lint({"train.py": parent})
    assert ("train.py", _lines(parent, "torch.manual_seed(7)")[0], "DDP014") not in found


# ---- one machine: the rank is the local rank, or the rendezvous is a config default on this host -----------
_LOCAL_AS_RANK = """
    import os
    import torch
    import torch.distributed as dist


    def fit(net, slot):
        dist.init_process_group("nccl", init_method="env://", rank=slot, world_size=4)
        torch.cuda.set_device(slot)
        net = torch.nn.parallel.DistributedDataParallel(net.cuda(slot), device_ids=[slot])
        net(torch.zeros(2, 3).cuda(slot)).sum().backward()
        if slot == 0:
            torch.save(net.module.state_dict(), "net.pt")
        dist.destroy_process_group()


    if __name__ == "__main__":
        local_rank = int(os.environ["LOCAL_RANK"])
        fit(torch.nn.Linear(3, 3), local_rank)
"""

_CONFIG_DEFAULT = """
    import os
    from dataclasses import dataclass

    import torch
    import torch.distributed as dist


    @dataclass
    class Settings:
        backend: str = "nccl"
        rendezvous: str = "tcp://localhost:29511"
        rank: int = 0
        world_size: int = 2


    def run(cfg):
        cfg.rank = int(os.environ["RANK"])
        dist.init_process_group(cfg.backend, cfg.rendezvous, rank=cfg.rank, world_size=cfg.world_size)
        torch.cuda.set_device(cfg.rank)
        dist.destroy_process_group()


    if __name__ == "__main__":
        run(Settings())
"""


def test_a_group_that_takes_the_local_rank_as_its_rank_is_one_machine():
    found = _lint({"train.py": _LOCAL_AS_RANK})
    assert ("train.py", _lines(_LOCAL_AS_RANK, "torch.save(")[0], "DDP004") not in found


def test_a_local_rank_guard_is_still_reported_where_the_group_takes_the_global_rank():
    global_rank = _LOCAL_AS_RANK.replace("rank=slot, world_size=4", "rank=int(os.environ[\"RANK\"]), world_size=4")
    found = _lint({"train.py": global_rank})
    assert ("train.py", _lines(_LOCAL_AS_RANK, "torch.save(")[0], "DDP004") in found


def test_a_rendezvous_a_config_class_pins_to_this_host_is_one_machine():
    found = _lint({"train.py": _CONFIG_DEFAULT})
    assert ("train.py", _lines(_CONFIG_DEFAULT, "set_device(")[0], "DDP012") not in found
    option = _CONFIG_DEFAULT + '\n    import argparse\n    argparse.ArgumentParser().add_argument("--rendezvous")\n'
    assert ("train.py", _lines(_CONFIG_DEFAULT, "set_device(")[0], "DDP012") in _lint({"train.py": option})


# ---- a branch for a wrapper the program never builds -----------------------------------------------------
_WRAPPED = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel


    def keep(net, path):
        if isinstance(net, torch.nn.DataParallel):
            torch.save(net.module.state_dict(), path)
        else:
            torch.save(net.state_dict(), path)


    def main():
        dist.init_process_group("nccl")
        net = DistributedDataParallel(torch.nn.Linear(3, 3).cuda())
        net(torch.zeros(2, 3).cuda()).sum().backward()
        keep(net, "net.pt")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_dataparallel_branch_of_a_program_that_builds_none_never_runs():
    found = _lint({"train.py": _WRAPPED})
    saves = _lines(_WRAPPED, "torch.save(")
    assert ("train.py", saves[0], "DDP004") not in found
    assert ("train.py", saves[1], "DDP004") in found
    built = _WRAPPED.replace("        net = DistributedDataParallel(torch.nn.Linear(3, 3).cuda())",
                             "        net = torch.nn.DataParallel(torch.nn.Linear(3, 3).cuda())")
    assert ("train.py", saves[0], "DDP004") in _lint({"train.py": built})
