"""Output and figures that are not one rank's copy: streams silenced per rank, messages naming a value that differs
per rank, metrics that sync themselves, branches no call takes, messages just before the process dies."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


_SILENCED_BOTH = """
    import os
    import sys

    import torch
    import torch.distributed as dist
    from tqdm import tqdm


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        print("before the redirect")
        if local_rank != 0:
            sink = open(os.devnull, "w")
            sys.stdout = sys.stderr = sink
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        print("after the redirect")
        for _ in tqdm(range(3)):
            pass
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_stdout_and_stderr_sent_to_a_null_file_held_in_a_name_silence_print_and_tqdm():
    found = _lint({"train.py": _SILENCED_BOTH})
    assert ("train.py", _line(_SILENCED_BOTH, 'print("after the redirect")'), "DDP008") not in found
    assert ("train.py", _line(_SILENCED_BOTH, "tqdm(range(3))"), "DDP008") not in found
    assert ("train.py", _line(_SILENCED_BOTH, 'print("before the redirect")'), "DDP008") in found


def test_a_name_holding_a_real_file_silences_nothing():
    code = _SILENCED_BOTH.replace("open(os.devnull, \"w\")", "open(\"train.log\", \"w\")")
    assert code != _SILENCED_BOTH
    found = _lint({"train.py": code})
    assert ("train.py", _line(code, 'print("after the redirect")'), "DDP008") in found
    assert ("train.py", _line(code, "tqdm(range(3))"), "DDP008") in found


_DEVICE_HELD = """
    import os

    import torch
    import torch.distributed as dist


    class Runner:
        def __init__(self, local_rank):
            self.device = torch.device("cuda", local_rank)
            self.epochs = 3
            print(f"using device: {self.device}")
            print(f"epochs: {self.epochs}")


    def main():
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        gpu = f"cuda:{local_rank}"
        print("training on", gpu)
        runner = Runner(local_rank)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_message_naming_a_value_derived_from_the_rank_is_each_ranks_own():
    found = _lint({"train.py": _DEVICE_HELD})
    assert ("train.py", _line(_DEVICE_HELD, 'print(f"using device'), "DDP008") not in found
    assert ("train.py", _line(_DEVICE_HELD, 'print("training on", gpu)'), "DDP008") not in found
    # the same message with a value every rank shares is still a duplicate
    assert ("train.py", _line(_DEVICE_HELD, 'print(f"epochs'), "DDP008") in found


def test_an_attribute_also_stored_from_a_shared_value_does_not_name_the_rank():
    code = _DEVICE_HELD.replace('        runner = Runner(local_rank)\n',
                                '        runner = Runner(local_rank)\n        runner.device = "cuda"\n')
    assert code != _DEVICE_HELD
    found = _lint({"train.py": code})
    assert ("train.py", _line(code, 'print(f"using device'), "DDP008") in found


_METRIC = """
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchmetrics import MeanMetric


    def main(model, loader):
        dist.init_process_group("nccl")
        rank = int(os.environ["RANK"])
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        model = DDP(model.cuda(local_rank), device_ids=[local_rank])
        train_loss = MeanMetric().cuda(local_rank)
        for batch in loader:
            loss = model(batch.cuda(local_rank)).mean()
            loss.backward()
            train_loss.update(loss.detach())
        figures = {"train_loss": train_loss.compute()}
        if rank == 0:
            print(f"train loss {figures['train_loss'].item()}")
        dist.destroy_process_group()
"""


def test_a_torchmetrics_metric_moved_to_the_rank_device_is_reduced_by_compute():
    found = _lint({"train.py": _METRIC})
    assert ("train.py", _line(_METRIC, 'print(f"train loss'), "DDP006") not in found


def test_a_torchmetrics_metric_that_does_not_sync_on_compute_is_one_ranks_figure():
    code = _METRIC.replace("MeanMetric()", "MeanMetric(sync_on_compute=False)")
    assert code != _METRIC
    found = _lint({"train.py": code})
    assert ("train.py", _line(code, 'print(f"train loss'), "DDP006") in found


_OPTIONS = """
    import argparse


    def parse(argv):
        parser = argparse.ArgumentParser()
        parser.add_argument("--mode", default="ddp")
        parser.add_argument("--gpu", type=int, default=0)
        opts = parser.parse_args(argv)
        print(opts)
        return opts


    if __name__ == "__main__":
        import sys
        parse(sys.argv[1:])
"""

_SPAWNING = """
    import os
    import sys

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    from options import parse


    def worker(rank, world_size, opts):
        if opts.mode == "ddp":
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
        torch.manual_seed(0)


    def main():
        opts = parse(sys.argv[1:])
        if opts.mode == "ddp":
            mp.spawn(worker, args=(2, opts), nprocs=2)
        else:
            worker(opts.gpu, 1, opts)


    if __name__ == "__main__":
        main()
