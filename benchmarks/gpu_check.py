"""One command that checks on a real GPU what one GPU can show of ddpkit's CUDA/NCCL paths, then benchmarks charlm.

    python benchmarks/gpu_check.py                 # one GPU: under 4 minutes; writes benchmarks/results/gpu_check.json
    python benchmarks/gpu_check.py --skip selftest,charlm   # the items only

Runs `ddpkit test`, then one item per CUDA/NCCL behaviour, each in its own process (a crash or a
hang in one cannot take the others down), then benchmarks/gpu_charlm.py. Each item prints OK
(ddpkit behaves), BUG (the defect shows; the detail says how), ERROR (the item itself failed) or
"needs GPU" (on a machine without CUDA: reported, never silently skipped). The exit status is 1
when any item is BUG or ERROR.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
RESULT_TAG = "GPU_CHECK_RESULT "
VERDICTS = ("OK", "BUG", "ERROR", "needs GPU")


@dataclasses.dataclass(frozen=True)
class Item:
    name: str
    defect: str
    """What it checks, e.g. '1 hang forensics'."""
    needs_gpu: bool
    timeout_s: float = 60.0


def _cuda():
    import torch

    torch.cuda.set_device(0)
    return torch.device("cuda:0")


def _nccl_group(tmp: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp}/store-{time.monotonic_ns()}", rank=0, world_size=1,
                            device_id=torch.device("cuda:0"))


QUEUE_KERNELS = 256
"""The most kernels the busy-stream helper queues: CUDA holds about a thousand launches before the
host blocks at the next one, so seconds of work must come from few, long kernels."""


def busy_plan(kernel_s: float, seconds: float) -> int:
    """How many kernels of `kernel_s` seconds keep `seconds` of work queued; ValueError when that takes
    more than QUEUE_KERNELS (the host would block at launch and the work would not stay queued)."""
    count = max(1, math.ceil(seconds / kernel_s))
    if count > QUEUE_KERNELS:
        raise ValueError(f"{seconds:g} s of {kernel_s * 1e3:.2f} ms kernels is {count} launches, more than the "
                         f"{QUEUE_KERNELS} the launch queue takes without blocking; use longer kernels")
    return count


def _kernel_s(a, out) -> float:
    import torch

    for _ in range(2):
        torch.matmul(a, a, out=out)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(3):
        torch.matmul(a, a, out=out)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 3 / 1e3


def _busy_stream(seconds: float) -> dict[str, float]:
    """Queue `seconds` of work on the current stream, so what follows stays in flight that long.

    Square bf16 matmuls, doubled in size until one takes long enough that `seconds` of them fit in
    QUEUE_KERNELS launches (measured with CUDA events). Raises when the launches took the host
    more than half of `seconds` or the work had already finished: then nothing stayed queued, and
    a check built on it would measure nothing.
    """
    import torch

    size = 4096
    while True:
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(a)
        kernel_s = _kernel_s(a, out)
        if kernel_s * QUEUE_KERNELS >= 2 * seconds or size >= 32768:
            break
        size *= 2
    count = busy_plan(kernel_s, seconds)
    start = time.perf_counter()
    for _ in range(count):
        torch.matmul(a, a, out=out)
    launch_s = time.perf_counter() - start
    queued = torch.cuda.Event()
    queued.record()
    if launch_s > seconds / 2 or queued.query():
        raise RuntimeError(f"busy stream: {count} matmuls of {size}x{size} ({kernel_s * 1e3:.1f} ms each) took the "
                           f"host {launch_s:.2f} s to launch; {seconds:g} s of work did not stay queued")
    return {"kernels": count, "size": size, "kernel_ms": round(kernel_s * 1e3, 2), "launch_s": round(launch_s, 3)}


def _syncs(fn: Callable[[], Any]) -> int:
    """How many host-device syncs `fn` made, counted by torch's CUDA sync debug mode."""
    import torch

    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in seen)


