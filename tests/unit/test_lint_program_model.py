"""Which code is part of a lint program and which rank runs it: modules imported at run time, launchers of the
project that start a program's ranks, rank checks written as helper flags and mode flags."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from ddpkit.lint import lint_files, lint_sources
from ddpkit.lint.imports import Modules, runtime_imports

from lint_markers import expected as _marks

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lint"


def test_modules_imported_at_run_time_are_part_of_the_program():
    """`importlib.import_module(f"tasks.{args.task}.train")`: every module the name can pick runs on every rank,
    with the helpers it imports; a function of it nothing names stays dead."""
    root = FIXTURES / "runtime_import"
    files = sorted(root.rglob("*.py"))
    found = lint_files(files)
    assert {(Path(f.path).relative_to(root).as_posix(), f.line, f.rule, f.severity) for f in found} \
        == _marks(files, root)
    for f in found:  # the message says why a file the entry never imports by name is linted with it
        assert "run-time import at launch.py:14" in f.message


def _names(code: str) -> set[str]:
    files = ["run.py", "pkg/__init__.py", "pkg/a/__init__.py", "pkg/a/train.py", "pkg/b/train.py", "pkg/b/eval.py",
             "other/train.py"]
    found = runtime_imports(Modules(files), "run.py", list(ast.walk(ast.parse(textwrap.dedent(code)))))
    return set(found)


def test_run_time_import_names_are_read_as_patterns_around_their_constant_part():
    assert _names('import importlib\nm = importlib.import_module(f"pkg.{name}.train")') \
        == {"pkg/a/train.py", "pkg/b/train.py"}
    assert _names('import importlib\nm = importlib.import_module("pkg.b." + name)') \
        == {"pkg/b/train.py", "pkg/b/eval.py"}
    assert _names('import importlib\nm = importlib.import_module("pkg.%s.train" % name)') \
        == {"pkg/a/train.py", "pkg/b/train.py"}
    assert _names('import importlib\nm = importlib.import_module("pkg.{}.eval".format(name))') == {"pkg/b/eval.py"}
    assert _names('name = "pkg.a.train"\nm = __import__(name)') == {"pkg/a/train.py"}
    # no constant package part: nothing to look under
    assert _names('import importlib\nm = importlib.import_module(args.module)') == set()
    assert _names('import importlib\nm = importlib.import_module(name + ".train")') == set()


def test_a_launcher_naming_its_script_at_run_time_is_linked_by_the_options_it_passes():
    """start.py runs `python <args.script> --config=... --world=... --rank=i` with stdout sent to os.devnull for
    every rank but 0: worker.py parses exactly those options and starts the process group, so its prints reach
    one console; solo.py parses other options and is not its program."""
    root = FIXTURES / "programs" / "launcher_by_interface"
    found = {(Path(f.path).name, f.line, f.rule) for f in lint_files(sorted(root.glob("*.py")))}
    worker = (root / "worker.py").read_text().splitlines()
    line = next(i for i, text in enumerate(worker, 1) if text.strip().startswith('print("config"'))
    assert ("worker.py", line, "DDP008") not in found
    assert any(name == "solo.py" and rule == "DDP008" for name, _, rule in found)


_LAUNCHER = """
    import os
    import subprocess
    import sys


    def main():
        script = sys.argv[1]
        procs = []
        for i in range(2):
            sink = None if i == 0 else open(os.devnull, "w")
            procs.append(subprocess.Popen([sys.executable, script, "--node=0", f"--rank={i}"], stdout=sink))
        for p in procs:
            p.wait()


    if __name__ == "__main__":
        main()
"""

_WORKER = """
    import argparse

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--rank", type=int)
        parser.add_argument("--node", type=int)
        args = parser.parse_args()
        dist.init_process_group("gloo", rank=args.rank, world_size=2)
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(2, 2))
        for epoch in range(3):
            for step in range(4):
                loss = model(torch.randn(4, 2)).sum()
                loss.backward()
            print("epoch", epoch)
            if args.rank == 0:
                print("loss", loss.item())
        dist.destroy_process_group()
