"""Tests of `ddpkit lint` on several files: imports resolved across a project, programs kept apart, formats."""

from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path

import pytest

from ddpkit.lint import RULES, lint_file, lint_files, lint_source, lint_sources, main
from ddpkit.lint.analysis import distributed_mode, is_eval_name

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lint"
PROJECT = FIXTURES / "project"


def _src(code: str) -> str:
    return textwrap.dedent(code)


def test_project_helpers_in_other_files_are_followed():
    files = sorted(PROJECT.glob("*.py"))
    assert {(Path(f.path).name, f.rule) for f in lint_files(files)} == {("model.py", "DDP013")}
    # one file at a time, the set_epoch, the rank-0 guard of the save and the cleanup are not seen
    alone = {f.rule for f in lint_file(PROJECT / "utils.py")} | {f.rule for f in lint_file(PROJECT / "train.py")}
    assert {"DDP001", "DDP004"} <= alone


def test_directory_is_linted_as_programs(capsys):
    assert main(["--format", "json", str(PROJECT)]) == 0
    assert [(Path(r["path"]).name, r["rule"]) for r in json.loads(capsys.readouterr().out)] == [("model.py", "DDP013")]


def test_unrelated_scripts_in_one_directory_stay_apart():
    with_destroy = _src("""
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        dist.destroy_process_group()
    """)
    without = with_destroy.replace("dist.destroy_process_group()\n", "")
    found = lint_sources({"a.py": with_destroy, "b.py": without})
    assert [(f.path, f.rule) for f in found] == [("b.py", "DDP009")]


def test_reduction_in_a_helper_module_is_a_reduction():
    helper = _src("""
        import torch.distributed as dist


        def combine(t):
            dist.all_reduce(t)
            return t
    """)
    script = _src("""
        import os
        import torch
        import torch.distributed as dist
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
        from metrics import combine
        dist.init_process_group("gloo")
        torch.manual_seed(int(os.environ["RANK"]))
        val_set = TensorDataset(torch.randn(100, 2), torch.randint(0, 2, (100,)))
        loader = DataLoader(val_set, sampler=DistributedSampler(val_set, shuffle=False, drop_last=True))
        counts = combine(torch.tensor([sum(len(y) for _, y in loader), 1.0]))
        accuracy = counts[0] / counts[1]
        if dist.get_rank() == 0:
            print(f"accuracy {accuracy}")
        dist.destroy_process_group()
    """)
    assert lint_sources({"proj/metrics.py": helper, "proj/train.py": script}) == []
    assert [f.rule for f in lint_source(script, "train.py")] == ["DDP006"]  # alone, the reduction is unseen


def test_one_finding_per_statement():
    code = _src("""
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        state = torch.load("x.pt", weights_only=False)
        dist.destroy_process_group()
    """)
    (finding,) = lint_source(code, "t.py")
    assert finding.rule == "DDP005" and "map_location" in finding.message and "weights_only=False" in finding.message


def test_spawn_scripts_are_not_told_to_read_local_rank():
    code = _src("""
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp


        def worker(rank, world_size):
            dist.init_process_group("nccl", rank=rank, world_size=world_size)
            torch.manual_seed(rank)
            torch.zeros(1).cuda()
            dist.destroy_process_group()


        if __name__ == "__main__":
            mp.spawn(worker, args=(2,), nprocs=2)
    """)
    (finding,) = lint_source(code, "t.py")
    assert finding.rule == "DDP012" and "LOCAL_RANK" not in finding.fix and "local_rank" not in finding.fix
    torchrun = code.replace("def worker(rank, world_size):", "def worker(rank=0, world_size=1):")
    torchrun = torchrun.replace("mp.spawn(worker, args=(2,), nprocs=2)", "worker()")
    assert "local_rank" in lint_source(torchrun, "t.py")[0].fix


