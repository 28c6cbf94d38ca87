"""Rank guards and exemptions the linter reads from a program's own code: decorators, loggers, paths."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _lint(files: dict[str, str]) -> set[tuple[str, int, str]]:
    found = lint_sources({name: textwrap.dedent(code) for name, code in files.items()})
    return {(f.path, f.line, f.rule) for f in found}


def _lines(code: str, text: str) -> list[int]:
    return [i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if text in line]


_DIST_UTIL = """
    import functools
    import torch.distributed as dist


    def world_info():
        if dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1


    def leader_only(func):
        @functools.wraps(func)
        def inner(*args, **kwargs):
            rank, _ = world_info()
            if rank == 0:
                return func(*args, **kwargs)
        return inner


    def rank_zero_only(func):  # named like a guard, but its wrapper calls func on every rank
        @functools.wraps(func)
        def inner(*args, **kwargs):
            return func(*args, **kwargs)
        return inner
"""

_MAIN = """
    import torch.distributed as dist
    from model import Net


    def main():
        dist.init_process_group("gloo")
        net = Net()
        net.store("a.pt")
        net.store_all("b.pt")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_project_decorator_is_a_rank_guard_by_its_code_not_its_name():
    model = """
        import torch
        from dist_util import leader_only, rank_zero_only


        class Net:
            @leader_only
            def store(self, path):
                torch.save(self.state, path)

            @rank_zero_only
            def store_all(self, path):
                torch.save(self.state, path)
    """
    saves = {(p, line) for p, line, rule in _lint({"dist_util.py": _DIST_UTIL, "model.py": model, "train.py": _MAIN})
             if rule == "DDP004"}
    assert saves == {("model.py", 13)}


def test_a_decorator_defined_in_the_same_file_is_read_too():
    code = _DIST_UTIL + """
    import torch


    @leader_only
    def store(state, path):
        torch.save(state, path)


    @rank_zero_only
    def store_all(state, path):
        torch.save(state, path)


    def main():
        dist.init_process_group("gloo")
        store({}, "a.pt")
        store_all({}, "b.pt")
        dist.destroy_process_group()
    """
    saves = {line for _, line, rule in _lint({"train.py": code}) if rule == "DDP004"}
    assert saves == {_lines(code, "torch.save(state, path)")[-1]}


def test_a_project_logger_that_names_the_rank_is_deliberate_per_rank_output():
    utils = """
        import logging


        class RankLog:
            def __init__(self, rank):
                self.rank = rank
                logging.basicConfig(level=logging.INFO)

            def info(self, text):
                logging.info(f"[rank {self.rank}] " + text)


        class PlainLog:
            def __init__(self):
                logging.basicConfig(level=logging.INFO)

            def info(self, text):
                logging.info("run: " + text)
    """
    train = """
        import logging
        import os
        import torch.distributed as dist
        from utils import RankLog


        def step(logging, n):
            logging.info(f"step {n}")


        def main():
            dist.init_process_group("gloo")
            rank = int(os.environ["RANK"])
            logging = RankLog(rank)
            logging.info("building the model")
            step(logging, 1)
            dist.destroy_process_group()


        if __name__ == "__main__":
            main()
    """
    assert not {r for p, _, r in _lint({"utils.py": utils, "train.py": train}) if p == "train.py" and r == "DDP008"}
    # the trap: the module itself, logging set up for every rank alike, still repeats each line
    plain = train.replace("from utils import RankLog", "").replace("logging = RankLog(rank)",
                                                                   "logging.basicConfig(level=logging.INFO)")
    assert ("train.py", _lines(plain, 'logging.info("building')[0], "DDP008") in _lint({"train.py": plain})


def test_a_local_rank_save_to_a_path_that_names_the_machine_is_per_node():
    utils = """
        import os
        import socket


        def run_dir(name):
            return os.path.join("runs", socket.gethostname() + "_" + name)


        def plain_dir(name):
            return os.path.join("runs", name)
    """
    train = """
        import argparse
        import torch
        import torch.distributed as dist
        from utils import run_dir, plain_dir


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, default=-1)
            args = parser.parse_args()
            dist.init_process_group("gloo", init_method="env://")
            if args.local_rank in (-1, 0):
                out = run_dir("gpt")
                torch.save({}, out + "/args.bin")
            if args.local_rank in (-1, 0):
                other = plain_dir("gpt")
                torch.save({}, other + "/args.bin")
            dist.destroy_process_group()


        if __name__ == "__main__":
            main()
    """
    saves = {line for p, line, rule in _lint({"utils.py": utils, "train.py": train}) if rule == "DDP004"}
    assert saves == {_lines(train, "torch.save")[1]}


def test_a_local_variable_named_like_a_function_does_not_run_it():
    code = """
        import logging
        import torch.distributed as dist


        def log(*args):
            print("log:", *args)


        def shout(*args):
            print("shout:", *args)


        def setup(name):
            log = logging.getLogger(name)
            log.setLevel(logging.WARNING)
            shout("set up", name)
            return log


        def main():
            dist.init_process_group("gloo")
            setup("train")
            dist.destroy_process_group()


        if __name__ == "__main__":
            main()
    """
    prints = {line for _, line, rule in _lint({"train.py": code}) if rule == "DDP008"}
    assert prints == {_lines(code, 'print("shout:"')[0]}


