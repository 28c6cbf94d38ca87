"""Cluster derivation (cluster.py) and `ddpkit run`'s multi-node settings: pure functions of an environ."""

from __future__ import annotations

import pytest

from ddpkit.run.nodes import (ClusterError, Nodes, detect_cluster, from_kubeflow, from_skypilot, from_slurm,
                              parse_hostlist, resolve_nodes, skypilot_port, slurm_port, tasks_per_node)
from ddpkit.run.launcher import LaunchError, build_torchrun_argv, config_from_args

SLURM_STEP = {
    "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NNODES": "3", "SLURM_JOB_NUM_NODES": "3",
    "SLURM_NODEID": "2", "SLURM_NTASKS": "3", "SLURM_PROCID": "2",
    "SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_STEP_NODELIST": "gpu[07-09]", "SLURM_GPUS_ON_NODE": "4",
}
PYTORCHJOB_PET = {
    "PET_NNODES": "4", "PET_NPROC_PER_NODE": "8", "PET_NODE_RANK": "3", "PET_MASTER_ADDR": "job-master-0",
    "PET_MASTER_PORT": "23456", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456",
    "WORLD_SIZE": "4", "RANK": "3", "KUBERNETES_SERVICE_HOST": "10.96.0.1",
}

TRAINJOB = {  # Kubeflow Trainer v2's torch runtime, pod of node 1 of 2
    "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "digits-node-0-0.digits", "PET_MASTER_PORT": "29400", "KUBERNETES_SERVICE_HOST": "10.96.0.1",
}
SKYPILOT = {
    "SKYPILOT_NUM_NODES": "3", "SKYPILOT_NODE_RANK": "2", "SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.7\n10.0.0.9\n",
    "SKYPILOT_NUM_GPUS_PER_NODE": "8", "SKYPILOT_TASK_ID": "sky-2026-12-01-16-30-00-000001_digits_1",
}


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("a[8-10]", ["a8", "a9", "a10"]),
    ("a[08-10]", ["a08", "a09", "a10"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("x1,y[3],z", ["x1", "y3", "z"]),
])
def test_parse_hostlist(text, hosts):
    assert parse_hostlist(text) == hosts


@pytest.mark.parametrize("bad, needle", [("node[1-3", "unbalanced"), ("node[3-1]", "runs backwards"),
                                         ("node[a-b]", "is not N or N-M")])
def test_parse_hostlist_errors(bad, needle):
    with pytest.raises(ClusterError, match=needle):
        parse_hostlist(bad)


def test_tasks_per_node_and_port():
    assert [tasks_per_node("2(x3),1", i) for i in range(4)] == [2, 2, 2, 1]
    assert slurm_port("4242") == slurm_port("4242") == 20000 + 4242
    assert slurm_port("1234_7") != slurm_port("1234_8")  # array tasks are distinct jobs
    assert 20000 <= slurm_port("987654321") < 30000


def test_slurm_step_one_task_per_node():
    c = from_slurm(SLURM_STEP)
    assert (c.source, c.nnodes, c.node_rank, c.rdzv_id, c.nproc_per_node) == ("slurm", "3", 2, "4242", "4")
    assert c.rdzv_endpoint == f"gpu07:{20000 + 4242}"  # the step's first host, same on every node
    assert from_slurm({**SLURM_STEP, "MASTER_ADDR": "head", "MASTER_PORT": "29400"}).rdzv_endpoint == "head:29400"
    assert from_slurm({**SLURM_STEP, "SLURM_GPUS_ON_NODE": "", "SLURM_GPUS_PER_NODE": "a100:2"}).nproc_per_node == "2"


def test_slurm_outside_a_step_or_one_node():
    batch_script = {k: v for k, v in SLURM_STEP.items() if k != "SLURM_STEP_ID"}
    assert from_slurm(batch_script) is None and from_slurm({}) is None
    one = from_slurm({**SLURM_STEP, "SLURM_NNODES": "1", "SLURM_NTASKS": "1", "SLURM_NODEID": "0"})
    assert one.nnodes == "1" and one.rdzv_endpoint is None


def test_slurm_task_per_rank_under_ddpkit_run_is_refused():
    with pytest.raises(ClusterError, match="srun --ntasks-per-node=1 ddpkit run"):
        from_slurm({**SLURM_STEP, "SLURM_NTASKS": "12"})


