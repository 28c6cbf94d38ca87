"""Train a small character-level transformer on the Python standard library's own source, on one device.

Plain PyTorch, no ddpkit: the single-device script `ddpkit port` starts from.

    python examples/plain/charlm.py
    ddpkit port examples/plain/charlm.py -o charlm_ddp.py    # the same script, ported to ddpkit

The text is this interpreter's own stdlib *.py files (no download), every tenth file held out for
validation, read as bytes. bf16 autocast, clipping, warmup + cosine learning rate, validation bits per
character over the whole held-out split. Prints one JSON line at the end: val_bpc, steps.
"""

import argparse
import json
import math
import sysconfig
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

VOCAB = 256


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d-model", type=int, default=128, help="transformer width")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads (must divide --d-model)")
    p.add_argument("--seq-len", type=int, default=128, help="characters per training sequence")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per optimizer step")
    p.add_argument("--max-steps", type=int, default=300, help="optimizer steps to train")
    p.add_argument("--lr", type=float, default=2e-3, help="peak AdamW learning rate")
    p.add_argument("--warmup-steps", type=int, default=30, help="linear warmup steps before the cosine decay")
    p.add_argument("--data-bytes", type=int, default=3_000_000, help="training text size in bytes")
    p.add_argument("--val-bytes", type=int, default=120_000, help="held-out text size in bytes")
    p.add_argument("--eval-every", type=int, default=100, help="validate every N optimizer steps")
    p.add_argument("--seed", type=int, default=0, help="seed of model init and data order")
    return p.parse_args()


def stdlib_text(train_bytes, val_bytes):
    """(train, val) bytes from the stdlib's *.py files; every tenth file (by sorted path) is held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idlelib"}
    files = sorted((p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts)),
                   key=lambda p: p.relative_to(root).as_posix())
    train, val = [], []
    for i, path in enumerate(files):
        (val if i % 10 == 9 else train).append(path.read_bytes() + b"\n")
        if sum(map(len, train)) >= train_bytes and sum(map(len, val)) >= val_bytes:
            break
    return b"".join(train)[:train_bytes], b"".join(val)[:val_bytes]


class Chunks(Dataset):
    """Non-overlapping (input, next-character target) windows of `seq_len` bytes."""

    def __init__(self, text, seq_len):
        self.data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
        self.seq_len = seq_len

    def __len__(self):
        return (len(self.data) - 1) // self.seq_len

    def __getitem__(self, i):
        window = self.data[i * self.seq_len:(i + 1) * self.seq_len + 1]
        return window[:-1], window[1:]


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(c, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class CharLM(nn.Module):
    def __init__(self, d_model, layers, heads, seq_len):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def evaluate(model, val_loader, device):
    model.eval()
    nll, count = 0.0, 0
    with torch.no_grad():
        for x, y in val_loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                logits = model(x)
            nll += F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1), reduction="sum").item()
            count += y.numel()
    model.train()
    return nll / count / math.log(2)


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    train_text, val_text = stdlib_text(args.data_bytes, args.val_bytes)
    train_loader = DataLoader(Chunks(train_text, args.seq_len), batch_size=args.batch_size, shuffle=True,
                              drop_last=True)
    val_loader = DataLoader(Chunks(val_text, args.seq_len), batch_size=64)
    model = CharLM(args.d_model, args.layers, args.heads, args.seq_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    def lr_lambda(step):
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    step = 0
    val_bpc = evaluate(model, val_loader, device)
    print(f"step 0: val_bpc {val_bpc:.3f}")
    while step < args.max_steps:
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().view(-1, VOCAB), y.view(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            if step % args.eval_every == 0 or step == args.max_steps:
                val_bpc = evaluate(model, val_loader, device)
                print(f"step {step}: loss {loss.item():.3f} val_bpc {val_bpc:.3f}")
            if step == args.max_steps:
                break
    print(json.dumps({"val_bpc": val_bpc, "steps": step}))


if __name__ == "__main__":
    main()
