"""Which rank runs what: rank-0 guards with single-process arms, output silenced off rank 0, data named by dict
keys and loader attributes, module functions reached only through modules."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


_DIST = """
    import torch.distributed as dist

    NUM_GPUS = 2


    def is_main_proc():
        return NUM_GPUS == 1 or dist.get_rank() % NUM_GPUS == 0
"""

_TRAIN = """
    import torch
    import torch.distributed as dist
    import distributed as du


    def save(model, path):
        if not du.is_main_proc():
            return
        torch.save(model.state_dict(), path)  # save via helper


    def save_if_first(model, path):
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        torch.save(model.state_dict(), path)  # save after early return


    def save_every_rank(model, path):
        if du.NUM_GPUS == 1 and dist.get_rank() != 0:
            return
        torch.save(model.state_dict(), path)  # save on every rank


    def main():
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 2)
        save(model, "a.pt")
        save_if_first(model, "b.pt")
        save_every_rank(model, "c.pt")
        if du.is_main_proc():
            print("from the helper")
        if du.NUM_GPUS == 1 or dist.get_rank() == 0:
            print("inline")
        is_master = not dist.is_initialized() or dist.get_rank() == 0
        if is_master:
            print("through a flag")
        if du.NUM_GPUS == 1 or du.NUM_GPUS > 4:
            print("no rank arm")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_single_process_arm_beside_a_rank_arm_guards_rank_0():
    found = _lint({"distributed.py": _DIST, "train.py": _TRAIN})
    for text in ("save via helper", "save after early return"):
        assert ("train.py", _line(_TRAIN, text), "DDP004") not in found, text
    for text in ('print("from the helper")', 'print("inline")', 'print("through a flag")'):
        assert ("train.py", _line(_TRAIN, text), "DDP008") not in found, text


def test_a_count_test_without_a_rank_arm_guards_nothing():
    found = _lint({"distributed.py": _DIST, "train.py": _TRAIN})
    assert ("train.py", _line(_TRAIN, "save on every rank"), "DDP004") in found
    assert ("train.py", _line(_TRAIN, 'print("no rank arm")'), "DDP008") in found


_SILENCED = """
    import logging
    import os
    import sys

    import torch
    import torch.distributed as dist
    from tqdm import tqdm


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        print("before the redirect")
        if rank != 0:
            sys.stdout = open(os.devnull, "w")
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
        logging.info("configured")
        print("after the redirect")
        for _ in tqdm(range(3)):
            pass
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_stdout_sent_to_devnull_off_rank_0_silences_print_and_logging_after_it():
    found = _lint({"train.py": _SILENCED})
    assert ("train.py", _line(_SILENCED, 'print("after the redirect")'), "DDP008") not in found
    assert ("train.py", _line(_SILENCED, 'logging.info("configured")'), "DDP008") not in found
    # before the redirect every rank prints; tqdm writes to sys.stderr, which nothing silences
    assert ("train.py", _line(_SILENCED, 'print("before the redirect")'), "DDP008") in found
    assert ("train.py", _line(_SILENCED, "tqdm(range(3))"), "DDP008") in found


def test_stdout_redirected_on_every_rank_silences_nothing():
    code = _SILENCED.replace("if rank != 0:\n            sys.stdout", "if True:\n            sys.stdout")
    assert code != _SILENCED
    found = _lint({"train.py": code})
    assert ("train.py", _line(code, 'print("after the redirect")'), "DDP008") in found
    assert ("train.py", _line(code, 'logging.info("configured")'), "DDP008") in found


_KEYED = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    def main(dataset):
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        sampler = {"train": None, "dev": None}
        sampler["train"] = DistributedSampler(dataset["train"], shuffle=True)
        sampler["dev"] = DistributedSampler(dataset["dev"], shuffle=False)
        samplers = {"test": DistributedSampler(dataset["test"])}
        loader = {
            "train": DataLoader(dataset["train"], sampler=sampler["train"]),
            "dev": DataLoader(dataset["dev"], sampler=sampler["dev"]),
            "test": DataLoader(dataset["test"], sampler=samplers["test"]),
        }
        for name in ("train", "dev", "test"):
            for batch in loader[name]:
                print(batch)
        dist.destroy_process_group()
"""


def test_a_dict_key_names_evaluation_data_like_a_variable():
    found = _lint({"train.py": _KEYED})
    assert ("train.py", _line(_KEYED, 'sampler["dev"] = Distributed'), "DDP006") in found
    assert ("train.py", _line(_KEYED, '"test": DistributedSampler'), "DDP006") in found
    assert ("train.py", _line(_KEYED, 'sampler["train"] = Distributed'), "DDP006") not in found


