"""A global rank unpacked from what a setup function of the file returns (`rank, world_size, device = setup()`
where setup ends `return rank, world_size, device` after `rank = dist.get_rank()`) is the global rank wherever the
caller uses it as a GPU index: DDP012 names that use too (AO+AP round)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = textwrap.dedent("""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def setup():
        dist.init_process_group("nccl")
        rank = dist.get_rank()
        world_size = dist.get_world_size()
        return rank, world_size, torch.device("cuda")


    def main():
        rank, world_size, device = setup()
        model = DDP(torch.nn.Linear(4, 1).to(device), device_ids=[rank])
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
""")


def _global_gpu_lines(code: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": code}) if f.rule == "DDP012" and "global rank" in f.message]


def _line(code: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if "device_ids=[rank]" in line)


def test_a_global_rank_returned_by_a_setup_function_is_a_global_gpu_index_in_the_caller():
    assert _global_gpu_lines(_TRAIN) == [_line(_TRAIN)]


def test_a_local_rank_returned_the_same_way_is_no_finding():
    code = _TRAIN.replace("rank = dist.get_rank()", "rank = int(os.environ['LOCAL_RANK'])").replace(
        "import torch\n", "import os\n\nimport torch\n", 1)
    assert code != _TRAIN
    assert _global_gpu_lines(code) == []
