"""Collective tracing and the hang watchdog's reports, in one process (no process group, no exits)."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from ddpkit.hang import tracer
from ddpkit.hang.watchdog import Watchdog, collect_reports, describe, summarize


class _Calls:
    def __init__(self):
        self.entered, self.exited = [], []

    def enter(self, call):
        self.entered.append(call)

    def exit(self, call):
        self.exited.append(call)


def test_tracer_reports_op_shape_and_the_callers_line_then_restores():
    import torch
    import torch.distributed as dist

    original = dist.all_reduce
    calls = _Calls()
    tracer.install(calls)
    try:
        line = sys._getframe().f_lineno + 2
        with pytest.raises((ValueError, RuntimeError)):  # no process group: torch refuses after we record
            dist.all_reduce(torch.ones(2, 3))
    finally:
        tracer.uninstall(calls)
    assert dist.all_reduce is original
    [call] = calls.entered
    assert calls.exited == [call]
    assert (call.op, call.shapes) == ("all_reduce", ["float32[2, 3]"])
    assert call.site.endswith(f"test_check_watchdog.py:{line}")


def _report(rank, **kw):
    base = {"rank": rank, "world_size": 2, "collective": None, "site": "train.py:91", "blocked_in": None}
    return {**base, **kw}


def test_describe_names_the_collective_backward_or_the_line():
    waiting = _report(1, collective={"op": "all_reduce", "shapes": ["float32[4]"], "site": "train.py:88",
                                     "waiting_s": 5.0})
    assert describe(waiting) == "rank 1 waiting in all_reduce (float32[4]) at train.py:88 for 5 s"
    assert describe(_report(0)) == "rank 0 at train.py:91, not in a collective"
    assert "backward" in describe(_report(0, blocked_in="backward"))


def test_collect_reports_takes_the_last_attempt_and_summarize_names_silent_ranks(tmp_path):
    for attempt, rank in ((0, 0), (0, 1), (1, 1)):
        folder = tmp_path / f"attempt-{attempt}"
        folder.mkdir(exist_ok=True)
        (folder / f"rank-{rank}.json").write_text(json.dumps(_report(rank, site=f"a{attempt}.py:1")))
    reports = collect_reports(tmp_path)
    assert sorted(reports) == [1] and reports[1]["site"] == "a1.py:1"
    lines = summarize(reports)
    assert lines[0].startswith("rank 0 wrote no report") and lines[1] == "rank 1 at a1.py:1, not in a collective"


def test_watchdog_sees_the_main_thread_in_a_collective_and_reports_its_stack():
    dog = Watchdog(timeout_s=60, rank=0, world_size=2)
    assert dog.blocked() is None
    call = tracer.Call(op="broadcast", shapes=[], site="train.py:7", index=3)
    dog.enter(call)
    out = {}
    worker = threading.Thread(target=lambda: out.update(dog.report("test")))
    worker.start()
    worker.join()
    assert dog.blocked() == "broadcast"
    assert out["collective"]["site"] == "train.py:7" and out["collective"]["index"] == 3
    assert any("test_check_watchdog.py" in line for line in out["stack"])
    before = dog.last_progress
    time.sleep(0.01)
    dog.exit(call)
    assert dog.current is None and dog.last_progress > before


def test_watchdog_rejects_a_non_positive_timeout():
    with pytest.raises(ValueError, match="hang timeout 0"):
        Watchdog(timeout_s=0, rank=0, world_size=1)
