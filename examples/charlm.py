"""Train a small character-level transformer on the Python standard library's own source with ddpkit.

    python examples/charlm.py                                  # one process (world size 1)
    ddpkit run --nproc-per-node 2 examples/charlm.py           # every rank of this machine
    ddpkit run examples/charlm.py --d-model 512 --layers 8 --heads 8 --seq-len 512 \\
        --global-batch-size 256 --max-steps 2000 --compile      # a GPU machine

The text is this interpreter's own stdlib *.py files (no download): sorted by path, every tenth
file held out for validation, read as bytes (a 256-symbol vocabulary; the sources are nearly all
ASCII, so a byte is a character). The loop uses everything a real job needs: mixed
precision (ddpkit.Precision, 'auto': bf16 where the hardware computes it natively, else fp16 on older
GPUs and fp32 on CPUs without AVX512_BF16/AMX), gradient accumulation without extra all-reduces (ddpkit.accumulate),
clipping by global norm, warmup + cosine learning rate, and exact validation bits per character
over the whole held-out split (ddpkit.eval_loader + reduce_means). Prints one JSON line at the end
(rank 0): val_bpc, val_bpc_start, world_size, steps, seconds, param_sha256, ...
The corpus differs between Python versions; `data_sha256` in the result names the one used.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sysconfig
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import ddpkit
from ddpkit.collectives import all_gather_object
from ddpkit.parallel.strategy import is_sharded
from ddpkit.metrics.log import MetricsLog, ProgressBar
from ddpkit.metrics.plot import finish_run

VOCAB = 256


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a = p.add_argument
    a("--d-model", type=int, default=128, help="transformer width")
    a("--layers", type=int, default=4, help="transformer blocks")
    a("--heads", type=int, default=4, help="attention heads (must divide --d-model)")
    a("--seq-len", type=int, default=128, help="characters per training sequence (the context length)")
    a("--dropout", type=float, default=0.0, help="dropout probability")
    a("--global-batch-size", type=int, default=32, help="sequences per optimizer step, all ranks together")
    a("--accumulation-steps", type=int, default=2, help="micro-steps per optimizer step on each rank")
    a("--max-steps", type=int, default=300, help="optimizer steps to train")
    a("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    a("--min-lr-ratio", type=float, default=0.1, help="final learning rate as a fraction of --lr")
    a("--warmup-steps", type=int, default=30, help="linear warmup steps before the cosine decay")
    a("--weight-decay", type=float, default=0.1, help="AdamW weight decay (matrices only)")
    a("--max-grad-norm", type=float, default=1.0, help="clip the global gradient norm to this (0: off)")
    a("--precision", default="auto", choices=["bf16", "fp16", "fp32", "auto"],
      help="autocast dtype; auto: bf16 where the hardware has it natively, else fp16 (GPU) or fp32 (CPU)")
    a("--compile", action="store_true", help="torch.compile the DDP model")
    a("--strategy", default="ddp", choices=["ddp", "fsdp"],
      help="ddp: every rank holds the model; fsdp: parameters, gradients and optimizer state sharded (not with fp16)")
    a("--data-bytes", type=int, default=3_000_000, help="training text size in bytes (stdlib prefix)")
    a("--val-bytes", type=int, default=120_000, help="held-out text size in bytes")
    a("--eval-every", type=int, default=100, help="validate every N optimizer steps (and at start and end)")
    a("--eval-batch-size", type=int, default=64, help="sequences per validation batch on each rank")
    a("--log-every", type=int, default=10, help="log train loss every N optimizer steps")
    a("--seed", type=int, default=0, help="seed of model init and data order")
    a("--run-dir", default="runs/charlm", help="where metrics.jsonl and plots go ('' for none)")
    a("--tensorboard", action="store_true", help="also write the metrics as TensorBoard scalars under RUN_DIR/tensorboard")
    a("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to train")
    return p.parse_args(argv)


def stdlib_text(train_bytes: int, val_bytes: int) -> tuple[bytes, bytes]:
    """(train, val) bytes from the stdlib's *.py files; every tenth file (by sorted path) is held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib"}
    files = sorted(
        (p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts)),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    train, val, sizes = [], [], [0, 0]
    for i, path in enumerate(files):
        part, which, cap = (val, 1, val_bytes) if i % 10 == 9 else (train, 0, train_bytes)
        if sizes[which] >= cap:
            if sizes[0] >= train_bytes and sizes[1] >= val_bytes:
                break
            continue
        text = path.read_bytes() + b"\n"
        part.append(text)
        sizes[which] += len(text)
    train_text, val_text = b"".join(train)[:train_bytes], b"".join(val)[:val_bytes]
    if len(train_text) < train_bytes // 2 or not val_text:
        raise ValueError(f"the stdlib at {root} holds too little source for --data-bytes {train_bytes}; lower it")
    return train_text, val_text


