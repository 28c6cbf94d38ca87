"""Findings the program itself answers, seen on the AK..AN sets (judged wrong by adjudicators): device_ids that
come through a `**kwargs` dict, ... each beside a twin that is still reported."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _found(files: dict[str, str]) -> set[tuple[str, str, str]]:
    """(path, stripped line, rule) of every finding."""
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, sources[f.path].splitlines()[f.line - 1].strip(), f.rule) for f in lint_sources(sources)}


_SPLAT_DDP = """
    import os
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Trainer:
        def __init__(self, rank, world_size):
            self.rank = rank
            self.gen = torch.nn.Linear(4, 4).cuda(rank)
            self.disc = torch.nn.Linear(4, 1).cuda(rank)
            {kwargs}
            self.gen_ddp = DDP(self.gen, **ddp_kwargs)
            self.disc_ddp = DDP(self.disc, **ddp_kwargs)

        def step(self):
            loss = self.disc_ddp(self.gen_ddp(torch.randn(8, 4).cuda(self.rank))).sum()
            loss.backward()


    def run(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        Trainer(rank, world_size).step()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(run, args=(torch.cuda.device_count(),), nprocs=torch.cuda.device_count())
"""


def test_device_ids_through_a_kwargs_dict_are_device_ids():
    found = _found({"train.py": _SPLAT_DDP.replace("{kwargs}", "ddp_kwargs = {'device_ids': [self.rank]}")})
    assert not {f for f in found if f[2] == "DDP012"}


def test_a_kwargs_dict_without_device_ids_is_still_reported():
    found = _found({"train.py": _SPLAT_DDP.replace("{kwargs}", "ddp_kwargs = {'find_unused_parameters': True}")})
    assert ("train.py", "self.gen_ddp = DDP(self.gen, **ddp_kwargs)", "DDP012") in found

