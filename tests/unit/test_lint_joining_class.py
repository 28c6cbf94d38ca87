"""An entry script whose ranks join the process group by building a project class (`exp = Exp(args)`, the class's
base `__init__` calling the method that runs init_process_group) runs on every rank: its prints are DDP008."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_BASE = textwrap.dedent("""\
    class ExpBase:
        def __init__(self, args):
            self.args = args
            self.model = self._build_model()

        def _build_model(self):
            raise NotImplementedError
""")

_EXP = textwrap.dedent("""\
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from exp_base import ExpBase


    class ExpTrain(ExpBase):
        def __init__(self, args):
            super().__init__(args)

        def _build_model(self):
            dist.init_process_group("nccl")
            local_rank = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local_rank)
            return DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])

        def train(self):
            for _ in range(3):
                self.model(torch.randn(2, 4).cuda()).sum().backward()
            dist.destroy_process_group()
""")

_MAIN = textwrap.dedent("""\
    import argparse

    from exp_train import ExpTrain

    args = argparse.ArgumentParser().parse_args()
    Exp = ExpTrain
    exp = Exp(args)
    print("start training")
    exp.train()
""")


def _prints(main: str) -> list[int]:
    found = lint_sources({"main.py": main, "exp_train.py": _EXP, "exp_base.py": _BASE})
    return [f.line for f in found if f.rule == "DDP008" and f.path == "main.py"]


def test_an_entry_that_builds_the_class_starting_the_group_prints_on_every_rank():
    assert _prints(_MAIN) == [8]


def test_an_entry_that_builds_no_such_class_is_not_every_rank_code():
    # the group is started by nothing the entry runs: whether its ranks join is not known from here
    alone = _MAIN.replace("Exp = ExpTrain\nexp = Exp(args)\n", "exp = None\n").replace("exp.train()\n", "")
    assert _prints(alone) == []
