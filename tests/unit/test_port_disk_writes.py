"""`ddpkit port`: what the project's own modules write to disk on every rank is a TODO at the script's call (or
import) that reaches it, naming each write's file:line; writes that are safe on every rank are not."""

from __future__ import annotations

from test_port_modules import port_project

_LOOP = """\
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset
    {imports}

    data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    {before}
    for epoch in range(2):
        for inputs, labels in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), labels).backward()
            optimizer.step()
    {after}
"""


def _writes_todos(result) -> list[str]:  # noqa: ANN001
    return [t.message for t in result.todos if "writes files:" in t.message]


def _named_writes(result) -> list[str]:  # noqa: ANN001
    """The TODOs that name writes: the writes TODO, or the "not checked" list of a project class the port reads
    whole (with its project base classes), which names them and leaves them out of the writes TODO."""
    return [t.message for t in result.todos if "writes files:" in t.message
            or "writes or downloads on every rank" in t.message]


def test_a_trainer_method_that_saves_through_self_and_its_base_class_is_a_todo_naming_each_write(tmp_path):
    lib = """\
        import os
        import torch


        class Base:
            def __init__(self, model, loader, out):
                self.model, self.loader, self.out = model, loader, out

            def checkpoint(self, epoch):
                if not os.path.exists(self.out):
                    os.makedirs(self.out)
                torch.save(self.model.state_dict(), os.path.join(self.out, "m.pt"))


        class Trainer(Base):
            def fit(self, epochs):
                for epoch in range(epochs):
                    self.checkpoint(epoch)
    """
    script = _LOOP.format(imports="from lib import Trainer", before="trainer = Trainer(model, loader, 'out')",
                          after="trainer.fit(2)")
    result = port_project(tmp_path, {"lib.py": lib}, script)
    todos = _writes_todos(result)
    assert len(todos) == 1 and todos[0].startswith("`trainer.fit(2)` runs the project's code on every rank"), todos
    assert "lib.py:11 os.makedirs, lib.py:12 torch.save" in todos[0]
    assert "exist_ok=True" in todos[0] and "rank 0" in todos[0]
    assert result.exit_code != 0


def test_one_name_bound_to_instances_of_several_project_classes_reads_each_class(tmp_path):
    files = {"base.py": """\
        import pickle


        class Saver:
            def report(self):
                with open("hist.pkl", "wb") as f:
                    pickle.dump([], f)
    """, "a.py": """\
        from base import Saver


        class A(Saver):
            def __init__(self, args):
                self.epochs = args.epochs
    """, "b.py": """\
        import matplotlib.pyplot as plt
        from base import Saver


        class B(Saver):
            def __init__(self, args):
                self.epochs = args.epochs

            def report(self):
                plt.savefig("loss.png")
                super().report()
    """}
    script = _LOOP.format(imports="import argparse\n    from a import A\n    from b import B",
                          before="parser = argparse.ArgumentParser()\n    parser.add_argument('--gan')\n    "
                                 "parser.add_argument('--epochs', type=int)\n    args = parser.parse_args()\n    "
                                 "if args.gan == 'a':\n        gan = A(args)\n    else:\n        gan = B(args)",
                          after="gan.report()")
    result = port_project(tmp_path, files, script)
    todos = _named_writes(result)
    # each class is read whole where it is made, its base class with it: Saver's writes are named at both
    assert len(todos) == 2 and all("base.py:6 `open(...)`" in t and "base.py:7 `pickle.dump(...)`" in t
                                   for t in todos), todos
    # the figure B's own method draws is named where B is made, not where A is
    assert ["b.py:10" in t for t in todos] == [False, True]


def test_a_module_whose_import_makes_a_directory_a_log_file_and_a_writer_is_a_todo_at_the_import(tmp_path):
    files = {"settings.py": """\
        import os
        from time import strftime
        from loguru import logger
        from tb import Writer

        if not os.path.isdir("logs"):
            os.mkdir("logs")
        stamp = strftime("%H%M%S")
        logger.add(f"logs/{stamp}.log")
        writer = Writer(f"runs/{stamp}")
        lr = 0.1


        def unused():
            os.mkdir("never")
    """, "tb.py": """\
        from torch.utils.tensorboard import SummaryWriter


        class Writer(SummaryWriter):
            pass
    """}
    script = _LOOP.format(imports="import settings", before="", after="")
    todos = _writes_todos(port_project(tmp_path, files, script))
    assert len(todos) == 1 and todos[0].startswith("importing settings.py runs its module-level code"), todos
    assert "settings.py:7 os.mkdir, settings.py:9 logger.add (a log file), settings.py:10 Writer (a SummaryWriter)" \
        in todos[0]
    assert "never" not in todos[0] and "settings.py:15" not in todos[0]


