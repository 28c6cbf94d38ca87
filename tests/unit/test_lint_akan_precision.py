"""Findings the program itself answers, seen on the AK..AN sets (judged wrong by adjudicators): device_ids that
come through a `**kwargs` dict, ... each beside a twin that is still reported."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _found(files: dict[str, str]) -> set[tuple[str, str, str]]:
    """(path, stripped line, rule) of every finding."""
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, sources[f.path].splitlines()[f.line - 1].strip(), f.rule) for f in lint_sources(sources)}


_SPLAT_DDP = """
    import os
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Trainer:
        def __init__(self, rank, world_size):
            self.rank = rank
            self.gen = torch.nn.Linear(4, 4).cuda(rank)
            self.disc = torch.nn.Linear(4, 1).cuda(rank)
            {kwargs}
            self.gen_ddp = DDP(self.gen, **ddp_kwargs)
            self.disc_ddp = DDP(self.disc, **ddp_kwargs)

        def step(self):
            loss = self.disc_ddp(self.gen_ddp(torch.randn(8, 4).cuda(self.rank))).sum()
            loss.backward()


    def run(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        Trainer(rank, world_size).step()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(run, args=(torch.cuda.device_count(),), nprocs=torch.cuda.device_count())
"""


def test_device_ids_through_a_kwargs_dict_are_device_ids():
    found = _found({"train.py": _SPLAT_DDP.replace("{kwargs}", "ddp_kwargs = {'device_ids': [self.rank]}")})
    assert not {f for f in found if f[2] == "DDP012"}


def test_a_kwargs_dict_without_device_ids_is_still_reported():
    found = _found({"train.py": _SPLAT_DDP.replace("{kwargs}", "ddp_kwargs = {'find_unused_parameters': True}")})
    assert ("train.py", "self.gen_ddp = DDP(self.gen, **ddp_kwargs)", "DDP012") in found


_TEST_MODE = """
    import argparse
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    parser = argparse.ArgumentParser()
    parser.add_argument("--test", type=str, default=None)
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)

        def forward(self, x):
            return self.fc(x)


    def save_trace(prof):
        prof.export_chrome_trace(f"trace{local_rank}.json")


    def score(outputs):
        print("scoring", len(outputs), "outputs")
        return sum(outputs)


    def main():
        model = Net()
        if args.test {test}:
            torch.cuda.set_device(local_rank)
            dist.init_process_group(backend="nccl")
            model = DDP(model.cuda(), device_ids=[local_rank])
            with torch.profiler.profile(on_trace_ready=save_trace) as prof:
                for step in range(10):
                    model(torch.randn(8, 4).cuda()).sum().backward()
                    prof.step()
            print("trained")
        else:
            model.load_state_dict(torch.load(args.test, map_location="cpu"))
            print("test score", score(model(torch.randn(8, 4)).tolist()))


    if __name__ == "__main__":
        main()
