"""read_env under cluster launchers: one srun task per rank, one Kubeflow pod per rank."""

from __future__ import annotations

import pytest

from ddpkit.env import EnvError, read_env

SRUN_TASK = {
    "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "6",
    "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_NODELIST": "cn[3-5]",
}


def test_srun_task_per_rank_derives_store_from_nodelist_and_job_id():
    env = read_env(SRUN_TASK)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size, env.node_rank) == (5, 1, 6, 2, 2)
    assert (env.master_addr, env.master_port, env.launcher) == ("cn3", 20077, "slurm")
    explicit = read_env({**SRUN_TASK, "MASTER_ADDR": "cn9", "MASTER_PORT": "29400"})
    assert (explicit.master_addr, explicit.master_port) == ("cn9", 29400)


def test_srun_uneven_tasks_per_node():
    env = read_env({**SRUN_TASK, "SLURM_STEP_TASKS_PER_NODE": "3,2(x2)", "SLURM_NTASKS": "7"})
    assert env.local_world_size == 2


def test_srun_without_a_way_to_find_the_store():
    bad = {k: v for k, v in SRUN_TASK.items() if k not in ("SLURM_STEP_NODELIST",)}
    with pytest.raises(EnvError, match="needs MASTER_ADDR and MASTER_PORT"):
        read_env(bad)


def test_batch_script_outside_srun_is_one_process():
    env = read_env({k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_ID"})
    assert env.world_size == 1 and env.launcher == "none"


def test_kubeflow_pod_per_rank():
    env = read_env({"MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "3",
                    "KUBERNETES_SERVICE_HOST": "10.96.0.1"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.node_rank) == (3, 4, 0, 1, 3)
    assert (env.master_addr, env.master_port, env.launcher) == ("job-master-0", 23456, "env")


def test_torchrun_rank_inside_a_pytorchjob_pod_uses_torchrun_values():
    env = read_env({"PET_NNODES": "2", "PET_NODE_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "1",
                    "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                    "TORCHELASTIC_RUN_ID": "r"})
    assert (env.rank, env.local_rank, env.node_rank, env.launcher) == (5, 1, 1, "torchrun")