def test_kubeflow_pet_and_plain_policies():
    c = from_kubeflow(PYTORCHJOB_PET)
    assert (c.nnodes, c.node_rank, c.rdzv_endpoint, c.nproc_per_node) == ("4", 3, "job-master-0:23456", "8")
    plain = {"MASTER_ADDR": "m-0", "MASTER_PORT": "1234", "WORLD_SIZE": "2", "RANK": "1",
             "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    p = from_kubeflow(plain)
    assert (p.nnodes, p.node_rank, p.rdzv_endpoint, p.nproc_per_node) == ("2", 1, "m-0:1234", None)
    assert from_kubeflow({**PYTORCHJOB_PET, "PET_NNODES": "2:4"}).nnodes == "2:4"
    # not a pod: a shell with WORLD_SIZE exported; and a rank torchrun already started
    assert from_kubeflow({k: v for k, v in plain.items() if k != "KUBERNETES_SERVICE_HOST"}) is None
    assert from_kubeflow({**PYTORCHJOB_PET, "LOCAL_RANK": "0"}) is None
    assert detect_cluster({}) is None


def _nodes(environ, **flags):
    kw = {"nnodes": None, "node_rank": None, "rdzv_endpoint": None, "rdzv_id": None, "nproc_per_node": None}
    return resolve_nodes(**{**kw, **flags}, environ=environ)


def test_cluster_values_fill_in_and_flags_override():
    n = _nodes(SLURM_STEP)
    assert n == Nodes(nnodes="3", node_rank=2, rdzv_endpoint="gpu07:24242", rdzv_id="4242", nproc_per_node="4")
    n = _nodes(SLURM_STEP, rdzv_endpoint="head:29400", nproc_per_node="2", node_rank=0)
    assert (n.rdzv_endpoint, n.nproc_per_node, n.node_rank, n.nnodes) == ("head:29400", "2", 0, "3")
    n = _nodes(PYTORCHJOB_PET)
    assert n.rdzv_id == "ddpkit-job-master-0-23456"  # every pod derives the same id


def test_config_from_args_in_slurm_builds_multinode_argv(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    cfg = config_from_args([str(script)], num_gpus=4, num_cpus=8, environ=SLURM_STEP)
    argv = build_torchrun_argv(cfg)
    assert "--nnodes=3" in argv and "--node-rank=2" in argv and "--rdzv-id=4242" in argv
    assert "--rdzv-endpoint=gpu07:24242" in argv and "--nproc-per-node=4" in argv
    assert any(a.startswith("--rdzv-conf=join_timeout=300") for a in argv)
    single = build_torchrun_argv(config_from_args([str(script)], num_gpus=0, num_cpus=2, environ={}))
    assert "--rdzv-endpoint=127.0.0.1:0" in single and "--nnodes=1" in single


@pytest.mark.parametrize("flags, needle", [
    ({"nnodes": "3:2"}, "--nnodes '3:2' is not N or MIN:MAX"),
    ({"nnodes": "two"}, "--nnodes 'two' is not N or MIN:MAX"),
    ({"nnodes": "1:2:3"}, "is not N or MIN:MAX"),
    ({"nnodes": "2", "node_rank": 2, "rdzv_endpoint": "h:1"}, "--node-rank 2 with --nnodes 2: node ranks are 0..1"),
    ({"nnodes": "2"}, "--nnodes 2 needs --rdzv-endpoint HOST:PORT"),
    ({"nnodes": "2", "rdzv_endpoint": "head"}, "--rdzv-endpoint 'head' has no port; pass HOST:PORT"),
    ({"nnodes": "2", "rdzv_endpoint": "head:http"}, "port 'http' is not a number"),
    ({"nnodes": "2", "rdzv_endpoint": "head:0"}, "port 0 cannot be shared"),
])
def test_multinode_input_errors_name_the_fix(flags, needle, tmp_path):
    pattern = needle.replace("(", r"\(").replace(".", r"\.")
    with pytest.raises(ClusterError, match=pattern):
        _nodes({}, **flags)
    # and `ddpkit run` reports the same line as its own setting error
    script = tmp_path / "t.py"
    script.write_text("")
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    with pytest.raises(LaunchError, match=pattern):
        config_from_args([*argv, str(script)], environ={}, num_gpus=0, num_cpus=2)


def test_elastic_range_and_iface_on_one_node(tmp_path):
    assert _nodes({}, nnodes="2:4", rdzv_endpoint="h:29400", node_rank=3).nnodes == "2:4"
    script = tmp_path / "t.py"
    script.write_text("")
    with pytest.raises(LaunchError, match="--iface eth0 applies to multi-node runs"):
        config_from_args(["--iface", "eth0", str(script)], num_gpus=0, num_cpus=2, environ={})


def test_kubeflow_trainjob_with_nproc_auto(tmp_path):
    c = from_kubeflow(TRAINJOB)
    assert (c.source, c.nnodes, c.node_rank, c.nproc_per_node) == ("kubeflow", "2", 1, "auto")
    assert c.rdzv_endpoint == "digits-node-0-0.digits:29400"
    n = _nodes(TRAINJOB)
    assert (n.nnodes, n.node_rank, n.nproc_per_node) == ("2", 1, "auto")
    assert n.rdzv_id == "ddpkit-digits-node-0-0.digits-29400"  # every pod derives the same id
    script = tmp_path / "t.py"
    script.write_text("")
    # auto: every GPU of the pod, else CPU ranks (one per core, up to 4), as `--nproc-per-node auto`
    for gpus, cpus, nproc in ((4, 8, 4), (0, 1, 1), (0, 8, 4)):
        argv = build_torchrun_argv(config_from_args([str(script)], num_gpus=gpus, num_cpus=cpus, environ=TRAINJOB))
        assert f"--nproc-per-node={nproc}" in argv and "--nnodes=2" in argv and "--node-rank=1" in argv
        assert "--rdzv-endpoint=digits-node-0-0.digits:29400" in argv


def test_skypilot_head_address_and_a_port_every_node_derives():
    c = from_skypilot(SKYPILOT)
    port = skypilot_port(SKYPILOT["SKYPILOT_TASK_ID"])
    assert (c.source, c.nnodes, c.node_rank, c.nproc_per_node) == ("skypilot", "3", 2, "8")
    assert c.rdzv_endpoint == f"10.0.0.5:{port}" and 20000 <= port < 30000  # the first address is the head
    assert c.rdzv_id == SKYPILOT["SKYPILOT_TASK_ID"]
    assert skypilot_port("sky-a_c_1") != skypilot_port("sky-a_c_2")  # two tasks on one cluster
    assert from_skypilot({**SKYPILOT, "MASTER_PORT": "29400"}).rdzv_endpoint == "10.0.0.5:29400"
    assert from_skypilot({**SKYPILOT, "SKYPILOT_NUM_GPUS_PER_NODE": "0"}).nproc_per_node is None  # CPU: auto
    one = from_skypilot({**SKYPILOT, "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_RANK": "0",
                         "SKYPILOT_NODE_IPS": "10.0.0.5"})
    assert one.nnodes == "1" and one.rdzv_endpoint is None
    assert from_skypilot({**SKYPILOT, "LOCAL_RANK": "0"}) is None and from_skypilot(PYTORCHJOB_PET) is None
    assert detect_cluster(SKYPILOT).source == "skypilot"
    n = _nodes(SKYPILOT)
    assert n == Nodes(nnodes="3", node_rank=2, rdzv_endpoint=f"10.0.0.5:{port}", rdzv_id=SKYPILOT["SKYPILOT_TASK_ID"],
                      nproc_per_node="8")


@pytest.mark.parametrize("change, needle", [
    ({"SKYPILOT_NODE_IPS": "10.0.0.5\n10.0.0.7"}, "SKYPILOT_NODE_IPS lists 2 address(es) but SKYPILOT_NUM_NODES=3"),
    ({"SKYPILOT_TASK_ID": ""}, "SKYPILOT_TASK_ID is unset, so the nodes cannot derive a shared port; set MASTER_PORT"),
    ({"SKYPILOT_NODE_RANK": "two"}, "SKYPILOT_NODE_RANK='two' is not an integer"),
])
def test_skypilot_errors_name_the_variable_and_the_fix(change, needle):
    with pytest.raises(ClusterError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        from_skypilot({**SKYPILOT, **change})