"""


def test_the_arm_that_starts_no_group_is_one_process_beside_a_model_class_and_a_callback():
    # the model's `super().__init__()` calls nn.Module's, no function of the program; the training arm starts the
    # group itself, whatever the profiler callback it hands along does
    found = _found({"train.py": _TEST_MODE.replace("{test}", "is None")})
    assert ("train.py", 'print("trained")', "DDP008") in found  # the training arm: every rank prints
    assert ("train.py", 'print("test score", score(model(torch.randn(8, 4)).tolist()))', "DDP008") not in found
    assert ("train.py", 'print("scoring", len(outputs), "outputs")', "DDP008") not in found


_BATCH_PROGRESS = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    def train_one_epoch(model, loader, optimizer, rank):
        total_loss = 0.0
        for step, (x, y) in enumerate(loader):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
            if rank == 0 and step % 10 == 0:
                print(f"step {step} loss {loss.item():.4f}")
        {tail}


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=8, sampler=sampler)
        model = DDP(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            epoch_loss = train_one_epoch(model, loader, optimizer, rank)
            if rank == 0:
                print(f"epoch {epoch} loss {epoch_loss:.4f}")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_batch_progress_line_is_no_figure_of_the_run_where_the_epoch_figure_is_returned():
    found = _found({"train.py": _BATCH_PROGRESS.replace("{tail}", "return total_loss / len(loader)")})
    assert ("train.py", 'print(f"step {step} loss {loss.item():.4f}")', "DDP006") not in found
    assert ("train.py", 'print(f"epoch {epoch} loss {epoch_loss:.4f}")', "DDP006") in found  # judged there


def test_a_batch_progress_line_is_reported_where_it_is_the_only_figure():
    found = _found({"train.py": _BATCH_PROGRESS.replace("{tail}", "return None")})
    assert ("train.py", 'print(f"step {step} loss {loss.item():.4f}")', "DDP006") in found


def test_a_batch_progress_line_of_a_loader_built_elsewhere_is_no_figure_of_the_run():
    code = _BATCH_PROGRESS.replace("{tail}", "return total_loss / len(loader)").replace(
        "from torch.utils.data import DataLoader, DistributedSampler, TensorDataset",
        "from loaders import build_loader")
    code = code.replace("""        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=8, sampler=sampler)
""", "        loader, sampler = build_loader(rank)\n")
    found = _found({"train.py": code})
    assert ("train.py", 'print(f"step {step} loss {loss.item():.4f}")', "DDP006") not in found
    assert ("train.py", 'print(f"epoch {epoch} loss {epoch_loss:.4f}")', "DDP006") in found


_WHOLE_DEV = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler, TensorDataset


    def evaluate(model, loader):
        correct = total = 0
        with torch.no_grad():
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum().item()
                total += len(y)
        return correct / total


    def main():
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        train_set = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
        sampler = DistributedSampler(train_set)
        model = DDP(torch.nn.Linear(4, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            sampler.set_epoch(epoch)
            for x, y in DataLoader(train_set, batch_size=8, sampler=sampler):
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            if rank == 0:
                dev_set = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
                dev_loader = DataLoader(dev_set, batch_size=8, sampler=SequentialSampler(dev_set))
                dev_acc = evaluate(model, dev_loader)
                print(f"epoch {epoch} dev_acc {dev_acc:.3f}")
        test_set = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
        test_loader = DataLoader(test_set, batch_size=8, sampler=DistributedSampler(test_set, shuffle=False))
        test_acc = evaluate(model, test_loader)
        if rank == 0:
            print(f"test_acc {test_acc:.3f}")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_an_accuracy_rank_0_evaluates_over_the_whole_set_is_the_runs():
    found = _found({"train.py": _WHOLE_DEV})
    assert ("train.py", 'print(f"epoch {epoch} dev_acc {dev_acc:.3f}")', "DDP006") not in found
    assert ("train.py", 'print(f"test_acc {test_acc:.3f}")', "DDP006") in found  # the shard's figure


def test_the_whole_set_evaluation_is_read_from_the_loader_that_reaches_it():
    # the same names bound to a sharded loader in another branch further up do not reach the loop's report
    code = _WHOLE_DEV.replace("""        for epoch in range(3):
""", """        if "--eval-first" in sys.argv:
            dev_loader = DataLoader(train_set, batch_size=8, sampler=DistributedSampler(train_set))
            dev_acc = evaluate(model, dev_loader)
            if rank == 0:
                print(f"dev_acc before training {dev_acc:.3f}")
        for epoch in range(3):
""").replace("    import torch\n", "    import sys\n    import torch\n", 1)
    found = _found({"train.py": code})
    assert ("train.py", 'print(f"epoch {epoch} dev_acc {dev_acc:.3f}")', "DDP006") not in found
    assert ("train.py", 'print(f"dev_acc before training {dev_acc:.3f}")', "DDP006") in found


_LOCAL_RANK_FLAG = """
    import argparse
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int{default})
    args = parser.parse_args()
    {fallback}
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[args.local_rank])
    model(torch.randn(8, 4).cuda()).sum().backward()
    dist.destroy_process_group()
