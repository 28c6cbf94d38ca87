"""The watchdog keeps collectives that returned but have not finished (async Work, NCCL), and names the oldest."""

from __future__ import annotations

import os
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


def test_an_expected_wait_stops_the_clock_and_a_plain_one_does_not():
    # The barrier after rank 0's checkpoint write: the other ranks wait in a collective for minutes.
    fired = []
    dog = Watchdog(timeout_s=5, rank=1, world_size=2, on_hang=fired.append)
    call = tracer.Call(op="broadcast_object_list", shapes=[], site="train.py:40", index=3)
    dog.enter(call)
    with dog.expected_wait():
        dog.last_progress = time.monotonic() - 60
        dog.poll()
        assert fired == []
    dog.last_progress = time.monotonic() - 60
    dog.poll()
    assert len(fired) == 1 and fired[0]["blocked_in"] == "broadcast_object_list"


def test_save_checkpoint_waits_for_rank_0_as_an_expected_wait(tmp_path, monkeypatch):
    import torch

    import ddpkit
    from ddpkit.checkpoint import api
    from ddpkit.hang import watchdog

    seen = []
    dog = Watchdog(timeout_s=5, rank=0, world_size=1)
    monkeypatch.setattr(watchdog, "_active", [dog])
    real = api.broadcast_object
    monkeypatch.setattr(api, "broadcast_object", lambda ctx, obj: seen.append(dog._expected_waits) or real(ctx, obj))
    with ddpkit.init(device="cpu") as ctx:
        ddpkit.save_checkpoint(ctx, tmp_path, step=1, model=torch.nn.Linear(2, 2))
    assert seen == [1] and dog._expected_waits == 0


def test_oldest_unfinished_recorder_entry_is_a_pending_collective(monkeypatch):
    # DDP's reducer and FSDP2 issue collectives from C++: only torch's flight recorder sees them.
    from ddpkit import torchinternals
    from ddpkit.hang.flightrecorder import oldest_unfinished

    now = time.time_ns()
    entry = {"profiling_name": "nccl:all_reduce", "collective_seq_id": 812, "state": "started", "retired": False,
             "time_created_ns": now - 30 * 10**9, "input_sizes": [[1024]], "input_dtypes": ["Float"]}
    done = dict(entry, collective_seq_id=811, state="completed", time_created_ns=now - 40 * 10**9)
    records = [{"entries": [done, entry]}]
    assert oldest_unfinished(records, now)["op"] == "all_reduce"
    assert oldest_unfinished(records, now)["shapes"] == ["float32[1024]"]
    assert oldest_unfinished([{"entries": [done]}], now) is None
    monkeypatch.setattr(torchinternals, "flight_records", lambda: records)
    dog = Watchdog(timeout_s=5, rank=0, world_size=2)
    assert dog.blocked() == "unfinished all_reduce"  # outside any Python collective, not in backward
    line = describe(dog.report("test"))
    assert "oldest unfinished: all_reduce (float32[1024]) issued from C++, not Python" in line, line
    assert Watchdog(timeout_s=60, rank=0, world_size=2).blocked() is None  # 30 s old: not yet a hang


def test_the_watchdog_thread_queries_cuda_events_on_the_ranks_device(monkeypatch):
    # A new thread's current device is cuda:0: a CUDA call there makes a context on GPU 0 for every rank.
    import threading

    import torch
    from simcuda import FakeEvent

    current = {"main": 3}
    calls = []

    def device_now():
        return current.get(threading.current_thread().name, 0)

    def set_device(d):
        calls.append(("set_device", threading.current_thread().name, d))
        current[threading.current_thread().name] = d

    class Event(FakeEvent):
        def query(self):
            calls.append(("query", threading.current_thread().name, device_now()))
            return False

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_device", device_now)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    current[threading.main_thread().name] = 3
    dog = Watchdog(timeout_s=5, rank=3, world_size=4)
    call = tracer.Call(op="all_reduce", shapes=["float32[4]"], site="train.py:9", index=0, on_cuda=True)
    dog.enter(call)
    dog.exit(call)
    worker = threading.Thread(target=dog.num_unfinished, name="ddpkit-hang-watchdog")
    worker.start()
    worker.join()
    queries = [c for c in calls if c[0] == "query" and c[1] == "ddpkit-hang-watchdog"]
    assert queries and all(device == 3 for _, _, device in queries), calls


def test_hang_timeout_leaves_cuda_untouched_before_the_users_script(tmp_path, monkeypatch):
    # A script may still set CUDA_VISIBLE_DEVICES itself: CUDA reads it once, when it first initialises.
    import torch

    from ddpkit import bootstrap
    from ddpkit.hang.watchdog import running_watchdog

    touched = []
    for name in ("is_available", "device_count", "init", "current_device"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, _n=name, **k: touched.append(_n) or 0)
    script = tmp_path / "script.py"
    script.write_text("import os\nopen(os.path.join(os.path.dirname(__file__), 'ran'), 'w').close()\n")
    monkeypatch.setattr("sys.argv", [str(script)])
    try:
        assert bootstrap.main(["--hang-timeout", "30", "--report-dir", str(tmp_path / "reports"), str(script)]) == 0
    finally:
        running_watchdog().stop()
    assert (tmp_path / "ran").exists() and touched == []
    assert os.environ.get("TORCH_FR_BUFFER_SIZE")  # the recorder is on for whatever backend the script picks