"""


def test_output_left_in_a_launched_program_names_the_launcher():
    found = lint_sources({"launch.py": textwrap.dedent(_LAUNCHER), "work.py": textwrap.dedent(_WORKER)})
    assert not any(f.rule == "DDP008" for f in found)
    metric = [f for f in found if f.rule == "DDP006"]
    assert metric and all("started by launch.py:12, which shows only rank 0's console" in f.message for f in metric)
    # without the launcher the same program repeats its output on every rank
    alone = lint_sources({"work.py": textwrap.dedent(_WORKER)})
    assert any(f.rule == "DDP008" for f in alone)
    assert [f.line for f in alone if f.rule == "DDP006"] == [f.line for f in metric]
    assert not any("launch.py" in f.message for f in alone)


_TUPLE_RANK = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    def main(distributed):
        if distributed:
            dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(2, 2)) if distributed else torch.nn.Linear(2, 2)
        model(torch.randn(4, 2)).sum().backward()
        if distributed:
            dist.destroy_process_group()
            return dist.get_rank(), 1.0
        return 0, 1.0


    if __name__ == "__main__":
        who, took = main(True)
        print(f"[{who}] took {took} s")
        print("took", took, "s")
"""


def test_a_rank_returned_in_a_tuple_names_the_rank_in_the_line_that_prints_it():
    """`who, took = main()` where main returns `dist.get_rank(), elapsed`: `who` is the rank, so a line that prints
    it is told apart per rank; the line that prints only `took` still repeats."""
    found = {(f.line, f.rule) for f in lint_sources({"train.py": textwrap.dedent(_TUPLE_RANK)})}
    lines = textwrap.dedent(_TUPLE_RANK).splitlines()
    named = next(i for i, text in enumerate(lines, 1) if 'print(f"[{who}]' in text)
    assert (named, "DDP008") not in found
    assert (named + 1, "DDP008") in found


def test_a_launcher_two_scripts_fit_is_a_guess_that_drops_output_findings_and_names_no_launcher():
    worker = textwrap.dedent(_WORKER)
    found = lint_sources({"launch.py": textwrap.dedent(_LAUNCHER), "work.py": worker, "work2.py": worker})
    assert not any(f.rule == "DDP008" for f in found)
    metric = [f for f in found if f.rule == "DDP006"]
    assert {f.path for f in metric} == {"work.py", "work2.py"}
    assert not any("launch.py" in f.message for f in found)


_ONE_PROCESS_ARMS = """
    import os

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP


    def build(model, gpus):
        if gpus > 1:
            print("one process drives", gpus, "GPUs")
            model = nn.DataParallel(model)
        return model


    def main():
        rank = int(os.environ.get("RANK", -1))
        world_size = int(os.environ.get("WORLD_SIZE", 0))
        if rank == -1 or world_size <= 0:
            print("no launcher: run me with torchrun")
            return
        dist.init_process_group("gloo")
        torch.manual_seed(rank)
        model = DDP(build(nn.Linear(2, 2), 1))
        model(torch.randn(4, 2)).sum().backward()
        print("done")
        dist.destroy_process_group()


    if __name__ == "__main__":
        main()
"""


def test_an_arm_that_wraps_in_data_parallel_and_a_world_size_of_zero_are_one_process():
    code = textwrap.dedent(_ONE_PROCESS_ARMS)
    lines = code.splitlines()
    found = {(f.line, f.rule) for f in lint_sources({"train.py": code})}
    for text in ('print("one process drives"', 'print("no launcher'):
        assert (next(i for i, t in enumerate(lines, 1) if text in t), "DDP008") not in found
    assert (next(i for i, t in enumerate(lines, 1) if 'print("done")' in t), "DDP008") in found


def test_a_module_a_run_time_pattern_may_pick_that_is_also_a_script_keeps_its_main_block():
    """`importlib.import_module(f"jobs.{name}")` may pick jobs/solo.py, which is also run as a script of its own:
    its `__main__` block still runs (and is linted) as an entry script's."""
    run = textwrap.dedent("""
        import importlib
        import sys

        import torch.distributed as dist

        if __name__ == "__main__":
            dist.init_process_group("gloo")
            importlib.import_module(f"jobs.{sys.argv[1]}").go()
            dist.destroy_process_group()
    """)
    solo = textwrap.dedent("""
        import torch
        import torch.distributed as dist


        def go():
            torch.manual_seed(dist.get_rank())


        if __name__ == "__main__":
            dist.init_process_group("gloo")
            go()
            torch.save({"step": 1}, "state.pt")
            dist.destroy_process_group()
    """)
    found = lint_sources({"run.py": run, "jobs/__init__.py": "", "jobs/solo.py": solo})
    line = solo.splitlines().index('    torch.save({"step": 1}, "state.pt")') + 1
    assert [(f.path, f.line, f.rule) for f in found if f.rule == "DDP004"] == [("jobs/solo.py", line, "DDP004")]


