"""A path built from a value only some ranks hold (`ckpt_dir = None` on every rank, set under `if local_rank == 0:`)
names no rank: the file it names is shared, so a save under that local-rank check is DDP004's multi-node warning
(AO+AP round). A path that names the rank itself stays a per-rank file."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main(args):
        local_rank = int(os.environ["LOCAL_RANK"])
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(4, 1).cuda(local_rank), device_ids=[local_rank])
        ckpt_dir = None
        if local_rank == 0:
            ckpt_dir = os.path.join(args.out, "checkpoints")
            os.makedirs(ckpt_dir, exist_ok=True)
        for epoch in range(args.epochs):
            if local_rank == 0:
                torch.save(model.module.state_dict(), os.path.join(ckpt_dir, f"model_{epoch}.pt"))
        dist.destroy_process_group()
""")


def _findings(code: str) -> set[tuple[int, str, str]]:
    return {(f.line, f.rule, f.severity) for f in lint_sources({"train.py": code})}


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if text in line)


def test_a_save_into_a_directory_only_local_rank_0_holds_is_the_multi_node_warning():
    assert (_line(_TRAIN, "torch.save("), "DDP004", "warning") in _findings(_TRAIN)


def test_a_directory_named_by_the_rank_stays_a_per_rank_file():
    code = _TRAIN.replace('"checkpoints")', 'f"checkpoints_{local_rank}")')
    assert code != _TRAIN
    assert not any(rule == "DDP004" for _, rule, _ in _findings(code))


def test_a_global_rank_check_is_still_no_finding():
    code = _TRAIN.replace("if local_rank == 0:", "if dist.get_rank() == 0:")
    assert not any(rule == "DDP004" for _, rule, _ in _findings(code))
