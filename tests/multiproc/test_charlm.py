"""examples/charlm.py: its pieces, a tiny in-process run that learns, a 2-rank `ddpkit run` + `ddpkit plot`."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "charlm.py"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "32", "--global-batch-size", "16",
        "--accumulation-steps", "2", "--data-bytes", "60000", "--val-bytes", "6000", "--warmup-steps", "3",
        "--lr", "5e-3", "--log-every", "5", "--eval-batch-size", "32"]


def _charlm():
    spec = importlib.util.spec_from_file_location("charlm_example", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_warmup_cosine_schedule():
    f = _charlm().warmup_cosine
    values = [f(s, warmup=4, total=20, min_ratio=0.1) for s in range(24)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(values[3:], values[4:]))  # non-increasing after warmup
    assert values[20] == pytest.approx(0.1) and values[23] == pytest.approx(0.1)


def test_held_out_text_is_whole_other_files():
    train, val = _charlm().stdlib_text(200_000, 20_000)
    assert len(train) == 200_000 and len(val) == 20_000
    # Validation windows are not in the training text (the split is by file, not by offset).
    assert val[1000:1200] not in train


@pytest.mark.timeout(300)
def test_tiny_run_learns_in_process(tmp_path):
    result = _charlm().main([*TINY, "--max-steps", "30", "--eval-every", "15", "--run-dir", str(tmp_path)])
    assert result["world_size"] == 1 and result["steps"] == 30 and result["skipped_steps"] == 0
    assert result["optimizer"] == "AdamW"
    assert result["val_bpc_start"] > 7.0  # about log2(256) = 8 bits before training
    assert result["val_bpc"] < result["val_bpc_start"] - 2.0
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "val_bpc" in line] == [0, 15, 30]
    losses = [line["loss"] for line in lines if "loss" in line]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert all(line["grad_norm"] > 0 for line in lines if "grad_norm" in line)


@pytest.mark.timeout(400)
def test_two_rank_run_then_ddpkit_plot(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", str(SCRIPT), *TINY,
           "--max-steps", "20", "--eval-every", "10", "--run-dir", str(run_dir), "--strategy", "fsdp"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=360, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["world_size"] == 2 and result["steps"] == 20 and result["strategy"] == "fsdp"
    assert result["val_bpc"] < result["val_bpc_start"] - 1.0
    plots = tmp_path / "plots"
    proc = subprocess.run([sys.executable, "-m", "ddpkit.cli", "plot", str(run_dir), "--out", str(plots)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    written = sorted(Path(line).name for line in proc.stdout.split())
    assert written == ["eval.png", "loss.png", "throughput.png"]
    for name in written:
        data = (plots / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, name