def _gated() -> tuple[bool, str]:
    """Whether ddpkit uses torch's private names on this torch (torchinternals.READ_AGAINST), and why not."""
    from ddpkit.torchinternals import READ_AGAINST, torch_version

    if torch_version() in READ_AGAINST:
        return True, ""
    return False, f"torch {torch_version()} is outside ddpkit's READ_AGAINST ({READ_AGAINST}): its documented fallback"


def _toy(device):
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).to(device)


def item_nccl_group(tmp: str):
    """An NCCL group of world size 1; ddpkit's reductions stay on the GPU whatever the backend is called (14)."""
    import torch
    import torch.distributed as dist

    from ddpkit.collectives import all_reduce_sum
    from ddpkit.env import LaunchEnv
    from ddpkit.runtime import Context

    dev = _cuda()
    _nccl_group(tmp)
    t = torch.arange(4.0, device=dev)
    dist.all_reduce(t)
    places = {}
    for backend in ("nccl", "nccl2", "cpu:gloo,cuda:nccl"):
        ctx = Context(env=LaunchEnv(world_size=2, local_world_size=2), device=dev, backend=backend, seed=0)
        places[backend] = str(all_reduce_sum(ctx, 1.0).device)
    dist.destroy_process_group()
    ok = t.tolist() == [0.0, 1.0, 2.0, 3.0] and set(places.values()) == {"cuda:0"}
    return ("OK" if ok else "BUG"), f"all_reduce {t.tolist()}, all_reduce_sum on {places}", {"devices": places}


def item_hang_forensics(tmp: str):
    """A rank blocked at .item() behind an unfinished NCCL all-reduce: the watchdog names the all-reduce's line (1)."""
    import torch
    import torch.distributed as dist

    from ddpkit.hang.flightrecorder import enable, read_summary
    from ddpkit.hang.watchdog import Watchdog, describe

    _cuda()
    enable(tmp)
    _nccl_group(tmp)
    fired: list = []
    dog = Watchdog(timeout_s=1.0, rank=0, world_size=1, poll_s=0.1, on_hang=fired.append).start()
    busy = _busy_stream(4.0)
    t = torch.ones(4, device="cuda")
    line = inspect.currentframe().f_lineno + 1
    dist.all_reduce(t)  # returns at once: the kernel waits behind the matmuls
    t.sum().item()  # blocks ~4 s here, far from the collective
    dog.stop()
    recorder = read_summary()
    dist.destroy_process_group()
    if not fired:
        return "BUG", "the watchdog stayed silent while the rank waited 4 s for an unfinished all_reduce", {}
    report = fired[0]
    site = (report.get("unfinished") or {}).get("site", "")
    gated, why = _gated()
    # without the gate ddpkit does not read the recorder (documented): only the Python side is checked
    recorded = recorder is not None and recorder.get("entries", 0) > 0 if gated else True
    ok = site.endswith(f"gpu_check.py:{line}") and recorded
    return (("OK" if ok else "BUG"), describe(report) + (f" ({why})" if why else ""),
            {"report_line": describe(report), "flight_recorder": recorder, "busy_stream": busy})


def item_cpp_collective_hang(tmp: str):
    """A collective Python never issued (DDP's reducer, FSDP2) left unfinished: the watchdog names it from
    NCCL's flight recorder while the rank waits at .item() (issue 23, 2)."""
    import torch
    import torch.distributed as dist

    from ddpkit.hang.flightrecorder import enable
    from ddpkit.hang.watchdog import Watchdog, describe

    _cuda()
    enable(tmp)
    _nccl_group(tmp)
    gated, why = _gated()
    fired: list = []
    dog = Watchdog(timeout_s=1.0, rank=0, world_size=1, poll_s=0.1, on_hang=fired.append).start()
    busy = _busy_stream(4.0)
    t = torch.ones(4, device="cuda")
    dist.group.WORLD.allreduce([t])  # ProcessGroup's own method, as DDP's C++ reducer calls it: no tracer
    t.sum().item()  # blocks ~4 s behind the matmuls, outside any collective Python saw
    dog.stop()
    dist.destroy_process_group()
    if not gated:
        return "OK", f"not checked: {why} (the flight recorder is not read)", {"busy_stream": busy}
    if not fired:
        return "BUG", "the watchdog stayed silent for 4 s behind an unfinished all-reduce issued from C++", {}
    line = describe(fired[0])
    ok = "issued from C++" in line and "all_reduce" in line
    return ("OK" if ok else "BUG"), line, {"report_line": line, "busy_stream": busy}


