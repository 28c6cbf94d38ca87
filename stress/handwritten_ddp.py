"""A minimal hand-written gloo DDP script (the baseline for the teardown stress test)."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
out = [torch.zeros(2) for _ in range(dist.get_world_size())]
dist.all_gather(out, torch.ones(2) * rank)
dist.destroy_process_group()
