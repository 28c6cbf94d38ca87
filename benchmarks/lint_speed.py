"""How long `ddpkit lint` takes on a project of N files (target: 50 files in under 2 seconds).

Generates a project of our own writing: one train.py that imports N-1 helper modules (data,
model, checkpoint and logging helpers of ~60 lines each, with guards, collectives and loops like a
real code base), then times linting it as one program, best of --repeats runs, in this process and
through the command line. Prints files, lines and seconds; it asserts nothing.

    python benchmarks/lint_speed.py [--files 50] [--repeats 5]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HELPER = '''\
"""Helper module {i}: data, model and checkpoint pieces."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Block{i}(nn.Module):
    def __init__(self, width=16):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))

    def forward(self, x):
        return self.layers(x) + x


def loader_{i}(batch_size, rank, world_size):
    data = TensorDataset(torch.randn(256, 16), torch.randn(256, 16))
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True)
    return DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=True), sampler


def mean_{i}(value, world_size):
    t = torch.tensor([float(value)])
    dist.all_reduce(t)
    return t.item() / world_size


def save_{i}(model, step, path):
    if dist.get_rank() == 0:
        torch.save({{"model": model.state_dict(), "step": step}}, os.path.join(path, "ckpt_{i}.pt"))
    dist.barrier()


def load_{i}(model, path):
    state = torch.load(os.path.join(path, "ckpt_{i}.pt"), map_location="cpu")
    model.load_state_dict(state["model"])


def log_{i}(step, loss, rank):
    if rank == 0 and step % 10 == 0:
        print(f"helper {i} step {{step}} loss {{loss:.4f}}")
'''

TRAIN = '''\
"""The entry point of the generated project."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

{imports}


def main():
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234 + rank)
    model = DDP(helper_1.Block1())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader, sampler = helper_1.loader_1(8, rank, world_size)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            helper_1.log_1(step, helper_1.mean_1(loss.item(), world_size), rank)
        helper_1.save_1(model.module, epoch, os.getcwd())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def make_project(root: Path, files: int) -> int:
    """Write the project; returns its number of lines."""
    lines = 0
    for i in range(1, files):
        text = HELPER.format(i=i)
        (root / f"helper_{i}.py").write_text(text)
        lines += text.count("\n")
    imports = "\n".join(f"import helper_{i}" for i in range(1, files))
    text = TRAIN.format(imports=imports)
    (root / "train.py").write_text(text)
    return lines + text.count("\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=50, help="files in the generated project (default 50)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs; the best is reported (default 5)")
    args = p.parse_args(argv)
    if args.files < 2 or args.repeats < 1:
        p.error(f"--files {args.files} --repeats {args.repeats}: need at least 2 files and 1 repeat")
    from ddpkit.lint import lint_files

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        lines = make_project(root, args.files)
        paths = sorted(root.glob("*.py"))
        best, findings = float("inf"), []
        for _ in range(args.repeats):
            start = time.perf_counter()
            findings = lint_files(paths)
            best = min(best, time.perf_counter() - start)
        start = time.perf_counter()
        cli = subprocess.run([sys.executable, "-m", "ddpkit.cli", "lint", str(root)], capture_output=True, text=True)
        cli_s = time.perf_counter() - start
    print(textwrap.dedent(f"""\
        project: {args.files} files, {lines} lines, {len(findings)} findings
        lint_files (in process, best of {args.repeats}): {best:.3f} s
        ddpkit lint DIR (new process, incl. start-up): {cli_s:.3f} s (exit {cli.returncode})"""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