"""


def test_a_local_rank_flag_the_program_fills_from_local_rank_works_under_torchrun():
    for default, fallback in (("", "if args.local_rank is None:\n"
                                   "        args.local_rank = int(os.environ['LOCAL_RANK'])"),
                              (", default=0", "args.local_rank = int(os.environ.get('LOCAL_RANK', 0))")):
        code = _LOCAL_RANK_FLAG.replace("{default}", default).replace("{fallback}", fallback)
        assert not {f for f in _found({"train.py": code}) if f[2] == "DDP007"}, fallback


def test_a_local_rank_flag_read_as_it_comes_is_still_the_old_contract():
    code = _LOCAL_RANK_FLAG.replace("{default}", ", default=0").replace(
        "{fallback}", "world_size = int(os.environ['WORLD_SIZE'])")
    found = _found({"train.py": code})
    assert ("train.py", 'parser.add_argument("--local_rank", type=int, default=0)', "DDP007") in found


_STOPPER = """
    import torch


    class EarlyStopping:
        def __init__(self, patience):
            self.patience = patience
            self.best = None
            self.counter = 0
            self.early_stop = False

        def __call__(self, val_loss, model, path):
            if self.best is None or val_loss < self.best:
                self.best = val_loss
                self.save_checkpoint(model, path)
            else:
                self.counter += 1
                print(f"EarlyStopping counter: {self.counter} out of {self.patience}")
                self.early_stop = self.counter >= self.patience

        def save_checkpoint(self, model, path):
            print("validation loss decreased, saving model")
            torch.save(model.state_dict(), path)
"""

_STOPPER_MAIN = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from utils import EarlyStopping


    def main():
        dist.init_process_group("gloo")
        local_rank = int(os.environ["LOCAL_RANK"])
        model = DDP(torch.nn.Linear(4, 1))
        early_stopping = EarlyStopping(patience=3)
        for epoch in range(10):
            model(torch.randn(8, 4)).sum().backward()
            val_loss = model(torch.randn(8, 4)).sum().item()
            {call}
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_callable_object_called_under_a_rank_check_runs_there():
    found = _found({"utils.py": _STOPPER, "train.py": _STOPPER_MAIN.replace(
        "{call}", "if dist.get_rank() == 0:\n                early_stopping(val_loss, model.module, 'best.pt')")})
    assert not {f for f in found if f[0] == "utils.py" and f[2] in ("DDP004", "DDP008")}


def test_a_callable_object_called_on_every_rank_still_reports_its_prints():
    found = _found({"utils.py": _STOPPER, "train.py": _STOPPER_MAIN.replace(
        "{call}", "early_stopping(val_loss, model.module, 'best.pt')")})
    assert ("utils.py", 'print(f"EarlyStopping counter: {self.counter} out of {self.patience}")', "DDP008") in found


_NAN_GUARD = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    class NanException(Exception):
        pass


    def main():
        dist.init_process_group("gloo")
        model = DDP(torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(100):
            loss = model(torch.randn(8, 4)).sum()
            loss.backward()
            optimizer.step()
            if torch.isnan(loss):
                print(f"NaN loss at step {step}, reloading the last checkpoint")
                model.module.load_state_dict(torch.load("last.pt", map_location="cpu"))
                {end}
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_message_in_an_arm_that_ends_by_raising_is_the_failing_ranks_diagnostic():
    found = _found({"train.py": _NAN_GUARD.replace("{end}", "raise NanException")})
    assert ("train.py", 'print(f"NaN loss at step {step}, reloading the last checkpoint")', "DDP008") not in found


def test_a_message_in_an_arm_that_goes_on_is_every_ranks_output():
    # (a test of the step: a message under a test of the rank's own values for NaN is that rank's, see
    # test_lint_anomaly_messages.py)
    found = _found({"train.py": _NAN_GUARD.replace("{end}", "optimizer.zero_grad()").replace(
        "if torch.isnan(loss):", "if step % 50 == 0:")})
    assert ("train.py", 'print(f"NaN loss at step {step}, reloading the last checkpoint")', "DDP008") in found


_GPU_COUNT_MODE = """
    import argparse
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from engine import Runner


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--num_gpus", type=int, default=1)
        cfg = parser.parse_args()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if cfg.num_gpus > 1:
            print("multi-GPU training on", cfg.num_gpus, "GPUs")
            torch.cuda.set_device(local_rank)
            dist.init_process_group("nccl")
        else:
            print("Using single GPU training.")
        runner = Runner(cfg)
        runner.train()


    if __name__ == "__main__":
        main()
