"""Profiling's overhead in one job: the same training step with and without `profile=True`, steps interleaved.

    ddpkit run --nproc-per-node 2 benchmarks/variants/profile_ab.py OUT.json STEPS

Two arms, each its own copy of the same initial model (benchmarks/common.py's 2.91 M-parameter MLP,
64 samples per rank) on the same batches, alternating A B B A ... so both share the machine's
drift step by step. The profiled arm runs under a copy of the Context with profiling on (the same
process group), so wrap, loader and Precision.step take their profiled paths. Each arm's step is
timed on the host, from asking for the batch to the end of Precision.step (on CUDA after a
synchronize, the same for both arms). Rank 0 writes the medians, their ratio, whether the two arms'
final parameters are identical, and the profile report of the profiled arm.
"""

import dataclasses
import json
import os
import statistics
import sys
import time

import torch

import ddpkit
from ddpkit.profile import profiler_for

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import build_model, forever, make_dataset  # noqa: E402

ARMS = ("plain", "profiled")


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
        if ctx.is_main:
            med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
            result = {"world_size": ctx.world_size, "device": str(ctx.device), "steps": steps,
                      "median_step_ms": med, "ratio_profiled_to_plain": med["profiled"] / med["plain"],
                      "same_parameters": len(set(digests.values())) == 1, "report": report}
            with open(out, "w") as f:
                json.dump(result, f, indent=1)
            print(f"median step: plain {med['plain']:.2f} ms, profiled {med['profiled']:.2f} ms, ratio "
                  f"{result['ratio_profiled_to_plain']:.4f}; same parameters: {result['same_parameters']}")


if __name__ == "__main__":
    main()
