"""GPU throughput of examples/charlm.py's model scaled up: tokens/s and MFU, bf16, eager vs compile,
ddpkit (world size 1) vs the same loop in plain PyTorch.

    python benchmarks/gpu_charlm.py                     # one GPU, about 3-4 minutes on an H200
    python benchmarks/gpu_charlm.py --device cpu --d-model 64 --layers 2 --heads 2 --seq-len 64 \\
        --batch-size 4 --steps 3 --warmup 1 --compile-backend aot_eager   # a smoke test on CPU

Four arms run one after another, each on a fresh model: plain/eager, ddpkit/eager, plain/compile,
ddpkit/compile. Data are random bytes in host memory. A step's clock covers fetching its batch and
the model step: the plain loop is the hand-written one (a DataLoader with pinned memory,
`.to(device, non_blocking=True)`), the ddpkit loop uses ddpkit.loader and ddpkit.wrap. At world
size 1 ddpkit.wrap adds no wrapper, so "x plain" measures what ddpkit's data path and wrapping cost
against the hand-written loop (were the batches fetched off the clock, the two arms would run the
same code and the ratio would be 1 by construction).

Model FLOPs per token (the PaLM paper's appendix B convention, as in nanoGPT's estimate_mfu, with
causal attention): 6 * N + 6 * layers * seq_len * d_model. N counts the parameters that take part in
matrix multiplies (every parameter but the learned position table, a lookup; the byte embedding
counts once, as the tied output head). The attention term is half of PaLM's 12 * L * T * d, which
counts the full T x T score matrix; a causal mask needs only its lower half (flash attention skips
the rest), so the full count would overstate MFU. MFU divides by the device's dense (no sparsity)
bf16 tensor-core peak. Prints a markdown table and writes benchmarks/results/gpu_charlm.json.

The FSDP arm shards the same model over several GPUs (ddpkit.wrap(strategy="fsdp"), bf16 through
FSDP's mixed precision): peak CUDA memory per rank (the largest rank's) and tokens/s of all ranks,
`--batch-size` sequences per rank:

    ddpkit run --nproc-per-node 8 benchmarks/gpu_charlm.py --strategy fsdp
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import ddpkit
from ddpkit.collectives import all_gather_object, broadcast_object

HERE = Path(__file__).resolve().parent
PEAK_BF16_TFLOPS = (
    ("H200 NVL", 835.0), ("H200", 989.0),
    ("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100", 989.0),
    ("A100", 312.0), ("L40S", 362.0), ("A10G", 125.0), ("L4", 121.0),
)
"""Dense bf16 tensor-core peaks (no sparsity; NVIDIA's datasheets print twice these, with sparsity), by a
substring of torch.cuda.get_device_name(), most specific first: the PCIe and NVL cards run lower clocks
than the SXM parts ("NVIDIA H100 80GB HBM3" and "NVIDIA H200" are SXM)."""


def peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by its name, or None when it is not in PEAK_BF16_TFLOPS."""
    return next((v for k, v in PEAK_BF16_TFLOPS if k in device_name), None)


def flops_per_token(*, matmul_params: int, layers: int, d_model: int, seq_len: int) -> int:
    """Training FLOPs per token, forward and backward, causal attention (see the module docstring)."""
    return 6 * matmul_params + 6 * layers * seq_len * d_model


def load_charlm():
    """examples/charlm.py as a module (it is a script, not a package)."""
    path = HERE.parent / "examples" / "charlm.py"
    if not path.is_file():
        raise SystemExit(f"{path} not found: this benchmark measures charlm's model (CharLM class)")
    spec = importlib.util.spec_from_file_location("charlm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=1024, help="transformer width")
    p.add_argument("--layers", type=int, default=12, help="transformer blocks")
    p.add_argument("--heads", type=int, default=16, help="attention heads")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step")
    p.add_argument("--steps", type=int, default=40, help="timed steps per arm")
    p.add_argument("--warmup", type=int, default=8, help="untimed steps per arm (compilation happens here)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--compile-backend", default="inductor", help="torch.compile backend ('' skips compile arms)")
    p.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak; default: by device name")
    p.add_argument("--time-limit", type=float, default=270.0,
                   help="skip the arms after the first that would start after this many seconds")
    p.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"],
                   help="fsdp: the sharded arm, on several ranks (ddpkit run --nproc-per-node N)")
    p.add_argument("--out", default=str(HERE / "results" / "gpu_charlm.json"))
    args = p.parse_args(argv)
    for name in ("d_model", "layers", "heads", "seq_len", "batch_size", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be 0 or more, got {args.warmup}")
    return args


def run_arm(charlm, args, ctx, *, use_ddpkit: bool, compile_backend: str) -> dict:
    torch.manual_seed(0)
    model = charlm.CharLM(d_model=args.d_model, layers=args.layers, heads=args.heads, seq_len=args.seq_len,
                          dropout=0.0)
    num_params = sum(p.numel() for p in model.parameters())
    matmul_params = num_params - model.pos.weight.numel()
    compile_opts = {"backend": compile_backend} if compile_backend else False
    if use_ddpkit and args.strategy == "fsdp":
        model = ddpkit.wrap(model, ctx, compile=compile_opts, strategy="fsdp", precision="bf16")
    elif use_ddpkit:
        model = ddpkit.wrap(model, ctx, compile=compile_opts)  # world size 1: no DDP wrapper, same model
    else:
        model = model.to(ctx.device)
        if compile_opts:
            model = torch.compile(model, **compile_opts)
    fused = ctx.device.type == "cuda" and args.strategy == "ddp"  # FSDP's DTensor shards: the foreach kernels
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=fused)
    n = args.batch_size * ctx.world_size * (args.warmup + args.steps)
    tokens = torch.randint(0, 256, (n, args.seq_len + 1), generator=torch.Generator().manual_seed(0))
    dataset = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    if use_ddpkit:
        batches = iter(ddpkit.loader(dataset, ctx, batch_size=args.batch_size, shuffle=False))
    else:
        cuda = ctx.device.type == "cuda"
        batches = ((x.to(ctx.device, non_blocking=cuda), y.to(ctx.device, non_blocking=cuda)) for x, y in
                   torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, pin_memory=cuda))
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, t_start = [], time.perf_counter()
    sync()
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        x, y = next(batches)
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = max(all_gather_object(ctx, statistics.median(times)))  # the slowest rank sets the pace
    tokens_per_s = args.batch_size * ctx.world_size * args.seq_len / step_s
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if ctx.device.type == "cuda" else None
    peak_mem = max(all_gather_object(ctx, peak_mem or 0.0)) if peak_mem is not None else None
    flops = flops_per_token(matmul_params=matmul_params, layers=args.layers, d_model=args.d_model,
                            seq_len=args.seq_len)
    return {
        "params_m": num_params / 1e6, "matmul_params": matmul_params, "flops_per_token": flops,
        "step_ms": 1000 * step_s, "tokens_per_s": tokens_per_s,
        "model_tflops": flops * tokens_per_s / 1e12, "arm_s": time.perf_counter() - t_start,
        "peak_mem_gb": peak_mem, "world_size": ctx.world_size,
        "final_loss": float(loss.detach()),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    charlm = load_charlm()
    started = time.perf_counter()
    with ddpkit.init(seed=0, device=args.device) as ctx:
        if args.strategy == "ddp" and ctx.world_size != 1:
            raise SystemExit("run gpu_charlm.py as one process (python benchmarks/gpu_charlm.py), not under ddpkit run; "
                             "only --strategy fsdp runs on several ranks")
        if args.strategy == "fsdp" and ctx.world_size < 2:
            raise SystemExit("--strategy fsdp shards over ranks: run it under ddpkit run --nproc-per-node N (N >= 2)")
        name = torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu"
        peak = args.peak_tflops or peak_tflops(name)
        torch.backends.cuda.matmul.allow_tf32 = True
        arms = [("plain PyTorch", False, ""), ("ddpkit", True, "")]
        if args.compile_backend:
            arms += [("plain PyTorch", False, args.compile_backend), ("ddpkit", True, args.compile_backend)]
        if args.strategy == "fsdp":
            label = f"ddpkit fsdp x{ctx.world_size}"
            arms = [(label, True, "")] + ([(label, True, args.compile_backend)] if args.compile_backend else [])
        results = []
        for label, use_ddpkit, backend in arms:
            late = bool(results) and time.perf_counter() - started > args.time_limit
            if broadcast_object(ctx, late):  # rank 0's clock decides for every rank
                print(f"skipped {label} compile={backend or 'no'}: past --time-limit", file=sys.stderr)
                continue
            r = run_arm(charlm, args, ctx, use_ddpkit=use_ddpkit, compile_backend=backend)
            r.update(arm=label, compile=backend or "no",
                     mfu=(r["model_tflops"] / (peak * ctx.world_size)) if peak else None)
            if ctx.is_main:
                print(json.dumps(r), file=sys.stderr, flush=True)
            results.append(r)
        if not ctx.is_main:
            return 0
    base = {r["compile"]: r for r in results if r["arm"] == "plain PyTorch"}
    lines = [f"\n{name}, bf16 autocast, {results[0]['params_m']:.3g} M params, batch {args.batch_size} x "
             f"seq {args.seq_len}\n",
             "| loop | compile | step ms (batch fetch included) | tokens/s | x plain (same compile) | model TFLOP/s "
             "| MFU | peak mem GB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        b = base.get(r["compile"])
        rel = f"{r['tokens_per_s'] / b['tokens_per_s']:.3f}" if b else "-"
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        mem = f"{r['peak_mem_gb']:.1f}" if r["peak_mem_gb"] is not None else "-"
        lines.append(f"| {r['arm']} | {r['compile']} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {rel} | "
                     f"{r['model_tflops']:.1f} | {mfu} | {mem} |")
    print("\n".join(lines))  # noqa: DDP008 (one process: main() refuses to run on several ranks)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"device": name, "peak_tflops": peak, "args": vars(args), "arms": results},
                                         indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
