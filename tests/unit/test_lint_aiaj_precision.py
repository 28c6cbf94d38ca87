"""Findings the program itself answers, seen on the AI+AJ set: a verbosity setting only rank 0 keeps, lines that
show no figure, ... each beside a twin that is still reported."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _found(files: dict[str, str]) -> set[tuple[str, str, str]]:
    """(path, stripped line, rule) of every finding."""
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, sources[f.path].splitlines()[f.line - 1].strip(), f.rule) for f in lint_sources(sources)}


_VERBOSE_TRAINER = """
    import logging
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Trainer:
        def __init__(self, params):
            self.verb = params["verb"]
            self.model = DDP(torch.nn.Linear(4, 1).cuda())

        def train(self, epochs):
            for epoch in range(epochs):
                loss = self.model(torch.randn(8, 4).cuda()).sum()
                loss.backward()
                if self.verb:
                    logging.info("epoch %d done", epoch)
"""

_VERBOSE_MAIN = """
    import argparse
    import logging
    import os
    import torch
    import torch.distributed as dist
    from trainer import Trainer


    def get_parser():
        parser = argparse.ArgumentParser()
        parser.add_argument("-v", "--verbosity", type=int, default=1, dest="verb")
        args = parser.parse_args()
        return args


    if __name__ == "__main__":
        logging.basicConfig(level=logging.INFO)
        args = get_parser()
        if args.verb > 2:
            print("arguments:", args)
        params = {}
        params["world_rank"] = int(os.environ["RANK"])
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl")
        params["verb"] = args.verb * (params["world_rank"] == 0)
        if params["verb"]:
            logging.info("starting")
        Trainer(params).train(3)
        dist.destroy_process_group()
"""


def test_a_verbosity_only_rank_0_keeps_is_a_rank_check():
    """`verb = args.verb * (rank == 0)` is zero on every other rank: `if verb:` and `if self.verb:` (the value stored
    on the trainer) run on rank 0 alone; the command line's own `args.verb` is the same on every rank."""
    found = _found({"train.py": _VERBOSE_MAIN, "trainer.py": _VERBOSE_TRAINER})
    assert ("train.py", 'print("arguments:", args)', "DDP008") in found
    assert not [f for f in found if f[2] == "DDP008" and "logging.info" in f[1]]
    every = _VERBOSE_MAIN.replace('args.verb * (params["world_rank"] == 0)', "args.verb")
    found = _found({"train.py": every, "trainer.py": _VERBOSE_TRAINER})
    assert ("trainer.py", 'logging.info("epoch %d done", epoch)', "DDP008") in found


_SELF_HELD = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    def pixel_loss_func(a, b):
        return (a - b).abs().mean()


    class Trainer:
        def __init__(self, rank):
            self.rank = rank
            data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
            self.train_loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
            self.criterion = pixel_loss_func
            self.model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[rank])

        def train(self):
            total = 0.0
            for x, y in self.train_loader:
                loss = self.criterion(self.model(x.cuda()), y.cuda())
                loss.backward()
                total += loss.item()
            self.epoch_loss = total / len(self.train_loader)
            if self.rank == 0:
                print("steps per epoch:", len(self.train_loader))


    if __name__ == "__main__":
        dist.init_process_group("nccl")
        rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(rank)
        Trainer(rank).train()
        dist.destroy_process_group()
"""


def test_a_value_read_off_self_is_not_everything_the_object_holds():
    """`len(self.train_loader)` shows no loss, though the trainer also holds its loss function; the epoch loss it
    holds, shown the same way, is still rank 0's own."""
    found = _found({"train.py": _SELF_HELD})
    assert not [f for f in found if f[2] == "DDP006"]
    twin = _SELF_HELD.replace('print("steps per epoch:", len(self.train_loader))', 'print("loss:", self.epoch_loss)')
    assert ("train.py", 'print("loss:", self.epoch_loss)', "DDP006") in _found({"train.py": twin})


