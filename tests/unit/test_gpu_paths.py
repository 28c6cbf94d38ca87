"""CUDA/NCCL paths checked on CPU with the GPU simulated: the DDP options passed, where loaded state lands,
the device a rank picks, batches on the device, pinning, the dtype chosen."""

from __future__ import annotations

import pytest
import torch

import ddpkit
from ddpkit.env import LaunchEnv
from ddpkit.runtime import Context


def _ctx(rank=0, world_size=1, device="cpu") -> Context:
    return Context(env=LaunchEnv(rank=rank, world_size=world_size, local_world_size=world_size, local_rank=rank),
                   device=torch.device(device), backend="gloo", seed=0)


class _SpyDDP(torch.nn.Module):
    """Stands in for DistributedDataParallel and keeps the keyword arguments it was built with."""

    built: list[dict] = []

    def __init__(self, module, **kwargs):
        super().__init__()
        self.module = module
        _SpyDDP.built.append(kwargs)


def test_ddp_options_reach_ddp_only_when_the_user_sets_them(monkeypatch):
    monkeypatch.setattr(torch.nn.parallel, "DistributedDataParallel", _SpyDDP)
    _SpyDDP.built.clear()
    ddpkit.wrap(torch.nn.Linear(2, 2), _ctx(world_size=2), comm=None)
    ddpkit.wrap(torch.nn.Linear(2, 2), _ctx(world_size=2), comm=None, bucket_cap_mb=25)
    default, explicit = _SpyDDP.built
    # An explicit bucket_cap_mb (even torch's own 25) makes DDP drop its 1 MiB first bucket.
    assert "bucket_cap_mb" not in default
    assert "find_unused_parameters" not in default and "static_graph" not in default
    assert default["gradient_as_bucket_view"] is True and default["device_ids"] is None
    assert explicit["bucket_cap_mb"] == 25
