"""Tests of `ddpkit lint`: every rule on a script with the mistake and on correct scripts, and the CLI."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest

import ddpkit
import ddpkit.collectives
from ddpkit.lint import RULES, lint_file, lint_source, main
from ddpkit.lint.analysis import GLOBAL, LOCAL, NONE, rank_name_kind
from ddpkit.lint.hangs import _DDPKIT_COLLECTIVES, _DDPKIT_METHODS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lint"
BAD = sorted(FIXTURES.glob("bad_*.py"))
GOOD = sorted(FIXTURES.glob("good_*.py"))
_EXPECT = re.compile(r"lint-expect: (DDP\d{3}) (error|warning|note)")


def expected(path: Path) -> set[tuple[int, str, str]]:
    """(line, rule, severity) for each `# lint-expect: RULE severity` marker in a fixture."""
    found = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        found.update((number, rule, severity) for rule, severity in _EXPECT.findall(line))
    return found


def got(findings) -> set[tuple[int, str, str]]:
    return {(f.line, f.rule, f.severity) for f in findings}


def lint(code: str):
    return lint_source(textwrap.dedent(code), "script.py")


def line_of(code: str, needle: str) -> int:
    """1-based line of the first line of `code` that contains `needle`."""
    return next(i for i, line in enumerate(textwrap.dedent(code).splitlines(), 1) if needle in line)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_fixture_reports_exactly_its_markers(path):
    marks = expected(path)
    assert marks, f"{path.name} has no lint-expect markers"
    assert got(lint_file(path)) == marks


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.stem)
def test_correct_script_has_no_findings(path):
    assert lint_file(path) == []


def test_every_rule_has_a_failing_fixture():
    covered = {rule for path in BAD for _, rule, _ in expected(path)}
    assert covered == set(RULES) - {"DDP000"}  # a syntax error is tested inline, not as a fixture


def test_syntax_error_is_a_finding_not_a_crash():
    (finding,) = lint_source("x = 1\ndef broken(:\n    pass\n", "broken.py")
    assert (finding.path, finding.line, finding.rule, finding.severity) == ("broken.py", 2, "DDP000", "error")


def test_findings_point_at_the_call_and_carry_a_fix():
    (finding,) = lint_file(FIXTURES / "bad_ddp004_save_every_rank.py")
    assert (finding.line, finding.col) == (12, 5)
    assert finding.fix and "rank" in finding.fix
    assert finding.path.endswith("bad_ddp004_save_every_rank.py")


# ---- rank guards and aliases -----------------------------------------------------------------
@pytest.mark.parametrize("name, kind", [
    ("rank", GLOBAL), ("global_rank", GLOBAL), ("ddp_rank", GLOBAL), ("is_main", GLOBAL),
    ("master_process", GLOBAL), ("is_global_zero", GLOBAL), ("get_rank", GLOBAL), ("RANK", GLOBAL),
    ("local_rank", LOCAL), ("LOCAL_RANK", LOCAL), ("get_local_rank", LOCAL), ("is_local_main", LOCAL),
    ("SLURM_LOCALID", LOCAL), ("world_size", NONE), ("ranking", NONE), ("main", NONE), ("frank", NONE),
    ("master", GLOBAL), ("local_master", LOCAL), ("master_addr", NONE),
    ("print_rank_0", GLOBAL), ("rank_zero_only", GLOBAL), ("local_rank_id", LOCAL),
    ("rank_loss_start_epoch", NONE), ("per_rank_splits", NONE), ("rank_in_group", GLOBAL), ("rank_is_zero", GLOBAL),
])
def test_rank_name_kind(name, kind):
    assert rank_name_kind(name) == kind


SAVE_PRELUDE = """
    import os
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
"""


@pytest.mark.parametrize("guard", [
    "if dist.get_rank() == 0:",
    "if int(os.environ['RANK']) == 0:",
    "if os.environ.get('RANK', '0') == '0':",
    "me = dist.get_rank()\nif me == 0:",
    "chief = int(os.environ['RANK']) == 0\nif chief:",
    "writer = dist.get_rank() == 0 and True\nif writer:",
    "class Run:\n    pass\nrun = Run()\nrun.leader = dist.get_rank() == 0\nif run.leader:",
])
def test_global_rank_guards_and_aliases_silence_save(guard):
    code = SAVE_PRELUDE + textwrap.indent(guard + "\n    torch.save(model.state_dict(), 'm.pt')\n", "    ")
    code += "    dist.destroy_process_group()\n"
    assert lint(code) == []


def test_alias_of_local_rank_is_a_local_guard():
    code = SAVE_PRELUDE + """
    r = int(os.environ["LOCAL_RANK"])
    if r == 0:
        torch.save(model.state_dict(), "m.pt")
    dist.destroy_process_group()
    """
    assert got(lint(code)) == {(line_of(code, "torch.save"), "DDP004", "warning")}


def test_distributed_mode_sentinel_is_not_a_rank_guard():
    code = SAVE_PRELUDE + """
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    if local_rank != -1:
        torch.save(model.state_dict(), "m.pt")
        dist.barrier()
    dist.destroy_process_group()
    """
    assert got(lint(code)) == {(line_of(code, "torch.save"), "DDP004", "error")}


def test_function_called_only_under_a_guard_and_early_return():
    code = SAVE_PRELUDE + """
    def checkpoint(step):
        torch.save(model.state_dict(), f"{step}.pt")

    def maybe_print(msg):
        if dist.get_rank() != 0:
            return
        print(msg)

    for step in range(3):
        if dist.get_rank() == 0:
            checkpoint(step)
        maybe_print(step)
    dist.destroy_process_group()
    """
    assert lint(code) == []


def test_function_called_from_a_guard_and_outside_it_is_unguarded():
    code = SAVE_PRELUDE + """
    def checkpoint(step):
        torch.save(model.state_dict(), f"{step}.pt")

    if dist.get_rank() == 0:
        checkpoint(0)
    checkpoint(1)
    dist.destroy_process_group()
    """
    assert got(lint(code)) == {(line_of(code, "torch.save"), "DDP004", "error")}


def test_paired_collectives_in_rank_branches_do_not_hang():
    code = """
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    t = torch.ones(1)
    if dist.get_rank() == 0:
        out = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.gather(t, gather_list=out)
    else:
        dist.gather(t)
    dist.destroy_process_group()
    """
    assert lint(code) == []


def test_subgroup_collective_under_rank_check_is_allowed():
    code = """
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    pair = dist.new_group([0, 1])
    t = torch.ones(1)
    if dist.get_rank() in (0, 1):
        dist.all_reduce(t, group=pair)
    dist.destroy_process_group()
    """
    assert lint(code) == []


def test_ddpkit_collective_under_is_main_hangs():
    code = """
    import ddpkit
    with ddpkit.init() as ctx:
        if ctx.is_main:
            ddpkit.barrier(ctx)
    """
    assert got(lint(code)) == {(line_of(code, "ddpkit.barrier"), "DDP010", "error")}


DDPKIT_PRELUDE = """
    import torch
    import ddpkit
    import ddpkit.parallel.comm
    with ddpkit.init() as ctx:
        model = ddpkit.wrap(torch.nn.Linear(2, 2), ctx)
        t = torch.ones(1)
        if ctx.rank == 0:
