"""Choose this rank's device and the process-group backend together."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ddpkit.env import LaunchEnv

if TYPE_CHECKING:
    import torch

__all__ = ["select_device", "plan_device"]

_CHOICES = ("auto", "cpu", "cuda")


def plan_device(env: LaunchEnv, *, device: str, num_gpus: int) -> tuple[str, str]:
    """Pure decision: (device string, backend) for this rank, given how many GPUs are visible.

    CUDA ranks use `cuda:{local_rank}` and nccl; CPU ranks use gloo (nccl has no CPU path). Under
    srun with one task per rank, SLURM may bind GPUs per task (--gpus-per-task, --gpu-bind): each
    task then sees only its own GPU(s), numbered from 0, and uses cuda:0.
    """
    if device not in _CHOICES:
        raise ValueError(f"device={device!r} is not one of {_CHOICES}; pass device='auto' to use GPUs when visible")
    if device == "cpu" or (device == "auto" and num_gpus == 0):
        return "cpu", "gloo"
    if num_gpus == 0:
        raise ValueError(
            "device='cuda' but no GPU is visible (torch.cuda.is_available() is False); "
            "pass device='auto' or 'cpu' to train on the CPU with gloo"
        )
    if env.local_rank >= num_gpus and env.launcher == "slurm":
        return "cuda:0", "nccl"  # this task's own GPU, bound by SLURM: local rank 3 sees it as device 0
    if env.local_rank >= num_gpus:
        raise ValueError(
            f"local rank {env.local_rank} needs GPU {env.local_rank} but only {num_gpus} are visible; "
            f"launch with --nproc-per-node {num_gpus} (or auto), or check CUDA_VISIBLE_DEVICES"
        )
    return f"cuda:{env.local_rank}", "nccl"


def select_device(env: LaunchEnv, *, device: str = "auto") -> tuple[torch.device, str]:
    """Return (device, backend) and make the device current before any process group exists.

    `torch.cuda.set_device` must run before `init_process_group`, or every rank's NCCL
    communicator and default allocations land on cuda:0.
    """
    import torch

    num_gpus = torch.cuda.device_count() if device != "cpu" and torch.cuda.is_available() else 0
    name, backend = plan_device(env, device=device, num_gpus=num_gpus)
    dev = torch.device(name)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return dev, backend