"""


_ENGINE = """
    class Hook:
        def train(self):
            return None


    class Runner:
        def __init__(self, cfg):
            self.hooks = [Hook() for _ in range(cfg.num_gpus)]

        def train(self):
            for hook in self.hooks:
                hook.train()
"""


def test_the_other_arm_of_a_comparison_that_starts_the_group_is_one_process():
    # what the function runs after the `if` (a runner whose hooks the program does not pin down) runs after its arms
    found = _found({"train.py": _GPU_COUNT_MODE, "engine.py": _ENGINE})
    assert ("train.py", 'print("multi-GPU training on", cfg.num_gpus, "GPUs")', "DDP008") in found
    assert ("train.py", 'print("Using single GPU training.")', "DDP008") not in found


_LOSS_BEFORE_SET_DEVICE = """
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    def worker(gpu, ngpus):
        criterion = {criterion}.cuda()
        torch.cuda.set_device(gpu)
        dist.init_process_group("nccl", rank=gpu, world_size=ngpus)
        model = DDP(nn.Linear(4, 3).cuda(gpu), device_ids=[gpu])
        criterion(model(torch.randn(8, 4).cuda(gpu)), torch.randint(0, 3, (8,)).cuda(gpu)).backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        mp.spawn(worker, args=(torch.cuda.device_count(),), nprocs=torch.cuda.device_count())
"""


def test_a_loss_module_without_tensors_moved_before_set_device_puts_nothing_on_gpu_0():
    found = _found({"train.py": _LOSS_BEFORE_SET_DEVICE.replace("{criterion}",
                                                                "nn.CrossEntropyLoss(ignore_index=255)")})
    assert not {f for f in found if f[2] == "DDP012"}


def test_a_loss_module_with_class_weights_moved_before_set_device_is_still_reported():
    found = _found({"train.py": _LOSS_BEFORE_SET_DEVICE.replace(
        "{criterion}", "nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 1.0]))")})
    line = "criterion = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 1.0])).cuda()"
    assert ("train.py", line, "DDP012") in found


_RUNTIME_BACKEND = """
    import argparse
    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser()
    parser.add_argument("--dist-backend", default="nccl")
    args = parser.parse_args()
    dist.init_process_group(backend=args.dist_backend, init_method="env://")
    model = torch.nn.Linear(4, 1).cuda()
    {wrap}
    model(torch.randn(8, 4).cuda()).sum().backward()
    dist.destroy_process_group()
"""


def test_bare_cuda_under_a_run_time_backend_is_one_finding_at_the_ddp_call_without_device_ids():
    found = {f for f in _found({"train.py": _RUNTIME_BACKEND.replace(
        "{wrap}", "model = torch.nn.parallel.DistributedDataParallel(model)")}) if f[2] == "DDP012"}
    assert found == {("train.py", "model = torch.nn.parallel.DistributedDataParallel(model)", "DDP012")}


def test_bare_cuda_under_a_run_time_backend_is_reported_at_the_init_where_ddp_gets_device_ids():
    found = _found({"train.py": _RUNTIME_BACKEND.replace(
        "{wrap}", "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])")})
    assert ("train.py", 'dist.init_process_group(backend=args.dist_backend, init_method="env://")', "DDP012") in found
