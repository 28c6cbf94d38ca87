"""Where a finding is reported and when there is none: a save or seed inside a small helper, at the training code's
calls of the helper that no rank check guards (ddpkit.lint.location); a `--local_rank` flag nothing reads (DDP007)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources

_UTILS = """
    import torch


    def save_checkpoint(model, optimizer, out_dir):
        torch.save(model.state_dict(), out_dir + "/model.pt")
        torch.save(optimizer.state_dict(), out_dir + "/optimizer.pt")


    def load_checkpoint(model, path):
        state = torch.load(path, map_location="cpu")
        torch.save(state, path + ".bak")
        return state
"""

_TRAIN = """
    import random

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler
    from torchvision import datasets, transforms

    from utils import load_checkpoint, save_checkpoint


    def set_seed(args):
        random.seed(args.seed)
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)


    def train(args):
        dist.init_process_group("nccl")
        local_rank = dist.get_rank() % torch.cuda.device_count()
        torch.cuda.set_device(local_rank)
        set_seed(args)
        augment = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.ToTensor()])
        data = datasets.CIFAR10("data", transform=augment)
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=64, sampler=sampler, num_workers=4)
        model = DDP(torch.nn.Linear(3072, 10).cuda(), device_ids=[local_rank])
        load_checkpoint(model, "init.pt")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x.cuda().flatten(1)), y.cuda())
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if dist.get_rank() == 0:
                save_checkpoint(model, optimizer, "best")
            save_checkpoint(model, optimizer, "last")
        dist.destroy_process_group()


    if __name__ == "__main__":
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--epochs", type=int, default=10)
        train(parser.parse_args())
"""


def _line(code: str, text: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line)


def _findings():
    return lint_sources({"train.py": textwrap.dedent(_TRAIN), "utils.py": textwrap.dedent(_UTILS)})


def test_saves_of_a_helper_are_one_finding_at_its_unguarded_call():
    saves = [f for f in _findings() if f.rule == "DDP004"]
    at_call = [f for f in saves if f.path == "train.py"]
    assert [f.line for f in at_call] == [_line(_TRAIN, 'save_checkpoint(model, optimizer, "last")')]
    inside = (_line(_UTILS, '"/model.pt"'), _line(_UTILS, '"/optimizer.pt"'))
    assert f"save_checkpoint() (utils.py:{inside[0]}, {inside[1]})" in at_call[0].message
    # the call under the rank check gets nothing; the helper's own lines get nothing
    assert not [f for f in saves if f.path == "utils.py" and f.line in inside]


def test_a_helper_whose_result_the_caller_uses_keeps_its_finding():
    """`state = load_checkpoint(...)`-like helpers return a value every rank needs: the save stays in the helper."""
    saves = {(f.path, f.line) for f in _findings() if f.rule == "DDP004"}
    assert ("utils.py", _line(_UTILS, '".bak"')) in saves


def test_a_seed_chosen_in_a_helper_is_reported_at_the_call():
    seeds = {(f.path, f.line) for f in _findings() if f.rule == "DDP014"}
    assert seeds == {("train.py", _line(_TRAIN, "    set_seed(args)"))}


# ---- DDP007: a --local_rank flag that only absorbs the old launcher's argument ----------------------------------
_ABSORBED = """
    import argparse
    import os

    import torch
    import torch.distributed as dist

    LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))


    def main(opt):
        dist.init_process_group("nccl")
        torch.cuda.set_device(LOCAL_RANK)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).cuda(), device_ids=[LOCAL_RANK])
        print(opt.epochs, model)
        dist.destroy_process_group()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=3)
        parser.add_argument("--local_rank", type=int, default=-1, help="DDP parameter, do not modify")
        main(parser.parse_args())