def test_a_classmethod_that_makes_a_run_directory_which_must_not_exist_is_a_todo(tmp_path):
    files = {"config.py": """\
        from datetime import datetime
        from pathlib import Path
        from utils import write_json


        class Config:
            def __init__(self, settings, run_id=None):
                if run_id is None:
                    run_id = datetime.now().strftime("%m%d_%H%M%S")
                self.save_dir = Path("saved") / run_id
                exist_ok = run_id == ""
                self.save_dir.mkdir(parents=True, exist_ok=exist_ok)
                write_json(settings, self.save_dir / "config.json")

            @classmethod
            def from_args(cls, argv):
                return cls({"argv": argv})
    """, "utils/__init__.py": "from .io import *\n", "utils/io.py": """\
        import json


        def write_json(content, path):
            with path.open("wt") as handle:
                json.dump(content, handle)
    """}
    script = _LOOP.format(imports="import sys\n    from config import Config", before="cfg = Config.from_args(sys.argv)",
                          after="")
    todos = _writes_todos(port_project(tmp_path, files, script))
    assert len(todos) == 1 and todos[0].startswith("`Config.from_args(sys.argv)` runs the project's code"), todos
    assert "config.py:12 self.save_dir.mkdir" in todos[0] or "config.py:12 mkdir" in todos[0], todos
    assert "utils/io.py:5 open(w), utils/io.py:6 json.dump" in todos[0]


def test_writes_that_are_safe_on_every_rank_leave_a_full_port(tmp_path):
    lib = """\
        import errno
        import imageio
        import logging
        import os
        import torch


        def makedirs(path):
            if not os.path.exists(path):
                try:
                    os.makedirs(path)
                except OSError as exc:
                    if exc.errno != errno.EEXIST:
                        raise


        class Logger:
            @classmethod
            def get(cls, file_path=None):
                logger = logging.getLogger("run")
                if file_path:
                    logger.addHandler(logging.FileHandler(file_path))
                return logger


        class Animator:
            def animate(self, frames, gif=True):
                if gif:
                    imageio.mimsave("progress.gif", frames)


        class Keeper(Animator):
            def __init__(self, rank=0):
                self.rank = rank
                os.makedirs("ckpt", exist_ok=True)
                Path = __import__("pathlib").Path
                Path("runs").mkdir(parents=True, exist_ok=True)

            def keep(self, state):
                if self.rank == 0:
                    torch.save(state, "ckpt/last.pt")
                with open(f"ckpt/log_{self.rank}.txt", "a") as f:
                    f.write("kept")
                with open("ckpt/last.pt", "rb") as f:
                    return f.read()
    """
    script = _LOOP.format(imports="from lib import Keeper, Logger, makedirs",
                          before="makedirs('out')\n    log = Logger.get()\n    keeper = Keeper()",
                          after="blob = keeper.keep(model.state_dict())\n    log.info(len(blob))\n    "
                                "keeper.animate([], gif=False)")
    result = port_project(tmp_path, {"lib.py": lib}, script)
    assert _writes_todos(result) == [] and not any("lib.py" in t.message for t in result.todos), result.todos


def test_many_writes_of_one_call_are_one_short_todo(tmp_path):
    lib = "import torch\n\n\nclass Base:\n    def dump_all(self, x):\n" + "".join(
        f"        torch.save(x, 'f{i}.pt')\n" for i in range(7)) + "        return x\n\n\nclass Saver(Base):\n    pass\n"
    script = _LOOP.format(imports="from lib import Saver", before="saver = Saver()", after="saver.dump_all(epoch)")
    todos = _writes_todos(port_project(tmp_path, {"lib.py": lib}, script))
    assert len(todos) == 1 and todos[0].count("torch.save") == 4 and "(+3 more)" in todos[0], todos


_DISPATCH = {"data/__init__.py": """\
    from .sets import Small, Large

    SETS = {"small": Small, "large": Large}


    def make_set(args):
        chosen = SETS[args.set]
        chosen = chosen(args)
        return chosen
""", "data/sets.py": """\
    from data.base import Base


    class Small(Base):
        pass


    class Large(Base):
        pass
""", "data/base.py": """\
    import os
    import pickle


    class Base:
        def __init__(self, args):
            self.root = args.root

        def prepare(self):
            if not os.path.isdir(self.root):
                os.makedirs(self.root)
            with open(os.path.join(self.root, "cache.pkl"), "wb") as f:
                pickle.dump([1, 2], f)
            return [1, 2]
""", "feed.py": """\
    from data import make_set


    class Feeder:
        def __init__(self, args, dataset):
            self.items = dataset.prepare()


    def make_feeder(args):
        return Feeder(args, make_set(args))
""", "runner.py": """\
    import torch


    class Runner:
        def __init__(self, model):
            self.model = model

        def fit(self):
            torch.save(self.model.state_dict(), "last.pt")


    RUNNERS = {"plain": Runner}


    def make_runner(kind, model):
        return RUNNERS[kind](model)
"""}


