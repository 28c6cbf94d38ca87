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
