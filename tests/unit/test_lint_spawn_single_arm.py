"""The parent of an mp.spawn program: a worker it also calls directly in the one-process arm of a mode check
(`if world_size > 1: mp.spawn(train, ...) else: train(...)`), and a method of a helper's object that only the
parent calls (`cfg.announce()` before the spawn): the parent's own code runs once, not on every rank."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAINING = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def train(rank, world_size, data):
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        model = torch.nn.Linear(2, 2)
        if rank == 0:
            print("trained")
        dist.destroy_process_group()


    def run(data):
        print("loading", len(data))  # parent: once
        world_size = torch.cuda.device_count()
        if world_size > 1:
            mp.spawn(train, args=(world_size, data), nprocs=world_size)
        else:
            train(world_size - 1, world_size, data)  # (a computed rank: not a fixed one)
        print("done")  # parent: once
"""

_MAIN = """
    import training

    if __name__ == "__main__":
        training.run([1, 2, 3])
"""


def _outputs(training: str) -> set[int]:
    found = lint_sources({"main.py": textwrap.dedent(_MAIN), "training.py": textwrap.dedent(training)})
    return {f.line for f in found if f.rule == "DDP008" and f.path == "training.py"}


def test_the_parent_that_calls_its_worker_in_the_one_process_arm_prints_once():
    assert _outputs(_TRAINING) == set()


def test_a_direct_call_on_every_rank_still_makes_the_caller_a_rank():
    # the ImageNet example's two modes: `else: train(...)` of a flag that torchrun's ranks take
    every_rank = _TRAINING.replace("if world_size > 1:", "if use_spawn:").replace(
        "world_size = torch.cuda.device_count()", "world_size, use_spawn = torch.cuda.device_count(), False")
    lines = textwrap.dedent(every_rank).splitlines()
    assert _outputs(every_rank) == {i for i, l in enumerate(lines, 1) if "# parent: once" in l}


_CONFIG = """
    class Config:
        def __init__(self, epochs):
            self.epochs = epochs

        def announce(self):
            print("epochs:", self.epochs)
"""

_RUN = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from config import Config


    def worker(rank, cfg):
        dist.init_process_group("gloo", rank=rank, world_size=2)
        model = torch.nn.Linear(2, 2)
        dist.destroy_process_group()


    if __name__ == "__main__":
        cfg = Config(3)
        cfg.announce()
        mp.spawn(worker, args=(cfg,), nprocs=2)
"""


def _config_outputs(run: str) -> set[int]:
    found = lint_sources({"run.py": textwrap.dedent(run), "config.py": textwrap.dedent(_CONFIG)})
    return {f.line for f in found if f.rule == "DDP008" and f.path == "config.py"}


def test_a_method_of_an_object_only_the_spawning_parent_calls_prints_once():
    assert _config_outputs(_RUN) == set()


def test_a_method_a_rank_calls_too_prints_on_every_rank():
    on_ranks = _RUN.replace("model = torch.nn.Linear(2, 2)", "model = torch.nn.Linear(2, 2)\n        cfg.announce()")
    assert _config_outputs(on_ranks) == {7}