def test_a_factory_that_dispatches_through_a_dict_of_classes_and_a_method_of_an_object_handed_in_are_followed(
        tmp_path):
    # four imports away (feed, data, data.sets, data.base), the dataset class is chosen by a dict lookup, the object is handed to another class whose __init__ calls its
    # method (defined in a base class): every rank makes the directory and pickles the cache
    script = _LOOP.format(imports="import argparse\n    from feed import make_feeder\n    from runner import make_runner",
                          before="args = argparse.Namespace(set='small', root='cache')\n    "
                                 "feeder = make_feeder(args)\n    runner = make_runner('plain', model)",
                          after="runner.fit()")
    todos = _writes_todos(port_project(tmp_path, _DISPATCH, script))
    feeder = [t for t in todos if t.startswith("`make_feeder(args)`")]
    assert len(feeder) == 1 and "data/base.py:11 os.makedirs, data/base.py:12 open(w), data/base.py:13 pickle.dump" \
        in feeder[0], todos
    # the instance a factory returns (through its dict) is followed where the script calls its method
    assert any(t.startswith("`runner.fit()`") and "runner.py:9 torch.save" in t for t in todos), todos


def test_a_method_of_the_scripts_own_object_called_inside_a_project_function_it_is_handed_to_is_followed(tmp_path):
    files = {"utils.py": """\
        import torch


        class Saving(torch.nn.Module):
            def save_model(self):
                torch.save(self.state_dict(), "model.pt")


        class Wrapper(Saving):
            def __init__(self, size):
                super().__init__()
                self.net = torch.nn.Linear(size, 2)

            def loss(self, x, y):
                return torch.nn.functional.cross_entropy(self.net(x), y)


        def training_loop(model, loader, optimizer):
            for x, y in loader:
                optimizer.zero_grad()
                model.loss(x, y).backward()
                optimizer.step()
            model.save_model()
    """}
    script = _LOOP.format(imports="from utils import Wrapper, training_loop",
                          before="holder = Wrapper(4)", after="training_loop(model=holder, loader=loader, "
                                                                  "optimizer=optimizer)")
    todos = _named_writes(port_project(tmp_path, files, script))
    assert len(todos) == 1 and "utils.py:6 `torch.save(...)`" in todos[0], todos


def test_a_method_of_an_object_handed_in_is_not_matched_to_a_project_class_it_cannot_be(tmp_path):
    # `optimizer.step()` and `log.write()` in the project's function are not the project class's `step`/`write`:
    # no instance of that class is made or handed in on this path
    files = {"utils.py": """\
        import torch


        class Recorder:
            def step(self):
                torch.save({}, "rec.pt")

            def write(self, text):
                with open("rec.txt", "a") as f:
                    f.write(text)


        def train_epoch(model, loader, optimizer, log):
            for x, y in loader:
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            log.write("done")
    """}
    script = _LOOP.format(imports="import sys\n    from utils import train_epoch", before="",
                          after="train_epoch(model, loader, optimizer, sys.stdout)")
    assert _writes_todos(port_project(tmp_path, files, script)) == []


def test_a_shell_command_that_redirects_into_a_file_is_a_write_on_every_rank(tmp_path):
    files = {"lists.py": """\
        import os
        import subprocess
        import torch


        class Listed(torch.utils.data.Dataset):
            def __init__(self, parts):
                os.system("cat %s > %s" % (" ".join(parts), "/tmp/listfile.txt"))
                subprocess.run(f"sort {parts[0]} >> {parts[1]}.sorted", shell=True)
                os.system("ls %s 2>&1 > /dev/null" % parts[0])
                self.lines = open("/tmp/listfile.txt").readlines()
    """}
    script = _LOOP.format(imports="from lists import Listed", before="names = Listed(['a.txt', 'b.txt'])", after="")
    todos = _writes_todos(port_project(tmp_path, files, script))
    assert len(todos) == 1 and "lists.py:8 os.system (a shell redirect), lists.py:9 subprocess.run (a shell redirect)" \
        in todos[0], todos
    assert "lists.py:10" not in todos[0]


