"""Preemption with real ranks: a signal to one rank or to `ddpkit run` stops every rank at one step, saved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from harness import RankInfo, run_ranks

ROOT = Path(__file__).resolve().parents[2]
DIGITS = str(ROOT / "examples" / "digits.py")


def _signal_one_rank(info: RankInfo, signal_rank: int, at_step: int):
    import ddpkit

    with info.init(device="cpu") as ctx:
        loader = ddpkit.loader(torch.utils.data.TensorDataset(torch.arange(64.0)), ctx, batch_size=2)
        steps = 0
        for _ in loader:
            steps += 1
            if ctx.rank == signal_rank and steps == at_step:
                os.kill(os.getpid(), signal.SIGUSR1)
        return steps, ctx.should_stop(), ctx.stop_signal, loader.state_dict()


def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step() -> None:
    results = run_ranks(_signal_one_rank, 2, 1, 5, timeout=180)
    assert results[0] == results[1]
    steps, stopped, signum, state = results[0]
    # caught during step 5, all-reduced at step 5's end, read at step 6's: one step later, on every rank
    assert stopped and signum == signal.SIGUSR1 and steps == 6 and state["samples_seen"] == 6 * 4


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _digits(ckpt: Path, run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", DIGITS, "--checkpoint-dir",
            str(ckpt), "--save-every", "100000", "--epochs", "20", "--run-dir", str(run_dir)]


def _result(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


@pytest.mark.timeout(2400)
def test_sigterm_to_ddpkit_run_saves_the_step_and_a_rerun_ends_bit_identical(tmp_path: Path) -> None:
    from ddpkit.checkpoint.api import latest_checkpoint

    whole = subprocess.run(_digits(tmp_path / "whole", tmp_path / "whole-run"), capture_output=True, text=True,
                           timeout=1500, env=_env())
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = _result(whole.stdout)

    ckpt, run_dir = tmp_path / "ckpt", tmp_path / "run"
    out, err = open(tmp_path / "stdout", "w+"), open(tmp_path / "stderr", "w+")  # files: a full pipe would block it
    proc = subprocess.Popen(_digits(ckpt, run_dir), stdout=out, stderr=err, text=True, env=_env())
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "metrics.jsonl").is_file() or not (run_dir / "metrics.jsonl").read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first epoch"
            time.sleep(0.5)
        ranks = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        err.close()
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert took < 30, f"ddpkit run took {took:.1f} s to exit after SIGTERM"
    assert "stopped by SIGTERM" in stderr
    stopped = _result(stdout)
    assert stopped["stopped_by_signal"] == signal.SIGTERM
    assert 0 < stopped["steps"] < expected["steps"]
    latest = latest_checkpoint(ckpt)
    assert latest is not None and str(stopped["steps"]) in latest.name
    time.sleep(0.5)
    assert not [pid for pid in ranks if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]

    rerun = subprocess.run(_digits(ckpt, run_dir), capture_output=True, text=True, timeout=1500, env=_env())
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed = _result(rerun.stdout)
    assert resumed["resumed_from_step"] == stopped["steps"]
    assert resumed["param_sha256"] == expected["param_sha256"]


def test_sigusr1_to_one_rank_under_ddpkit_run_stops_all_with_its_exit_code(tmp_path: Path) -> None:
    job = str(Path(__file__).parent / "scripts" / "stop_job.py")
    proc = subprocess.Popen([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", job, str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        deadline = time.monotonic() + 240
        while len(list(tmp_path.glob("rank*.pid"))) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        time.sleep(1.0)  # some steps in
        os.kill(int((tmp_path / "rank1.pid").read_text()), signal.SIGUSR1)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGUSR1, stderr[-3000:]
    assert "the ranks stopped at a step boundary after a signal (exit code 138)" in stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and ranks[0]["signal"] == signal.SIGUSR1 and 0 < ranks[0]["step"] < 5000