class Chunks(torch.utils.data.Dataset):
    """Non-overlapping (input, next-character target) windows of `seq_len` bytes."""

    def __init__(self, text: bytes, seq_len: int):
        self.data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq_len

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len
        window = self.data[start:start + self.seq_len + 1]
        return window[:-1], window[1:]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP, each on a residual."""

    def __init__(self, d_model: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.ln2(x)))


class CharLM(nn.Module):
    """Byte embeddings + learned positions -> blocks -> logits over 256 bytes (output tied to input)."""

    def __init__(self, *, d_model: int, layers: int, heads: int, seq_len: int, dropout: float):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        self.head.weight = self.tok.weight
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def warmup_cosine(step: int, *, warmup: int, total: int, min_ratio: float) -> float:
    """Learning-rate multiplier: linear 0 -> 1 over `warmup` steps, then cosine 1 -> min_ratio."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def evaluate(model: nn.Module, data, ctx: ddpkit.Context, prec: ddpkit.Precision) -> dict[str, float]:
    """Exact validation loss over every held-out character: per-rank sums, one all-reduce."""
    net = ddpkit.unwrap(model).eval()
    nll, count = 0.0, 0
    # A sharded model all-gathers in every forward, so every rank must run as many as the others:
    # unpadded eval shards can differ by a batch, and the shorter ones run empty batches to match.
    extra = max(all_gather_object(ctx, len(data))) - len(data) if is_sharded(model) else 0
    with torch.no_grad():
        for x, y in data:
            with prec.autocast():
                logits = net(x)
            nll += F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1), reduction="sum").item()
            count += y.numel()
        for _ in range(extra):  # an empty batch of the last one's shape (eval shards differ by one batch at most)
            with prec.autocast():
                net(x[:0])
    net.train()
    loss = ddpkit.reduce_means(ctx, {"nll": nll}, count)["nll"]  # collective, after the loop
    return {"val_loss": loss, "val_bpc": loss / math.log(2)}