_RESUMED = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    def main():
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[local_rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        start_epoch, train_losses = 0, []
        if os.path.exists("ckpt.pt"):
            checkpoint = torch.load("ckpt.pt", map_location="cpu")
            model.module.load_state_dict(checkpoint["model"])
            start_epoch = checkpoint["epoch"] + 1
            train_losses = checkpoint["train_losses"]
            if dist.get_rank() == 0:
                print(f"resuming from epoch {start_epoch}")
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=8, sampler=sampler)
        for epoch in range(start_epoch, 10):
            sampler.set_epoch(epoch)
            total = 0.0
            for x, y in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
                total += loss.item()
            train_losses.append(total / len(loader))
            if dist.get_rank() == 0:
                checkpoint = {"epoch": epoch, "model": model.module.state_dict(), "train_losses": train_losses}
                torch.save(checkpoint, "ckpt.pt")
                print(f"saved epoch {epoch + 1}")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_an_item_read_by_its_key_is_that_item_not_the_whole_dict():
    """`start_epoch = checkpoint["epoch"] + 1` is the epoch the checkpoint holds, not its losses: a line showing it
    (or the epoch counter the loop takes from it) shows no figure; the losses, shown the same way, are rank 0's."""
    found = _found({"train.py": _RESUMED})
    assert not [f for f in found if f[2] == "DDP006" and "epoch" in f[1]]
    twin = _RESUMED.replace('print(f"saved epoch {epoch + 1}")', 'print(f"loss {train_losses[-1]}")')
    assert ("train.py", 'print(f"loss {train_losses[-1]}")', "DDP006") in _found({"train.py": twin})


_RUN_PER_RANK = """
    import os
    from datetime import datetime
    import torch
    import torch.distributed as dist
    import wandb


    def main(log_all=False):
        dist.init_process_group("nccl")
        rank = int(os.environ["RANK"])
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        run_name = datetime.now().strftime("%y%m%d") + f"_GPU{rank}"
        run = wandb.init(project="faces", name=run_name) if rank == 0 or log_all else None
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_wandb_runs_named_for_their_rank_are_asked_for():
    """`wandb.init(name=f"..._GPU{rank}")`: one run per process, each named for its rank, is the script's choice;
    the same call with a name the ranks share opens world_size runs of one job."""
    assert not [f for f in _found({"train.py": _RUN_PER_RANK}) if f[2] == "DDP008"]
    twin = _RUN_PER_RANK.replace('+ f"_GPU{rank}"', '+ "_faces"')
    assert [f for f in _found({"train.py": twin}) if f[2] == "DDP008" and "wandb.init" in f[1]]


_SETTINGS_SHOWN = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    class Trainer:
        def __init__(self, configs, rank):
            self.rank = rank
            self.best_model_path = configs["best_model_path"]
            data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
            self.loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
            self.model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[rank])

        def train(self, configs):
            loss_function_type = configs.get("loss-function", "mse")
            if self.rank == 0:
                print(f"loss function: {loss_function_type}")
            for x, y in self.loader:
                loss = torch.nn.functional.mse_loss(self.model(x.cuda()), y.cuda())
                loss.backward()
                self.last = loss.item()
            if self.rank == 0:
                print(f"best model saved at: {self.best_model_path}")


    if __name__ == "__main__":
        dist.init_process_group("nccl")
        rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(rank)
        configs = {"best_model_path": "best.pt"}
        Trainer(configs, rank).train(configs)
        dist.destroy_process_group()
"""


def test_a_setting_shown_under_a_rank_check_is_no_figure():
    """The loss function's name looked up with a text default, and a path the trainer keeps on `self` beside a
    figure of its shard, show no figure; the figure itself, shown the same way, is rank 0's."""
    assert not [f for f in _found({"train.py": _SETTINGS_SHOWN}) if f[2] == "DDP006"]
    twin = _SETTINGS_SHOWN.replace("{self.best_model_path}", "{self.last}")
    assert [f for f in _found({"train.py": twin}) if f[2] == "DDP006" and "self.last" in f[1]]


