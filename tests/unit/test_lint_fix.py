"""Tests of `ddpkit lint --fix` and `--diff`: the rewrites, what they leave alone, idempotence, the CLI."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from ddpkit.lint import lint_sources, main
from ddpkit.lint.fixes import FIXABLE, fix_source

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "lint"
FIXABLE_FIXTURES = sorted(p for p in FIXTURES.glob("bad_*.py") if re.match(r"bad_(ddp00[123579]|ddp011)", p.stem))
LEFT = {  # findings --fix leaves on purpose: no safe mechanical rewrite
    "bad_ddp002_kwargs": {("DDP002", "loader_kwargs = dict(")},
    "bad_ddp002_kwargs_update": {("DDP002", "cuda_kwargs = {")},
    "bad_ddp001_epoch_rank0": {("DDP001", "sampler.set_epoch(epoch)")},
    "bad_ddp001_sampler_alias": {("DDP001", "sampler=make(train_set)")},  # the loader may hold no such sampler
    # the sampler's loader is picked from a dict by key: no loop over a loader built on it by name
    "bad_ddp001_unread_loader_key": {("DDP001", 'samplers = {"train": DistributedSampler')},
    "bad_ddp005_load": {("DDP005", "extra = torch.load(")},
    "bad_ddp007_launch": {("DDP007", "import torch.distributed.launch  #"),
                          ("DDP007", 'command = f"python -m torch.distributed.launch')},
}


def _fixed(path: Path) -> tuple[str, str]:
    source = path.read_text()
    return source, fix_source({str(path): source})[str(path)]


@pytest.mark.parametrize("path", FIXABLE_FIXTURES, ids=lambda p: p.stem)
def test_fix_silences_its_rules_and_is_idempotent(path):
    source, fixed = _fixed(path)
    compile(fixed, path.name, "exec")
    left = {(f.rule, fixed.splitlines()[f.line - 1]) for f in lint_sources({str(path): fixed}) if f.rule in FIXABLE}
    expected = LEFT.get(path.stem, set())
    assert {(rule, next(line for line in fixed.splitlines() if text in line)) for rule, text in expected} == left
    assert fix_source({str(path): fixed})[str(path)] == fixed
    if path.stem not in ("bad_ddp002_kwargs", "bad_ddp002_kwargs_update", "bad_ddp001_epoch_rank0",
                         "bad_ddp001_sampler_alias",
                         "bad_ddp001_unread_loader_key"):
        assert fixed != source


@pytest.mark.parametrize("path", FIXABLE_FIXTURES, ids=lambda p: p.stem)
def test_fix_keeps_comments_and_untouched_lines(path):
    source, fixed = _fixed(path)
    comments = [line.split("#", 1)[1] for line in source.splitlines() if "#" in line and '"' not in line.split("#")[0]]
    assert all(c in fixed for c in comments)
    kept = set(fixed.splitlines())
    changed = [line for line in source.splitlines() if line not in kept]
    assert len(changed) <= 4  # only the statements the fixes touch


def test_fix_rewrites_each_pattern():
    source = textwrap.dedent('''\
        import argparse
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int)
        args = parser.parse_args()
        dist.init_process_group("gloo")
        torch.manual_seed(dist.get_rank())
        data = TensorDataset(torch.randn(8, 2))
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=2, sampler=sampler, shuffle=True, static_graph=True)
        model = DDP(torch.nn.Linear(2, 1))  # keep this comment
        state = torch.load("init.pt")
        device = torch.cuda.device(args.local_rank)
        x = torch.zeros(1).to(device)
        for epoch in range(2):
            for (batch,) in loader:
                pass
        ''')
    fixed = fix_source({"t.py": source})["t.py"]
    assert 'parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))' in fixed
    assert "import os\n" in fixed
    assert "loader = DataLoader(data, batch_size=2, sampler=sampler)\n" in fixed
    assert "model = DDP(torch.nn.Linear(2, 1), static_graph=True)  # keep this comment\n" in fixed
    assert 'state = torch.load("init.pt", map_location="cpu")' in fixed
    assert 'device = torch.device("cuda", args.local_rank)' in fixed
    assert "for epoch in range(2):\n    loader.sampler.set_epoch(epoch)\n    for (batch,) in loader:" in fixed
    assert fixed.endswith("dist.destroy_process_group()\n")
    assert not [f for f in lint_sources({"t.py": fixed}) if f.rule in FIXABLE]


def test_destroy_is_not_added_where_the_run_does_not_clearly_end():
    source = textwrap.dedent('''\
        import os
        import torch
        import torch.distributed as dist

        if "RANK" in os.environ:
            dist.init_process_group("gloo")
        torch.manual_seed(0)
        ''')
    assert fix_source({"t.py": source})["t.py"] == source
    assert "DDP009" in {f.rule for f in lint_sources({"t.py": source})}


def test_from_import_destroy_is_imported():
    source = textwrap.dedent('''\
        import torch
        from torch.distributed import init_process_group


        def main():
            init_process_group("gloo")
            torch.manual_seed(0)


        main()
        ''')
    fixed = fix_source({"t.py": source})["t.py"]
    assert "from torch.distributed import init_process_group, destroy_process_group" in fixed \
        or "from torch.distributed import destroy_process_group" in fixed
    assert "    torch.manual_seed(0)\n    destroy_process_group()\n" in fixed
    compile(fixed, "t.py", "exec")


def test_cli_diff_prints_and_writes_nothing(tmp_path, capsys):
    script = tmp_path / "train.py"
    shutil.copy(FIXTURES / "bad_ddp009_no_destroy.py", script)
    before = script.read_text()
    assert main(["--diff", str(script)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"--- {script}\n+++ {script}\n") and "+dist.destroy_process_group()" in out
    assert script.read_text() == before


def test_cli_fix_writes_and_reports_what_is_left(tmp_path, capsys):
    script = tmp_path / "train.py"
    shutil.copy(FIXTURES / "bad_ddp005_load.py", script)
    assert main(["--fix", str(script)]) == 0
    out = capsys.readouterr().out
    assert 'torch.load("ckpt.pt", map_location="cpu")' in script.read_text()
    assert "weights_only=False" in out and out.count("DDP005") == 1
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file, none left behind
    assert main(["--fix", str(script)]) == 0
    assert capsys.readouterr().out == out  # nothing more to change
