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


def test_slurm_task_with_its_own_gpu_uses_it():
    from ddpkit.device import plan_device
    from ddpkit.env import read_env

    # srun --ntasks-per-node 4 --gpus-per-task 1: the task of local rank 3 sees one GPU, its own, as device 0.
    env = read_env({"SLURM_PROCID": "3", "SLURM_LOCALID": "3", "SLURM_NTASKS": "4", "SLURM_NODEID": "0",
                    "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "gpu01",
                    "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_GPUS_PER_TASK": "1", "CUDA_VISIBLE_DEVICES": "3"})
    assert (env.launcher, env.local_rank) == ("slurm", 3)
    assert plan_device(env, device="auto", num_gpus=1) == ("cuda:0", "nccl")
    assert plan_device(env, device="cuda", num_gpus=1) == ("cuda:0", "nccl")
    # torchrun's ranks all see the node's GPUs: local rank 3 with one visible is still a mistake.
    torchrun = LaunchEnv(rank=3, local_rank=3, world_size=4, local_world_size=4, launcher="torchrun")
    with pytest.raises(ValueError, match="local rank 3 needs GPU 3 but only 1 are visible"):
        plan_device(torchrun, device="auto", num_gpus=1)
    assert plan_device(torchrun, device="auto", num_gpus=4) == ("cuda:3", "nccl")


def test_resume_loads_to_the_cpu_and_leaves_adams_step_counters_there(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    with ddpkit.init(seed=0) as ctx:
        ddpkit.save_checkpoint(ctx, tmp_path, step=1, model=model, optimizer=opt)
        # The meta device stands for the rank's GPU: parameters and a fresh optimizer live there.
        ctx.device = torch.device("meta")
        resumed = torch.nn.Linear(4, 2).to("meta")
        resumed_opt = torch.optim.Adam(resumed.parameters(), lr=0.1)
        locations = []
        load = torch.load
        monkeypatch.setattr(torch, "load", lambda *a, **kw: locations.append(kw.get("map_location")) or load(*a, **kw))
        ddpkit.load_checkpoint(ctx, tmp_path, model=resumed, optimizer=resumed_opt)
    assert locations == ["cpu"]
    for state in resumed_opt.state.values():
        assert state["step"].device.type == "cpu"  # read by the CPU every step: no device sync
        assert state["exp_avg"].device.type == "meta" and state["exp_avg_sq"].device.type == "meta"
