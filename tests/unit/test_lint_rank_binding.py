"""DDP012 for the global rank used as a GPU index is one finding per cause: at the assignment that stores the
rank (the line to fix), naming every line that uses it as a GPU; a parameter used several times in one function
is one finding at its first use."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _ddp012(source: str) -> list[tuple[int, str]]:
    found = lint_sources({"train.py": textwrap.dedent(source)})
    return [(f.line, f.message) for f in found if f.rule == "DDP012" and "is the global rank" in f.message]


_NAMED_LOCAL = """\
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    local_rank = int(os.environ["RANK"])


    def main():
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        device = torch.device("cuda", local_rank)
        model = DDP(torch.nn.Linear(4, 1).to(device), device_ids=[local_rank], output_device=local_rank)
        for _ in range(3):
            model(torch.randn(2, 4, device=device)).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_local_rank_read_from_rank_is_one_finding_at_its_assignment():
    found = _ddp012(_NAMED_LOCAL)
    assert [line for line, _ in found] == [7]
    assert "lines 11, 13, 14" in found[0][1]


_ALIASED = """\
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    device_id = rank
    torch.cuda.set_device(device_id)
    model = DDP(torch.nn.Linear(4, 1).to(device_id), device_ids=[device_id])
    for _ in range(3):
        x = torch.randn(2, 4).to(device_id)
        model(x).sum().backward()
    dist.destroy_process_group()
"""


def test_an_alias_of_the_global_rank_is_reported_where_it_is_bound():
    assert [line for line, _ in _ddp012(_ALIASED)] == [7]


_PARAMETER = """\
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def train(rank, model):
        model = DDP(model.cuda(rank), device_ids=[rank])
        for _ in range(3):
            x = torch.randn(2, 4).cuda(rank)
            y = torch.randn(2, 1).cuda(rank)
            (model(x) - y).pow(2).mean().backward()


    def main():
        dist.init_process_group("nccl")
        train(dist.get_rank(), torch.nn.Linear(4, 1))
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_global_rank_parameter_used_several_times_is_one_finding_at_its_first_use():
    found = _ddp012(_PARAMETER)
    assert [line for line, _ in found] == [7]
    assert "lines 7, 9, 10" in found[0][1]


def test_the_local_rank_is_still_no_finding():
    assert _ddp012(_NAMED_LOCAL.replace('"RANK"', '"LOCAL_RANK"')) == []


def test_a_rank_also_read_as_the_rank_is_reported_at_its_first_use_as_a_gpu():
    # `rank = dist.get_rank()` is right for the seed: the mistake is using it as a GPU, so the finding stays there
    seeded = _ALIASED.replace("    device_id = rank\n", "    torch.manual_seed(rank)\n").replace("device_id", "rank")
    found = _ddp012(seeded)
    assert [line for line, _ in found] == [8]
    assert "lines 8, 9, 11" in found[0][1]


def test_a_name_passed_on_as_a_device_is_still_held_for_a_gpu():
    passed = _ALIASED.replace("    dist.destroy_process_group()", "    evaluate(model, device=device_id)\n"
                              "    dist.destroy_process_group()").replace(
        "    dist.init_process_group", "    def evaluate(model, device):\n        model.eval()\n\n\n"
                                      "    dist.init_process_group")  # four lines more above the assignment
    assert [line for line, _ in _ddp012(passed)] == [11]
    assert _ddp012(passed.replace("device=device_id", "seed=device_id"))[0][0] == 12  # read as something else


_ONE_BRANCH_STORES_THE_GLOBAL_RANK = """\
    import argparse
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def setup(args):
        if "SLURM_PROCID" in os.environ:
            args.local_rank = int(os.environ["SLURM_PROCID"])
            args.rank = int(os.environ["SLURM_PROCID"])
        else:
            args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
            args.rank = int(os.environ.get("RANK", 0))
        torch.cuda.set_device(args.local_rank)
        dist.init_process_group("nccl", rank=args.rank)


    def main(args):
        setup(args)
        model = DDP(torch.nn.Linear(4, 1).to(args.local_rank), device_ids=[args.local_rank])
        for _ in range(3):
            model(torch.randn(2, 4).to(args.local_rank)).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main(argparse.ArgumentParser().parse_args())
"""


def test_a_local_rank_that_one_branch_reads_from_the_global_rank_is_reported_at_that_store():
    # the SLURM branch stores SLURM_PROCID (the global rank) where the other branch stores LOCAL_RANK: that one
    # store is the line to fix (SLURM_LOCALID), not each use of args.local_rank as a GPU
    found = _ddp012(_ONE_BRANCH_STORES_THE_GLOBAL_RANK)
    assert [line for line, _ in found] == [11]
    assert "lines 16, 22, 24" in found[0][1]
