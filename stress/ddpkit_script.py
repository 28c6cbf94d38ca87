"""The same job through ddpkit (init/close via the context manager)."""

import torch

import ddpkit
from ddpkit.collectives import all_gather_object

with ddpkit.init() as ctx:
    model = ddpkit.wrap(torch.nn.Linear(8, 8), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    all_gather_object(ctx, ctx.rank)
    ddpkit.all_reduce_sum(ctx, torch.ones(2))
