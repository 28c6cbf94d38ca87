"""`ddpkit test` end to end on 2 CPU ranks: every check passes, the JSON is complete, a real failure exits 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _ddpkit_test(*args: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ddpkit.cli", "test", "--nproc-per-node", "2", *args],
                          capture_output=True, text=True, timeout=240, env=env, cwd=cwd)


@pytest.mark.timeout(300)
def test_ddpkit_test_passes_on_two_cpu_ranks_and_reports_json(tmp_path):
    out = _ddpkit_test("--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)  # stdout holds the JSON only: the ranks print to stderr
    assert report["ok"] is True and report["world_size"] == 2 and report["device"] == "cpu"
    assert report["backend"] == "gloo" and report["link"].startswith("shared memory / loopback")
    names = [c["name"] for c in report["checks"]]
    assert names == ["rendezvous", "all-reduce", "bus bandwidth", "DDP equivalence", "batches to device",
                     "mixed precision", "checkpoint round trip", "skipped collective", "teardown"]
    assert all(c["ok"] and c["failed_ranks"] == [] for c in report["checks"]), report["checks"]
    assert "reported after" in next(c["detail"] for c in report["checks"] if c["name"] == "skipped collective")
    assert len(report["bandwidth"]) == 3
    for row in report["bandwidth"]:
        assert row["busbw_gbps"] > 0 and row["busbw_gbps"] == pytest.approx(row["algbw_gbps"], abs=1e-3)  # 2(n-1)/n = 1
    assert report["seconds"] < 200


@pytest.mark.timeout(300)
def test_ddpkit_test_fails_when_a_check_fails(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoint directory should be")
    out = _ddpkit_test("--checkpoint-dir", str(blocker), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    rows = {line.split("  ")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("  ")
            and ("  ok  " in line or "  FAIL  " in line)}
    assert "  FAIL  " in rows["checkpoint round trip"] and str(blocker) in rows["checkpoint round trip"]
    assert "  ok  " in rows["teardown"] and "  ok  " in rows["all-reduce"]
    assert "FAILED: checkpoint round trip" in out.stdout
