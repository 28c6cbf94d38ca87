"""Recall of DDP012 and DDP010 on shapes a rank's own code makes: a helper process forked by a rank (not another
rank), and loops whose length only some ranks know."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


_FORKED_HELPER = """
    import argparse
    import multiprocessing as mp
    import torch
    import torch.distributed as dist

    dist.init_process_group(backend="nccl", init_method="env://")
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int)
    args = parser.parse_args()
    torch.cuda.set_device(args.local_rank)


    def make_shards(worker):
        for i in range(100):
            if i % (4 * dist.get_world_size()) == dist.get_rank() * 4 + worker:
                torch.save(torch.randn(8), f"shard{i}.pt")


    for worker in range(4):
        mp.Process(target=make_shards, args=(worker,)).start()

    model = torch.nn.Linear(4, 4)
    model.load_state_dict(torch.load("w.pt", map_location=lambda storage, loc: storage.cuda(dist.get_rank())))
    model = torch.nn.parallel.DistributedDataParallel(model.cuda(), device_ids=[args.local_rank])
    dist.destroy_process_group()
"""


def test_a_process_a_rank_forks_after_joining_the_group_is_no_rank_of_its_own() -> None:
    # the file joined the group at its top before starting the generator: torchrun started it, and the rank's GPU
    # index read from the global rank is wrong on a second node
    found = _lint({"train.py": _FORKED_HELPER})
    assert ("train.py", _line(_FORKED_HELPER, "storage.cuda(dist.get_rank())"), "DDP012") in found


_CUDA_FIRST = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def worker(gpu, args):
        dist.init_process_group("nccl", init_method="tcp://10.0.0.1:23456", rank=gpu, world_size=2)
        model = torch.nn.Linear(4, 4).cuda()
        if args.gpu is not None:
            torch.cuda.set_device(gpu)
            model.cuda(gpu)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
        dist.destroy_process_group()


    def main(args):
        mp.spawn(worker, nprocs=2, args=(args,))
"""


def test_a_bare_cuda_above_the_set_device_of_the_same_function_is_reported() -> None:
    found = _lint({"train.py": _CUDA_FIRST})
    assert ("train.py", _line(_CUDA_FIRST, "torch.nn.Linear(4, 4).cuda()"), "DDP012") in found
    # trap: with set_device first, the same .cuda() lands on the rank's GPU
    fixed = _CUDA_FIRST.replace("        model = torch.nn.Linear(4, 4).cuda()\n",
                                "        torch.cuda.set_device(gpu)\n        model = torch.nn.Linear(4, 4).cuda()\n")
    assert ("train.py", _line(fixed, "torch.nn.Linear(4, 4).cuda()"), "DDP012") not in _lint({"train.py": fixed})


_TYPED = """
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def worker(rank, world_size):
        dist.init_process_group("nccl", init_method="tcp://10.0.0.1:23456", rank=rank, world_size=world_size)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).to(rank), device_ids=[rank])
        Tensor = torch.cuda.FloatTensor
        for step in range(10):
            x = torch.randn(8, 4).type(Tensor)
            target = Tensor(np.ones((8, 1)))
            assert isinstance(x, torch.cuda.FloatTensor)
            torch.nn.functional.mse_loss(model(x), target).backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(worker, nprocs=2, args=(2,))
"""


def test_a_legacy_cuda_tensor_type_without_set_device_is_reported_at_the_type() -> None:
    found = {(line, rule) for _, line, rule in _lint({"train.py": _TYPED})}
    assert (_line(_TYPED, "Tensor = torch.cuda.FloatTensor"), "DDP012") in found
    assert (_line(_TYPED, "assert isinstance"), "DDP012") not in found  # trap: a type test places nothing
