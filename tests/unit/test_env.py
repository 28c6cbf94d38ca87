"""Launcher contract parsing (env.py) and device/backend choice (device.py): pure functions."""

from __future__ import annotations

import pytest

from ddpkit.device import plan_device
from ddpkit.env import EnvError, LaunchEnv, read_env

TORCHRUN = {
    "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
    "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400", "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_RUN_ID": "job",
}


def test_plain_process_is_world_size_one():
    env = read_env({})
    assert env == LaunchEnv()
    assert not env.distributed and env.is_main and env.launcher == "none"


def test_torchrun_variables():
    env = read_env(TORCHRUN)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (3, 1, 4, 2, 1)
    assert (env.master_addr, env.master_port, env.restart_count) == ("10.0.0.1", 29400, 2)
    assert env.launcher == "torchrun" and env.distributed and not env.is_main


def test_env_is_frozen():
    with pytest.raises(AttributeError):
        read_env(TORCHRUN).rank = 0  # type: ignore[misc]


@pytest.mark.parametrize("bad, needle", [
    ({**TORCHRUN, "RANK": "x"}, "RANK='x' is not an integer"),
    ({**TORCHRUN, "RANK": "4"}, "RANK=4 is outside 0..3"),
    ({**TORCHRUN, "LOCAL_RANK": "2"}, "LOCAL_RANK=2 is outside 0..1"),
    ({**TORCHRUN, "WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be >= 1"),
])
def test_inconsistent_variables_are_named(bad, needle):
    with pytest.raises(EnvError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        read_env(bad)


def test_pod_per_rank_without_local_rank():
    env = read_env({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "m", "MASTER_PORT": "1"})
    assert (env.local_rank, env.local_world_size, env.launcher) == (0, 1, "env")


def test_plan_device_cpu_and_cuda():
    env = read_env(TORCHRUN)
    assert plan_device(env, device="auto", num_gpus=0) == ("cpu", "gloo")
    assert plan_device(env, device="auto", num_gpus=2) == ("cuda:1", "nccl")
    assert plan_device(env, device="cpu", num_gpus=2) == ("cpu", "gloo")


def test_plan_device_errors_name_the_fix():
    env = read_env(TORCHRUN)  # local rank 1
    with pytest.raises(ValueError, match="only 1 are visible; launch with --nproc-per-node 1"):
        plan_device(env, device="auto", num_gpus=1)
    with pytest.raises(ValueError, match="no GPU is visible"):
        plan_device(env, device="cuda", num_gpus=0)
    with pytest.raises(ValueError, match="not one of"):
        plan_device(env, device="gpu", num_gpus=1)