_SAMPLING = """
    import torch
    import torch.distributed as dist
    from torch.distributions import Normal
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main():
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in torch.ones(10, 4).split(2):
            out = model(x)
            q = Normal(out[:, :4], out[:, 4:].exp())
            z = q.rsample()
            loss = z.pow(2).mean()
            loss.backward()
            opt.step()
        dist.destroy_process_group()
"""


def test_a_shared_seed_with_distribution_samples_in_the_training_step_is_reported():
    assert ("train.py", _lines(_SAMPLING, "manual_seed")[0], "DDP014") in _lint({"train.py": _SAMPLING})
    # the trap: the mean of the distribution, no draw at all
    quiet = _SAMPLING.replace("q.rsample()", "q.mean")
    assert not {r for _, _, r in _lint({"train.py": quiet}) if r == "DDP014"}


_ONCE = """
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler


    def train_one_epoch(loader, epoch):
        for x in loader:
            pass


    def main():
        dist.init_process_group("gloo")
        first_epoch = torch.load("state.pt", map_location="cpu", weights_only=True)["epoch"]
        data = torch.arange(100.0)
        sampler = DistributedSampler(data)
        loader = DataLoader(data, sampler=sampler, batch_size=4)
        sampler.set_epoch(first_epoch)
        for epoch in range(first_epoch, 10):
            train_one_epoch(loader, epoch)
        dist.destroy_process_group()
"""


def test_set_epoch_called_once_before_the_epoch_loop_is_reported():
    assert ("train.py", _lines(_ONCE, "set_epoch")[0], "DDP001") in _lint({"train.py": _ONCE})
    # the trap: set_epoch in the function that runs one epoch, called from the loop
    per_epoch = _ONCE.replace("        sampler.set_epoch(first_epoch)\n", "").replace(
        "        for x in loader:", "        loader.sampler.set_epoch(epoch)\n        for x in loader:")
    assert not {r for _, _, r in _lint({"train.py": per_epoch}) if r == "DDP001"}
    # nor one in a function its caller gives the epoch, whatever loops follow it there
    given = _ONCE.replace("        sampler.set_epoch(first_epoch)\n", "").replace(
        "    def train_one_epoch(loader, epoch):\n",
        "    def train_one_epoch(loader, epoch):\n        loader.sampler.set_epoch(epoch)\n"
        "        for step in range(3):\n            train_steps(loader)\n\n\n    def train_steps(loader):\n")
    assert "set_epoch(epoch)" in given
    assert not {r for _, _, r in _lint({"train.py": given}) if r == "DDP001"}


_FROZEN = """
    import os
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def set_grad(model, flag):
        for p in model.parameters():
            p.requires_grad = flag


    def train_step(net, opt):
        set_grad(net, True)
        loss = net(torch.ones(2, 4)).sum()
        loss.backward()
        opt.step()
        set_grad(net, False)


    def main():
        dist.init_process_group("gloo")
        rank = int(os.environ["RANK"])
        net = DDP(torch.nn.Linear(4, 4))
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for epoch in range(3):
            train_step(net, opt)
            if rank == 0:
                preview = net(torch.zeros(1, 4))
        dist.destroy_process_group()
"""


def test_a_rank_zero_forward_of_a_frozen_model_without_buffers_starts_no_collective():
    assert not {r for _, _, r in _lint({"train.py": _FROZEN}) if r == "DDP010"}
    # the traps: gradients left on, or a BatchNorm whose buffers DDP broadcasts in forward
    for changed in (_FROZEN.replace("set_grad(net, False)", "set_grad(net, True)"),
                    _FROZEN.replace("torch.nn.Linear(4, 4)", "torch.nn.Sequential(torch.nn.Linear(4, 4), "
                                                             "torch.nn.BatchNorm1d(4))")):
        assert ("train.py", _lines(changed, "preview = net")[0], "DDP010") in _lint({"train.py": changed})