def item_stop_flag(tmp: str):
    """The preemption stop flag agreed at a step end does not wait for the GPU's queued work (issue 23, 1)."""
    import torch

    from ddpkit.preemption import StopFlag

    dev = _cuda()
    _nccl_group(tmp)
    flag = StopFlag()
    flag.agree(distributed=True, device=dev)  # the first step end: starts the first all-reduce
    busy = _busy_stream(2.0)  # the next step's kernels, queued
    start = time.perf_counter()
    flag.agree(distributed=True, device=dev)  # reads the previous result, starts the next
    host_s = time.perf_counter() - start
    torch.cuda.synchronize()
    import torch.distributed as dist

    dist.destroy_process_group()
    ok = host_s < 0.5
    return (("OK" if ok else "BUG"), f"agree() held the host {host_s * 1e3:.0f} ms with 2 s of work queued",
            {"host_ms": round(host_s * 1e3, 1), "busy_stream": busy})


def item_abort(tmp: str):
    """Context.abort() with NCCL work in flight returns at once; destroy_process_group is timed for reference (2)."""
    import torch
    import torch.distributed as dist

    from ddpkit.env import LaunchEnv
    from ddpkit.runtime import Context

    dev = _cuda()
    times = {}
    for how in ("destroy_process_group", "Context.abort"):
        _nccl_group(tmp)
        _busy_stream(4.0)  # raises when the work could not stay queued: an ERROR, not a verdict
        dist.all_reduce(torch.ones(1 << 20, device=dev))  # in flight behind the matmuls
        start = time.perf_counter()
        if how == "Context.abort":
            Context(env=LaunchEnv(), device=dev, backend="nccl", seed=0).abort(RuntimeError("simulated failure"))
        else:
            dist.destroy_process_group()
        times[how] = round(time.perf_counter() - start, 3)
        torch.cuda.synchronize()
    ok = times["Context.abort"] < 1.0 and not dist.is_initialized()
    return ("OK" if ok else "BUG"), f"with ~4 s of work in flight: {times} s", {"seconds": times}


