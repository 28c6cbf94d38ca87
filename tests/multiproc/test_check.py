"""`ddpkit check` end to end: each fault fixture is reported at its line; correct scripts pass (2 gloo ranks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[1] / "fixtures" / "check"


def _check(script: str, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ddpkit.cli", "check", *args, str(FIXTURES / script)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=FIXTURES)


def _line(script: str, text: str) -> int:
    lines = (FIXTURES / script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


@pytest.mark.timeout(170)
@pytest.mark.parametrize("script, kind, line_text, words", [
    ("bad_rank_local_grad.py", "grads", "opt.step()", "rank-local gradient"),
    ("bad_no_sync.py", "grads", "opt.step()", "inside no_sync()"),
    ("bad_no_sampler.py", "data-overlap", "for x, y in loader", "trained on"),
    ("bad_no_set_epoch.py", "data-order", "for x, y in loader", "same order"),
    ("bad_save_every_rank.py", "save", "torch.save(", "written by 2 ranks"),
    ("bad_eval_padding.py", "eval-padding", "for x, y in test_loader", "padded 1 duplicates"),
])
def test_each_fault_is_reported_at_its_line(script, kind, line_text, words):
    out = _check(script)
    assert out.returncode == 1, out.stdout + out.stderr
    site = f"{script}:{_line(script, line_text)}: [{kind}]"
    [finding] = [line for line in out.stdout.splitlines() if site in line]
    assert words in finding
    assert "fix: " in out.stdout


@pytest.mark.timeout(170)
def test_a_rank_only_collective_is_named_with_both_ranks():
    script = "bad_collective_branch.py"
    out = _check(script, "--hang-timeout", "5")
    assert out.returncode == 1, out.stdout + out.stderr
    line = _line(script, "dist.all_reduce(metric)")
    assert f"{script}:{line}: [collectives]" in out.stdout
    assert f"rank 0 all_reduce float32[] at {script}:{line}; rank 1 never issued it" in out.stdout


@pytest.mark.timeout(170)
@pytest.mark.parametrize("script", ["good_torch_cuda.py", "good_ddpkit.py"])
def test_correct_scripts_pass(script, tmp_path):
    out = _check(script)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no problems found" in out.stdout
    if script == "good_torch_cuda.py":  # written for CUDA/NCCL: mapped, and each mapping named
        assert f"'nccl' -> 'gloo' at {script}:{_line(script, 'init_process_group')}" in out.stdout
        assert f"device_ids= dropped (CPU) at {script}:{_line(script, 'device_ids=')}" in out.stdout
