"""DDP options A/B in one job: one model copy per option set, steps interleaved A B C A B C ...

Every arm trains its own copy of the same initial model on the same batches, so step times share
the machine's drift step by step, and each arm's final parameters can be compared with the arm
that uses PyTorch's DDP defaults (exact DDP). Also times fetching one batch from torch's
DataLoader + DistributedSampler against ddpkit.loader.
"""

import json
import os
import statistics
import sys
import time

import torch

import ddpkit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import build_model, forever, make_dataset  # noqa: E402

ARMS = {
    "PyTorch DDP defaults": {"gradient_as_bucket_view": False, "comm": None},
    "ddpkit defaults": {},
    "ddpkit defaults + shard_optimizer": {"shard_optimizer": True},
    "comm='shm' (opt-in)": {"comm": "shm"},
    "bucket_cap_mb=1": {"bucket_cap_mb": 1},
    "bucket_cap_mb=2.5": {"bucket_cap_mb": 2.5},
    "bucket_cap_mb=5": {"bucket_cap_mb": 5},
    "bucket_cap_mb=100 (one bucket)": {"bucket_cap_mb": 100},
    "static_graph=True": {"static_graph": True},
    "comm='fp16'": {"comm": "fp16"},
    "comm='bf16'": {"comm": "bf16"},
}
REFERENCE = "PyTorch DDP defaults"
"""Every arm is ddpkit.wrap(**options), except "shard_optimizer", which shards the arm's optimizer."""


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    with ddpkit.init(seed=0) as ctx:
        dataset = make_dataset(0)
        models, opts = {}, {}
        for name, options in ARMS.items():
            options = dict(options)
            shard = options.pop("shard_optimizer", False)
            models[name] = ddpkit.wrap(build_model(0), ctx, **options)
            opts[name] = torch.optim.SGD(models[name].parameters(), lr=0.05, momentum=0.9)
            if shard:
                opts[name] = ddpkit.shard_optimizer(opts[name], models[name], ctx)
        times: dict[str, list[float]] = {name: [] for name in ARMS}
        losses: dict[str, float] = {}
        data = ddpkit.loader(dataset, ctx, batch_size=64)
        # forever() calls sampler.set_epoch at each epoch
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=ctx.world_size, rank=ctx.rank, seed=0)  # noqa: DDP001
        plain = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler, drop_last=True)
        fetch = {"DataLoader + DistributedSampler": forever(plain), "ddpkit.loader": forever(data)}
        fetch_s: dict[str, list[float]] = {name: [] for name in fetch}
        names = list(ARMS)
        for t in range(steps + 3):
            for name in list(fetch)[t % 2:] + list(fetch)[:t % 2]:
                t0 = time.perf_counter()
                x, y = next(fetch[name])
                fetch_s[name].append(time.perf_counter() - t0)
            for name in names[t % len(names):] + names[:t % len(names)]:
                model, opt = models[name], opts[name]
                t0 = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if t >= 3:  # the first steps build buckets and warm caches
                    times[name].append(time.perf_counter() - t0)
                losses[name] = float(loss.detach())
        ref = {k: v for k, v in ddpkit.unwrap(models[REFERENCE]).state_dict().items()}
        result = {
            "arms": {name: {
                "options": ARMS[name],
                "step_ms": 1000 * statistics.median(times[name]),
                "p25_ms": 1000 * statistics.quantiles(times[name], n=4)[0],
                "p75_ms": 1000 * statistics.quantiles(times[name], n=4)[2],
                "max_abs_diff_vs_reference": max(
                    float((v - ref[k]).abs().max()) for k, v in ddpkit.unwrap(models[name]).state_dict().items()),
                "last_loss": losses[name],
            } for name in ARMS},
            "fetch_ms": {name: 1000 * statistics.median(v[3:]) for name, v in fetch_s.items()},
            "reference": REFERENCE,
            "steps": steps,
        }
        if ctx.is_main:
            with open(out, "w") as f:
                json.dump(result, f)


if __name__ == "__main__":
    main()
