"""Code no rank runs, followed from the entry point through the program's files: module functions reached only
as a namesake method of a value, framework classes nothing builds, plain classes in a program that reads its
configuration by name; each beside a twin that runs and is still reported."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_sources


def _found(files: dict[str, str]) -> set[tuple[str, str, str]]:
    """(path, stripped line, rule) of every finding."""
    sources = {path: textwrap.dedent(code) for path, code in files.items()}
    return {(f.path, sources[f.path].splitlines()[f.line - 1].strip(), f.rule) for f in lint_sources(sources)}


_TRAIN = """
    import argparse
    import threading
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    import utils


    class Engine:
        def __init__(self, model):
            self.model = model

        def step(self, x):
            return self.model(x)


    def main():
        args = argparse.ArgumentParser().parse_args()
        dist.init_process_group("gloo")
        model = torch.nn.Linear(2, 2)
        engine = Engine(model)
        data = torch.randn(8, 2)
        loader = DataLoader(data, sampler=DistributedSampler(data))
        for epoch in range(2):
            loader.sampler.set_epoch(epoch)
            for x in loader:
                engine.step(x).sum().backward()
        threading.Thread(target=utils.watch).start()
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""

_UTILS = """
    import torch


    def step(x):
        print("step", x)
        torch.save(x, "x.pt")


    def watch():
        print("watching")
"""


def test_a_module_function_named_like_a_method_called_on_a_value_is_not_run_by_that_call():
    """`engine.step(x)` runs Engine.step, not utils.step: nothing names utils.step (its print and save used to be
    reported); utils.watch, handed to a Thread, runs."""
    assert _found({"train.py": _TRAIN, "utils.py": _UTILS}) == {("utils.py", 'print("watching")', "DDP008")}


def test_a_module_function_named_on_its_module_still_runs():
    train = _TRAIN.replace("engine.step(x).sum().backward()", "engine.step(x).sum().backward()\n"
                           "                utils.step(x)")
    assert _found({"train.py": train, "utils.py": _UTILS}) == {
        ("utils.py", 'print("watching")', "DDP008"), ("utils.py", 'print("step", x)', "DDP008"),
        ("utils.py", 'torch.save(x, "x.pt")', "DDP004")}


_CALLBACKS = """
    import argparse
    import torch
    import torch.distributed as dist
    import pytorch_lightning as pl
    from torch.utils.data import Dataset


    class Snapshot(pl.Callback):
        def on_train_epoch_end(self, trainer, module):
            print("epoch done")
            torch.save(module.state_dict(), "snap.pt")


    class Legacy(Dataset):
        def __init__(self, root):
            print("reading", root)

        def __getitem__(self, i):
            return i


    class Progress(pl.Callback):
        def on_train_epoch_end(self, trainer, module):
            print("progress")


    def main():
        args = argparse.ArgumentParser().parse_args()
        for key in vars(args):
            print(key, getattr(args, key))
        dist.init_process_group("gloo")
        trainer = pl.Trainer(callbacks=[Progress()])
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_a_framework_class_nothing_builds_never_runs_nor_does_a_plain_class_in_a_program_reading_args_by_name():
    """Snapshot (a pl.Callback) is never built: its hook never runs; Legacy is built nowhere, and `vars(args)` /
    `getattr(args, key)` pick no class by name. Progress, handed to the Trainer, runs its hook."""
    found = _found({"train.py": _CALLBACKS})
    assert {line for _, line, _ in found} == {"print(key, getattr(args, key))", 'print("progress")'}


def test_a_class_picked_by_a_string_from_a_module_may_still_run():
    """`getattr(models, args.arch)` on a project module: any class of the program may be the one built."""
    code = _CALLBACKS.replace("for key in vars(args):", "for key in vars(args):\n"
                              "            getattr(__import__('train'), key)")
    found = _found({"train.py": code})
    assert {'print("epoch done")', 'print("reading", root)'} <= {line for _, line, _ in found}


def test_a_method_named_by_a_constant_getattr_and_a_function_exported_in_all_run():
    """`getattr(self, "report")()` runs report; `export` is listed in `__all__`, so a file not linted may import
    and call it: both keep their findings. `unused` is neither called nor exported: nothing runs it."""
    train = """
        import torch
        import torch.distributed as dist
        from helpers import export

        class Runner:
            def __init__(self, model):
                self.model = model

            def run(self):
                getattr(self, "report")()

            def report(self):
                print("report")

        def main():
            dist.init_process_group("gloo")
            Runner(torch.nn.Linear(2, 2)).run()
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """
    helpers = """
        import torch

        __all__ = ["export", "dump"]

        def export(x):
            print("export")

        def dump(x):
            print("dump")

        def unused(x):
            torch.save(x, "unused.pt")
    """
    assert _found({"train.py": train, "helpers.py": helpers}) == {
        ("train.py", 'print("report")', "DDP008"), ("helpers.py", 'print("export")', "DDP008"),
        ("helpers.py", 'print("dump")', "DDP008")}


def test_a_bare_name_imported_from_one_module_does_not_run_a_namesake_of_another():
    """`from engine import train_one_epoch` then `train_one_epoch(...)`: engine's runs, utils' legacy namesake
    (imported from for build_model only) does not; its bar, print and save used to be reported."""
    train = """
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler
        from engine import train_one_epoch
        from utils import build_model

        def main():
            dist.init_process_group("gloo")
            model = build_model()
            data = torch.randn(8, 2)
            loader = DataLoader(data, sampler=DistributedSampler(data))
            for epoch in range(2):
                loader.sampler.set_epoch(epoch)
                train_one_epoch(model, loader)
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """
    engine = """
        def train_one_epoch(model, loader):
            for x in loader:
                model(x).sum().backward()
            print("epoch done")
    """
    utils = """
        import torch
        from tqdm import tqdm

        def build_model():
            return torch.nn.Linear(2, 2)

        def train_one_epoch(model, loader):
            for x in tqdm(loader):
                model(x).sum().backward()
            torch.save(model.state_dict(), "legacy.pt")
    """
    assert _found({"train.py": train, "engine.py": engine, "utils.py": utils}) == {
        ("engine.py", 'print("epoch done")', "DDP008")}


def test_a_method_named_like_a_call_on_a_library_object_is_not_run_by_it():
    """`logger.log(...)` on `logging.getLogger(__name__)` and `writer.flush()` on a SummaryWriter run the library's
    methods: Trainer.log and Trainer.flush, which nothing else calls, never run (their print and save used to be
    reported). `copy.deepcopy(trainer).report()` may run the project's report: kept."""
    code = """
        import copy
        import logging
        import torch
        import torch.distributed as dist
        from torch.utils.tensorboard import SummaryWriter

        logger = logging.getLogger(__name__)

        class Trainer:
            def __init__(self, model):
                self.model = model

            def fit(self):
                self.model(torch.randn(2, 2)).sum().backward()

            def log(self, msg):
                print(msg)

            def flush(self):
                torch.save(self.model.state_dict(), "f.pt")

            def report(self):
                print("report")

        def main():
            dist.init_process_group("gloo")
            rank = dist.get_rank()
            trainer = Trainer(torch.nn.Linear(2, 2))
            trainer.fit()
            logger.log(logging.INFO, "done")
            writer = SummaryWriter(log_dir=f"runs/{rank}")
            writer.flush()
            twin = copy.deepcopy(trainer)
            twin.report()
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """
    assert _found({"train.py": code}) == {("train.py", 'print("report")', "DDP008")}