def _prompt_todos(result) -> list[str]:  # noqa: ANN001
    return [t.message for t in result.todos if "asks the terminal" in t.message]


def test_an_input_the_projects_code_reaches_at_import_or_through_a_call_is_a_todo_naming_it(tmp_path):
    # options.py parses at import and its template asks which dataset; the helper asks before it saves: under
    # torchrun only rank 0 reads the terminal, so the others wait or take another answer
    files = {"options.py": """\
        import argparse
        from templates import set_template

        parser = argparse.ArgumentParser()
        parser.add_argument("--template", default=None)
        args = parser.parse_args()
        set_template(args)

        if __name__ == "__main__":
            input("never at import")
    """, "templates.py": """\
        def set_template(args):
            if args.template is None:
                return
            args.data = "ml-" + input("Input 1 or 20: ") + "m"
    """, "helpers.py": """\
        import getpass


        def confirm(text):
            return input(text) == "y"


        def login():
            return getpass.getpass("token: ")


        def unused():
            return input("never called")
    """}
    script = _LOOP.format(imports="from options import args\n    from helpers import confirm, login", before="",
                          after="if confirm('again? '):\n        print(login())")
    result = port_project(tmp_path, files, script)
    todos = _prompt_todos(result)
    assert len(todos) == 3, todos
    assert todos[0].startswith("importing options.py runs its module-level code on every rank, which asks the "
                               "terminal: templates.py:4 input"), todos
    assert "options.py:10" not in todos[0] and "broadcast_object" in todos[0]
    assert todos[1].startswith("`confirm('again? ')` runs the project's code on every rank, which asks the terminal: "
                               "helpers.py:5 input"), todos
    assert todos[2].startswith("`login()` runs") and "helpers.py:9 getpass.getpass" in todos[2], todos
    assert not any("helpers.py:13" in t.message for t in result.todos)


def _report_todos(result) -> list[str]:  # noqa: ANN001
    return [t.message for t in result.todos if "reports to an experiment tracker or opens a window" in t.message]


def test_a_tracker_run_and_an_env_window_the_projects_code_opens_on_every_rank_are_named(tmp_path):
    files = {"callbacks.py": """\
        import mlflow


        class ToMLflow:
            def __init__(self, params, run_name):
                mlflow.start_run(run_name=run_name)
                mlflow.log_params(params)

            def on_episode_end(self, metrics):
                for key, value in metrics.items():
                    mlflow.log_metric(key, value)
    """, "agent.py": """\
        class Agent:
            def __init__(self, env, callbacks):
                self.env, self.callbacks = env, callbacks

            def play(self, episodes, render=False, preview=False):
                for _ in range(episodes):
                    self.env.reset()
                    if render:
                        self.env.render()
                    if preview:
                        self.show()

            def show(self):
                self.env.render()
    """}
    script = _LOOP.format(imports="import gym\n    from agent import Agent\n    from callbacks import ToMLflow",
                          before="env = gym.make('CartPole-v1')\n    hooks = [ToMLflow({'lr': 0.1}, run_name='dqn')]\n    "
                                 "agent = Agent(env, hooks)",
                          after="agent.play(5, render=True)\n    agent.play(5)")
    todos = _report_todos(port_project(tmp_path, files, script))
    assert len(todos) == 2, todos
    assert todos[0].startswith("`ToMLflow({'lr': 0.1}, run_name='dqn')` runs the project's code on every rank") and \
        "callbacks.py:6 mlflow.start_run, callbacks.py:7 mlflow.log_params" in todos[0], todos
    assert todos[1].startswith("`agent.play(5, render=True)`") and "agent.py:9 self.env.render" in todos[1]
    assert "agent.py:14" not in todos[1]  # preview is left False by that call


def _stop_todos(result) -> list[str]:  # noqa: ANN001
    return [t.message for t in result.todos if "stops on this rank's own" in t.message]


def test_a_stop_the_projects_training_function_decides_on_its_own_loss_is_a_todo_at_the_call(tmp_path):
    # the loss check raises inside the step loop and the handler returns: that rank leaves the loop while the
    # others wait for it in the next backward's all-reduce
    files = {"fit.py": """\
        import math
        import torch


        def fit(model, loader, optimizer, steps):
            step = 0
            try:
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                    loss.backward()
                    optimizer.step()
                    value = loss.item()
                    if value > 1e8 or math.isnan(value):
                        raise Exception("Loss exploded")
                    step += 1
                    if step >= steps:
                        break
            except Exception as e:
                print(e)
                return


        def evaluate(model, loader):
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                if loss.item() > 10:
                    return loss
    """}
    script = _LOOP.format(imports="from fit import evaluate, fit", before="",
                          after="fit(model, loader, optimizer, 100)\n    evaluate(model, loader)")
    todos = _stop_todos(port_project(tmp_path, files, script))
    assert len(todos) == 1 and todos[0].startswith("`fit(model, loader, optimizer, 100)` runs the project's training "
                                                   "code on every rank, which stops on this rank's own loss"), todos
    assert "fit.py:14 raise" in todos[0] and "fit.py:17" not in todos[0], todos


