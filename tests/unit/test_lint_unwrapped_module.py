"""DDP015 for a module an optimizer trains beside the DDP wrapper but never wrapped itself: one finding per module,
at the copy-pasted wrap that wraps another module a second time where there is one (`d1 = DDP(d1)` twice, `d2`
never), else at its first run in the step."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_TRAIN = """\
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        net = DDP(torch.nn.Linear(4, 4).cuda(), device_ids=[local_rank])
        d1 = torch.nn.Linear(4, 1).cuda()
        d1 = DDP(d1, device_ids=[local_rank])
        d2 = torch.nn.Linear(4, 1).cuda()
        d1 = DDP(d1, device_ids=[local_rank])
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        opt_d1 = torch.optim.SGD(d1.parameters(), lr=0.1)
        opt_d2 = torch.optim.SGD(d2.parameters(), lr=0.1)
        for _ in range(10):
            out = net(torch.randn(2, 4).cuda())
            d1(out).mean().backward(retain_graph=True)
            loss = d2(out.detach()).mean()
            loss.backward()
            for _ in range(2):
                out = net(torch.randn(2, 4).cuda())
                extra = d2(out.detach()).mean()
                extra.backward()
            opt.step()
            opt_d1.step()
            opt_d2.step()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def _ddp015(source: str) -> list[tuple[int, str]]:
    found = lint_sources({"train.py": textwrap.dedent(source)})
    return [(f.line, f.message) for f in found if f.rule == "DDP015"]


def test_a_module_never_wrapped_beside_a_second_wrap_of_another_is_one_finding_at_that_wrap():
    found = _ddp015(_TRAIN)
    assert [line for line, _ in found] == [16]
    assert "d2" in found[0][1] and "d1" in found[0][1]


def test_a_module_never_wrapped_is_one_finding_at_its_first_run():
    once = _TRAIN.replace("        d1 = DDP(d1, device_ids=[local_rank])\n        opt = ", "        opt = ")
    assert [line for line, _ in _ddp015(once)] == [22]


def test_every_module_wrapped_is_not_reported():
    fixed = _TRAIN.replace("        d1 = DDP(d1, device_ids=[local_rank])\n        opt = ",
                           "        d2 = DDP(d2, device_ids=[local_rank])\n        opt = ")
    assert _ddp015(fixed) == []
