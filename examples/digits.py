"""Train a small CNN on scikit-learn's bundled 8x8 digits images with ddpkit (real data, no download).

    python examples/digits.py                               # one process (world size 1)
    ddpkit run --nproc-per-node 2 examples/digits.py        # every rank of this machine
    ddpkit run --max-restarts 3 examples/digits.py --checkpoint-dir ckpt   # survive crashes, resume
    ddpkit run examples/digits.py --tensorboard             # also log to TensorBoard (runs/digits/tensorboard)

SIGTERM or SIGUSR1 (a preemption notice) to `ddpkit run` or to any rank: every rank stops at the same
step, a checkpoint of that step is saved (with --checkpoint-dir), and the process exits with
128 + the signal's number (143, 138); rerunning the same command resumes from it.

Prints one JSON line at the end (rank 0): test_accuracy, test_loss, world_size, epochs, seconds,
param_sha256, ... The global batch is fixed (--global-batch-size), so the number of ranks changes
only the speed, not the samples each optimizer step sees.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn

import ddpkit
from ddpkit.metrics.log import MetricsLog, ProgressBar
from ddpkit.metrics.plot import finish_run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=25, help="passes over the training set")
    p.add_argument("--global-batch-size", type=int, default=64, help="samples per optimizer step, all ranks together")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of model init, data order and split")
    p.add_argument("--run-dir", default="runs/digits", help="where metrics.jsonl and plots go ('' for none)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to train")
    p.add_argument("--checkpoint-dir", default="",
                   help="save checkpoints here and resume from the newest valid one at start ('' for none)")
    p.add_argument("--save-every", type=int, default=0,
                   help="optimizer steps between checkpoints (0: at the end of every epoch)")
    p.add_argument("--tensorboard", action="store_true",
                   help="also write the metrics as TensorBoard scalars under RUN_DIR/tensorboard")
    return p.parse_args(argv)


def digits_datasets(seed: int) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    """1797 real 8x8 grey images of handwritten digits, split 80/20 stratified, scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)

    def as_dataset(xs, ys):
        images = torch.tensor(xs, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        return torch.utils.data.TensorDataset(images, torch.tensor(ys, dtype=torch.long))

    return as_dataset(x_train, y_train), as_dataset(x_test, y_test)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10),
    )


def evaluate(model: nn.Module, data, ctx: ddpkit.Context) -> dict[str, float]:
    """Exact accuracy and mean loss over the whole test set: sums and counts reduced across ranks."""
    net = ddpkit.unwrap(model).eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for x, y in data:
            logits = net(x)
            loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
            count += len(y)
    net.train()
    means = ddpkit.reduce_means(ctx, {"loss": loss_sum, "accuracy": correct}, count)
    return {"test_loss": means["loss"], "test_accuracy": means["accuracy"]}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.save_every < 0:
        raise ValueError(f"--save-every {args.save_every} must be >= 0 (0 saves at the end of every epoch)")
    with ddpkit.init(seed=args.seed, device=args.device) as ctx:
        start = time.perf_counter()
        train_set, test_set = digits_datasets(args.seed)
        if args.global_batch_size % ctx.world_size:
            raise ValueError(
                f"--global-batch-size {args.global_batch_size} is not divisible by world size {ctx.world_size}; "
                "pick a multiple of the number of ranks"
            )
        train = ddpkit.loader(train_set, ctx, batch_size=args.global_batch_size // ctx.world_size)
        test = ddpkit.eval_loader(test_set, ctx, batch_size=256)
        torch.manual_seed(args.seed)  # same initial weights for every world size (DDP also broadcasts rank 0's)
        model = ddpkit.wrap(make_model(), ctx)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * train.steps_per_epoch)
        step, first_epoch, resumed_from = 0, 0, None
        if args.checkpoint_dir:  # resume if a checkpoint exists; None on a fresh start
            ckpt = ddpkit.load_checkpoint(ctx, args.checkpoint_dir, model=model, optimizer=opt, scheduler=sched,
                                          loader=train)
            if ckpt is not None:
                step = resumed_from = ckpt["step"]
                first_epoch = train.state_dict()["epoch"]  # mid-epoch: the loop continues inside it
        # A resumed run continues its log; a fresh one moves an old log aside (kept, not mixed in).
        trackers = ("tensorboard",) if args.tensorboard else ()
        log = (MetricsLog(args.run_dir, ctx, resume=resumed_from is not None, trackers=trackers)
               if args.run_dir else None)
        total_steps = args.epochs * train.steps_per_epoch
        save_every = args.save_every or train.steps_per_epoch
        metrics, saved = None, step
        with ProgressBar(ctx, total=total_steps - step, desc="digits") as bar:
            for epoch in range(first_epoch, args.epochs):
                for x, y in train:
                    loss = nn.functional.cross_entropy(model(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    sched.step()
                    step += 1
                    bar.update(samples=train.global_batch_size, loss=loss)
                    if args.checkpoint_dir and (step % save_every == 0 or step == total_steps):
                        ddpkit.save_checkpoint(ctx, args.checkpoint_dir, step=step, model=model, optimizer=opt,
                                               scheduler=sched, loader=train)
                        saved = step
                if ctx.should_stop():  # a preemption notice: every rank is here after the same step
                    if args.checkpoint_dir and saved != step:
                        ddpkit.save_checkpoint(ctx, args.checkpoint_dir, step=step, model=model, optimizer=opt,
                                               scheduler=sched, loader=train)
                    break
                metrics = evaluate(model, test, ctx)
                train_loss = ddpkit.reduce_mean(ctx, loss.detach() * len(y), len(y))
                if log is not None:
                    log.log(step=step, epoch=epoch, loss=train_loss, lr=sched.get_last_lr()[0],
                            samples_per_s=bar.samples_per_s, **metrics)
        if ctx.stop_signal is not None:
            stopped = {"stopped_by_signal": ctx.stop_signal, "steps": step, "checkpoint_dir": args.checkpoint_dir}
            finish_run(ctx, stopped, log, plot=False)
            return stopped
        if metrics is None:  # resumed from the final checkpoint: nothing left to train
            metrics = evaluate(model, test, ctx)
        result = {
            **metrics,
            "world_size": ctx.world_size,
            "epochs": args.epochs,
            "global_batch_size": train.global_batch_size,
            "steps": step,
            "seconds": round(time.perf_counter() - start, 2),
            "param_sha256": ddpkit.param_sha256(model),
        }
        if args.checkpoint_dir:
            result["resumed_from_step"] = resumed_from
        finish_run(ctx, result, log)
    return result


if __name__ == "__main__":
    outcome = main()
    if "stopped_by_signal" in outcome:
        sys.exit(128 + outcome["stopped_by_signal"])  # like a process the signal ended; rerun to resume