@pytest.mark.parametrize("test, sense", [
    ("args.distributed", 1), ("not args.distributed", -1), ("ddp", 1), ("dist.is_initialized()", 1),
    ("not dist.is_initialized()", -1), ("world_size > 1", 1), ("args.world_size == 1", -1),
    ("local_rank != -1", 1), ("args.local_rank == -1", -1), ("'RANK' in os.environ", 1),
    ("args.multiprocessing_distributed", 0), ("rank == 0", 0), ("dist.is_available() and dist.is_initialized()", 1),
])
def test_distributed_mode(test, sense):
    import ast

    assert distributed_mode(ast.parse(test, mode="eval").body) == sense


def test_sarif_carries_rule_severity_line_message_and_fix(capsys):
    path = FIXTURES / "bad_ddp004_save_every_rank.py"
    assert main(["--format", "sarif", str(path)]) == 1
    log = json.loads(capsys.readouterr().out)
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run,) = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(RULES)
    assert all(r["defaultConfiguration"]["level"] in ("error", "warning", "note") for r in rules)
    (result,) = run["results"]
    assert result["ruleId"] == "DDP004" and result["level"] == "error"
    assert rules[result["ruleIndex"]]["id"] == "DDP004"
    region = result["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (12, 5)
    assert result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == path.as_posix()
    assert result["message"]["text"].startswith("torch.save runs on every rank")
    assert "if dist.get_rank() == 0" in result["fixes"][0]["description"]["text"]


def test_json_carries_the_fix(capsys):
    assert main(["--format", "json", str(FIXTURES / "bad_ddp014_same_seed.py")]) == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["rule"] == "DDP014" and record["severity"] == "warning" and "rank" in record["fix"]


def test_entry_scripts_sharing_a_helper_are_separate_programs(tmp_path):
    (tmp_path / "datautils.py").write_text("import torch\n\n\ndef dataset():\n    return torch.randn(8, 2)\n")
    (tmp_path / "single_gpu.py").write_text(_src("""
        import torch
        from datautils import dataset
        model = torch.nn.Linear(2, 1)
        torch.save(model.state_dict(), "model.pt")
    """))
    (tmp_path / "multigpu.py").write_text(_src("""
        import torch
        import torch.distributed as dist
        from datautils import dataset
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        torch.save(dataset(), "data.pt")
        dist.destroy_process_group()
    """))
    found = lint_files(sorted(tmp_path.glob("*.py")))
    assert [(Path(f.path).name, f.rule) for f in found] == [("multigpu.py", "DDP004")]


def test_each_script_imports_its_own_utils(tmp_path):
    for name, body in (("a", 'torch.save({}, "x.pt")\n'), ("b", "")):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "utils.py").write_text(f"import torch\n\n\ndef save():\n    {body or 'pass'}\n")
    (tmp_path / "b" / "train.py").write_text(_src("""
        import torch
        import torch.distributed as dist
        import utils
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        utils.save()
        dist.destroy_process_group()
    """))
    assert lint_files(sorted(tmp_path.rglob("*.py"))) == []  # b/train.py's utils is b/utils.py, not a/utils.py


PROGRAMS = sorted(p for p in (FIXTURES / "programs").iterdir() if p.is_dir())
_EXPECT = re.compile(r"lint-expect: (DDP\d{3}) (error|warning|note)")


@pytest.mark.parametrize("folder", PROGRAMS, ids=lambda p: p.name)
def test_program_fixture_reports_exactly_its_markers(folder):
    """Multi-file programs: a helper's own __main__ and unused functions (no rank runs them), a guard at the
    call site of a `from x import *` helper, a collective in another module's helper called on rank 0."""
    files = sorted(folder.rglob("*.py"))  # (a package of the program in a subfolder too)
    marks = {(f.relative_to(folder).as_posix(), number, rule, severity) for f in files
             for number, line in enumerate(f.read_text().splitlines(), 1)
             for rule, severity in _EXPECT.findall(line)}
    assert {(Path(f.path).relative_to(folder).as_posix(), f.line, f.rule, f.severity)
            for f in lint_files(files)} == marks


