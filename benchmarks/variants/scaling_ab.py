"""Scaling, A/B in one job: one process on both cores against 2 ranks, steps interleaved.

The scaling row of run.py compares separate jobs, and on a shared 2-core machine the 2-thread
single process is the noisiest figure there is (its runs spread over +-20 %). Here every arm runs
inside one 2-rank job, in blocks of BLOCK steps (default 10) taken in turn, so they all share the
machine's drift:

- "1 process x 128, 2 threads": rank 0 alone, with 2 intra-op threads, trains a plain copy of the
  model on a batch of 128 from torch's DataLoader, while rank 1 sleeps in a gloo barrier;
- the 2-rank arms, each on its own DDP copy, 64 samples per rank from ddpkit.loader.

The first 2 steps of every block are not timed: after the 2-thread arm its idle OpenMP worker keeps
spinning for a while, and would otherwise take a core from the next arm's first steps (with one
step per turn that bias cost the 2-rank arms 5-15 %).

Run with `ddpkit run --nproc-per-node 2 benchmarks/variants/scaling_ab.py OUT.json STEPS [BLOCK]`.
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

import ddpkit
from ddpkit.parallel.shm import ShmBarrier, map_segment

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import build_model, forever, make_dataset, no_exchange_hook  # noqa: E402

SINGLE = "1 process x 128, 2 threads"
ARMS = (SINGLE, "ddpkit defaults", "comm='shm' (opt-in)",
        "no exchange (floor; wrong results)")


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    block = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    if block < 3:
        raise SystemExit(f"scaling_ab.py: BLOCK must be at least 3 steps (2 untimed), got {block}")
    torch.set_num_threads(1)
    with ddpkit.init(seed=0) as ctx:
        if ctx.world_size != 2:
            raise SystemExit("scaling_ab.py compares 2 ranks with one 2-thread process: run it with 2 ranks")
        dataset = make_dataset(0)
        # gloo's barrier sleeps, so a rank can wake from it a millisecond late; the flag barrier, which
        # spins, then lines both ranks up to within microseconds before a timed 2-rank step.
        _, flags = map_segment(0, what="scaling_ab", fix="")
        align = ShmBarrier(flags, ctx.rank, 2, 60.0, "aligning with rank {peer}", "stopped").wait
        models, opts, batches = {}, {}, {}
        for name in ARMS[1:]:
            models[name] = ddpkit.wrap(build_model(0), ctx, comm="shm" if name.startswith("comm='shm'") else None)
            opts[name] = torch.optim.SGD(models[name].parameters(), lr=0.05, momentum=0.9)
            if name.startswith("no exchange"):
                models[name].register_comm_hook(None, no_exchange_hook)
            batches[name] = forever(ddpkit.loader(dataset, ctx, batch_size=64))
        if ctx.is_main:
            models[SINGLE] = build_model(0)
            opts[SINGLE] = torch.optim.SGD(models[SINGLE].parameters(), lr=0.05, momentum=0.9)
            g = torch.Generator().manual_seed(0)
            batches[SINGLE] = forever(torch.utils.data.DataLoader(dataset, batch_size=128, shuffle=True,
                                                                   drop_last=True, generator=g))
        times: dict[str, list[float]] = {name: [] for name in ARMS}
        rounds = -(-steps // (block - 2))
        for r in range(rounds):
            for name in ARMS[r % len(ARMS):] + ARMS[:r % len(ARMS)]:
                dist.barrier()  # both ranks start the block together (untimed)
                for k in range(block):
                    if name == SINGLE:
                        if not ctx.is_main:
                            break  # rank 1 sleeps in the barrier below meanwhile
                        torch.set_num_threads(2)
                        elapsed = _step(models[name], opts[name], batches[name])
                        torch.set_num_threads(1)
                    else:
                        align()
                        elapsed = _step(models[name], opts[name], batches[name])
                    if k >= 2:
                        times[name].append(elapsed)
                if name == SINGLE:
                    dist.barrier()
        if ctx.is_main:
            base = statistics.median(times[SINGLE])
            result = {"baseline": SINGLE, "steps": steps, "block": block, "arms": {name: {
                "step_ms": 1000 * statistics.median(times[name]),
                "p25_ms": 1000 * statistics.quantiles(times[name], n=4)[0],
                "p75_ms": 1000 * statistics.quantiles(times[name], n=4)[2],
                "throughput_x_baseline": base / statistics.median(times[name]),
            } for name in ARMS}}
            with open(out, "w") as f:
                json.dump(result, f, indent=1)
            for name, arm in result["arms"].items():
                print(f"{name:38s} {arm['step_ms']:6.2f} ms (p25 {arm['p25_ms']:.2f}, p75 {arm['p75_ms']:.2f})  "
                      f"throughput x {arm['throughput_x_baseline']:.3f}")


def _step(model, opt, batches) -> float:
    """One optimizer step on 128 samples in all (one process) or 64 per rank; its wall time."""
    t0 = time.perf_counter()
    x, y = next(batches)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
