"""DDP010 for an early stop on a counter that only some ranks update (`fail_time += 1` under `if rank == 0:`): those
ranks leave the training loop, the others go on into DDP's gradient all-reduce and wait for them."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = """\
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def train_epoch(model, optimizer):
        for _ in range(10):
            model(torch.randn(2, 4).cuda()).sum().backward()
            optimizer.step()


    def evaluate(model):
        return float(torch.rand(1))


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        best, bad_epochs, patience = 0.0, 0, 3
        for epoch in range(100):
            if bad_epochs >= patience:
                break
            train_epoch(model, optimizer)
            if dist.get_rank() == 0:
                score = evaluate(model.module)
                if score > best:
                    best, bad_epochs = score, 0
                else:
                    bad_epochs += 1
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _ddp010(source: str) -> list[tuple[int, str]]:
    found = lint_sources({"train.py": textwrap.dedent(source)})
    return [(f.line, f.message) for f in found if f.rule == "DDP010"]


def test_an_early_stop_on_a_counter_only_rank_0_updates_is_reported_at_its_test():
    found = _ddp010(_TRAIN)
    assert [line for line, _ in found] == [26]
    assert "'bad_epochs'" in found[0][1] and "line 29" in found[0][1]


def test_an_early_stop_on_a_counter_every_rank_receives_is_not_reported():
    shared = _TRAIN.replace("        dist.destroy_process_group()",
                            "            flag = [bad_epochs]\n"
                            "            dist.broadcast_object_list(flag, src=0)\n"
                            "            bad_epochs = flag[0]\n"
                            "        dist.destroy_process_group()")
    assert _ddp010(shared) == []


def test_an_early_stop_on_a_counter_every_rank_updates_is_not_reported():
    every_rank = _TRAIN.replace("            if dist.get_rank() == 0:\n", "            if True:\n")
    assert _ddp010(every_rank) == []


def test_a_stop_outside_the_training_loop_is_not_reported():
    # a loop that makes no collective and trains nothing: leaving it on one rank makes no other rank wait
    scan = _TRAIN.replace("            if bad_epochs >= patience:\n                break\n            train_epoch(model, optimizer)\n",
                          "            train_epoch(model, optimizer)\n")
    scan = scan.replace("        dist.destroy_process_group()",
                        "        for i in range(3):\n            if bad_epochs >= patience:\n                break\n"
                        "            print(i)\n        dist.destroy_process_group()")
    assert _ddp010(scan) == []