"""


@pytest.mark.parametrize("call, name", [
    ("ddpkit.init(seed=1)", "ddpkit.init"),
    ("ddpkit.wrap(torch.nn.Linear(2, 2), ctx)", "ddpkit.wrap"),
    ("ddpkit.export_state_dict(ctx, model, 'model.pt')", "ddpkit.export_state_dict"),
    ("ddpkit.save_checkpoint(ctx, 'ckpt', step=0, model=model)", "ddpkit.save_checkpoint"),
    ("ddpkit.load_checkpoint(ctx, 'ckpt', model=model)", "ddpkit.load_checkpoint"),
    ("ddpkit.parallel.comm.register_comm(model, 'bf16')", "ddpkit.parallel.comm.register_comm"),
    ("ddpkit.barrier(ctx)", "ddpkit.barrier"),
    ("ddpkit.all_reduce_sum(ctx, 1.0)", "ddpkit.all_reduce_sum"),
    ("ddpkit.reduce_mean(ctx, 1.0, 1)", "ddpkit.reduce_mean"),
    ("ddpkit.reduce_means(ctx, {'loss': 1.0}, 1)", "ddpkit.reduce_means"),
    ("ddpkit.all_gather_object(ctx, 1)", "ddpkit.all_gather_object"),
    ("ddpkit.collectives.broadcast_object(ctx, 1)", "ddpkit.collectives.broadcast_object"),
    ("ddpkit.gather_in_order(ctx, t, [0])", "ddpkit.gather_in_order"),
    ("ctx.close()", "ctx.close"),
    ("torch.distributed.fsdp.fully_shard(model)", "torch.distributed.fsdp.fully_shard"),
])
def test_every_ddpkit_collective_under_a_rank_check_hangs(call, name):
    code = DDPKIT_PRELUDE + f"            {call}  # here\n"
    (finding,) = lint(code)
    assert (finding.line, finding.rule, finding.severity) == (line_of(code, "# here"), "DDP010", "error")
    assert finding.message.startswith(f"{name}() is a collective that every rank must call")


def test_ddpkit_collectives_known_to_lint_match_ddpkit_docstrings():
    documented = {name for name in ddpkit.__all__ if callable(getattr(ddpkit, name))
                  and re.search(r"\bCollective\b", getattr(ddpkit, name).__doc__ or "")}
    assert documented <= _DDPKIT_COLLECTIVES
    assert set(ddpkit.collectives.__all__) <= _DDPKIT_COLLECTIVES
    assert {"init", "wrap", "save_checkpoint", "load_checkpoint", "export_state_dict"} <= _DDPKIT_COLLECTIVES
    assert "every rank must call it" in ddpkit.Context.close.__doc__ and "close" in _DDPKIT_METHODS["init"]
    assert not {"print0", "finish_run", "loader", "eval_loader", "unwrap", "latest_checkpoint"} & _DDPKIT_COLLECTIVES


def test_ddpkit_save_checkpoint_on_main_only_says_it_writes_from_rank_0():
    code = """
    import ddpkit
    with ddpkit.init() as ctx:
        model = ddpkit.wrap(object(), ctx)
        if ctx.is_main:
            ddpkit.save_checkpoint(ctx, "ckpt", step=0, model=model)
    """
    (finding,) = lint(code)
    assert (finding.line, finding.rule) == (line_of(code, "save_checkpoint"), "DDP010")
    assert "ddpkit.save_checkpoint()" in finding.message
    assert "on every rank" in finding.fix and "from rank 0 by itself" in finding.fix


def test_ddp010_fix_keeps_only_torch_save_and_printing_inside_the_check():
    torch_only = lint_file(FIXTURES / "bad_ddp010_collective_in_branch.py")
    assert torch_only and all("(torch.save, printing)" in f.fix and "save_checkpoint" not in f.fix for f in torch_only)
    with_ddpkit = lint(DDPKIT_PRELUDE + "            ddpkit.barrier(ctx)\n")
    assert [f.rule for f in with_ddpkit] == ["DDP010"]
    assert "(torch.save, printing)" in with_ddpkit[0].fix
    assert "ddpkit.save_checkpoint is a collective too and must run on every rank" in with_ddpkit[0].fix


def test_rank_zero_work_beside_ddpkit_collectives_is_clean():
    code = """
    import torch
    import ddpkit

    def log(ctx, text):
        if not ctx.is_main:
            return
        print(text)

    with ddpkit.init() as ctx:
        model = ddpkit.wrap(torch.nn.Linear(2, 2), ctx)
        ddpkit.save_checkpoint(ctx, "ckpt", step=1, model=model)
        loss = ddpkit.reduce_mean(ctx, 1.0, 1)
        if ctx.is_main:
            torch.save(ddpkit.unwrap(model).state_dict(), "model.pt")
            print(loss)
        log(ctx, loss)
    """
    assert lint(code) == []


HELPER_PRELUDE = """
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    rank = dist.get_rank()
    t = torch.ones(1)

    def sync_metric(x):
        dist.all_reduce(x)
        return x

    def evaluate(x):
        return sync_metric(x) * 2
