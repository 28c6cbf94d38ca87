"""DDP012 for a literal "cuda:0" that every rank is given as a device (`torch.load(..., map_location="cuda:0")`,
`device="cuda:0"`) in a program that otherwise gives each rank its own GPU by the local rank."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = """\
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Masker:
        def __init__(self, size):
            self.keep = torch.ones(size, device="cuda:0")


    def main(resume):
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        model = torch.nn.Linear(4, 4).cuda(local_rank)
        if resume:
            state = torch.load(resume, map_location="cuda:0")
            model.load_state_dict(state)
        masker = Masker(4)
        model = DDP(model, device_ids=[local_rank])
        for _ in range(3):
            (model(torch.randn(2, 4).cuda(local_rank)) * masker.keep).sum().backward()
        if dist.get_rank() == 0:
            torch.save(model.module.state_dict(), "last.pt")
            check = torch.load("last.pt", map_location="cuda:0")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main(os.environ.get("RESUME", ""))
"""


def _first_gpu(source: str) -> list[int]:
    found = lint_sources({"train.py": textwrap.dedent(source)})
    return [f.line for f in found if f.rule == "DDP012" and '"cuda:0"' in f.message]


def test_cuda_0_given_on_every_rank_beside_local_rank_gpus_is_reported():
    # the load and the buffer of every rank; not the load under the rank-0 check
    assert _first_gpu(_TRAIN) == [10, 19]


def test_cuda_0_is_not_reported_where_each_rank_sees_its_own_gpu_as_cuda_0():
    renumbered = _TRAIN.replace('    torch.cuda.set_device(local_rank)\n',
                                '    os.environ["CUDA_VISIBLE_DEVICES"] = str(local_rank)\n')
    assert _first_gpu(renumbered) == []


def test_cuda_0_is_not_reported_where_nothing_picks_a_gpu_by_the_local_rank():
    # a program that never indexes GPUs by the local rank has its own DDP012 (no set_device) or runs one GPU per rank
    alone = (_TRAIN.replace("torch.cuda.set_device(local_rank)", "pass")
             .replace(".cuda(local_rank)", ".cuda()").replace("device_ids=[local_rank]", ""))
    assert _first_gpu(alone) == []


def test_a_map_location_that_maps_cuda_0_and_a_question_about_gpu_0_are_not_reported():
    mapped = _TRAIN.replace('map_location="cuda:0")\n            model', 'map_location={"cuda:0": f"cuda:{local_rank}"})\n            model')
    asked = _TRAIN.replace('torch.ones(size, device="cuda:0")', 'torch.cuda.memory_allocated(device="cuda:0")')
    assert _first_gpu(mapped) == [10]
    assert _first_gpu(asked) == [19]
