"""Profiling's overhead in one job: the same training step with and without `profile=True`, steps interleaved.

    ddpkit run --nproc-per-node 2 benchmarks/variants/profile_ab.py OUT.json STEPS

Two arms, each its own copy of the same initial model (benchmarks/common.py's 2.91 M-parameter MLP,
64 samples per rank) on the same batches, alternating A B B A ... so both share the machine's
drift step by step. The profiled arm runs under a copy of the Context with profiling on (the same
process group), so wrap, loader and Precision.step take their profiled paths. Each arm's step is
timed on the host, from asking for the batch to the end of Precision.step (on CUDA after a
synchronize, the same for both arms). Rank 0 writes the medians, their ratio, the median of the
per-step ratios (each profiled step against the plain step next to it), the host time of the
profiler's own calls per step (timed alone, without the step's noise), whether the two arms' final
parameters are identical, and the profiled arm's report (its "other" holds the plain arm's
interleaved step).
"""

import dataclasses
import json
import os
import random
import statistics
import sys
import time

import torch

import ddpkit
from ddpkit.profile import profiler_for

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import build_model, forever, make_dataset  # noqa: E402

ARMS = ("plain", "profiled")


def own_cost_us(ctx, steps: int = 20000) -> float:
    """The host time of the profiler's own calls in one step (one batch, one watched gradient, backward's
    and the optimizer's marks), timed over many empty steps on a fresh profiler of `ctx`'s device: what
    profiling adds to every step, measured without the noise of the training step around it."""
    from ddpkit.profile import StepProfiler

    prof = StepProfiler(ctx)
    prof.last_param = 0  # past the warm-up: the one remaining gradient hook records a mark
    batches = prof.batches(iter(range(steps)), 1)
    t0 = time.perf_counter()
    for _ in batches:
        prof._grad_ready(0, None)
        prof.mark_backward()
        prof.mark_optimizer(started=True)
        prof.mark_optimizer(started=False)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    with ddpkit.init(seed=0) as ctx:
        contexts = {"plain": ctx, "profiled": dataclasses.replace(ctx, profile=True, profiler=None, _at_close=[])}
        dataset = make_dataset(0)
        arms = {}
        for name, c in contexts.items():
            model = ddpkit.wrap(build_model(0), c)
            arms[name] = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                          "prec": ddpkit.Precision(c, dtype="fp32"),
                          "data": forever(ddpkit.loader(dataset, c, batch_size=64))}
        times: dict[str, list[float]] = {name: [] for name in ARMS}
        for t in range(steps + 5):
            for name in (ARMS if t % 2 == 0 else ARMS[::-1]):
                arm = arms[name]
                t0 = time.perf_counter()
                x, y = next(arm["data"])
                with arm["prec"].autocast():
                    loss = torch.nn.functional.cross_entropy(arm["model"](x), y)
                arm["prec"].backward(loss)
                arm["prec"].step(arm["opt"], arm["model"])
                if ctx.device.type == "cuda":
                    torch.cuda.synchronize()
                if t >= 5:
                    times[name].append(time.perf_counter() - t0)
        report = profiler_for(contexts["profiled"]).finish()  # a collective, as ctx.close() would run it
        digests = {name: ddpkit.param_sha256(arm["model"]) for name, arm in arms.items()}
        own_us = own_cost_us(contexts["profiled"])
        if ctx.is_main:
            med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
            paired = sorted(a / b for a, b in zip(times["profiled"], times["plain"]))
            q1, q3 = paired[len(paired) // 4], paired[3 * len(paired) // 4]
            rng = random.Random(0)  # the median's standard error, by bootstrap: how far the noise reaches
            se = statistics.stdev(statistics.median(rng.choices(paired, k=len(paired))) for _ in range(1000))
            result = {"world_size": ctx.world_size, "device": str(ctx.device), "steps": steps,
                      "median_step_ms": med, "ratio_of_medians": med["profiled"] / med["plain"],
                      "median_paired_ratio": statistics.median(paired), "paired_ratio_quartiles": [q1, q3],
                      "paired_ratio_median_se": se,
                      "profiler_us_per_step": own_us, "profiler_share_of_step": own_us / 1e3 / med["plain"],
                      "same_parameters": len(set(digests.values())) == 1, "report": report}
            with open(out, "w") as f:
                json.dump(result, f, indent=1)
            print(f"median step: plain {med['plain']:.2f} ms, profiled {med['profiled']:.2f} ms; profiled/plain: "
                  f"ratio of medians {result['ratio_of_medians']:.4f}, median of paired steps "
                  f"{result['median_paired_ratio']:.4f} +- {se:.4f} (quartiles {q1:.3f}-{q3:.3f}); the profiler's own calls "
                  f"{own_us:.1f} us per step = {100 * result['profiler_share_of_step']:.3f}% of the plain step; "
                  f"same parameters: {result['same_parameters']}")


if __name__ == "__main__":
    main()