def test_a_stop_on_a_step_counter_beside_a_loss_stored_on_the_object_is_not_a_per_rank_stop(tmp_path):
    # `self.last = loss.item()` stores into the object, and `self.backward(...)` is the object's helper: `self.step`
    # is not computed from the loss
    files = {"solver.py": """\
        import torch


        class Solver:
            def __init__(self, model, loader, optimizer):
                self.model, self.loader, self.optimizer = model, loader, optimizer
                self.step, self.max_step = 0, 100

            def run(self):
                while True:
                    for x, y in self.loader:
                        self.optimizer.zero_grad()
                        loss = torch.nn.functional.cross_entropy(self.model(x), y)
                        loss.backward()
                        self.optimizer.step()
                        self.last = loss.item()
                        self.step += 1
                        if self.step > self.max_step:
                            return

            def backward(self, loss):
                loss.backward()
                self.optimizer.step()

            def run_with_helper(self):
                for x, y in self.loader:
                    self.optimizer.zero_grad()
                    self.backward(torch.nn.functional.cross_entropy(self.model(x), y))
                    self.step += 1
                    if self.step > self.max_step:
                        break
    """}
    script = _LOOP.format(imports="from solver import Solver", before="solver = Solver(model, loader, optimizer)",
                          after="solver.run()\n    solver.run_with_helper()")
    assert _stop_todos(port_project(tmp_path, files, script)) == []


def test_a_stop_on_the_epoch_loss_a_training_method_of_the_same_class_returns_is_a_todo_at_the_call(tmp_path):
    # `train` breaks out of the epoch loop on the figure `self.train_epoch` returns: the mean of this rank's own
    # losses (backward() runs in train_epoch), so one rank leaves while the others wait in their next all-reduce;
    # a stop on the epoch counter is alike on every rank
    files = {"trainer.py": """\
        import torch


        class Trainer:
            def __init__(self, model, loader, optimizer):
                self.model, self.loader, self.optimizer = model, loader, optimizer

            def train_epoch(self):
                total = 0.0
                for x, y in self.loader:
                    self.optimizer.zero_grad()
                    loss = torch.nn.functional.cross_entropy(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
                    total += loss.item()
                return total / len(self.loader)

            def train(self, epochs):
                for epoch in range(epochs):
                    epoch_loss = self.train_epoch()
                    if epoch_loss > 1e6:
                        print("Gradient explosion detected. Ending...")
                        break
                    if epoch > 100:
                        break
    """}
    script = _LOOP.format(imports="from trainer import Trainer", before="",
                          after="trainer = Trainer(model, loader, optimizer)\n    trainer.train(3)")
    todos = _stop_todos(port_project(tmp_path, files, script))
    assert len(todos) == 1 and "trainer.py:21 break" in todos[0] and "trainer.py:24" not in todos[0], todos


def test_the_writes_of_a_project_class_bound_to_another_name_first_are_named(tmp_path):
    # `Exp = Exp_Main` then `exp = Exp(args)`: the methods of the class the alias names write result files on every
    # rank; before, the alias hid the class and no TODO named them
    files = {"exp_main.py": """\
        import os

        import numpy as np
        import torch


        class Exp_Main:
            def __init__(self, model, loader, optimizer):
                self.model, self.loader, self.optimizer = model, loader, optimizer

            def train(self, setting):
                for x, y in self.loader:
                    self.optimizer.zero_grad()
                    torch.nn.functional.cross_entropy(self.model(x), y).backward()
                    self.optimizer.step()
                torch.save(self.model.state_dict(), "checkpoints/" + setting + ".pth")

            def test(self, setting):
                np.save("results/" + setting + "_pred.npy", np.zeros(3))
    """}
    script = _LOOP.format(imports="from exp_main import Exp_Main", before="Exp = Exp_Main",
                          after="exp = Exp(model, loader, optimizer)\n    exp.train('s')\n    exp.test('s')")
    result = port_project(tmp_path, files, script)
    assert any("exp_main.py:19 `np.save(...)` writes or downloads on every rank" in t.message
               for t in result.todos), result.todos