def _own_package_modules() -> Modules:
    files = ["proj/main.py", "proj/engine.py", "proj/util/misc.py", "proj/models/net.py"]
    code = {"proj/main.py": "import mypkg.util.misc as misc\nfrom mypkg import engine\nfrom mypkg.models.net import Net\n"
                            "import timm.models\nfrom timm.data import Mixup\n",
            "proj/engine.py": "", "proj/util/misc.py": "", "proj/models/net.py": "class Net:\n    pass\n"}
    return Modules(files, {p: ast.parse(c) for p, c in code.items()})


def test_a_project_that_imports_itself_under_its_package_name_finds_its_files():
    """`import mypkg.util.misc` in a checkout whose folder is not named mypkg (a renamed clone, an unpacked archive):
    every module the project names under mypkg sits at its top (engine.py, util/, models/), so mypkg is the project
    itself; timm names a folder it has (models/) but also one it has not (data/), so timm stays a library."""
    modules = _own_package_modules()
    assert modules.locate("proj/main.py", "mypkg.util.misc") == "proj/util/misc.py"
    assert modules.locate("proj/main.py", "mypkg.engine") == "proj/engine.py"
    assert modules.locate("proj/main.py", "mypkg.models.net") == "proj/models/net.py"
    assert modules.locate("proj/main.py", "timm.models") is None
    assert modules.locate("proj/main.py", "timm.data") is None
    # a name taken from a module of the project that the module does not define: a library's module of that name
    modules = Modules(["proj/main.py", "proj/models.py", "proj/utils.py"], {
        "proj/main.py": ast.parse("from timm.models import create_model\nfrom timm.utils import accuracy\n"),
        "proj/models.py": ast.parse("def vit():\n    pass\n"), "proj/utils.py": ast.parse("def accuracy():\n    pass\n")})
    assert modules.locate("proj/main.py", "timm.utils") is None


def test_a_print_swap_in_the_projects_own_package_silences_the_entry_scripts_prints(tmp_path):
    """misc.init_distributed_mode swaps builtins.print for a rank-0 print; main.py reaches it as `mypkg.util.misc`
    (and engine.py as `mypkg.engine`) from a folder not named mypkg: its prints after the call show on rank 0 alone (no DDP008)."""
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "misc.py").write_text(textwrap.dedent("""\
        import builtins
        import os
        import torch.distributed as dist


        def setup_for_distributed(is_master):
            builtin_print = builtins.print

            def print(*args, **kwargs):
                if is_master:
                    builtin_print(*args, **kwargs)

            builtins.print = print


        def init_distributed_mode():
            dist.init_process_group("nccl")
            setup_for_distributed(int(os.environ["RANK"]) == 0)
        """))
    (tmp_path / "main.py").write_text(textwrap.dedent("""\
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        import mypkg.util.misc as misc
        from mypkg.engine import train_one_epoch


        def main():
            misc.init_distributed_mode()
            model = DDP(torch.nn.Linear(4, 2).cuda())
            print("training starts", model)
            train_one_epoch(model)


        if __name__ == "__main__":
            main()
        """))
    (tmp_path / "engine.py").write_text("def train_one_epoch(model):\n    return model\n")
    found = lint_files([tmp_path / "main.py", tmp_path / "engine.py", tmp_path / "util" / "misc.py"])
    assert not [f for f in found if f.rule == "DDP008"], found


def test_a_function_read_off_an_imported_package_whose_init_is_not_linted_joins_the_program():
    """`import lib.utils as utils; utils.dist_sum(...)` where lib/utils/__init__.py is not linted: the one module of
    lib/utils that defines dist_sum is part of the program, so the figure it all-reduces is the whole set's."""
    train = textwrap.dedent("""\
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        import lib.utils as utils


        def main():
            dist.init_process_group("nccl")
            data = TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
            loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data), drop_last=True)
            model = DDP(torch.nn.Linear(4, 2).cuda())
            correct, total = 0, 0
            for x, y in loader:
                correct += (model(x).argmax(1) == y).sum().item()
                total += len(y)
            correct, total = utils.dist_sum(correct, total)
            accuracy = correct / total
            if dist.get_rank() == 0:
                print("accuracy %.3f" % accuracy)
            dist.destroy_process_group()


        if __name__ == "__main__":
            main()
        """)
    helper = textwrap.dedent("""\
        import torch
        import torch.distributed as dist


        def dist_sum(*values):
            out = []
            for v in values:
                t = torch.tensor(v).cuda()
                dist.all_reduce(t)
                out.append(t.item())
            return out
        """)
    found = lint_sources({"train.py": train, "lib/utils/dist_helper.py": helper})
    assert not [f for f in found if f.rule == "DDP006"], found
