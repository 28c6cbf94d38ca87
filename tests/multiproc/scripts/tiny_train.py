"""A tiny ddpkit training script for end-to-end launcher tests: `--crash-rank R`, `--sleep S`, `--out DIR`,
`--no-with` (ctx = ddpkit.init() ... ctx.close() instead of a with block)."""

import argparse
import json
import os
import time

import torch

import ddpkit

p = argparse.ArgumentParser()
p.add_argument("--crash-rank", type=int, default=-1)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--out", default="")
p.add_argument("--steps", type=int, default=5)
p.add_argument("--no-with", action="store_true")
p.add_argument("extra", nargs="*")
args = p.parse_args()


def train(ctx):
    model = ddpkit.wrap(torch.nn.Linear(4, 1), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = ddpkit.loader(torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), ctx, batch_size=4)
    for step, (x, y) in zip(range(args.steps), data):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 2 and ctx.rank == args.crash_rank:
            raise ValueError(f"deliberate failure on rank {ctx.rank}")
    if args.out:
        path = os.path.join(args.out, f"rank{ctx.rank}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"rank": ctx.rank, "world_size": ctx.world_size, "pid": os.getpid(), "extra": args.extra,
                       "sha": ddpkit.param_sha256(model)}, f)
        os.replace(path + ".tmp", path)  # whole, when a test polling for it sees it
    time.sleep(args.sleep)


if args.no_with:
    ctx = ddpkit.init(seed=1)
    train(ctx)
    ctx.close()
else:
    with ddpkit.init(seed=1) as ctx:
        train(ctx)
