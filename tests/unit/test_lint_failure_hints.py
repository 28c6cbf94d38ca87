"""Findings that rested on a guess, seen on the AQ+AR sets (judged wrong by adjudicators): a message in an `except`
block that shows the item that failed (only the rank whose own sample failed prints it), the other arm of a flag
compared with True where the program starts the process group (`if opt.parallel == True:`), and the old launcher
named only in an error or help text (it starts nothing)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _found(code: str, rule: str) -> set[str]:
    """The stripped source lines of every `rule` finding."""
    source = textwrap.dedent(code)
    return {source.splitlines()[f.line - 1].strip() for f in lint_sources({"train.py": source}) if f.rule == rule}


_SKIPPED_SAMPLES = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    try:
        import apex
    except ImportError:
        print("apex not found: mixed precision is off")


    class Frames(Dataset):
        def __init__(self, paths, transform):
            self.paths, self.transform = paths, transform

        def __len__(self):
            return len(self.paths)

        def __getitem__(self, i):
            sample = {"path": self.paths[i]}
            try:
                sample = self.transform(**sample)
            except Exception as e:
                print("bad sample", sample)
                print(e)
            return sample


    def main():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        torch.cuda.set_device(rank)
        model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[rank])
        data = Frames(["a", "b"], lambda **s: s)
        for batch in DataLoader(data, sampler=DistributedSampler(data)):
            try:
                loss = model(batch).sum()
            except RuntimeError as err:
                print("skipped a batch:", err)
                continue
            loss.backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_message_showing_the_failed_item_in_an_except_block_is_that_ranks_own():
    found = _found(_SKIPPED_SAMPLES, "DDP008")
    assert 'print("bad sample", sample)' not in found
    assert "print(e)" not in found
    assert 'print("skipped a batch:", err)' not in found
    # a constant message after a failed import is the same line on every rank
    assert 'print("apex not found: mixed precision is off")' in found


_FLAG_COMPARED = """
    import argparse

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    parser = argparse.ArgumentParser()
    parser.add_argument("--parallel", action="store_true")
    opt = parser.parse_args()
    if opt.parallel == True:
        dist.init_process_group("nccl")
        torch.cuda.set_device(dist.get_rank())
    model = torch.nn.Linear(2, 2).cuda()
    if opt.parallel:
        model = DDP(model, device_ids=[dist.get_rank()])
    for step in range(10):
        loss = model(torch.randn(2, 2).cuda()).sum()
        if opt.parallel:
            print("parallel step", step)
        else:
            print("single step", step)
    if opt.parallel is True:
        dist.destroy_process_group()
"""


def test_the_other_arm_of_a_flag_compared_with_true_that_starts_the_group_is_one_process():
    found = _found(_FLAG_COMPARED, "DDP008")
    assert 'print("single step", step)' not in found
    assert 'print("parallel step", step)' in found


_LAUNCH_HINTS = """
    import argparse
    import subprocess

    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, help="start with python -m torch.distributed.launch")


    def check_world(num_gpus):
        world_size = dist.get_world_size()
        if world_size != num_gpus:
            message = "world size is %d but %d GPUs were asked for"
            if world_size == 1:
                message += ". Did you launch with `python -m torch.distributed.launch`?"
            raise ValueError(message % (world_size, num_gpus))
        if world_size > 8:
            raise RuntimeError("too many ranks for python -m torch.distributed.launch")


    def relaunch():
        command = "python -m torch.distributed.launch --nproc_per_node 2 train.py"
        subprocess.run(command, shell=True)
"""


def test_the_old_launcher_named_only_in_an_error_or_help_text_is_not_reported():
    found = _found(_LAUNCH_HINTS, "DDP007")
    assert found == {'command = "python -m torch.distributed.launch --nproc_per_node 2 train.py"'}