def make_optimizer(model: nn.Module, args: argparse.Namespace) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.d_model % args.heads:
        raise ValueError(f"--heads {args.heads} must divide --d-model {args.d_model}; e.g. --heads 4")
    if args.strategy == "fsdp" and args.precision == "fp16":
        raise ValueError("--strategy fsdp does not work with --precision fp16 (loss scaling); use bf16 or fp32")
    with ddpkit.init(seed=args.seed, device=args.device) as ctx:
        start = time.perf_counter()
        per_step = ctx.world_size * args.accumulation_steps
        if args.global_batch_size % per_step:
            raise ValueError(
                f"--global-batch-size {args.global_batch_size} is not divisible by world size {ctx.world_size} "
                f"x --accumulation-steps {args.accumulation_steps}; pick a multiple of {per_step}"
            )
        train_text, val_text = stdlib_text(args.data_bytes, args.val_bytes)
        train = ddpkit.loader(Chunks(train_text, args.seq_len), ctx, batch_size=args.global_batch_size // per_step,
                              accumulation_steps=args.accumulation_steps)
        val = ddpkit.eval_loader(Chunks(val_text, args.seq_len), ctx, batch_size=args.eval_batch_size)
        torch.manual_seed(args.seed)  # same initial weights for every world size (DDP also broadcasts rank 0's)
        net = CharLM(d_model=args.d_model, layers=args.layers, heads=args.heads, seq_len=args.seq_len,
                     dropout=args.dropout)
        prec = ddpkit.Precision(ctx, dtype=args.precision)
        model = ddpkit.wrap(net, ctx, compile=args.compile, strategy=args.strategy,
                            **({"precision": prec} if args.strategy == "fsdp" else {}))
        opt = make_optimizer(model, args)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(
            s, warmup=args.warmup_steps, total=args.max_steps, min_ratio=args.min_lr_ratio))
        trackers = ("tensorboard",) if args.tensorboard else ()
        log = MetricsLog(args.run_dir, ctx, trackers=trackers) if args.run_dir else None
        first = evaluate(model, val, ctx, prec)
        if log is not None:
            log.log(step=0, **first)
        metrics, step, tokens_per_step = first, 0, train.global_batch_size * args.seq_len
        loss_sum, loss_count = torch.zeros((), dtype=torch.float64, device=ctx.device), 0
        max_norm = args.max_grad_norm or None
        with ProgressBar(ctx, total=args.max_steps, desc="charlm") as bar:
            while step < args.max_steps:
                for x, y in train:
                    with ddpkit.accumulate(model, sync=train.step_end):
                        with prec.autocast():
                            logits = model(x)
                        loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
                        prec.backward(loss / train.accumulation_steps)
                    loss_sum += loss.detach() * y.numel()
                    loss_count += y.numel()
                    if not train.step_end:
                        continue
                    info = prec.step(opt, model, max_grad_norm=max_norm)
                    sched.step()
                    step += 1
                    bar.update(samples=train.global_batch_size, loss=loss)
                    if step % args.log_every == 0 or step == args.max_steps:
                        # Every rank's characters since the last log, not rank 0's alone (collective).
                        train_loss = ddpkit.reduce_mean(ctx, loss_sum, loss_count)
                        loss_sum.zero_()
                        loss_count = 0
                        if log is not None:
                            rate = bar.samples_per_s
                            log.log(step=step, loss=train_loss, train_bpc=train_loss / math.log(2),
                                    lr=sched.get_last_lr()[0], skipped_steps=prec.skipped_steps,
                                    tokens_per_s=None if rate is None else rate * args.seq_len, **info.as_dict())
                    if step % args.eval_every == 0 or step == args.max_steps:
                        metrics = evaluate(model, val, ctx, prec)
                        if log is not None:
                            log.log(step=step, **metrics)
                    if step == args.max_steps:
                        break
        seconds = time.perf_counter() - start
        result = {
            **metrics,
            "val_bpc_start": first["val_bpc"],
            "world_size": ctx.world_size,
            "steps": step,
            "global_batch_size": train.global_batch_size,
            "tokens_per_step": tokens_per_step,
            "precision": prec.dtype,
            "optimizer": type(opt).__name__,
            "strategy": args.strategy,
            "skipped_steps": prec.skipped_steps,
            "num_params": sum(p.numel() for p in net.parameters()),
            "train_bytes": len(train_text),
            "val_chars": len(Chunks(val_text, args.seq_len)) * args.seq_len,
            "data_sha256": hashlib.sha256(train_text + val_text).hexdigest()[:16],
            "seconds": round(seconds, 2),
            "tokens_per_s": round(step * tokens_per_step / seconds, 1),
            "param_sha256": ddpkit.param_sha256(model),
        }
        finish_run(ctx, result, log)
    return result


if __name__ == "__main__":
    main()
