"""DDP015 where the training step reaches the wrapper's bare module through another name (`model_without_ddp =
model.module`) or through a getter fed the batch (`model.module.get_losses(x)`)."""

from __future__ import annotations

from ddpkit.lint import lint_sources

_ALIAS = '''import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from net import Net


def main():
    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = Net().cuda()
    model_without_ddp = model
    model = DDP(model, device_ids=[local_rank])
    model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model.parameters())
    for x, y in loader:
        model.train()
        out = model_without_ddp.encode(x.cuda())
        loss = torch.nn.functional.mse_loss(out, y.cuda())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if dist.get_rank() == 0:
        torch.save(model_without_ddp.state_dict(), "model.pt")
'''

_GETTER = '''import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from net import Net


class Trainer:
    def __init__(self, rank):
        self.net = Net().cuda()
        self.net = DDP(self.net, device_ids=[rank])
        self.optimizer = torch.optim.Adam(self.net.parameters())

    def step(self, batch):
        losses = self.net.module.get_losses(batch)
        loss = losses.l2 + 0.1 * losses.l1
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()


def main():
    dist.init_process_group("nccl")
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    trainer = Trainer(rank)
    for batch in loader:
        trainer.step(batch.cuda())
'''


def _lines(source: str) -> list[int]:
    return [f.line for f in lint_sources({"train.py": source}) if f.rule == "DDP015"]


def test_a_step_through_the_name_kept_for_the_bare_module_is_reported_where_it_runs():
    assert _lines(_ALIAS) == [20]


def test_the_same_step_through_the_wrapper_is_no_finding():
    assert _lines(_ALIAS.replace("model_without_ddp.encode(x.cuda())", "model(x.cuda())")) == []


def test_a_getter_of_the_bare_module_fed_the_batch_is_a_forward_around_the_wrapper():
    assert _lines(_GETTER) == [16]


def test_a_getter_fed_no_data_is_no_forward():
    source = _GETTER.replace("losses = self.net.module.get_losses(batch)",
                             "losses = self.net(batch)\n        w = self.net.module.get_weight()")
    assert _lines(source) == []
