"""Hang forensics: a rank that skips an all_reduce ends the run within the hang timeout, with a summary."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import run_ranks

FIXTURE = Path(__file__).parents[1] / "fixtures" / "check" / "hang_skip_allreduce.py"


def _line(text: str) -> int:
    return next(i for i, line in enumerate(FIXTURE.read_text().splitlines(), 1) if text in line)


@pytest.mark.timeout(90)
def test_ddpkit_run_hang_timeout_prints_one_line_per_rank_and_fails():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", "--hang-timeout", "5",
                          FIXTURE.name], capture_output=True, text=True, timeout=60, env=env, cwd=FIXTURE.parent)
    elapsed = time.monotonic() - start
    assert out.returncode != 0
    summary = [line for line in out.stderr.splitlines() if line.startswith("ddpkit run:   rank")]
    assert len(summary) == 2, out.stderr
    name = FIXTURE.name
    assert summary[0].startswith(f"ddpkit run:   rank 0 waiting in all_reduce (float32[4]) at "
                                 f"{name}:{_line('HANG-ALLREDUCE')}")
    assert summary[1].startswith(f"ddpkit run:   rank 1 waiting in barrier at {name}:{_line('HANG-BARRIER')}")
    assert "hang detected (--hang-timeout 5 s)" in out.stderr
    assert elapsed < 45, f"took {elapsed:.0f} s"


def _skip_all_reduce(info, hang_timeout_s):
    import torch
    import torch.distributed as dist

    with info.init(hang_timeout_s=hang_timeout_s):
        t = torch.ones(3)
        if info.rank == 0:
            dist.all_reduce(t)  # rank 1 skips it and waits in the barrier below
        dist.barrier()
    return "finished"


@pytest.mark.timeout(60)
def test_init_hang_timeout_ends_a_hung_job():
    start = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        run_ranks(_skip_all_reduce, 2, 3.0, timeout=40)
    assert time.monotonic() - start < 35
    message = str(failure.value)
    # One rank's watchdog fires first and exits with its code (124); the other's collective then
    # fails, or its own watchdog fires too. Which rank is first depends on the machine's load:
    # either way no rank is left waiting for the process-group timeout.
    ended = {r: f"rank {r}: no result (exit code 124)" in message for r in (0, 1)}
    assert any(ended.values()), message
    assert all(ended[r] or f"rank {r} raised" in message for r in (0, 1)), message


def _healthy(info, hang_timeout_s):
    import torch
    import torch.distributed as dist

    with info.init(hang_timeout_s=hang_timeout_s):
        t = torch.ones(3)
        for _ in range(5):
            dist.all_reduce(t)
            time.sleep(0.3)  # longer gaps in total than the timeout, but never blocked that long
        return t.tolist()


@pytest.mark.timeout(60)
def test_init_hang_timeout_leaves_a_healthy_job_alone():
    assert run_ranks(_healthy, 2, 1.0, timeout=40) == [[32.0] * 3] * 2


ASYNC = FIXTURE.parent / "hang_async_wait.py"


@pytest.mark.timeout(90)
def test_hang_in_an_async_collective_names_the_line_that_issued_it():
    """gloo with async_op=True stands in for NCCL, whose collectives all return before they finish."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", "--hang-timeout", "5",
                          ASYNC.name], capture_output=True, text=True, timeout=60, env=env, cwd=ASYNC.parent)
    assert out.returncode != 0
    summary = [line for line in out.stderr.splitlines() if line.startswith("ddpkit run:   rank")]
    assert len(summary) == 2, out.stderr
    lines = ASYNC.read_text().splitlines()
    at = {tag: next(i for i, line in enumerate(lines, 1) if tag in line)
          for tag in ("ASYNC-ISSUE", "ASYNC-WAIT", "ASYNC-BARRIER")}
    name = ASYNC.name
    assert summary[0].startswith(f"ddpkit run:   rank 0 waiting at {name}:{at['ASYNC-WAIT']}; oldest unfinished: "
                                 f"all_reduce (float32[4]) issued at {name}:{at['ASYNC-ISSUE']} "), out.stderr
    assert summary[1].startswith(f"ddpkit run:   rank 1 waiting in barrier at {name}:{at['ASYNC-BARRIER']}"), out.stderr


CPP = FIXTURE.parent / "hang_cpp_collective.py"


@pytest.mark.timeout(90)
def test_hang_in_a_collective_python_never_issued_is_seen_through_the_flight_recorder():
    """DDP's gradient all-reduces and FSDP2's collectives are issued from C++: the tracer never sees
    them. On NCCL the rank blocks later, outside any collective; the flight recorder still has them."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", "--hang-timeout", "4",
                          CPP.name], capture_output=True, text=True, timeout=60, env=env, cwd=CPP.parent)
    assert out.returncode != 0
    summary = [line for line in out.stderr.splitlines() if line.startswith("ddpkit run:   rank")]
    assert len(summary) == 2, out.stderr
    wait = next(i for i, line in enumerate(CPP.read_text().splitlines(), 1) if "CPP-WAIT" in line)
    assert summary[0].startswith(f"ddpkit run:   rank 0 waiting at {CPP.name}:{wait}; oldest unfinished: "
                                 "all_reduce (float32[4]) issued from C++, not Python (DDP's gradient all-reduce or "
                                 "FSDP's collectives; seen by the flight recorder) "), out.stderr