"""


def test_a_local_rank_flag_never_read_beside_local_rank_from_the_environment_is_not_reported():
    found = lint_sources({"train.py": textwrap.dedent(_ABSORBED)})
    assert not [f for f in found if f.rule == "DDP007"]


def test_a_local_rank_flag_the_program_reads_is_reported():
    code = _ABSORBED.replace("torch.cuda.set_device(LOCAL_RANK)", "torch.cuda.set_device(opt.local_rank)")
    found = lint_sources({"train.py": textwrap.dedent(code)})
    assert [f.line for f in found if f.rule == "DDP007"] == [_line(code, '"--local_rank"')]


# ---- DDP008: a line that names the rank's device ------------------------------------------------------------------
_DEVICE = """
    import os

    import torch
    import torch.distributed as dist


    def main():
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        world_size = int(os.environ.get("WORLD_SIZE", 1))
        if world_size > 1:
            dist.init_process_group("nccl", world_size=world_size, rank=local_rank)
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        print(f"Using device: {device}")
        model = torch.nn.Linear(2, 2).to(device)
        if world_size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
            dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_device_built_from_the_local_rank_names_the_rank_beside_a_single_process_arm():
    found = lint_sources({"train.py": textwrap.dedent(_DEVICE)})
    assert not [f for f in found if f.rule == "DDP008"]


def test_a_device_that_does_not_name_the_rank_is_still_reported():
    code = _DEVICE.replace('device = torch.device("cuda", local_rank)', 'device = torch.device("cuda")')
    found = lint_sources({"train.py": textwrap.dedent(code)})
    assert [f.line for f in found if f.rule == "DDP008"] == [_line(code, "Using device")]


_LOCAL_GUARD = """
    import argparse
    import os

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def save_model(args, model, step):
        path = os.path.join(args.output_dir, f"step{step}.bin")
        torch.save(model.module.state_dict(), path)


    def train(args):
        dist.init_process_group("nccl")
        torch.cuda.set_device(args.local_rank)
        model = DDP(torch.nn.Linear(4, 1).cuda(), device_ids=[args.local_rank])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(100):
            model(torch.randn(2, 4).cuda()).sum().backward()
            optimizer.step()
            if args.local_rank in [-1, 0]:
                save_model(args, model, step)
        dist.destroy_process_group()


    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
        parser.add_argument("--output_dir", default="out")
        train(parser.parse_args())
"""


def test_a_helper_called_under_a_local_rank_check_only_is_reported_at_the_call():
    """The local-rank check to change into a global-rank one is the caller's, so the warning goes there."""
    found = [f for f in lint_sources({"train.py": textwrap.dedent(_LOCAL_GUARD)}) if f.rule == "DDP004"]
    assert [(f.line, f.severity) for f in found] == [(_line(_LOCAL_GUARD, "        save_model("), "warning")]
    assert f"save_model() (train.py:{_line(_LOCAL_GUARD, 'torch.save(')})" in found[0].message
    assert "local-rank check only" in found[0].message
    assert "no rank check" not in found[0].message


_MODULE_LEVEL_TRAINING = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def save_weights(model, path):
        torch.save(model.module.state_dict(), path)


    def main():
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(4, 1).cuda())
        torch.save(model.module.state_dict(), "init.pt")


    if __name__ == "__main__":
        dist.init_process_group("nccl")
        model = DDP(torch.nn.Linear(4, 1).cuda())
        for epoch in range(3):
            model(torch.randn(2, 4).cuda()).sum().backward()
            save_weights(model, "last.pt")
"""


def test_a_helper_called_from_module_level_training_code_is_reported_at_the_call():
    """Module code that trains (a loop) is the training code: the rank check goes around its call of the helper."""
    found = [f for f in lint_sources({"train.py": textwrap.dedent(_MODULE_LEVEL_TRAINING)}) if f.rule == "DDP004"]
    assert [f.line for f in found] == [_line(_MODULE_LEVEL_TRAINING, '"last.pt"')]
    assert f"save_weights() (train.py:{_line(_MODULE_LEVEL_TRAINING, 'state_dict(), path)')})" in found[0].message


def test_an_entry_function_the_module_only_calls_keeps_its_finding():
    """`if __name__ == "__main__": main()` with no loop of its own: main is the entry point, not a helper."""
    source = textwrap.dedent(_MODULE_LEVEL_TRAINING).split('if __name__')[0] + 'if __name__ == "__main__":\n    main()\n'
    found = [f for f in lint_sources({"train.py": source}) if f.rule == "DDP004"]
    assert [f.line for f in found] == [_line(_MODULE_LEVEL_TRAINING, '"init.pt"')]
