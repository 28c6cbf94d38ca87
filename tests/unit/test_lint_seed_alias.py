"""DDP014 follows a seed helper's callers also where a file imports the helper under another name
(`from lib import preview as lib_preview`): the seed such a call passes is not taken for a per-rank one."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_UTILS = """
    import random

    import numpy as np
    import torch


    def set_seed(seed):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
"""

_LIB = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import utils


    def train(cfg):
        dist.init_process_group("gloo")
        utils.set_seed(cfg["seed"])
        model = DDP(torch.nn.Linear(4, 1))
        for _ in range(10):
            x = torch.randn(8, 4)
            noise = torch.randn_like(x)
            model(x + noise).sum().backward()
        dist.destroy_process_group()


    def preview(cfg, seed=None):
        utils.set_seed(seed if seed is not None else cfg["seed"])
"""

_TRAIN = """
    import argparse

    from lib import preview as lib_preview
    from lib import train

    parser = argparse.ArgumentParser()
    parser.add_argument("--preview", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    if args.preview:
        lib_preview({"seed": 0}, seed=args.seed)
    else:
        train({"seed": 0})
"""


def _ddp014(train: str) -> list[tuple[str, int]]:
    sources = {"utils.py": _UTILS, "lib.py": _LIB, "train.py": train}
    found = lint_sources({path: textwrap.dedent(source) for path, source in sources.items()})
    return [(f.path, f.line) for f in found if f.rule == "DDP014"]


def test_a_seed_helper_called_under_an_import_alias_with_every_ranks_seed_is_no_per_rank_seed():
    assert ("lib.py", 11) in _ddp014(_TRAIN)


def test_a_per_rank_seed_passed_through_the_alias_still_counts():
    per_rank = _TRAIN.replace("import argparse", "import argparse\n    import os").replace(
        "seed=args.seed)", 'seed=args.seed + int(os.environ["RANK"]))')
    assert _ddp014(per_rank) == []


def test_a_seed_of_a_path_that_trains_nothing_is_left_out_beside_the_one_that_trains():
    # preview() seeds alike too, but runs no backward: the finding is the training path's alone
    assert _ddp014(_TRAIN) == [("lib.py", 11)]
