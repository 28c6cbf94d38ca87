"""The digits job (examples/digits.py) on Ray Train: TorchTrainer starts the workers and their process
group, ddpkit runs unchanged inside the training function, and its checkpoints travel through Ray's.

    pip install 'ddpkit[ray,examples]'
    python examples/ray_digits.py --num-workers 2                       # a local Ray cluster, CPU workers
    python examples/ray_digits.py --address auto --num-workers 8 --use-gpu --storage-path /shared/ray
    python examples/ray_digits.py --max-failures 3 --fail-once-after-epoch 5   # Ray restarts, ddpkit resumes

Each epoch every worker calls `ray.train.report` with the test metrics, and rank 0 hands the
checkpoint ddpkit just wrote to Ray, which copies it to `--storage-path/--name`. When a worker or a
node fails, Ray restarts the whole worker group (up to --max-failures times) and the training
function resumes from that checkpoint: the same step, data position, optimizer and generator states.
Running the same command again (same --name and --storage-path) after the job stopped resumes too.
Prints one JSON line at the end: rank 0's last report (test_accuracy, param_sha256, ...).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ddpkit
from digits import digits_datasets, evaluate, make_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-workers", type=int, default=2, help="Ray Train workers (ranks)")
    p.add_argument("--use-gpu", action="store_true", help="one GPU per worker (nccl); default CPU workers (gloo)")
    p.add_argument("--address", default=None,
                   help="Ray cluster to join ('auto' for a running one); default: start a local one")
    p.add_argument("--storage-path", default=str(Path("runs/ray").resolve()),
                   help="where Ray keeps checkpoints and results (shared or cloud storage on several nodes)")
    p.add_argument("--name", default="digits", help="the run's name; the same name and storage path resume")
    p.add_argument("--max-failures", type=int, default=0, help="restarts of the worker group Ray may do")
    p.add_argument("--fail-once-after-epoch", type=int, default=None,
                   help="simulate a failure: raise after this epoch's checkpoint, in a run started from scratch")
    p.add_argument("--epochs", type=int, default=25, help="passes over the training set")
    p.add_argument("--global-batch-size", type=int, default=64, help="samples per optimizer step, all ranks together")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of model init, data order and split")
    return p.parse_args(argv)


def train_digits(config: dict[str, Any]) -> None:
    """Ray Train's training function: runs on every worker, after Ray created the process group."""
    import ray.train

    seed, epochs = config["seed"], config["epochs"]
    # ddpkit.init adopts Ray's process group: rank, world size and device come from it
    with ddpkit.init(seed=seed) as ctx:
        train_set, test_set = digits_datasets(seed)
        train = ddpkit.loader(train_set, ctx, batch_size=config["global_batch_size"] // ctx.world_size)
        test = ddpkit.eval_loader(test_set, ctx, batch_size=256)
        torch.manual_seed(seed)  # same initial weights for every world size
        model = ddpkit.wrap(make_model(), ctx)
        opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs * train.steps_per_epoch)
        step, first_epoch, resumed_from = 0, 0, None
        restored = ray.train.get_checkpoint()  # the newest checkpoint Ray holds for this run, or None
        if restored is not None:
            # as_directory gives every worker of a node the same local path, which load_checkpoint needs
            with restored.as_directory() as directory:
                step = resumed_from = ddpkit.load_checkpoint(ctx, directory, model=model, optimizer=opt,
                                                             scheduler=sched, loader=train)["step"]
            first_epoch = train.state_dict()["epoch"]
        for epoch in range(first_epoch, epochs):
            for x, y in train:
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
                step += 1
            metrics = {**evaluate(model, test, ctx), "epoch": epoch, "step": step,
                       "loss": ddpkit.reduce_mean(ctx, loss.detach() * len(y), len(y)),
                       "world_size": ctx.world_size, "resumed_from_step": resumed_from}
            if epoch == epochs - 1:
                metrics["param_sha256"] = ddpkit.param_sha256(model)
            with tempfile.TemporaryDirectory() as directory:
                # every rank takes part in the save; rank 0 writes the file and gives it to Ray, which
                # copies it to the run's storage before report returns
                ddpkit.save_checkpoint(ctx, directory, step=step, model=model, optimizer=opt, scheduler=sched,
                                       loader=train, keep_last=1)
                checkpoint = ray.train.Checkpoint.from_directory(directory) if ctx.is_main else None
                ray.train.report(metrics, checkpoint=checkpoint)
            if epoch == config["fail_once_after_epoch"] and restored is None:
                raise RuntimeError(f"simulated failure after epoch {epoch} (--fail-once-after-epoch)")


def fit(args: argparse.Namespace) -> Any:
    """Run the job on the Ray cluster this process is connected to; returns Ray's Result."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    config = {k: getattr(args, k) for k in ("seed", "epochs", "global_batch_size", "lr", "fail_once_after_epoch")}
    trainer = TorchTrainer(
        train_digits,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=RunConfig(name=args.name, storage_path=args.storage_path,
                             failure_config=FailureConfig(max_failures=args.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    return trainer.fit()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import ray

    args = parse_args(argv)
    if not ray.is_initialized():
        # the workers import this file's directory (digits.py) from Ray's copy of it
        ray.init(address=args.address, runtime_env={"working_dir": str(Path(__file__).parent)})
    result = fit(args)
    metrics = dict(result.metrics)
    print(json.dumps(metrics), flush=True)
    return metrics


if __name__ == "__main__":
    main()