"""


def test_options_parsed_in_the_spawning_parent_print_once():
    found = _lint({"options.py": _OPTIONS, "train.py": _SPAWNING})
    assert ("options.py", _line(_OPTIONS, "print(opts)"), "DDP008") not in found


def test_a_direct_worker_call_that_may_start_a_group_keeps_its_caller_per_rank():
    # the worker joins a process group whatever the mode: started by torchrun, main runs on every rank
    code = _SPAWNING.replace('        if opts.mode == "ddp":\n            os.environ', '        if True:\n            os.environ')
    assert code != _SPAWNING
    found = _lint({"options.py": _OPTIONS, "train.py": code})
    assert ("options.py", _line(_OPTIONS, "print(opts)"), "DDP008") in found


_SETTINGS = """
    CACHE_IN_MEMORY = False
    PATIENCE = 10
"""

_DATA = """
    import torch


    class Images(torch.utils.data.Dataset):
        def __init__(self, root, in_memory=False):
            self.root = root
            if in_memory:
                print("caching the images")


    class Runner:
        def fit(self, epochs, patience=None):
            if patience is not None:
                self.patience = patience
            else:
                print("training without early stopping")
            if patience == 10:
                print("patience of ten")
"""

_TRAIN_CONSTANTS = """
    import torch
    import torch.distributed as dist

    from data import Images, Runner
    from settings import CACHE_IN_MEMORY


    def main():
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        images = Images("data", CACHE_IN_MEMORY)
        Runner().fit(3, patience=10)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_branches_decided_by_literals_at_every_call_run_on_no_rank():
    files = {"settings.py": _SETTINGS, "data.py": _DATA, "train.py": _TRAIN_CONSTANTS}
    found = _lint(files)
    assert ("data.py", _line(_DATA, 'print("caching the images")'), "DDP008") not in found
    assert ("data.py", _line(_DATA, 'print("training without early stopping")'), "DDP008") not in found
    # the arm every call takes still runs on every rank
    assert ("data.py", _line(_DATA, 'print("patience of ten")'), "DDP008") in found


def test_a_setting_rebound_or_a_call_passing_another_value_keeps_the_branch():
    files = {"settings.py": _SETTINGS + "CACHE_IN_MEMORY = True\n", "data.py": _DATA,
             "train.py": _TRAIN_CONSTANTS.replace("Runner().fit(3, patience=10)",
                                                  "Runner().fit(3, patience=10)\n        Runner().fit(3)")}
    found = _lint(files)
    assert ("data.py", _line(_DATA, 'print("caching the images")'), "DDP008") in found
    assert ("data.py", _line(_DATA, 'print("training without early stopping")'), "DDP008") in found


_DIES = """
    import argparse

    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="small")
    parser.add_argument("--extra", nargs="*", default=[])
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    known = ["lr", "epochs"]
    for key in args.extra:
        if key not in known:
            print("unknown setting", key)
            assert key in known
    if args.data == "small":
        size = 10
    elif args.data == "large":
        size = 1000
    else:
        print("unknown data set", args.data)
    steps = size // 2
    if args.data == "small":
        width = 4
    else:
        print("default width")
    width = 8
    print("steps", steps, width)
    dist.destroy_process_group()
"""


def test_a_message_right_before_the_process_dies_is_not_a_duplicate():
    found = _lint({"train.py": _DIES})
    assert ("train.py", _line(_DIES, 'print("unknown setting"'), "DDP008") not in found
    assert ("train.py", _line(_DIES, 'print("unknown data set"'), "DDP008") not in found
    # `width` is bound again before it is read: that arm carries on, and so does every rank
    assert ("train.py", _line(_DIES, 'print("default width")'), "DDP008") in found
    assert ("train.py", _line(_DIES, 'print("steps"'), "DDP008") in found


_QUIET_BLOCK = """
    import os
    import sys

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Quiet:
        def __init__(self, rank):
            self.rank = rank

        def __enter__(self):
            if self.rank != 0:
                self.saved = sys.stdout
                sys.stdout = open(os.devnull, "w")

        def __exit__(self, *exc):
            if self.rank != 0:
                sys.stdout.close()
                sys.stdout = self.saved


    if __name__ == "__main__":
        dist.init_process_group("gloo")
        print("group joined")
        with Quiet(int(os.environ["LOCAL_RANK"])):
            print("inside the quiet block")
            model = DDP(nn.Linear(4, 1))
            model(torch.randn(8, 4)).pow(2).mean().backward()
        print("after the quiet block")
        dist.destroy_process_group()
"""


def test_a_context_manager_that_silences_stdout_silences_only_its_block():
    """`with Quiet(local_rank):` sends sys.stdout to devnull on the other ranks in `__enter__` and gives it back in
    `__exit__`: a print inside the block is rank 0's alone, the module-level prints above and below it run on
    every rank."""
    found = _lint({"train.py": _QUIET_BLOCK})
    assert ("train.py", _line(_QUIET_BLOCK, 'print("inside the quiet block")'), "DDP008") not in found
    assert ("train.py", _line(_QUIET_BLOCK, 'print("group joined")'), "DDP008") in found
    assert ("train.py", _line(_QUIET_BLOCK, 'print("after the quiet block")'), "DDP008") in found