"""


def test_collective_in_a_helper_called_under_a_rank_check_hangs():
    code = HELPER_PRELUDE + """
    if dist.get_rank() == 0:
        print(evaluate(t))
    dist.destroy_process_group()
    """
    (finding,) = lint(code)
    assert (finding.line, finding.rule, finding.severity) == (line_of(code, "print(evaluate"), "DDP010", "error")
    assert finding.message.startswith(f"evaluate() runs dist.all_reduce() (line {line_of(code, 'dist.all_reduce')})")
    assert f"rank check on line {line_of(code, 'if dist.get_rank')}" in finding.message
    assert finding.fix.startswith("call evaluate() on every rank")


@pytest.mark.parametrize("use", [
    "out = evaluate(t)",  # every rank
    "if rank == 0:\n    sync_metric(t)\nelse:\n    dist.all_reduce(t)",  # the other ranks meet it in the else
    "if rank != 0:\n    evaluate(t)\nif rank == 0:\n    sync_metric(t)",  # complementary checks
    "if rank == 0:\n    dist.all_reduce(t, group=dist.new_group([0]))",  # a subgroup
    "if rank == 0:\n    sync_metric(t)  # noqa: DDP010",
])
def test_helper_collectives_every_rank_reaches_are_clean(use):
    code = HELPER_PRELUDE + textwrap.indent(use, "    ") + "\n    dist.destroy_process_group()\n"
    assert lint(code) == []


def test_same_collective_under_two_rank_zero_checks_is_not_paired():
    code = HELPER_PRELUDE + """
    if rank == 0:
        sync_metric(t)  # first
    if dist.get_rank() == 0:
        dist.all_reduce(t)  # second
    dist.destroy_process_group()
    """
    assert got(lint(code)) == {(line_of(code, "# first"), "DDP010", "error"),
                               (line_of(code, "# second"), "DDP010", "error")}


def test_noqa_silences_one_rule_or_all():
    code = SAVE_PRELUDE + """
    torch.save(model.state_dict(), "m.pt")  # noqa: DDP004
    print("hi")  # noqa
    print("there")  # noqa: DDP004
    dist.destroy_process_group()
    """
    assert got(lint(code)) == {(line_of(code, '"there"'), "DDP008", "warning")}


def test_plain_script_is_not_linted_as_distributed():
    code = """
    import torch
    print("hello")
    torch.save({}, "x.pt")
    torch.load("x.pt")
    """
    assert lint(code) == []


# ---- command line ------------------------------------------------------------------------------
def test_main_exit_codes(capsys):
    assert main([str(FIXTURES / "good_torch_ddp.py")]) == 0
    assert main([str(FIXTURES / "bad_ddp001_no_set_epoch.py")]) == 1
    assert main([str(FIXTURES / "bad_ddp008_print_every_rank.py")]) == 0  # warnings only
    assert main([str(FIXTURES / "bad_ddp013_batchnorm.py")]) == 0  # a note only
    capsys.readouterr()


def test_main_text_output(capsys):
    path = FIXTURES / "bad_ddp004_save_every_rank.py"
    assert main([str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{path}:12:5: DDP004 error: torch.save runs on every rank")
    assert ". fix: " in out[0]
    assert out[-1] == "1 error in 1 file checked"


def test_main_json_output_parses(capsys):
    assert main(["--format", "json", str(FIXTURES / "bad_ddp005_load.py")]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["line"], r["rule"], r["severity"]) for r in records] == [
        (12, "DDP005", "warning"), (13, "DDP005", "warning")]
    assert set(records[0]) == {"path", "line", "col", "rule", "severity", "message", "fix"}


def test_main_directory_select_and_ignore(capsys):
    assert main(["--format", "json", str(FIXTURES)]) == 1
    every = json.loads(capsys.readouterr().out)
    assert {r["rule"] for r in every} == set(RULES) - {"DDP000"}
    assert main(["--format", "json", "--select", "DDP008,ddp013", str(FIXTURES)]) == 0
    assert {r["rule"] for r in json.loads(capsys.readouterr().out)} == {"DDP008", "DDP013"}
    assert main(["--format", "json", "--ignore", "DDP001,DDP004", str(FIXTURES)]) == 1
    assert {r["rule"] for r in json.loads(capsys.readouterr().out)} == set(RULES) - {"DDP000", "DDP001", "DDP004"}


def test_main_skips_hidden_directories(tmp_path, capsys):
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "bad.py").write_text("def broken(:\n")
    (tmp_path / "ok.py").write_text("x = 1\n")
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "no findings in 1 file checked"
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "broken.py").write_text("def broken(:\n")
    assert main([str(tmp_path)]) == 1
    assert "broken.py:1:" in capsys.readouterr().out


def test_main_usage_errors(tmp_path, capsys):
    missing = tmp_path / "nope.py"
    assert main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpkit lint: error: ") and str(missing) in err and "pass a .py file" in err
    assert main([]) == 2
    assert "no PATH given" in capsys.readouterr().err
    assert main(["--select", "DDP999", str(FIXTURES)]) == 2
    assert "unknown rule id DDP999" in capsys.readouterr().err
    assert main(["--format", "xml", str(FIXTURES)]) == 2
    capsys.readouterr()


def test_main_rejects_a_file_that_is_not_python(tmp_path, capsys):
    notes = tmp_path / "README.md"
    notes.write_text("# ddpkit — notes\n")
    assert main([str(notes)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"ddpkit lint: error: path {str(notes)!r} is not a Python file") and "pass a .py file" in err
    (tmp_path / "ok.py").write_text("x = 1\n")
    assert main([str(tmp_path)]) == 0  # a directory: its .py files only
    assert capsys.readouterr().out.strip() == "no findings in 1 file checked"


def test_list_rules(capsys):
    assert main(["--list-rules"]) == 0
    out = capsys.readouterr().out
    assert all(rule in out for rule in RULES)
