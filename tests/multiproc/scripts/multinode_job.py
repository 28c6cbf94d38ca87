"""A tiny job for the multi-node tests: train, or wait, and report what each rank did to OUT_DIR.

usage: multinode_job.py OUT_DIR train GLOBAL_BATCH STEPS [SLEEP_AFTER_STEP SLEEP_S]
       multinode_job.py OUT_DIR sleep SECONDS
       multinode_job.py OUT_DIR elastic STEPS   (trains "forever", ready after step 2; after a restart
                                                 that left it alone: STEPS steps, then reports)
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

import ddpkit


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    with ddpkit.init(seed=5, timeout_s=60) as ctx:
        # the launcher is the ranks' parent: tells the parent test which `ddpkit run` a rank belongs to
        info = {"rank": ctx.rank, "world_size": ctx.world_size, "pid": os.getpid(), "launcher_pid": os.getppid(),
                "node_rank": ctx.env.node_rank, "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
                "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))}
        if mode == "sleep":
            ddpkit.barrier(ctx)  # every rank's gloo sockets exist before the parent looks
            _write(out, ctx.rank, {**info, "ready": True})
            time.sleep(float(sys.argv[3]))
            return
        if mode == "elastic":
            # alone after a restart, i.e. the other node was lost (a first group of one grows once the
            # other node joins late: a membership change, not a restart)
            alone = ctx.world_size == 1 and info["restart"] > 0
            _train(ctx, out, info, 16, int(sys.argv[3]) if alone else 10**6, -1 if alone else 2, 0.1)
            return
        _train(ctx, out, info, int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]) if len(sys.argv) > 5 else -1,
               float(sys.argv[6]) if len(sys.argv) > 6 else 0.0)


def _train(ctx, out: str, info: dict, global_batch: int, steps: int, sleep_after: int, sleep_s: float) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    torch.manual_seed(1)  # identical initial weights on every rank and in every run
    model = ddpkit.wrap(torch.nn.Linear(4, 1), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    batches = ddpkit.loader(data, ctx, batch_size=global_batch // ctx.world_size, seed=2)
    done = 0
    while done < steps:
        for xb, yb in batches:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == sleep_after:
                _write(out, ctx.rank, {**info, "ready": True})
                time.sleep(sleep_s)
            if done == steps:
                break
    _write(out, ctx.rank, {**info, "sha": ddpkit.param_sha256(model), "steps": done,
                           "optimizer": type(opt).__name__,
                           "params": [p.tolist() for p in ddpkit.unwrap(model).parameters()]})


def _write(out: str, rank: int, record: dict) -> None:
    tmp = os.path.join(out, f".rank{rank}.json")
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, os.path.join(out, f"rank{rank}.json"))


if __name__ == "__main__":
    main()
