"""`ddpkit run` end to end: real torchrun, real ranks, real failures."""

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

SCRIPT = str(Path(__file__).parent / "scripts" / "tiny_train.py")
ROOT = Path(__file__).resolve().parents[2]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _run(args, timeout=120, **kw):
    return subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env(), **kw)


def _ranks(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _assert_gone(pids):
    time.sleep(0.5)
    alive = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"orphaned rank processes: {alive}"


def _workers_of(token: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and token in " ".join(p.info["cmdline"])
            and "ddpkit.cli" not in " ".join(p.info["cmdline"])]


def test_two_ranks_train_and_args_pass_through(tmp_path):
    proc = _run(["--nproc-per-node", "2", SCRIPT, "--out", str(tmp_path), "a", "--", "b"])
    assert proc.returncode == 0, proc.stderr
    ranks = _ranks(tmp_path)
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert ranks[0]["extra"] == ["a", "b"]
    assert ranks[0]["sha"] == ranks[1]["sha"]
    # clean teardown: no "destroy_process_group() was not called" warning, no abort
    assert "destroy_process_group" not in proc.stderr and "terminate called" not in proc.stderr


def test_crashing_rank_fails_fast_with_traceback_and_no_orphans(tmp_path):
    start = time.monotonic()
    proc = _run(["--nproc-per-node", "2", SCRIPT, "--crash-rank", "1", "--sleep", "60", "--out", str(tmp_path)])
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert elapsed < 45, f"took {elapsed:.0f}s to notice the crash"
    assert "ValueError: deliberate failure on rank 1" in proc.stderr
    assert "Traceback" in proc.stderr
    assert "ddpkit run: rank 1 (local rank 1" in proc.stderr
    assert not _workers_of(SCRIPT + " --crash-rank")
    assert "lost the ranks" not in proc.stderr  # one node: the peer's closed connection is only an echo


@pytest.mark.parametrize("attempt", range(3))  # the abort it replaces happened in about 1 run of 4
def test_crash_without_a_with_block_is_summarised_not_aborted(tmp_path, attempt):
    proc = _run(["--nproc-per-node", "2", SCRIPT, "--no-with", "--crash-rank", "1", "--out", str(tmp_path)])
    assert proc.returncode == 1
    summary = [line for line in proc.stderr.splitlines() if line.startswith("ddpkit run: rank 1 ")]
    assert summary and summary[0].endswith("failed with exit code 1: ValueError: deliberate failure on rank 1"), \
        proc.stderr[-3000:]
    assert "terminate called" not in proc.stderr and "SIGABRT" not in proc.stderr


def test_ctrl_c_stops_every_rank(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", SCRIPT,
                             "--sleep", "120", "--out", str(tmp_path)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = [r["pid"] for r in _ranks(tmp_path)]
        assert len(pids) == 2, "ranks did not start"
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    _assert_gone(pids)


def test_two_jobs_at_once_do_not_collide(tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = []
    for out in outs:
        out.mkdir()
        procs.append(subprocess.Popen([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", SCRIPT,
                                       "--out", str(out)], env=_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    assert all(len(_ranks(out)) == 2 for out in outs)


def test_module_mode_runs(tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(Path(SCRIPT).read_text())
    proc = _run(["--nproc-per-node", "2", "-m", "mypkg.train", "--out", str(tmp_path)], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(_ranks(tmp_path)) == 2


def test_same_script_runs_under_plain_torchrun(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           SCRIPT, "--out", str(tmp_path)], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    assert [r["world_size"] for r in _ranks(tmp_path)] == [2, 2]


@pytest.mark.timeout(400)
def test_main_job_reaches_accuracy_on_two_ranks_and_runs_alone():
    digits = str(ROOT / "examples" / "digits.py")
    proc = _run(["--nproc-per-node", "2", digits, "--run-dir", ""], timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["world_size"] == 2 and result["test_accuracy"] >= 0.97
    assert len(result["param_sha256"]) == 64
    alone = subprocess.run([sys.executable, digits, "--run-dir", "", "--epochs", "2"], capture_output=True,
                           text=True, timeout=300, env=_env())
    assert alone.returncode == 0, alone.stderr
    assert json.loads(alone.stdout.strip().splitlines()[-1])["world_size"] == 1
