"""torchrun's flags through a real `ddpkit run`: --log-dir with --redirects writes one log per rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = str(Path(__file__).parent / "scripts" / "tiny_train.py")


def test_log_dir_and_redirects_give_per_rank_log_files(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    proc = subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", "--log-dir", str(logs),
                           "--redirects", "3", SCRIPT, "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    stdout_logs = sorted(logs.glob("*/attempt_0/*/stdout.log"))
    stderr_logs = sorted(logs.glob("*/attempt_0/*/stderr.log"))
    assert [p.parent.name for p in stdout_logs] == ["0", "1"] and [p.parent.name for p in stderr_logs] == ["0", "1"]
    assert len(list(tmp_path.glob("rank*.json"))) == 2  # both ranks ran to the end