_WORKERS_AND_HOST = """
    import argparse
    import threading
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--num_gpus", type=int, default=2)
    args = parser.parse_args()
    torch.cuda.set_device(max(args.local_rank, 0) % args.num_gpus)
    dist.init_process_group("gloo")
    gpus = dist.new_group(ranks=list(range(args.num_gpus)), backend="nccl")

    if args.local_rank < args.num_gpus:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).cuda(), process_group=gpus,
                                                          device_ids=[args.local_rank])
        prev = None
        for step in range(10):
            if prev is not None:
                prev.join()
                loss = model(torch.randn(8, 4).cuda()).sum()
                loss.backward()
            prev = threading.Thread(target=print)
            prev.start()
    dist.destroy_process_group()
"""


def test_the_ranks_that_build_the_ddp_model_all_run_it():
    """Only the GPU workers (`local_rank < num_gpus`) build the DDP model, on a group of their own, and every one
    of them runs its forward; a value set to `None` and refilled in that same arm is held by each of them."""
    assert not [f for f in _found({"train.py": _WORKERS_AND_HOST}) if f[2] == "DDP010"]
    twin = _WORKERS_AND_HOST.replace("            if prev is not None:", "            if args.local_rank == 0:")
    assert [f for f in _found({"train.py": twin}) if f[2] == "DDP010"]


_SHOWN_BY_LIBRARIES = """
    import os
    from pprint import pprint
    import torch
    import torch.distributed as dist
    from torchsummary import summary


    def main(args):
        dist.init_process_group("nccl")
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        pprint(args)
        model = torch.nn.Linear(4, 1).cuda()
        summary(model, (4,))
        dist.destroy_process_group()


    if __name__ == "__main__":
        main({"lr": 0.1})
"""


def test_pprint_and_torchsummary_print_on_every_rank():
    """`pprint(args)` writes sys.stdout and torchsummary's `summary()` prints its table: on every rank, both are
    DDP008; under a rank check, neither."""
    found = _found({"train.py": _SHOWN_BY_LIBRARIES})
    assert {("train.py", "pprint(args)", "DDP008"), ("train.py", "summary(model, (4,))", "DDP008")} <= found
    guarded = _SHOWN_BY_LIBRARIES.replace("        pprint(args)", "        if dist.get_rank() == 0:\n"
                                          "            pprint(args)")
    guarded = guarded.replace("        summary(model, (4,))", "        if dist.get_rank() == 0:\n"
                              "            summary(model, (4,))")
    assert not [f for f in _found({"train.py": guarded}) if f[2] == "DDP008"]


_LOG_FILE = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    def main():
        dist.init_process_group("nccl")
        rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(rank)
        model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[rank])
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data))
        total_loss = 0.0
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
            loss.backward()
            total_loss += loss.item()
        if rank == 0:
            avg_loss = total_loss / len(loader)
            with open("train.txt", "a") as f:
                f.writelines(f"loss: {avg_loss:.6f}\\n")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_loss_written_to_a_log_file_with_writelines_is_reported():
    """`f.writelines(f"loss: {avg_loss}")` under a rank check records rank 0's own loss, as `f.write` does."""
    assert ("train.py", 'f.writelines(f"loss: {avg_loss:.6f}\\n")', "DDP006") in _found({"train.py": _LOG_FILE})


def test_torchinfo_summary_prints_its_table_unless_made_quiet():
    """torchinfo's `summary(model)` prints its table by default (outside a notebook) as torchsummary's does: on
    every rank, DDP008; `verbose=0` makes it quiet (it only returns the statistics)."""
    code = _SHOWN_BY_LIBRARIES.replace("from torchsummary import summary", "from torchinfo import summary")
    assert ("train.py", "summary(model, (4,))", "DDP008") in _found({"train.py": code})
    quiet = code.replace("summary(model, (4,))", "summary(model, (4,), verbose=0)")
    assert ("train.py", "summary(model, (4,), verbose=0)", "DDP008") not in _found({"train.py": quiet})
