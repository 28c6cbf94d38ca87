"""Tests of `ddpkit env`: collect() on this CPU machine, text and JSON output, the port check."""

from __future__ import annotations

import json
import os
import socket

import pytest
import torch

from ddpkit.run import envreport
from ddpkit.run.envreport import DEFAULT_PORT, collect, format_text, main, port_is_free


@pytest.fixture(scope="module")
def info():
    return collect()


def test_collect_has_every_key(info):
    keys = {"python", "python_executable", "platform", "hostname", "torch", "torch_error", "cuda_available",
            "cuda_version", "nccl_version", "gpus", "backends", "cuda_visible_devices", "cpu_count",
            "cpu_affinity", "interfaces", "env", "default_port", "default_port_free", "launch"}
    assert keys <= set(info)
    json.dumps(info)  # plain values only


def test_collect_values_match_this_machine(info):
    assert info["torch"] == torch.__version__
    assert info["cuda_available"] == torch.cuda.is_available()
    assert len(info["gpus"]) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert info["backends"]["gloo"] is torch.distributed.is_gloo_available()
    assert info["cpu_count"] == os.cpu_count()
    assert 1 <= info["cpu_affinity"] <= info["cpu_count"]
    assert info["default_port"] == DEFAULT_PORT and isinstance(info["default_port_free"], bool)
    try:
        import psutil  # noqa: F401
    except ImportError:  # names only, from socket.if_nameindex
        assert info["interfaces"]
    else:
        assert any("127.0.0.1" in addrs for addrs in info["interfaces"].values())


def test_launch_suggestion_matches_the_devices(info):
    launch = info["launch"]
    assert launch["nproc_per_node"] >= 1
    assert launch["command"] == f"ddpkit run --nproc-per-node {launch['nproc_per_node']} SCRIPT"
    assert launch["backend"] == ("nccl" if info["gpus"] else "gloo")


def test_launch_fallback_without_ddpkit_launch(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_launch(name, *args, **kwargs):
        if name == "ddpkit.run.launcher":
            raise ImportError("simulated")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_launch)
    assert envreport._launch(0, 16)["nproc_per_node"] == 4
    assert envreport._launch(0, 2)["nproc_per_node"] == 2
    assert envreport._launch(3, 16, environ={}) == {"nproc_per_node": 3, "backend": "nccl",
                                        "command": "ddpkit run --nproc-per-node 3 SCRIPT"}


def test_launch_command_is_the_one_ddpkit_run_resolves_from_the_cluster(monkeypatch, tmp_path):
    from ddpkit.run.launcher import config_from_args

    slurm = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
             "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_NTASKS": "2"}
    launch = envreport._launch(0, 2, environ=slurm)
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "train.py").write_text("")
    cfg = config_from_args([str(tmp_path / "train.py")], environ=os.environ, num_gpus=0, num_cpus=2)
    assert launch["command"] == (f"ddpkit run --nnodes {cfg.nnodes} --node-rank {cfg.node_rank} --rdzv-endpoint "
                                 f"{cfg.rdzv_endpoint} --rdzv-id {cfg.rdzv_id} --nproc-per-node 2 SCRIPT")
    assert "--nnodes 2 --node-rank 1 --rdzv-endpoint node01:" in launch["command"]
    env = collect()["env"]
    assert env["SLURM_STEP_ID"] == "0" and env["SLURM_STEP_NODELIST"] == "node[01-02]"
    bad = envreport._launch(0, 2, environ={**slurm, "SLURM_NODEID": "5"})
    assert bad["command"].startswith("(ddpkit run would refuse: ") and "--node-rank 5" in bad["command"]


def test_env_section_picks_launcher_variables(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("SKYPILOT_NODE_RANK", "1")
    monkeypatch.setenv("SOME_SECRET_TOKEN", "x")
    env = collect()["env"]
    assert env["PET_NNODES"] == "2" and env["SKYPILOT_NODE_RANK"] == "1"
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["NCCL_DEBUG"] == "INFO"
    assert env["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert "SOME_SECRET_TOKEN" not in env


def test_port_is_free_for_a_held_and_a_released_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert port_is_free(port) is False
    assert port_is_free(port) is True


def test_text_output(info, capsys):
    text = format_text(info)
    assert torch.__version__ in text
    assert "launch:" in text and info["launch"]["command"] in text
    assert main([]) == 0
    assert torch.__version__ in capsys.readouterr().out


def test_json_output_parses(capsys):
    assert main(["--format", "json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["torch"] == torch.__version__
    assert main(["--format", "yaml"]) == 2
    capsys.readouterr()


def test_gpu_machine_is_reported(monkeypatch):
    """The CUDA branch, with torch's device queries stubbed to look like a 2-GPU node."""
    from types import SimpleNamespace

    props = SimpleNamespace(name="NVIDIA H100", total_memory=80 * 2**30, major=9, minor=0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setattr(envreport, "_launch", lambda num_gpus, num_cpus: {
        "nproc_per_node": num_gpus, "backend": "nccl", "command": f"ddpkit run --nproc-per-node {num_gpus} SCRIPT"})
    info = collect()
    assert [g["name"] for g in info["gpus"]] == ["NVIDIA H100", "NVIDIA H100"]
    assert info["gpus"][0]["memory_gib"] == 80.0 and info["nccl_version"] == "2.21.5"
    text = format_text(info)
    assert "gpu 1:" in text and "NVIDIA H100 (80.0 GiB, sm 9.0)" in text and "yes (2.21.5)" in text
    assert "ddpkit run --nproc-per-node 2 SCRIPT" in text
