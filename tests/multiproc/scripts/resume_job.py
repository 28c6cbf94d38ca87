"""A resumable ddpkit job for restart tests: checkpoints every N steps, resumes from the latest, can SIGKILL itself.

    ddpkit run --nproc-per-node 2 --max-restarts 1 resume_job.py --checkpoint-dir D --kill-at 10 --out result.json

The only checkpoint code is the two ddpkit calls a user writes: load_checkpoint (None on a fresh
start) and save_checkpoint. `--kill-at K` kills rank `--kill-rank` with SIGKILL after step K, on the
first attempt only (TORCHELASTIC_RESTART_COUNT=0), so the restarted group runs to the end.
`--workers N` loads through N loader workers that add random noise to every sample (python, numpy
and torch draws, as augmentation would).
"""

import argparse
import json
import os
import random
import signal

import numpy as np
import torch

import ddpkit

p = argparse.ArgumentParser()
p.add_argument("--checkpoint-dir", required=True)
p.add_argument("--steps", type=int, default=30)
p.add_argument("--save-every", type=int, default=4)
p.add_argument("--kill-at", type=int, default=-1)
p.add_argument("--kill-rank", type=int, default=1)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--out", default="")
args = p.parse_args()


class Augmented(torch.utils.data.Dataset):
    """The samples with noise drawn where they are loaded: python, numpy and torch generators."""

    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        noise = torch.randn(x.shape) * 0.05 + float(np.random.randn()) * 0.05
        return x + noise * (0.5 + random.random()), y


g = torch.Generator().manual_seed(0)
x_all = torch.randn(320, 8, generator=g)
dataset = torch.utils.data.TensorDataset(x_all, (x_all @ torch.randn(8, 1, generator=g)).squeeze(1))

with ddpkit.init(seed=5) as ctx:
    with torch.random.fork_rng():  # the same initial weights on every attempt, rank streams untouched
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
    model = ddpkit.wrap(net, ctx)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=6, gamma=0.8)
    if args.workers:
        data = ddpkit.loader(Augmented(dataset), ctx, batch_size=8, num_workers=args.workers)
    else:
        data = ddpkit.loader(dataset, ctx, batch_size=8)
    ckpt = ddpkit.load_checkpoint(ctx, args.checkpoint_dir, model=model, optimizer=opt, scheduler=sched, loader=data)
    step = ckpt["step"] if ckpt else 0
    while step < args.steps:
        for x, y in data:
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            if step == args.kill_at and ctx.rank == args.kill_rank and ctx.env.restart_count == 0:
                os.kill(os.getpid(), signal.SIGKILL)
            if step % args.save_every == 0:
                ddpkit.save_checkpoint(ctx, args.checkpoint_dir, step=step, model=model, optimizer=opt,
                                       scheduler=sched, loader=data)
            if step == args.steps:
                break
    if ctx.is_main and args.out:
        with open(args.out, "w") as f:
            json.dump({"param_sha256": ddpkit.param_sha256(model), "steps": step, "world_size": ctx.world_size,
                       "restart_count": ctx.env.restart_count, "resumed_from": ckpt["step"] if ckpt else None}, f)
