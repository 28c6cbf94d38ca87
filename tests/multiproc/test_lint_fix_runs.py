"""A script `ddpkit lint --fix` rewrote still runs: fixed, then run on 2 gloo ranks under `ddpkit check`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "fixtures" / "lint" / "fixable" / "train_fixable.py"


def _ddpkit(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ddpkit.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


@pytest.mark.timeout(200)
def test_fixed_script_runs_under_check(tmp_path):
    script = tmp_path / SCRIPT.name
    shutil.copy(SCRIPT, script)
    before = _ddpkit("lint", "--format", "json", script.name, cwd=tmp_path, timeout=60)
    assert before.returncode == 1 and '"DDP002"' in before.stdout and '"DDP003"' in before.stdout
    fixed = _ddpkit("lint", "--fix", script.name, cwd=tmp_path, timeout=60)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert fixed.stdout.strip() == "no findings in 1 file checked"
    out = _ddpkit("check", script.name, cwd=tmp_path, timeout=170)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no problems found" in out.stdout
    assert (tmp_path / "final.pt").exists()
