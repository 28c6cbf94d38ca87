"""Recall of the AC+AD round (DDP014): per-sample randomness reached from a dataset's __getitem__ through its own
methods, and Python `random` draws that pick a crop or an augmentation with constant bounds."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.utils.data import DataLoader, DistributedSampler

    from clips import Clips


    def run(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        torch.manual_seed(1234)
        data = Clips(["a.wav", "b.wav"])
        loader = DataLoader(data, sampler=DistributedSampler(data), num_workers=4)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).cuda(rank), device_ids=[rank])
        for x in loader:
            model(x.cuda(rank)).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(run, args=(2,), nprocs=2)
""")

_CLIPS = textwrap.dedent("""
    import random

    import torch


    class Clips(torch.utils.data.Dataset):
        def __init__(self, paths):
            self.paths = paths

        def load(self, path):
            variant = random.randint(60, 90)
            return torch.load(path.replace(".wav", f"_{variant}.pt"))

        def pair(self, path):
            return self.load(path)

        def __getitem__(self, index):
            return self.pair(self.paths[index])

        def __len__(self):
            return len(self.paths)
""")


def _seeds(clips: str) -> list[tuple[str, int]]:
    return [(f.path, f.line) for f in lint_sources({"train.py": _TRAIN, "clips.py": clips}) if f.rule == "DDP014"]


def test_a_random_choice_in_a_method_getitem_calls_makes_the_shared_seed_a_finding():
    """`random.randint(60, 90)` picks each sample's variant in a method `__getitem__` reaches through `self`: with
    `torch.manual_seed(1234)` on every rank the loader workers' streams, and so the picks, match on every rank."""
    assert _seeds(_CLIPS) == [("train.py", _TRAIN.splitlines().index("    torch.manual_seed(1234)") + 1)]


def test_a_random_crop_offset_drawn_with_randrange_is_per_sample_randomness():
    clips = _CLIPS.replace("variant = random.randint(60, 90)", "variant = random.randrange(0, len(path))") \
        .replace("return self.pair(self.paths[index])", "return self.load(self.paths[index])")
    assert len(_seeds(clips)) == 1


def test_a_draw_in_a_method_no_sample_path_calls_is_not_per_sample():
    """The same draw in a method only __init__ calls is drawn once per process, not per sample."""
    clips = _CLIPS.replace("return self.pair(self.paths[index])", "return torch.load(self.paths[index])") \
        .replace("self.paths = paths", "self.paths = paths\n        self.pair(paths[0])")
    assert _seeds(clips) == []