def item_cuda_dataset(tmp: str):
    """ddpkit.loader over a dataset already on the GPU, with and without pin_memory=False (3)."""
    import torch

    import ddpkit

    ctx = ddpkit.init(device="cuda")
    data = torch.utils.data.TensorDataset(torch.randn(64, 4, device="cuda"), torch.arange(64, device="cuda"))
    problems = []
    for kwargs in ({}, {"pin_memory": False}):
        try:
            for x, y in ddpkit.loader(data, ctx, batch_size=8, **kwargs):
                if x.device.type != "cuda":
                    problems.append(f"{kwargs}: batch on {x.device}")
                    break
        except Exception as e:
            problems.append(f"loader({kwargs}): {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    ctx.close()
    return ("BUG", "; ".join(problems), {}) if problems else ("OK", "CUDA-resident batches, pin_memory=False accepted", {})


@dataclasses.dataclass
class _Pair:
    x: Any
    y: Any


class _HasTo:
    def __init__(self, t):
        self.t = t

    def to(self, device, non_blocking=False):
        return _HasTo(self.t.to(device, non_blocking=non_blocking))


def item_custom_batches(tmp: str):
    """to_device moves dataclasses and objects with a .to() method (PyG Batch, HF BatchEncoding) (4)."""
    import torch

    import ddpkit
    from ddpkit.device import to_device

    dev = _cuda()
    moved = to_device({"pair": _Pair(torch.ones(2), torch.zeros(2)), "obj": _HasTo(torch.ones(3))}, dev)
    where = {"dataclass": str(moved["pair"].x.device), "to()": str(moved["obj"].t.device)}
    ok = set(where.values()) == {"cuda:0"}
    return ("OK" if ok else "BUG"), f"after to_device: {where}", {"devices": where}


def item_first_bucket(tmp: str):
    """ddpkit.wrap leaves DDP's bucket size unset unless passed, so DDP keeps its small first bucket (5)."""
    import torch
    import torch.distributed as dist

    import ddpkit
    from ddpkit.env import LaunchEnv
    from ddpkit.runtime import Context

    cuda = torch.cuda.is_available()
    dev = _cuda() if cuda else torch.device("cpu")
    if cuda:
        _nccl_group(tmp)
    else:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    # A context that says "distributed" so wrap builds DDP, over a real group of one rank.
    ctx = Context(env=LaunchEnv(world_size=2, local_world_size=2), device=dev, backend="nccl" if cuda else "gloo", seed=0)
    flags = {}
    for label, kwargs in (("default", {}), ("bucket_cap_mb=25 passed", {"bucket_cap_mb": 25})):
        model = ddpkit.wrap(_toy(dev), ctx, comm=None, **kwargs)
        flags[label] = bool(getattr(model, "bucket_bytes_cap_default", False))
    dist.destroy_process_group()
    ok = flags == {"default": True, "bucket_cap_mb=25 passed": False}
    return ("OK" if ok else "BUG"), f"DDP bucket_bytes_cap_default: {flags}", {"bucket_bytes_cap_default": flags}


def item_resume_syncs(tmp: str):
    """Training steps after load_checkpoint make no more host syncs than before it (Adam's step stays on the CPU) (6)."""
    import torch

    import ddpkit

    ctx = ddpkit.init(device="cuda")
    x = torch.randn(32, 64, device=ctx.device)

    def steps(model, opt, n=3):
        for _ in range(n):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    model = _toy(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps(model, opt)
    before = _syncs(lambda: steps(model, opt))
    ddpkit.save_checkpoint(ctx, Path(tmp) / "ckpt", step=6, model=model, optimizer=opt)
    fresh = _toy(ctx.device)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    ddpkit.load_checkpoint(ctx, Path(tmp) / "ckpt", model=fresh, optimizer=fresh_opt)
    after = _syncs(lambda: steps(fresh, fresh_opt))
    step_on = str(next(iter(fresh_opt.state.values()))["step"].device)
    ctx.close()
    ok = after <= before
    return (("OK" if ok else "BUG"), f"syncs in 3 steps: {before} before the resume, {after} after; Adam's step on "
            f"{step_on}", {"syncs_before": before, "syncs_after": after, "adam_step_device": step_on})


def item_bf16_choice(tmp: str):
    """Precision('auto') picks bf16 only where the GPU has it natively (not through emulation) (7)."""
    import torch

    import ddpkit

    ctx = ddpkit.init(device="cuda")
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    chosen = ddpkit.Precision(ctx, dtype="auto").dtype
    ctx.close()
    want = "bf16" if native else "fp16"
    return (("OK" if chosen == want else "BUG"), f"{torch.cuda.get_device_name()}: native bf16 {native}, auto chose "
            f"{chosen}", {"native_bf16": native, "auto": chosen})


def item_step_syncs(tmp: str):
    """Precision.step makes no host sync with a fused optimizer (the grad norm stays a tensor) (12)."""
    import torch

    import ddpkit

    ctx = ddpkit.init(device="cuda")
    counts = {}
    for fused in (True, False):
        model = _toy(ctx.device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
        prec = ddpkit.Precision(ctx, dtype="bf16")
        x = torch.randn(32, 64, device=ctx.device)

        def steps():
            for _ in range(3):
                with prec.autocast():
                    loss = model(x).square().mean()
                prec.backward(loss)
                prec.step(opt, model, max_grad_norm=1.0)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Precision's one-line advice for the unfused optimizer
            steps()
            counts["fused" if fused else "unfused"] = _syncs(steps)
    ctx.close()
    gated, why = _gated()
    # gated: the fused optimizer skips on the device (0 reads); otherwise the fallback reads the
    # flag once per step, as for an unfused optimizer: more than 3 in 3 steps is a defect either way
    ok = counts["fused"] == 0 if gated else counts["fused"] <= 3
    return (("OK" if ok else "BUG"), f"syncs in 3 Precision steps: {counts} (an unfused optimizer cannot skip an "
            f"inf step on the device: one flag read per step){'; ' + why if why else ''}", {"syncs": counts})


def item_profile(tmp: str):
    """Profiling on CUDA: no host sync per step (events read in batches), sane phases, overhead <= 1% (26)."""
    import dataclasses
    import statistics

    import torch
    import torch.distributed as dist

    import ddpkit
    from ddpkit.env import LaunchEnv
    from ddpkit.profile import PHASES, profiler_for, summarize
    from ddpkit.runtime import Context

    cuda = torch.cuda.is_available()
    dev = _cuda() if cuda else torch.device("cpu")
    if cuda:
        _nccl_group(tmp)
    else:  # the same code on CPU, to try the item without a GPU (ITEMS marks it needs_gpu)
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store-profile", rank=0, world_size=1)
    # A context that says "distributed" so wrap builds DDP (which profiling watches) over a real group of one rank.
    plain = Context(env=LaunchEnv(world_size=2, local_world_size=2), device=dev, backend="nccl" if cuda else "gloo",
                    seed=0)
    contexts = {"plain": plain, "profiled": dataclasses.replace(plain, profile=True, profiler=None, _at_close=[])}
    width, blocks, batch = (4096, 4, 1024) if cuda else (256, 2, 64)  # 3.3 TFLOP per step on the GPU
    g = torch.Generator().manual_seed(0)
    dataset = torch.utils.data.TensorDataset(torch.randn(batch * 2 * 8, width, generator=g))

    def forever(loader):
        while True:
            yield from loader

    arms = {}
    for name, ctx in contexts.items():
        torch.manual_seed(0)
        layers = [m for _ in range(blocks) for m in (torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                                     torch.nn.Linear(4 * width, width))]
        model = ddpkit.wrap(torch.nn.Sequential(*layers), ctx)
        arms[name] = {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=1e-4),
                      "prec": ddpkit.Precision(ctx, dtype="bf16" if cuda else "fp32"),
                      "data": forever(ddpkit.loader(dataset, ctx, batch_size=batch))}

    def step(arm):
        (x,) = next(arm["data"])
        with arm["prec"].autocast():
            loss = arm["model"](x).float().square().mean()
        arm["prec"].backward(loss)
        arm["prec"].step(arm["opt"], arm["model"])

    for _ in range(24):  # the profiled arm alone first: its figures must describe its own steps
        step(arms["profiled"])
    prof = profiler_for(contexts["profiled"])
    figures = prof.figures()
    report = summarize([figures])
    times: dict[str, list[float]] = {name: [] for name in arms}
    for t in range(40):
        for name in (("plain", "profiled") if t % 2 == 0 else ("profiled", "plain")):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            step(arms[name])
            if cuda:
                torch.cuda.synchronize()
            if t >= 8:
                times[name].append(time.perf_counter() - t0)
    syncs = ({name: _syncs(lambda arm=arm: [step(arm) for _ in range(20)]) for name, arm in arms.items()}
             if cuda else {})
    dist.destroy_process_group()
    row = report["ranks"][0]
    parts = sum(row[f"{p}_ms"] for p in PHASES)
    ratio = statistics.median(a / b for a, b in zip(times["profiled"], times["plain"]))
    sane = row["step_ms"] > 0 and all(row[f"{p}_ms"] >= 0 for p in PHASES) and 0.8 <= parts / row["step_ms"] <= 1.2
    ok = sane and syncs.get("profiled", 0) <= syncs.get("plain", 0) and ratio <= 1.01
    shares = ", ".join(f"{p} {row[f'{p}_ms'] / row['step_ms']:.0%}" for p in PHASES)
    return (("OK" if ok else "BUG"), f"step {row['step_ms']:.2f} ms ({shares}; parts sum to {parts:.2f} ms); host "
            f"syncs in 20 steps {syncs}; profiled/plain step {ratio:.4f} (median of paired steps)",
            {"report": report, "syncs": syncs, "ratio": ratio, "steps": figures["steps"]})


ITEMS = (
    Item("selftest", "ddpkit test", needs_gpu=False, timeout_s=150),
    Item("nccl_group", "14 NCCL group of world size 1", needs_gpu=True),
    Item("hang_forensics", "1 hang forensics on NCCL", needs_gpu=True),
    Item("cpp_collective_hang", "1b hang in a collective issued from C++", needs_gpu=True),
    Item("stop_flag", "15 stop flag without a host sync", needs_gpu=True),
    Item("abort", "2 abort with in-flight work", needs_gpu=True),
    Item("cuda_dataset", "3 CUDA-resident dataset", needs_gpu=True),
    Item("custom_batches", "4 custom batches to_device", needs_gpu=True),
    Item("first_bucket", "5 DDP first bucket", needs_gpu=False),
    Item("resume_syncs", "6 syncs after a resume", needs_gpu=True),
    Item("bf16_choice", "7 bf16 only where native", needs_gpu=True),
    Item("step_syncs", "12 syncs in Precision.step", needs_gpu=True),
    Item("profile", "26 step profile on CUDA", needs_gpu=True, timeout_s=120),
    Item("charlm", "charlm throughput / MFU", needs_gpu=True, timeout_s=200),
)


def _run_selftest(timeout_s: float) -> tuple[str, str, dict]:
    proc = subprocess.run([sys.executable, "-m", "ddpkit.cli", "test", "--format", "json"], capture_output=True,
                          text=True, timeout=timeout_s)
    report = json.loads(proc.stdout)
    failed = [c["name"] for c in report["checks"] if not c["ok"]]
    detail = (f"{report['world_size']} rank(s) on {report['device']}, link {report['link']}: "
              + ("all checks passed" if not failed else "failed: " + ", ".join(failed)))
    return ("OK" if proc.returncode == 0 and report["ok"] else "BUG"), detail, {"report": report}


def charlm_time_limit(elapsed_s: float, budget_s: float) -> float:
    """gpu_charlm.py's --time-limit: 90 s, less what the budget has left after the items (at least 10 s)."""
    return max(10.0, min(90.0, budget_s - elapsed_s - 45.0))


def _run_charlm(timeout_s: float, tmp: str, time_limit_s: float = 90.0) -> tuple[str, str, dict]:
    out = Path(tmp) / "gpu_charlm.json"
    proc = subprocess.run([sys.executable, str(HERE / "gpu_charlm.py"), "--steps", "20", "--warmup", "5",
                           "--time-limit", f"{time_limit_s:g}", "--out", str(out)], capture_output=True, text=True,
                          timeout=min(timeout_s, time_limit_s + 60))
    if proc.returncode != 0:
        return "ERROR", f"gpu_charlm.py exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}", {}
    data = json.loads(out.read_text())
    arms = data.get("arms", [])
    detail = "; ".join(f"{a.get('arm')} compile={a.get('compile')}: {a.get('tokens_per_s', 0):,.0f} tok/s, MFU "
                       + (f"{100 * a['mfu']:.1f}%" if a.get("mfu") is not None else "-") for a in arms)
    return "OK", detail, {"charlm": data, "table": proc.stdout.strip()}


def run_item(item: Item, *, has_gpu: bool, tmp: str, runner: Callable | None = None,
             charlm_limit_s: float = 90.0) -> dict[str, Any]:
    """Run one item (in a child process unless `runner` is given); never raises: failures become ERROR."""
    start = time.monotonic()
    result = {"item": item.name, "checks": item.defect}
    try:
        if item.needs_gpu and not has_gpu:
            verdict, detail, figures = "needs GPU", "no CUDA device on this machine: not run", {}
        elif runner is not None:
            verdict, detail, figures = runner(tmp)
        elif item.name == "selftest":
            verdict, detail, figures = _run_selftest(item.timeout_s)
        elif item.name == "charlm":
            verdict, detail, figures = _run_charlm(item.timeout_s, tmp, charlm_limit_s)
        else:
            verdict, detail, figures = _in_child(item, tmp)
    except subprocess.TimeoutExpired:
        verdict, detail, figures = "ERROR", f"timed out after {item.timeout_s:g} s", {}
    except Exception as e:
        verdict, detail, figures = "ERROR", " ".join(f"{type(e).__name__}: {e}".split())[:400], {}
    result.update(verdict=verdict, detail=detail, figures=figures, seconds=round(time.monotonic() - start, 2))
    return result


def _in_child(item: Item, tmp: str) -> tuple[str, str, dict]:
    proc = subprocess.run([sys.executable, __file__, "--item", item.name, "--tmp", tmp], capture_output=True, text=True,
                          timeout=item.timeout_s, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            verdict, detail, figures = json.loads(line[len(RESULT_TAG):])
            return verdict, detail, figures
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return "ERROR", f"item process exited {proc.returncode} without a result: {tail[:300]}", {}


def verdict_table(results: list[dict[str, Any]]) -> str:
    width = max(len(r["checks"]) for r in results)
    lines = [f"{'item'.ljust(width)}  verdict    detail"]
    lines += [f"{r['checks'].ljust(width)}  {r['verdict']:<9}  {r['detail']}" for r in results]
    counts = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
    lines.append("  ".join(f"{v}: {n}" for v, n in counts.items()))
    return "\n".join(lines)


def build_report(results: list[dict[str, Any]], *, device: str, torch_version: str) -> dict[str, Any]:
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "device": device,
            "torch": torch_version, "items": results,
            "summary": {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(HERE / "results" / "gpu_check.json"), help="JSON file written at the end")
    p.add_argument("--skip", default="", help="comma-separated item names to leave out, e.g. selftest,charlm")
    p.add_argument("--budget", type=float, default=225.0,
                   help="seconds for the whole run; charlm gets what the other items leave (up to 90 s)")
    p.add_argument("--item", default=None, help=argparse.SUPPRESS)  # one item, in this (child) process
    p.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.item is not None:
        fn = globals()[f"item_{args.item}"]
        print(RESULT_TAG + json.dumps(list(fn(args.tmp))), flush=True)
        os._exit(0)  # NCCL and CUDA threads need no teardown: the result is out
    names = {i.name for i in ITEMS}
    skip = {s for s in args.skip.split(",") if s}
    if skip - names:
        p.error(f"--skip {','.join(sorted(skip - names))}: unknown item(s); known: {', '.join(i.name for i in ITEMS)}")
    import torch

    has_gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if has_gpu else "cpu (no CUDA device)"
    results = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddpkit-gpu-check-") as tmp:
        for item in ITEMS:
            if item.name in skip:
                continue
            limit = charlm_time_limit(time.monotonic() - started, args.budget)
            results.append(run_item(item, has_gpu=has_gpu, tmp=tmp, charlm_limit_s=limit))
            print(f"{results[-1]['verdict']:<9} {item.defect}: {results[-1]['detail']}", flush=True)
    report = build_report(results, device=device, torch_version=torch.__version__)
    print("\n" + verdict_table(results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out}")
    return 1 if report["summary"]["BUG"] or report["summary"]["ERROR"] else 0


if __name__ == "__main__":
    sys.exit(main())
