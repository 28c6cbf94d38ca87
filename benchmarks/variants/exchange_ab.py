"""The shared-memory exchange's piece size, A/B in one job: one model copy per arm, steps interleaved.

Arms: the opt-in exchange (comm="shm") with pieces of 256 KiB to 4 MiB, PyTorch's all-reduce (the
default, comm=None), and a floor
that exchanges nothing (every rank keeps its own gradients: wrong results, the cost of DDP without
communication). Run with `ddpkit run --nproc-per-node 2 benchmarks/variants/exchange_ab.py OUT.json STEPS`.
"""

import json
import os
import statistics
import sys
import time

import torch

import ddpkit
import ddpkit.parallel.shm

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import build_model, make_dataset, no_exchange_hook  # noqa: E402

PIECES = {"pieces of 256 KiB": 1 << 18, "pieces of 512 KiB (default)": 1 << 19, "pieces of 1 MiB": 1 << 20,
          "pieces of 4 MiB": 1 << 22}
REFERENCE = "comm=None (PyTorch's all-reduce)"
FLOOR = "no exchange (floor; wrong results)"


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    default_piece = ddpkit.parallel.shm.PIECE_BYTES
    with ddpkit.init(seed=0) as ctx:
        models = {}
        for name, piece in PIECES.items():
            ddpkit.parallel.shm.PIECE_BYTES = piece  # read when wrap() sets up the segment
            models[name] = ddpkit.wrap(build_model(0), ctx, comm="shm")
        ddpkit.parallel.shm.PIECE_BYTES = default_piece
        models[REFERENCE] = ddpkit.wrap(build_model(0), ctx)
        models[FLOOR] = ddpkit.wrap(build_model(0), ctx)
        models[FLOOR].register_comm_hook(None, no_exchange_hook)
        opts = {name: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for name, m in models.items()}
        times: dict[str, list[float]] = {name: [] for name in models}
        names, data, t = list(models), ddpkit.loader(make_dataset(0), ctx, batch_size=64), 0
        while t < steps + 3:
            for x, y in data:
                for name in names[t % len(names):] + names[:t % len(names)]:
                    t0 = time.perf_counter()
                    torch.nn.functional.cross_entropy(models[name](x), y).backward()
                    opts[name].step()
                    opts[name].zero_grad(set_to_none=True)
                    if t >= 3:
                        times[name].append(time.perf_counter() - t0)
                t += 1
                if t == steps + 3:
                    break
        ref = ddpkit.unwrap(models[REFERENCE]).state_dict()
        base = statistics.median(times[REFERENCE])
        result = {"reference": REFERENCE, "steps": steps, "arms": {name: {
            "step_ms": 1000 * statistics.median(times[name]),
            "x_reference": statistics.median(times[name]) / base,
            "max_abs_diff_vs_reference": max(
                float((v - ref[k]).abs().max()) for k, v in ddpkit.unwrap(models[name]).state_dict().items()),
        } for name in names}}
        if ctx.is_main:
            with open(out, "w") as f:
                json.dump(result, f, indent=1)
            for name, arm in result["arms"].items():
                print(f"{name:38s} {arm['step_ms']:6.2f} ms  x {arm['x_reference']:.3f}  "
                      f"max |dθ| {arm['max_abs_diff_vs_reference']:.1e}")


if __name__ == "__main__":
    main()
