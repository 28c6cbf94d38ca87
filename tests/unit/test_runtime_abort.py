"""Context.abort() aborts the process group; it never waits for in-flight collectives as destroy does."""

from __future__ import annotations

import threading

import torch

from ddpkit.env import LaunchEnv
from ddpkit.runtime import Context


def test_abort_does_not_wait_for_in_flight_work(monkeypatch):
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    in_flight = threading.Event()  # a collective a dead peer will never finish
    calls = []

    def destroy(group=None):
        # what destroy_process_group does under NCCL since torch 2.6: wait for the work in flight
        calls.append("destroy")
        in_flight.wait(timeout=5)
        raise TimeoutError("destroy_process_group waited for in-flight work")

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", destroy)
    monkeypatch.setattr(c10d, "_abort_process_group", lambda group=None: calls.append("abort"))
    ctx = Context(env=LaunchEnv(rank=0, world_size=2, local_world_size=2), device=torch.device("cpu"),
                  backend="gloo", seed=0)
    ctx.abort(RuntimeError("a peer failed"))
    assert calls == ["abort"]
    ctx.abort()  # idempotent
    assert calls == ["abort"]


def test_close_still_destroys_the_group(monkeypatch):
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: calls.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: calls.append("destroy"))
    monkeypatch.setattr("ddpkit.runtime._store_barrier", lambda dist, key: calls.append("store"))
    ctx = Context(env=LaunchEnv(rank=0, world_size=2, local_world_size=2), device=torch.device("cpu"),
                  backend="gloo", seed=0)
    ctx.close()
    assert calls == ["barrier", "store", "destroy"]


def _abort_with_error_file(monkeypatch, path):
    import torch.distributed as dist

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    ctx = Context(env=LaunchEnv(rank=0, world_size=2, local_world_size=2), device=torch.device("cpu"),
                  backend="gloo", seed=0)
    try:
        raise RuntimeError("a peer failed")
    except RuntimeError as e:
        ctx.abort(e)


def test_abort_writes_torchruns_error_file_whole(monkeypatch, tmp_path):
    import json

    error_file = tmp_path / "error.json"
    _abort_with_error_file(monkeypatch, error_file)
    data = json.loads(error_file.read_text())
    assert data["message"]["message"] == "RuntimeError: a peer failed"
    assert "a peer failed" in data["message"]["extraInfo"]["py_callstack"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["error.json"]  # no temporary file left
    import os
    assert os.environ["TORCHELASTIC_ERROR_FILE"] == str(error_file)


def test_a_rank_killed_while_writing_its_error_file_leaves_none(monkeypatch, tmp_path):
    """torchrun's agent SIGTERMs the other ranks as soon as one dies; a rank stopped mid-write used to leave
    an empty error file, on which the agent's json.load crashed the whole launcher instead of restarting."""
    import json

    def killed_mid_write(obj, fp, *args, **kwargs):
        fp.write('{"message": ')
        fp.flush()
        raise KeyboardInterrupt  # stands in for the process dying here (it then never returns at all)

    monkeypatch.setattr(json, "dump", killed_mid_write)
    error_file = tmp_path / "error.json"
    try:
        _abort_with_error_file(monkeypatch, error_file)
    except KeyboardInterrupt:
        pass
    # what the agent reads: no file (it then reports the exit code), never a truncated one
    assert not error_file.exists()