_FLAGGED = """
    import torch
    import torch.distributed as dist

    DEBUG = False

    def dump(model):
        torch.save(model.state_dict(), "dump.pt")

    def main():
        dist.init_process_group("gloo")
        model = torch.nn.Linear(2, 2)
        if False:
            print("never")
        if DEBUG:
            dump(model)
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
"""


def test_a_branch_on_false_or_on_a_module_constant_bound_once_to_false_never_runs():
    """`if False:` and `if DEBUG:` with `DEBUG = False` bound nowhere else: neither body runs, nor `dump`, which
    only that branch calls (its save and the print used to be reported)."""
    assert _found({"train.py": _FLAGGED}) == set()


def test_a_module_constant_the_program_may_rebind_is_not_taken_as_false():
    """nanoGPT's `exec(open("configurator.py").read())` can set DEBUG from the command line: the branch may run.
    The save is reported where the training code calls its helper with no rank check (see ddpkit.lint.location)."""
    code = _FLAGGED.replace('dist.init_process_group("gloo")', 'exec(open("configurator.py").read())\n'
                            '        dist.init_process_group("gloo")')
    assert {line for _, line, _ in _found({"train.py": code})} == {'dump(model)'}


def test_a_flag_read_of_an_attribute_does_not_run_a_method_of_its_name():
    """`if args.resume:` and `not args.evaluate` test values of the parsed arguments: Trainer.resume and
    Trainer.evaluate, which nothing calls, never run (their prints used to be reported); `hook = hook or
    trainer.report` hands report over, so it may run."""
    code = """
        import argparse
        import torch
        import torch.distributed as dist

        class Trainer:
            def __init__(self, model):
                self.model = model

            def fit(self, hook=None):
                self.model(torch.randn(2, 2)).sum().backward()
                hook = hook or self.report
                hook()

            def resume(self, path):
                print("resuming", path)

            def evaluate(self):
                print("evaluating")

            def report(self):
                print("report")

        def main(args):
            dist.init_process_group("gloo")
            trainer = Trainer(torch.nn.Linear(2, 2))
            if args.resume and dist.get_rank() == 0:
                pass
            trainer.fit()
            if not args.evaluate:
                trainer.fit()
            dist.destroy_process_group()

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--resume", default="")
            parser.add_argument("--evaluate", action="store_true")
            main(parser.parse_args())
    """
    assert {line for _, line, _ in _found({"train.py": code})} == {'print("report")'}


