"""Precision of the linter on flags that hold a rank test, loaders that are not sharded, and single-process paths."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


_SETUP = """
    import os
    import torch
    import torch.distributed as dist


    def setup(opts):
        opts.rank = int(os.environ["RANK"])
        dist.init_process_group("nccl", rank=opts.rank)
        if opts.rank % torch.cuda.device_count() == 0:
            opts.chatty = True
        else:
            opts.chatty = False
"""

_TRAIN = """
    import argparse
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from setup import setup


    def main():
        opts = argparse.ArgumentParser().parse_args()
        setup(opts)
        model = DDP(torch.nn.Linear(2, 2).cuda())
        for step in range(10):
            loss = model(torch.randn(4, 2).cuda()).sum()
            loss.backward()
            if opts.chatty:
                print("step", step)
        print("done")


    if __name__ == "__main__":
        main()
"""


def test_an_attribute_set_true_in_a_rank_branch_and_false_otherwise_is_a_rank_check_in_another_file():
    found = _lint({"setup.py": _SETUP, "train.py": _TRAIN})
    assert ("train.py", _line(_TRAIN, 'print("step"'), "DDP008") not in found
    assert ("train.py", _line(_TRAIN, 'print("done")'), "DDP008") in found  # the control: no check at all


_TAGGED = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        model = DDP(torch.nn.Linear(2, 2).cuda())
        for epoch in range(3):
            print(f"[GPU{torch.cuda.current_device()}] epoch {epoch}")
            print(f"epoch {epoch}")
            model(torch.randn(4, 2).cuda()).sum().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_line_that_names_the_current_device_is_tagged_per_process():
    found = _lint({"train.py": _TAGGED})
    assert ("train.py", _line(_TAGGED, "[GPU{"), "DDP008") not in found
    assert ("train.py", _line(_TAGGED, 'print(f"epoch'), "DDP008") in found
