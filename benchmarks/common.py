"""What every benchmark variant shares: the model, the synthetic data, the step loop's record, the CLI."""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

__all__ = ["IN_FEATURES", "HIDDEN", "NUM_CLASSES", "build_model", "make_dataset", "parse_args", "Recorder",
           "no_exchange_hook", "save_params", "forever"]

# An MLP of 2.91 M parameters: 784 -> 1024 -> 1024 -> 1024 -> 10. Small enough for CPU ranks,
# big enough that the gradient all-reduce (11.6 MB of float32) is a real share of each step.
IN_FEATURES, HIDDEN, NUM_CLASSES = 784, 1024, 10
NUM_SAMPLES = 16384


def build_model(seed: int):
    """The same initial weights in every variant and on every rank (DDP would broadcast them anyway)."""
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, NUM_CLASSES),
    )


def make_dataset(seed: int, num_samples: int = NUM_SAMPLES):
    """A learnable synthetic classification set: labels from a fixed random linear teacher."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(num_samples, IN_FEATURES, generator=g)
    teacher = torch.randn(IN_FEATURES, NUM_CLASSES, generator=g)
    y = (x @ teacher).argmax(dim=1)
    return torch.utils.data.TensorDataset(x, y)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="one benchmark variant (run by benchmarks/run.py)")
    p.add_argument("--out", required=True, help="JSON file this rank writes its record to ({rank} is replaced)")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps to time")
    p.add_argument("--warmup", type=int, default=5, help="first steps left out of the step-time figures")
    p.add_argument("--batch-size", type=int, default=64, help="samples per rank per micro-step")
    p.add_argument("--accumulation-steps", type=int, default=1, help="micro-steps per optimizer step")
    p.add_argument("--no-skip-sync", action="store_true", help="all-reduce every micro-step (the naive way)")
    p.add_argument("--no-exchange", action="store_true",
                   help="ddpkit variant: skip the gradient exchange (a floor for DDP's step time; wrong results)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads of this process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--launch-time", type=float, default=None, help="time.time() when the launcher was started")
    p.add_argument("--options", default="{}", help="JSON dict of variant options (ddpkit: wrap() keyword arguments)")
    p.add_argument("--save-params", default=None, help="write the final parameters here (.pt, rank 0)")
    return p.parse_args(argv)


class Recorder:
    """Per-step wall times and the run's other figures; `write` saves one JSON per rank."""

    def __init__(self, args: argparse.Namespace, import_s: float):
        self.args = args
        self.import_s = import_s
        self.step_ends: list[float] = []
        self.losses: list[float] = []
        self.first_step_wall: float | None = None

    def step(self, loss) -> None:
        """Call after each optimizer step with its (last micro-step's) loss tensor."""
        now = time.perf_counter()
        if self.first_step_wall is None:
            self.first_step_wall = time.time()
        self.step_ends.append(now)
        self.losses.append(float(loss.detach()))

    def write(self, rank: int, world_size: int, extra: dict | None = None) -> None:
        a = self.args
        ends = self.step_ends
        steps = [b - e for e, b in zip(ends[a.warmup:], ends[a.warmup + 1:])]
        record = {
            "rank": rank,
            "world_size": world_size,
            "step_s": steps,
            "import_s": self.import_s,
            "start_to_first_step_s": self.first_step_wall - _process_start_time(),
            "launch_to_first_step_s": (self.first_step_wall - a.launch_time) if a.launch_time else None,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "final_loss": sum(self.losses[-10:]) / len(self.losses[-10:]),
            "samples_per_step": a.batch_size * a.accumulation_steps * world_size,
            **(extra or {}),
        }
        path = a.out.replace("{rank}", str(rank))
        with open(path, "w") as f:
            json.dump(record, f)


def _process_start_time() -> float:
    """When this process started (from /proc, in the clock's ticks), as a time.time() value."""
    with open(f"/proc/{os.getpid()}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start_ticks = int(fields[19])  # field 22 of proc(5), counted from after the command name
    with open("/proc/uptime") as f:
        uptime = float(f.read().split()[0])
    return time.time() - uptime + start_ticks / os.sysconf("SC_CLK_TCK")


def no_exchange_hook(state, bucket):
    """A DDP comm hook that keeps each rank's own gradients: what a step costs without communication."""
    import torch

    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def save_params(model, path: str) -> None:
    """The final parameters of the plain module, for the equivalence checks in run.py."""
    import torch

    torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)


def forever(loader):
    """Batches of successive epochs without end (ddpkit.loader advances its epoch by itself)."""
    epoch = 0
    while True:
        if hasattr(loader, "sampler") and hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1