def test_an_attribute_of_the_parsed_arguments_passed_along_does_not_run_a_method_of_its_name():
    """`torch.load(args.resume)` with `args = parser.parse_args()` of an `argparse.ArgumentParser()`: the namespace
    is a library's object, so Trainer.resume, which nothing calls, never runs (its print used to be reported)."""
    code = """
        import argparse
        import torch
        import torch.distributed as dist

        class Trainer:
            def __init__(self, model):
                self.model = model

            def resume(self, path):
                print("resuming", path)

        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("--resume", default="")
            args = parser.parse_args()
            dist.init_process_group("gloo")
            trainer = Trainer(torch.nn.Linear(2, 2))
            trainer.model.load_state_dict(torch.load(args.resume, map_location="cpu"))
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """
    assert _found({"train.py": code}) == set()


def test_a_parameter_every_call_fills_with_the_parsed_arguments_is_a_library_object():
    """`def main(args)` called only as `main(parser.parse_args())`-made `args`: `args.resume` in main is the
    namespace's, so Trainer.resume never runs; a function also handed to mp.spawn is not read so."""
    code = """
        import argparse
        import torch
        import torch.distributed as dist

        class Trainer:
            def __init__(self, model):
                self.model = model

            def resume(self, path):
                print("resuming", path)

        def main(args):
            dist.init_process_group("gloo")
            trainer = Trainer(torch.nn.Linear(2, 2))
            trainer.model.load_state_dict(torch.load(args.resume, map_location="cpu"))
            dist.destroy_process_group()

        if __name__ == "__main__":
            parser = argparse.ArgumentParser()
            parser.add_argument("--resume", default="")
            args = parser.parse_args()
            main(args)
    """
    assert _found({"train.py": code}) == set()
    spawned = code.replace("            main(args)", "            main(args)\n            run = main")
    assert {line for _, line, _ in _found({"train.py": spawned})} == {'print("resuming", path)'}


def test_a_lookup_by_string_on_an_object_keeps_the_methods_of_its_class_only():
    """`getattr(self, f"{mode}_step")()` may call any method of Runner: its `spare` is kept (it used to be taken
    for code no rank runs, as nothing names it); the `getattr(args, key)` of the parsed arguments calls none of the
    project's methods, so Trainer.resume, which nothing calls, stays dead."""
    code = """
        import argparse
        import torch
        import torch.distributed as dist

        class Runner:
            def __init__(self, model):
                self.model = model

            def run(self, mode):
                getattr(self, f"{mode}_step")()

            def train_step(self):
                print("train step")

            def spare(self):
                print("spare")

        class Trainer:
            def __init__(self, model):
                self.model = model

            def resume(self, path):
                print("resuming", path)

        def main():
            parser = argparse.ArgumentParser()
            args = parser.parse_args()
            dist.init_process_group("gloo")
            if dist.get_rank() == 0:
                for key in vars(args):
                    print(key, getattr(args, key))
            Trainer(torch.nn.Linear(2, 2))
            Runner(torch.nn.Linear(2, 2)).run("train")
            dist.destroy_process_group()

        if __name__ == "__main__":
            main()
    """
    assert {line for _, line, _ in _found({"train.py": code})} == {'print("train step")', 'print("spare")'}


def test_a_test_case_unittest_finds_by_itself_runs():
    """A framework class nothing names is dead, except a unittest.TestCase: `unittest.main()` finds it."""
    code = """
        import unittest
        import torch.distributed as dist

        class DistTest(unittest.TestCase):
            def test_group(self):
                dist.init_process_group("gloo")
                print("testing")
                dist.destroy_process_group()

        if __name__ == "__main__":
            unittest.main()
    """
    assert {line for _, line, _ in _found({"train.py": code})} == {'print("testing")'}


_SWITCH_WITH_CONFIG_DICT = """
    import argparse
    import torch
    import torch.distributed as dist

    class Processor:
        def __init__(self, arg):
            self.arg = arg
            print("options", vars(arg))  # noqa: DDP008
            self.measure(torch.nn.Linear(2, 2), profile=False)

        def measure(self, model, profile=False):
            if profile:
                print("profiling", model)

    if __name__ == "__main__":
        dist.init_process_group("nccl")
        Processor(argparse.ArgumentParser().parse_args())
        dist.destroy_process_group()
"""


def test_a_branch_every_call_switches_off_stays_off_beside_vars_of_a_config():
    """`vars(arg)` reads the values a configuration holds; it picks no method by name, so every call of measure()
    is known and its `if profile:` branch never runs."""
    assert {f for f in _found({"train.py": textwrap.dedent(_SWITCH_WITH_CONFIG_DICT)}) if f[2] == "DDP008"} == set()
    on = _SWITCH_WITH_CONFIG_DICT.replace("profile=False)\n", "profile=True)\n", 1)
    assert ("train.py", 'print("profiling", model)', "DDP008") in _found({"train.py": textwrap.dedent(on)})
