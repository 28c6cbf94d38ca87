"""Backends are told apart by the devices they serve, never by the string 'nccl'."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from ddpkit.env import LaunchEnv
from ddpkit.runtime import Context

SRC = Path(__file__).parents[2] / "src" / "ddpkit"


def _ctx(device: str, backend: str) -> Context:
    return Context(env=LaunchEnv(rank=0, world_size=2, local_world_size=2), device=torch.device(device),
                   backend=backend, seed=0)


@pytest.mark.parametrize("backend", ["nccl2", "nccl-legacy", "cpu:gloo,cuda:nccl", "NCCL"])
def test_all_reduce_sum_reduces_on_the_ranks_device_whatever_the_backend_is_called(monkeypatch, backend):
    import torch.distributed as dist

    from ddpkit.collectives import all_reduce_sum

    seen = []
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None: seen.append(t.device))
    # "meta" stands in for a CUDA device: the tensor must go to the rank's device, not to the CPU
    all_reduce_sum(_ctx("meta", backend), 3.0)
    assert seen == [torch.device("meta")]
    all_reduce_sum(_ctx("cpu", "gloo"), 3.0)
    assert seen[-1] == torch.device("cpu")


@pytest.mark.parametrize(("backend", "expected"), [
    ("nccl", "gloo"), ("NCCL", "gloo"), ("nccl2", "gloo"), ("xccl", "gloo"), ("cuda:nccl", "gloo"),
    ("cpu:gloo,cuda:nccl", "gloo"), ("cpu:mpi,cuda:nccl2", "mpi"), ("gloo", None), ("cpu:gloo", None), (None, None),
])
def test_check_maps_every_backend_without_a_cpu_path_to_gloo(monkeypatch, backend, expected):
    import torch.distributed.distributed_c10d as c10d

    from ddpkit.check.cpumap import CpuMapping

    calls, notes = [], []
    monkeypatch.setattr(c10d, "init_process_group", lambda backend=None, *a, **k: calls.append(backend))
    mapping = CpuMapping(lambda what, site: notes.append(what))
    mapping.install()
    try:
        import torch.distributed as dist

        dist.init_process_group(backend)
    finally:
        mapping.uninstall()
    assert calls == [expected if expected is not None else backend]
    assert bool(notes) == (expected is not None)


def test_no_module_compares_a_backend_to_the_nccl_string():
    """`backend == "nccl"`, `"nccl" in backend` and the like: the device type decides instead.
    (lint's rules read user scripts' literals, which is not a runtime decision, and are exempt.)"""
    pattern = re.compile(r"""(==|!=|\bin)\s*["']nccl["']|["']nccl["']\s*(==|!=|\bin\b)""")
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.parent.name == "lint":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and "backend" in line:  # error-message text may name nccl
                offenders.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert offenders == []

