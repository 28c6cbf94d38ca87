"""Memory per rank and step time, strategy="fsdp" against "ddp", at 1, 2 and 4 CPU ranks (gloo).

    python benchmarks/fsdp_memory.py                         # ~20 M parameters, AdamW; a few minutes
    python benchmarks/fsdp_memory.py --dim 32 --blocks 2 --steps 2 --worlds 1,2   # a smoke test

One model (`--blocks` residual MLP blocks of width `--dim`, 4x expansion: 10 blocks of 512 hold
21 M parameters) trained with AdamW for `--steps` steps on each world size and strategy, every
rank a fresh process. Each rank reports what it holds itself, counted from its local shards:
parameter, gradient (just before the optimizer step) and optimizer-state bytes, and its peak RSS
(ru_maxrss, which includes the interpreter and torch). The table gives those per rank, the
sharded bytes as a fraction of world size 1's (FSDP's must be about 1/W), and FSDP's median step
time over DDP's at the same world size. Figures are ratios within one run; dated results go in
docs/benchmarks.md. Writes benchmarks/results/fsdp_memory.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=512, help="block width")
    p.add_argument("--blocks", type=int, default=10, help="residual MLP blocks (8 * dim^2 parameters each)")
    p.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps per run")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    p.add_argument("--worlds", default="1,2,4", help="comma-separated world sizes")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run before its ranks are killed")
    p.add_argument("--out", default=str(HERE / "results" / "fsdp_memory.json"))
    args = p.parse_args(argv)
    args.worlds = [int(w) for w in args.worlds.split(",")]
    if min(args.dim, args.blocks, args.batch_size, args.steps, *args.worlds) < 1 or args.warmup < 0:
        p.error("--dim, --blocks, --batch-size, --steps and every --worlds entry must be at least 1")
    return args


def _model(args):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(args.dim, 4 * args.dim), nn.Linear(4 * args.dim, args.dim)

        def forward(self, h):
            return h + self.down(torch.relu(self.up(h)))

    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(args.blocks)]), Block


def _bytes(tensors) -> int:
    from ddpkit.parallel.strategy import local_numel

    return sum(local_numel(t) * t.element_size() for t in tensors)


def _rank(rank: int, world_size: int, strategy: str, args, init_method: str, out: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                       "LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1"})
    import resource

    import torch

    import ddpkit

    torch.set_num_threads(1)
    with ddpkit.init(seed=0, init_method=init_method) as ctx:
        net, block = _model(args)
        extra = {"shard_modules": (block,)} if strategy == "fsdp" else {"comm": None}
        model = ddpkit.wrap(net, ctx, strategy=strategy, **extra)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        g = torch.Generator().manual_seed(rank)
        times, grad_bytes = [], 0
        for step in range(args.warmup + args.steps):
            x = torch.randn(args.batch_size, args.dim, generator=g)
            t0 = time.perf_counter()
            model(x).pow(2).mean().backward()
            grad_bytes = _bytes([p.grad for p in model.parameters() if p.grad is not None])
            opt.step()
            opt.zero_grad(set_to_none=True)
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        record = {
            "rank": rank, "world_size": world_size, "strategy": strategy,
            "num_params": sum(p.numel() for p in model.parameters()),
            "param_bytes": _bytes(model.parameters()), "grad_bytes": grad_bytes,
            "optim_bytes": _bytes([v for s in opt.state.values() for v in s.values()
                                   if isinstance(v, torch.Tensor) and v.dim() > 0]),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
            "step_ms": 1000 * statistics.median(times),
        }
    Path(out).write_text(json.dumps(record))


def run(world_size: int, strategy: str, args) -> list[dict]:
    """One job of `world_size` fresh processes; their records by rank."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ddpkit-fsdp-bench-") as tmp:
        init_method = "file://" + str(Path(tmp) / "rendezvous")
        outs = [str(Path(tmp) / f"rank{r}.json") for r in range(world_size)]
        procs = [ctx.Process(target=_rank, args=(r, world_size, strategy, args, init_method, outs[r]), daemon=True)
                 for r in range(world_size)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + args.timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(5)
        missing = [r for r, o in enumerate(outs) if not os.path.exists(o)]
        if missing:
            raise SystemExit(f"{strategy} on {world_size} ranks: ranks {missing} wrote no record "
                             f"(exit codes {[p.exitcode for p in procs]}; --timeout {args.timeout:g}s)")
        return [json.loads(Path(o).read_text()) for o in outs]


def table(records: list[dict]) -> str:
    """The markdown table: per-rank maxima, sharded bytes against world size 1, FSDP step time over DDP's."""
    def key(r):
        return r["strategy"], r["world_size"]

    by: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        by.setdefault(key(r), []).append(r)
    mib = 2 ** 20
    lines = ["| strategy | ranks | params MiB/rank | grads MiB/rank | AdamW state MiB/rank | sharded bytes x W=1 "
             "| peak RSS MB/rank | step ms | x DDP step |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (strategy, w), rs in sorted(by.items()):
        held = {f: max(r[f] for r in rs) for f in ("param_bytes", "grad_bytes", "optim_bytes")}
        base = by.get((strategy, 1))
        frac = "-"
        if base:
            total = sum(held.values())
            frac = f"{total / sum(max(r[f] for r in base) for f in held):.3f} (1/W = {1 / w:.3f})"
        ddp = by.get(("ddp", w))
        step = max(r["step_ms"] for r in rs)
        rel = f"{step / max(r['step_ms'] for r in ddp):.2f}" if ddp else "-"
        lines.append(f"| {strategy} | {w} | {held['param_bytes'] / mib:.1f} | {held['grad_bytes'] / mib:.1f} | "
                     f"{held['optim_bytes'] / mib:.1f} | {frac} | {max(r['peak_rss_mb'] for r in rs):.0f} | "
                     f"{step:.1f} | {rel} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    records = []
    for w in args.worlds:
        for strategy in ("ddp", "fsdp"):
            records += run(w, strategy, args)
            print(json.dumps(records[-1]), file=sys.stderr, flush=True)
    print(f"\n{records[0]['num_params'] / 1e6:.1f} M parameters, AdamW, batch {args.batch_size} per rank\n")
    print(table(records))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "records": records},
                                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