def test_code_no_rank_runs_is_linted_when_the_helper_is_linted_alone():
    """A helper linted on its own (a library: its entry does nothing at import) keeps its findings."""
    helper = _src("""
        import torch
        import torch.distributed as dist


        def save(model):
            torch.save(model.state_dict(), "m.pt")
            dist.barrier()
    """)
    assert [f.rule for f in lint_sources({"helpers.py": helper})] == ["DDP004"]


def test_mmcv_launcher_none_is_the_single_process_branch():
    assert distributed_mode(ast.parse('args.launcher == "none"', mode="eval").body) == -1
    assert distributed_mode(ast.parse('args.launcher != "none"', mode="eval").body) == 1


def test_methods_a_framework_calls_through_a_project_base_class_are_linted():
    """`Model(Base)`, `Base(SomeFrameworkModule)`: the framework calls training_step, so its save is every rank's."""
    code = _src("""
        import torch
        import torch.distributed as dist
        from framework import FrameworkModule


        class Base(FrameworkModule):
            def helper(self):
                return 1


        class Model(Base):
            def training_step(self, batch):
                torch.save(self.state_dict(), "step.pt")


        if __name__ == "__main__":
            dist.init_process_group("gloo")
            torch.manual_seed(0)
            Model().fit()
            dist.destroy_process_group()
    """)
    assert [(f.rule, f.line) for f in lint_sources({"train.py": code})] == [("DDP004", line_of(code, "torch.save"))]


def line_of(code: str, needle: str) -> int:
    return next(i for i, line in enumerate(code.splitlines(), 1) if needle in line)


@pytest.mark.parametrize("name, evaluation", [
    ("val_loader", True), ("validset", True), ("evalloader", True), ("test_data", True), ("devset", True),
    ("device", False), ("testing", False), ("train_set", False)])
def test_evaluation_names_with_a_joined_data_word(name, evaluation):
    """`validset` is the validation set as much as `valid_set`; `device` and `testing` are not evaluation data."""
    assert is_eval_name(name) == evaluation


def test_backend_default_of_the_setup_function_is_followed():
    """`def start(backend="nccl")` called as `start()`: NCCL, and no rank picks its GPU."""
    code = _src("""
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP


        def start(backend="nccl"):
            dist.init_process_group(backend=backend)


        start()
        torch.manual_seed(dist.get_rank())
        model = DDP(torch.nn.Linear(4, 1).to("cuda", non_blocking=True), device_ids=[0])
        dist.destroy_process_group(dist.group.WORLD)
    """)
    found = [(f.rule, f.line) for f in lint_sources({"train.py": code})]
    init = next(i for i, line in enumerate(code.splitlines(), 1) if "init_process_group" in line)
    assert ("DDP012", init) in found
    assert not any(rule == "DDP009" for rule, _ in found)  # destroying group.WORLD is destroying the default group


def test_class_built_under_a_rank_check_runs_its_init_there_unless_a_subclass_or_value_shares_it(tmp_path):
    """`Board(...)` only under `if rank == 0:` runs Board.__init__ on rank 0; but a subclass built on every rank
    (or the class handed around as a value) runs the same __init__ everywhere."""
    (tmp_path / "board.py").write_text(_src("""
        class Board:
            def __init__(self, name):
                print("board", name)
    """))
    (tmp_path / "quiet.py").write_text(_src("""
        class Quiet:
            def __init__(self, name):
                print("quiet", name)
    """))
    train = _src("""
        import torch
        import torch.distributed as dist
        from board import Board
        from quiet import Quiet

        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        if dist.get_rank() == 0:
            board = Board("run")
            quiet = Quiet("run")
        SHARED = None
        dist.destroy_process_group()
    """)
    (tmp_path / "train.py").write_text(train)
    assert lint_files(sorted(tmp_path.glob("*.py"))) == []
    (tmp_path / "train.py").write_text(train.replace("SHARED = None", "SHARED = Board"))
    assert [(Path(f.path).name, f.line) for f in lint_files(sorted(tmp_path.glob("*.py")))] == [("board.py", 4)]