_QUEUES = """
    import argparse

    import torch
    import torch.distributed as dist
    import utils
    from torch.utils.data import DataLoader, DistributedSampler


    def main(args, train_data, valid_data):
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        train_queue = DataLoader(train_data, sampler=DistributedSampler(train_data))
        valid_queue = DataLoader(valid_data, sampler=DistributedSampler(valid_data))
        model = torch.nn.Linear(2, 2)
        for epoch in range(args.epochs):
            train_queue.sampler.set_epoch(epoch)
            valid_queue.sampler.set_epoch(0)  # evaluation order
            train_queue.sampler.set_epoch(0)  # training order
            for x in train_queue:
                model(x).sum().backward()
            utils.store(model, args.save)
        dist.destroy_process_group()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--save", default="out")
        parser.add_argument("--epochs", type=int, default=2)
        main(parser.parse_args(), None, None)
"""

_UTILS = """
    import torch
    import torch.distributed as dist


    def store(model, path):
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), path)


    def save(model, path):  # never called: `args.save` is a string of the parsed arguments
        torch.save(model.state_dict(), path)
"""


def test_set_epoch_on_a_loader_named_for_evaluation_is_not_a_fixed_training_order():
    found = _lint({"train.py": _QUEUES, "utils.py": _UTILS})
    assert ("train.py", _line(_QUEUES, "# evaluation order"), "DDP001") not in found
    assert ("train.py", _line(_QUEUES, "# training order"), "DDP001") in found


def test_an_attribute_of_a_value_does_not_reach_a_module_function_of_that_name():
    found = _lint({"train.py": _QUEUES, "utils.py": _UTILS})
    assert ("utils.py", _line(_UTILS, "def save") + 1, "DDP004") not in found
    called = _QUEUES.replace("utils.store(model, args.save)", "utils.save(model, args.save)")
    found = _lint({"train.py": called, "utils.py": _UTILS})
    assert ("utils.py", _line(_UTILS, "def save") + 1, "DDP004") in found


_PARENT = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import helpers


    def worker(rank, world_size):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        torch.manual_seed(rank)
        helpers.announce("worker")
        dist.destroy_process_group()


    if __name__ == "__main__":
        helpers.prepare("out")
        mp.spawn(worker, args=(2,), nprocs=2)
"""

_HELPERS = """
    import os


    def prepare(path):
        os.makedirs(path, exist_ok=True)
        print("experiment dir", path)  # parent only


    def announce(what):
        print("started", what)  # every rank
"""


def test_a_helper_only_the_parent_of_spawn_calls_runs_once():
    found = _lint({"train.py": _PARENT, "helpers.py": _HELPERS})
    assert ("helpers.py", _line(_HELPERS, "# parent only"), "DDP008") not in found
    assert ("helpers.py", _line(_HELPERS, "# every rank"), "DDP008") in found


_MEMBER = """
    import torch
    import torch.distributed as dist
    from backbones import ResNet  # not linted


    class Head(torch.nn.Module):
        def __init__(self, path):
            super().__init__()
            self.base = ResNet()
            self.base.load_param(path)  # the backbone's own method

        def load_param(self, path):
            print("loading", path)  # never called

        def describe(self):
            print("head")  # called from main

        def forward(self, x):
            return self.base(x)


    def main():
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = Head("w.pt")
        model.describe()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_call_on_a_member_does_not_run_the_class_own_method_of_that_name():
    found = _lint({"train.py": _MEMBER})
    assert ("train.py", _line(_MEMBER, "# never called"), "DDP008") not in found
    assert ("train.py", _line(_MEMBER, "# called from main"), "DDP008") in found
    called = _MEMBER.replace("model.describe()", "model.describe()\n        model.load_param('x.pt')")
    assert ("train.py", _line(called, "# never called"), "DDP008") in _lint({"train.py": called})


_ONLY_DDP = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    def main(args, data):
        if args.distributed:
            dist.init_process_group("gloo")
        else:
            raise NotImplementedError("only DDP")
        torch.manual_seed(0)
        sampler = DistributedSampler(data)
        loader = DataLoader(data, sampler=sampler)
        model = torch.nn.Linear(2, 2)
        for epoch in range(3):
            if args.distributed:
                sampler.set_epoch(epoch)  # under the flag
            for x in loader:
                model(x).sum().backward()
        dist.destroy_process_group()
"""


def test_a_run_without_the_flag_that_raises_never_builds_the_sampler():
    found = _lint({"train.py": _ONLY_DDP})
    assert ("train.py", _line(_ONLY_DDP, "# under the flag"), "DDP001") not in found
    falls_through = _ONLY_DDP.replace('raise NotImplementedError("only DDP")', 'print("one process")')
    # nor where the run without the flag goes on: every distributed run sets it, so each reshuffles
    assert not {f for f in _lint({"train.py": falls_through}) if f[2] == "DDP001"}
