"""The watchdog keeps collectives that returned but have not finished (async Work, NCCL), and names the oldest."""

from __future__ import annotations

import time

from ddpkit.hang import tracer
from ddpkit.hang.flightrecorder import enable, recorder_env, summarize_record
from ddpkit.hang.watchdog import Watchdog, describe


class _LateWork:
    """An asynchronous Work that completes when the test says so (as NCCL's do, long after the call returned)."""

    def __init__(self):
        self.done = False

    def is_completed(self):
        return self.done


def _issue(dog: Watchdog, op: str, site: str, index: int, result, started: float) -> tracer.Call:
    call = tracer.Call(op=op, shapes=["float32[4]"], site=site, index=index, start=started)
    dog.enter(call)
    call.result = result
    dog.exit(call)
    return call


def test_oldest_unfinished_collective_is_reported_until_it_completes():
    dog = Watchdog(timeout_s=5, rank=1, world_size=2)
    first, second = _LateWork(), _LateWork()
    long_ago = time.monotonic() - 30
    _issue(dog, "all_reduce", "train.py:10", 0, first, long_ago)
    _issue(dog, "broadcast", "train.py:11", 1, second, long_ago + 1)
    _issue(dog, "barrier", "train.py:12", 2, None, long_ago + 2)  # finished on return (gloo, sync): not kept
    assert [c.site for c, _ in dog.pending] == ["train.py:10", "train.py:11"]
    assert dog.blocked() == "unfinished all_reduce"  # older than the timeout: a hang even outside any collective
    report = dog.report("test")
    assert report["unfinished"]["site"] == "train.py:10" and report["num_unfinished"] == 2
    line = describe(report)
    assert "oldest unfinished: all_reduce (float32[4]) issued at train.py:10 " in line, line
    first.done = True
    assert dog.oldest_unfinished().site == "train.py:11"
    second.done = True
    assert dog.oldest_unfinished() is None and dog.blocked() is None
    assert "oldest unfinished" not in describe(dog.report("test"))


def test_a_young_unfinished_collective_is_not_a_hang():
    dog = Watchdog(timeout_s=60, rank=0, world_size=2)
    _issue(dog, "all_reduce", "train.py:10", 0, _LateWork(), time.monotonic())
    assert dog.blocked() is None


def test_flight_recorder_summary_names_the_first_collective_not_completed():
    record = {"entries": [
        {"profiling_name": "nccl:all_reduce", "collective_seq_id": 7, "state": "completed", "input_sizes": [[4]]},
        {"profiling_name": "nccl:all_reduce", "collective_seq_id": 8, "state": "started", "input_sizes": [[1024]]},
        {"profiling_name": "nccl:broadcast", "collective_seq_id": 9, "state": "scheduled", "input_sizes": [[2]]},
    ]}
    summary = summarize_record(record)
    assert summary["first_pending"]["seq"] == 8 and summary["last_completed"]["seq"] == 7
    assert summary["line"] == "all_reduce #8 started, sizes [[1024]] (last completed #7)"
    report = {"rank": 0, "collective": None, "site": "train.py:40", "blocked_in": "unfinished all_reduce",
              "unfinished": {"op": "all_reduce", "shapes": [], "site": "train.py:30", "index": 3, "waiting_s": 9},
              "flight_recorder": summary}
    assert describe(report).endswith("; NCCL flight recorder: all_reduce #8 started, sizes [[1024]] (last completed #7)")
    assert summarize_record(None) is None


def test_flight_recorder_switches_keep_the_users_own_settings():
    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}
    added = enable("/tmp/reports", environ)
    assert environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "50" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in added
    assert environ["TORCH_FR_BUFFER_SIZE"] == recorder_env()["TORCH_FR_BUFFER_SIZE"]
    assert environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"].startswith("/tmp/reports/")
