"""DDP001 follows a sampler a data helper returns in a tuple, unpacked by name at the call
(`train_set, train_sampler = load_data(...)`), to the loop that passes over its loader again: the finding is at that
loop (where the epochs, and the fix, are), not at the sampler in the helper."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_DATA = """
    import torch
    from torch.utils.data import TensorDataset
    from torch.utils.data.distributed import DistributedSampler


    def load_data(size):
        train_set = TensorDataset(torch.randn(size, 4), torch.randn(size, 1))
        train_sampler = DistributedSampler(train_set)
        return train_set, train_sampler
"""

_ENGINE = """
    def train(model, loader, epochs):
        for epoch in range(epochs):
            for x, y in loader:
                (model(x) - y).pow(2).mean().backward()
"""

_TRAIN = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    from data import load_data
    from engine import train

    dist.init_process_group("gloo")
    train_set, train_sampler = load_data(64)
    loader = DataLoader(train_set, batch_size=8, sampler=train_sampler)
    train(DDP(torch.nn.Linear(4, 1)), loader, 3)
    dist.destroy_process_group()
"""


def _ddp001(engine: str) -> list[tuple[str, int]]:
    sources = {"data.py": _DATA, "engine.py": engine, "train.py": _TRAIN}
    found = lint_sources({path: textwrap.dedent(source) for path, source in sources.items()})
    return [(f.path, f.line) for f in found if f.rule == "DDP001"]


def test_a_sampler_returned_in_a_tuple_is_reported_at_the_loop_that_passes_again():
    assert _ddp001(_ENGINE) == [("engine.py", 4)]


def test_set_epoch_on_the_unpacked_sampler_is_no_finding():
    engine = _ENGINE.replace("        for x, y in loader:", "        loader.sampler.set_epoch(epoch)\n        for x, y in loader:")
    assert _ddp001(engine) == []
