"""The checks `ddpkit test` runs inside every rank: each one a small real job, timed, its verdict written to a file.

    python -m ddpkit.selftest.checks --out DIR [--device auto|cpu|cuda] [--checkpoint-dir DIR] [--hang-timeout S]

`ddpkit test` starts this module on every rank through `ddpkit run`'s launcher; each rank writes
DIR/rank-N.json (see docs/gpu.md for the fields). A check that raises fails with its one-line
error; the others still run. Every check is a collective: all ranks run them in the same order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

__all__ = ["main", "bus_bandwidth", "CHECKS", "message_sizes"]

CHECKS = ("rendezvous", "all-reduce", "bus bandwidth", "DDP equivalence", "batches to device",
          "mixed precision", "checkpoint round trip", "skipped collective", "teardown")
"""The checks in the order they run (and are reported)."""


def bus_bandwidth(num_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one all-reduce, in the nccl-tests convention: busbw = algbw * 2(n-1)/n.

    The bus bandwidth is what each link carried, so it compares across world sizes and with the
    hardware's link speed; at world size 1 nothing crosses a link and busbw is 0.
    """
    algbw = num_bytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * 2 * (world_size - 1) / world_size


def message_sizes(device_type: str) -> tuple[int, ...]:
    """All-reduce message sizes in bytes: small (latency-bound) to large (bandwidth-bound)."""
    mib = 1 << 20
    return (mib, 16 * mib, 256 * mib) if device_type == "cuda" else (mib // 4, 4 * mib, 32 * mib)


def _sync(ctx) -> None:
    import torch

    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


def _rendezvous(ctx, args) -> str:
    import socket

    from ddpkit.collectives import all_gather_object

    peers = all_gather_object(ctx, (ctx.rank, socket.gethostname(), str(ctx.device)))
    ranks = sorted(p[0] for p in peers)
    if ranks != list(range(ctx.world_size)):
        raise RuntimeError(f"ranks {ranks} joined, expected 0..{ctx.world_size - 1}")
    hosts = sorted({p[1] for p in peers})
    return f"{ctx.world_size} rank(s) on {len(hosts)} host(s), backend {ctx.backend}, devices {sorted({p[2] for p in peers})}"


def _all_reduce(ctx, args) -> str:
    import torch

    from ddpkit.collectives import all_reduce_sum

    n = ctx.world_size
    checked = []
    for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
        for numel in (1, 1000, 1 << 18):
            # Values whose sum is exact in every dtype: rank r contributes (r + 1) * (i % 7).
            base = (torch.arange(numel, device=ctx.device) % 7).to(dtype)
            t = base * (ctx.rank + 1)
            if ctx.distributed:
                import torch.distributed as dist

                dist.all_reduce(t)
            want = base * (n * (n + 1) // 2)
            if not torch.equal(t, want):
                bad = int((t != want).nonzero()[0, 0])
                raise RuntimeError(f"{dtype} all-reduce of {numel} elements is wrong at index {bad}: "
                                   f"{t[bad].item()} instead of {want[bad].item()}")
            checked.append(dtype)
    total = float(all_reduce_sum(ctx, 1.0))
    if total != n:
        raise RuntimeError(f"all_reduce_sum of 1.0 over {n} ranks gave {total}")
    return f"exact sums for float32, float64, int64, bfloat16 at 1, 1000 and 262144 elements over {n} rank(s)"


def _bandwidth(ctx, args, result: dict) -> str:
    import torch

    import torch.distributed as dist

    rows: list[dict[str, Any]] = []
    result["bandwidth"] = rows
    if not ctx.distributed:
        return "not applicable at world size 1 (nothing crosses a link)"
    for num_bytes in message_sizes(ctx.device.type):
        t = torch.ones(num_bytes // 4, dtype=torch.float32, device=ctx.device)
        iters = 5
        for i in range(2 + iters):
            if i == 2:
                _sync(ctx)
                start = time.perf_counter()
            dist.all_reduce(t)
        _sync(ctx)
        elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=ctx.device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        seconds = float(elapsed)
        algbw, busbw = bus_bandwidth(num_bytes, seconds, ctx.world_size)
        rows.append({"bytes": num_bytes, "time_us": round(seconds * 1e6, 1), "algbw_gbps": round(algbw, 3),
                     "busbw_gbps": round(busbw, 3)})
    return " | ".join(f"{_size(r['bytes'])} {r['busbw_gbps']:.2f} GB/s" for r in rows) + " busbw"


def _size(num_bytes: int) -> str:
    return f"{num_bytes >> 20} MiB" if num_bytes >= 1 << 20 else f"{num_bytes >> 10} KiB"


def _toy(ctx, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(ctx.device)


def _global_batch(ctx, per_rank: int = 8):
    import torch

    g = torch.Generator().manual_seed(1)
    n = per_rank * ctx.world_size
    return torch.randn(n, 16, generator=g).to(ctx.device), torch.randn(n, 1, generator=g).to(ctx.device)


def _ddp(ctx, args) -> str:
    import torch

    import ddpkit

    x, y = _global_batch(ctx)
    b = x.shape[0] // ctx.world_size
    shard = slice(ctx.rank * b, (ctx.rank + 1) * b)
    model = ddpkit.wrap(_toy(ctx), ctx)
    reference = _toy(ctx)  # one process, the whole global batch
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, reference)]
    for _ in range(3):
        for m, opt, (xs, ys) in ((model, opts[0], (x[shard], y[shard])), (reference, opts[1], (x, y))):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(m(xs), ys).backward()
            opt.step()
    worst = max(float((a.detach() - b.detach()).abs().max())
                for a, b in zip(ddpkit.unwrap(model).parameters(), reference.parameters()))
    if worst > 1e-5:
        raise RuntimeError(f"after 3 steps DDP's parameters differ from one process's by {worst:.3g} (tolerance 1e-5)")
    return f"3 SGD steps equal a single process on the global batch (max difference {worst:.1e})"


def _batches(ctx, args) -> str:
    import torch

    import ddpkit
    from ddpkit.device import to_device

    data = torch.utils.data.TensorDataset(torch.arange(64.0).reshape(32, 2), torch.arange(32))
    train = ddpkit.loader(data, ctx, batch_size=4)
    x, y = next(iter(train))
    moved = to_device({"x": torch.ones(2), "pair": (torch.zeros(1), torch.ones(1))}, ctx.device)
    devices = {x.device, y.device, moved["x"].device, *(t.device for t in moved["pair"])}
    if devices != {ctx.device}:
        raise RuntimeError(f"batches landed on {sorted(map(str, devices))}, expected {ctx.device}")
    return f"loader batches and nested batches on {ctx.device}"


def _precision(ctx, args) -> str:
    import torch

    import ddpkit

    dtype = "auto" if ctx.device.type == "cuda" else "bf16"
    model = ddpkit.wrap(_toy(ctx), ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    prec = ddpkit.Precision(ctx, dtype=dtype)
    x, y = _global_batch(ctx)
    before = ddpkit.param_sha256(model)
    with prec.autocast():
        loss = torch.nn.functional.mse_loss(model(x), y)
    prec.backward(loss)
    info = prec.step(opt, model, max_grad_norm=1.0)
    if info.skipped or not torch.isfinite(loss) or ddpkit.param_sha256(model) == before:
        raise RuntimeError(f"{prec.dtype} step did not update the model (loss {float(loss):g}, {info})")
    return f"{prec.dtype} step: finite loss, grad norm {info.grad_norm:.3g}, parameters updated"


def _checkpoint(ctx, args) -> str:
    import torch

    import ddpkit
    from ddpkit.collectives import broadcast_object

    folder = Path(args.checkpoint_dir) if args.checkpoint_dir else Path(args.out) / "checkpoint"
    model = ddpkit.wrap(_toy(ctx), ctx)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = _global_batch(ctx)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    path = ddpkit.save_checkpoint(ctx, folder, step=1, model=model, optimizer=opt)
    fresh = ddpkit.wrap(_toy(ctx, seed=1), ctx)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    meta = ddpkit.load_checkpoint(ctx, folder, model=fresh, optimizer=fresh_opt)
    same = ddpkit.param_sha256(fresh) == ddpkit.param_sha256(model)
    if meta is None or meta["step"] != 1 or not same or len(fresh_opt.state) != len(opt.state):
        raise RuntimeError(f"checkpoint {path} did not restore the model and optimizer it saved")
    broadcast_object(ctx, None)  # nobody leaves while another rank still reads the file
    return f"saved and restored model + optimizer bit-identically ({path})"


def _skipped_collective(ctx, args) -> str:
    """Rank 0 issues an all-reduce that the others join only later; the watchdog must name it in time."""
    if not ctx.distributed:
        return "not applicable at world size 1 (no peer can skip a collective)"
    import torch
    import torch.distributed as dist

    from ddpkit.hang.watchdog import Watchdog

    group = dist.new_group(list(range(ctx.world_size)))
    # The ranks agree when to join rank 0's all-reduce through a host-only (gloo) group. Meeting in a
    # collective of another device communicator (the default group's barrier) while rank 0 holds an
    # unfinished all-reduce on `group` would order the two communicators differently across ranks:
    # on NCCL each rank's kernels can then wait for the other communicator's forever.
    host = dist.new_group(list(range(ctx.world_size)), backend="gloo")
    t = torch.ones(4, device=ctx.device)
    dist.all_reduce(t, group=group)  # every rank: NCCL connects a new group on its first collective
    fired: list[dict[str, Any]] = []
    dog = Watchdog(timeout_s=args.hang_timeout, rank=ctx.rank, world_size=ctx.world_size,
                   poll_s=0.1, on_hang=fired.append).start()
    start = time.monotonic()
    try:
        if ctx.rank == 0:
            work = dist.all_reduce(t, group=group, async_op=True)  # the others skip it, for now
            while not fired and time.monotonic() - start < 3 * args.hang_timeout + 5:
                time.sleep(0.05)
    finally:
        dog.stop()
    waited = time.monotonic() - start
    dist.barrier(group=host)
    if ctx.rank != 0:
        work = dist.all_reduce(t, group=group, async_op=True)  # the late join lets rank 0's finish
    work.wait()
    _sync(ctx)
    dist.destroy_process_group(group)
    dist.destroy_process_group(host)
    if ctx.rank != 0:
        return "joined rank 0's all-reduce late, as planned"
    if not fired:
        raise RuntimeError(f"the watchdog did not report an all-reduce left waiting for {waited:.1f} s "
                           f"(hang timeout {args.hang_timeout:g} s)")
    named = fired[0].get("unfinished") or fired[0].get("collective") or {}
    if named.get("op") != "all_reduce" or named.get("shapes") != [f"float32{list(t.shape)}"]:
        raise RuntimeError(f"the watchdog reported {named or fired[0].get('blocked_in')}, not the skipped all_reduce")
    if waited > args.hang_timeout + 3:
        raise RuntimeError(f"reported after {waited:.1f} s, hang timeout {args.hang_timeout:g} s")
    return f"reported after {waited:.1f} s (hang timeout {args.hang_timeout:g} s)"


_RUNS: dict[str, Callable] = {
    "rendezvous": _rendezvous, "all-reduce": _all_reduce, "DDP equivalence": _ddp, "batches to device": _batches,
    "mixed precision": _precision, "checkpoint round trip": _checkpoint, "skipped collective": _skipped_collective,
}


def _record(results: list, name: str, fn: Callable, *fn_args) -> None:
    start = time.monotonic()
    try:
        detail, ok = fn(*fn_args), True
    except Exception as e:
        detail, ok = " ".join(f"{type(e).__name__}: {e}".split())[:500], False
        traceback.print_exc()
    results.append({"name": name, "ok": ok, "detail": detail, "seconds": round(time.monotonic() - start, 3)})


def _write(out: Path, rank: int, result: dict) -> None:
    tmp = out / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out / f"rank-{rank}.json")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddpkit.selftest.checks")
    p.add_argument("--out", required=True, help="directory for rank-N.json")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--checkpoint-dir", default=None, help="where the checkpoint round trip writes (default OUT/checkpoint)")
    p.add_argument("--hang-timeout", type=float, default=2.0, help="the injected skipped collective's timeout")
    p.add_argument("--deadline", type=float, default=120.0, help="a rank still running after this many seconds exits")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    os.dup2(2, 1)  # the parent owns stdout (its table or JSON); anything a rank prints goes to stderr
    sys.stdout = sys.stderr
    import ddpkit

    out = Path(args.out)
    ctx = ddpkit.init(device=args.device, timeout_s=max(30.0, args.deadline))
    result: dict[str, Any] = {"rank": ctx.rank, "world_size": ctx.world_size, "device": str(ctx.device),
                              "backend": ctx.backend, "checks": []}
    watchdog = threading.Timer(args.deadline, lambda: (_write(out, ctx.rank, result), os._exit(3)))
    watchdog.daemon = True
    watchdog.start()
    for name in CHECKS:
        if name == "bus bandwidth":
            _record(result["checks"], name, _bandwidth, ctx, args, result)
        elif name == "teardown":
            _record(result["checks"], name, _teardown, ctx)
        else:
            _record(result["checks"], name, _RUNS[name], ctx, args)
    _write(out, ctx.rank, result)
    sys.stderr.flush()
    os._exit(0)  # the group is gone and the result written; skip torch's thread teardown at exit


def _teardown(ctx) -> str:
    import torch.distributed as dist

    start = time.monotonic()
    ctx.close()
    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("a process group is still initialised after close()")
    return f"process group closed on every rank in {time.monotonic() - start:.2f} s"


if __name__ == "__main__":
    sys.exit(main())