_FLAG_PARAMETER = """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    def report(step, verbose):
        if verbose:
            print("step", step)
        print("done", step)


    def main():
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(nn.Linear(4, 1))
        for step in range(3):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            report(step, verbose=dist.get_rank() == 0)
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_parameter_every_call_gives_a_rank_test_is_a_rank_check():
    """`report(step, verbose=rank == 0)` at every call: `if verbose:` in report runs on rank 0 only; the print
    outside it still runs on every rank."""
    found = _lint({"train.py": _FLAG_PARAMETER})
    assert found == {("train.py", _lines(_FLAG_PARAMETER, 'print("done"')[0], "DDP008")}


def test_a_parameter_one_call_gives_a_constant_is_no_rank_check():
    code = _FLAG_PARAMETER.replace("        dist.destroy_process_group()",
                                   "        report(-1, verbose=True)\n        dist.destroy_process_group()")
    found = _lint({"train.py": code})
    assert ("train.py", _lines(code, 'print("step"')[0], "DDP008") in found


_RANK_ZERO_LOG = """
    import torch
    import torch.distributed as dist
    import wandb
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


    def main():
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=8, sampler=sampler)
        model = DDP(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if dist.get_rank() == 0:
                    wandb.log({"Rank-0 Batch Wise/train_loss": loss.item()})
                    wandb.log({"train_loss": loss.item()})
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_figure_labelled_as_rank_zeros_own_is_not_reported_as_the_runs():
    """`wandb.log({"Rank-0 Batch Wise/train_loss": ...})` says whose loss it is; the same loss under a plain key
    is still DDP006."""
    found = _lint({"train.py": _RANK_ZERO_LOG})
    assert found == {("train.py", _lines(_RANK_ZERO_LOG, '{"train_loss"')[0], "DDP006")}


_CONFIG_DICT = """
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main(config):
        if config["distributed"]:
            dist.init_process_group("gloo")
            config["chatty"] = dist.get_rank() == 0
        else:
            config["chatty"] = True
        torch.manual_seed(0)
        model = DDP(nn.Linear(4, 1))
        if (not config["distributed"]) or dist.get_rank() == 0:
            print("built")
        if config["chatty"]:
            print("chatty")
        print("everyone")
        model(torch.randn(8, 4)).pow(2).mean().backward()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main({"distributed": True})
"""


def test_a_config_dict_mode_check_and_rank_flag_are_read():
    """`not config["distributed"] or rank == 0` is a rank-0 guard with a single-process arm, and
    `config["chatty"] = rank == 0` a rank-0 flag; the print outside both is still reported."""
    found = _lint({"train.py": _CONFIG_DICT})
    assert found == {("train.py", _lines(_CONFIG_DICT, 'print("everyone")')[0], "DDP008")}


def test_the_rank_stored_on_a_config_attribute_is_tested_in_the_file_it_is_handed_to():
    """`args.proc = int(os.environ["RANK"])` in train.py, `if opt.proc == 0:` in trainer.py that gets the
    namespace: a rank check, whatever the attribute's name (it used to be read only where it was assigned)."""
    train = """
        import argparse
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from trainer import fit


        def setup(args):
            dist.init_process_group("gloo")
            args.proc = int(os.environ["RANK"])
            args.who = dist.get_rank()
            return args


        def main():
            args = setup(argparse.ArgumentParser().parse_args())
            fit(DDP(torch.nn.Linear(4, 1)), args)
            dist.destroy_process_group()


        if __name__ == "__main__":
            main()
    """
    trainer = """
        import torch


        def fit(model, opt):
            for step in range(3):
                if opt.proc == 0:
                    print("step", step)
                if opt.who == 0:
                    torch.save(model.state_dict(), "m.pt")
                print("every rank")
    """
    assert _lint({"train.py": train, "trainer.py": trainer}) == {
        ("trainer.py", _lines(trainer, '"every rank"')[0], "DDP008")}


_ITEM_ATTRIBUTE_CONFIG = """
    import logging

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    logging.basicConfig(level=logging.INFO)


    class Settings:
        def __init__(self, values):
            self.values = {}
            for key, value in values.items():
                self[key] = value

        def __getitem__(self, key):
            return self.values[key]

        def __setitem__(self, key, value):
            self.values[key] = value
            self.__setattr__(key, value)


    class Trainer:
        def __init__(self, settings):
            self.settings = settings
            self.model = DDP(nn.Linear(4, 1))
            if self.settings.verbose:
                logging.info("model built")
            logging.info("everyone")

        def fit(self):
            self.model(torch.randn(8, 4)).pow(2).mean().backward()


    if __name__ == "__main__":
        dist.init_process_group("gloo")
        settings = Settings({"verbose": True})
        settings["verbose"] = (dist.get_rank() == 0) and settings["verbose"]
        Trainer(settings).fit()
        dist.destroy_process_group()
"""


def test_an_item_flag_of_a_config_class_that_mirrors_items_as_attributes_is_read_by_attribute():
    """`settings["verbose"] = rank == 0 and ...` where the program's Settings class sets each item as an attribute
    too (`__setitem__` calls `__setattr__`): `if self.settings.verbose:` is a rank-0 check; the line outside it is
    still reported. A plain dict's item is not its attribute: without the mirroring class, nothing is read."""
    found = _lint({"train.py": _ITEM_ATTRIBUTE_CONFIG})
    assert found == {("train.py", _lines(_ITEM_ATTRIBUTE_CONFIG, 'logging.info("everyone")')[0], "DDP008")}
    plain = _ITEM_ATTRIBUTE_CONFIG.replace("            self.__setattr__(key, value)\n", "")
    assert ("train.py", _lines(plain, 'logging.info("model built")')[0], "DDP008") in _lint({"train.py": plain})
