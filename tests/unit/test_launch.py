"""`ddpkit run`: argv -> RunConfig -> torchrun argv, its input errors, and its rendezvous (node order, failures)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from types import SimpleNamespace

import pytest
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError, RendezvousConnectionError, RendezvousStateError, RendezvousTimeoutError,
)

from ddpkit.cli import main
from ddpkit.run.launcher import (
    DEAD_NODE_S, LaunchError, RunConfig, build_torchrun_argv, config_from_args, default_nproc_per_node, run_torchrun,
    threads_per_rank,
)
from ddpkit.run.rendezvous import NodeMismatchError, _check_peers, _Node


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_single_node_argv_uses_loopback_and_a_port_the_os_picks(script):
    cfg = config_from_args(["--nproc-per-node", "2", script, "--lr", "0.1", "-m", "x"], environ={}, num_gpus=0,
                           num_cpus=2)
    argv = build_torchrun_argv(cfg)
    assert "--nproc-per-node=2" in argv
    assert "--rdzv-endpoint=127.0.0.1:0" in argv  # port 0: bound by the store itself, no probe race
    assert "--rdzv-backend=c10d" in argv and "--local-addr=127.0.0.1" in argv
    # script args pass through untouched, after the script, even ones that look like our flags
    assert argv[-5:] == [script, "--lr", "0.1", "-m", "x"]


def test_two_runs_get_distinct_rendezvous_ids(script):
    a = build_torchrun_argv(config_from_args([script], environ={}, num_gpus=0, num_cpus=2))
    b = build_torchrun_argv(config_from_args([script], environ={}, num_gpus=0, num_cpus=2))
    ids = [x for x in a + b if x.startswith("--rdzv-id=")]
    assert len(ids) == 2 and ids[0] != ids[1]


def test_module_mode(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
    cfg = config_from_args(["-m", "pkg.train", "--epochs", "1"], environ={}, num_gpus=0, num_cpus=2)
    argv = build_torchrun_argv(cfg)
    assert argv[-4:] == ["-m", "pkg.train", "--epochs", "1"]


def test_default_nproc(script):
    assert default_nproc_per_node(num_gpus=8, num_cpus=2) == 8
    assert default_nproc_per_node(num_gpus=0, num_cpus=2) == 2
    assert default_nproc_per_node(num_gpus=0, num_cpus=64) == 4
    assert default_nproc_per_node(num_gpus=0, num_cpus=1) == 1
    assert config_from_args([script], environ={}, num_gpus=3, num_cpus=2).nproc_per_node == 3
    for flag, num_gpus, num_cpus, nproc in (("gpu", 3, 2, 3), ("cpu", 0, 6, 6)):
        cfg = config_from_args(["--nproc-per-node", flag, script], environ={}, num_gpus=num_gpus, num_cpus=num_cpus)
        assert cfg.nproc_per_node == nproc


def test_threads_per_rank():
    assert threads_per_rank(2, 2) == 1
    assert threads_per_rank(4, 16) == 4
    assert threads_per_rank(8, 2) == 1


def test_multi_node_argv():
    cfg = RunConfig(target="t.py", nproc_per_node=8, nnodes="2", node_rank=1, rdzv_endpoint="head:29400", rdzv_id="j")
    argv = build_torchrun_argv(cfg)
    assert "--nnodes=2" in argv and "--rdzv-endpoint=head:29400" in argv and "--node-rank=1" in argv
    assert "--rdzv-id=j" in argv and "--local-addr=127.0.0.1" not in argv
    assert _rdzv_conf(argv)["node_rank"] == "1"  # where ddpkit's rendezvous backend reads it


def _rdzv_conf(argv: list[str]) -> dict[str, str]:
    conf = next(a for a in argv if a.startswith("--rdzv-conf=")).removeprefix("--rdzv-conf=")
    return dict(kv.split("=", 1) for kv in conf.split(","))


@pytest.mark.parametrize("timeout, join, last_call", [(2.5, 3, 1), (10, 10, 1), (20, 20, 1), (60, 60, 15),
                                                      (300, 300, 30)])
def test_rendezvous_timeouts_are_whole_seconds_and_the_last_call_fits(timeout, join, last_call):
    cfg = RunConfig(target="t.py", nnodes="1:2", rdzv_endpoint="head:29400", rdzv_id="j", rdzv_timeout=timeout)
    conf = _rdzv_conf(build_torchrun_argv(cfg))
    # torch reads both as integers, and waits its own 30 s last call unless told otherwise
    assert (conf["join_timeout"], conf["last_call_timeout"]) == (str(join), str(last_call))
    if timeout >= 20:  # a survivor waits for the lost node to be dropped, then the last call
        assert DEAD_NODE_S + last_call < timeout


def test_nodes_are_ordered_by_node_rank_then_as_torch_orders_them():
    one = _Node("10.0.0.1", 100, 0, node_rank=1, nnodes="3")
    zero = _Node("10.0.0.9", 200, 0, node_rank=0, nnodes="3")  # torch alone would put it last (address)
    unranked = _Node("10.0.0.0", 50, 0, node_rank=None, nnodes="3")
    assert sorted([unranked, one, zero]) == [zero, one, unranked]
    assert sorted([_Node("b", 1, 0, None, "2"), _Node("a", 2, 0, None, "2")])[0].addr == "a"
    # the descriptor travels to the other nodes in the pickled rendezvous state, as a dict key
    assert {pickle.loads(pickle.dumps(zero)): 0} == {zero: 0} and repr(zero) == "10.0.0.9_200_0"


def test_nodes_launched_differently_are_refused_on_sight():
    me = _Node("10.0.0.1", 1, 0, node_rank=0, nnodes="2")
    other = _Node("10.0.0.2", 7, 0, node_rank=1, nnodes="3")
    with pytest.raises(NodeMismatchError, match=r"this node has --nnodes 2 but 10\.0\.0\.2 \(pid 7, --node-rank 1, "
                                                r"--nnodes 3\) joined the same rendezvous; start every node with"):
        _check_peers(me, SimpleNamespace(participants={me: 0, other: 0}, wait_list=set()))
    twin = _Node("10.0.0.3", 8, 0, node_rank=1, nnodes="3")
    peers = [_Node("10.0.0.1", 1, 0, node_rank=0, nnodes="3"), other, twin]
    with pytest.raises(NodeMismatchError, match=r"--node-rank 1 was given to two nodes, 10\.0\.0\.2 .* and "
                                                r"10\.0\.0\.3 .*; give each node its own --node-rank \(0\.\.2\)"):
        _check_peers(peers[0], SimpleNamespace(participants=dict.fromkeys(peers, 0), wait_list=set()))
    # not yet in the state: the others could not see this node, so it does not fail alone
    _check_peers(me, SimpleNamespace(participants={other: 0}, wait_list=set()))
    _check_peers(me, SimpleNamespace(participants={me: 0, _Node("10.0.0.2", 7, 0, 1, "2"): 0}, wait_list=set()))


@pytest.mark.parametrize("error, needle", [
    (RendezvousTimeoutError("no other node joined"),
     "rendezvous at 127.0.0.1:29633 timed out after --rdzv-timeout 5 s: --nnodes 2 expects 2 nodes and no other "
     "node joined; start every node with the same --nnodes 2 and --rdzv-endpoint 127.0.0.1:29633"),
    (RendezvousClosedError(), "rendezvous at 127.0.0.1:29633 was closed by another node before 2 nodes joined: "
                              "that node timed out, failed or finished"),
    (RendezvousConnectionError("The connection to the C10d store has failed."),
     "lost the rendezvous store at 127.0.0.1:29633 (The connection to the C10d store has failed.): the node"),
    (RendezvousStateError("corrupt\nstate"), "rendezvous at 127.0.0.1:29633 failed (RendezvousStateError: corrupt); "
                                             "start every node with the same --nnodes 2"),
    (NodeMismatchError("this node has --nnodes 2 but x joined"),
     "rendezvous at 127.0.0.1:29633: this node has --nnodes 2 but x joined"),
], ids=["timeout", "closed", "connection", "other", "mismatch"])
def test_rendezvous_failures_are_one_line_errors(monkeypatch, capsys, script, error, needle):
    import torch.distributed.run

    def run(args):
        raise error

    monkeypatch.setattr(torch.distributed.run, "run", run)
    cfg = RunConfig(target=script, nnodes="2", node_rank=0, rdzv_endpoint="127.0.0.1:29633", rdzv_id="j",
                    rdzv_timeout=5)
    assert run_torchrun(cfg) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ddpkit run: error: {needle}"), err


def test_max_restarts_passed(script):
    cfg = config_from_args(["--max-restarts", "3", script], environ={}, num_gpus=0, num_cpus=2)
    argv = build_torchrun_argv(cfg)
    assert "--max-restarts=3" in argv


@pytest.mark.parametrize("args, needle", [
    (["--nproc-per-node", "0"], "--nproc-per-node 0 must be at least 1"),
    (["--nproc-per-node", "two"], "--nproc-per-node 'two' is not a number"),
    (["--nproc-per-node", "8"], "--nproc-per-node 8 asks for 8 GPUs but 2 are visible"),
    (["--max-restarts", "-1"], "--max-restarts -1 must be >= 0"),
])
def test_bad_input_errors(script, args, needle):
    with pytest.raises(LaunchError, match=needle):
        config_from_args([*args, script], environ={}, num_gpus=2, num_cpus=2)


def test_missing_script_is_one_line_error_and_exit_2(capsys, tmp_path):
    rc = main(["run", str(tmp_path / "nope.py")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.count("\n") == 0 and "does not exist" in err and "nope.py" in err


def test_missing_module_is_one_line_error_and_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('imported: the check must not import')\n")
    (tmp_path / "mypkg" / "train.py").write_text("")
    from ddpkit.run.launcher import check_target

    check_target("mypkg.train", module=True)  # found in the current directory, nothing imported
    check_target("json.tool", module=True)  # or installed
    for missing in ("mypkg.nosuch", "nosuch_pkg_xyz.train", "mypkg.train.deeper", "not a name"):
        rc = main(["run", "-m", missing])
        err = capsys.readouterr().err.strip()
        assert rc == 2, missing
        assert err.count("\n") == 0 and f"module {missing!r} is not importable from {tmp_path}" in err


@pytest.mark.parametrize("value", ["0", "abc"])
def test_cli_process_bad_nproc_exits_nonzero(script, value):
    proc = subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", value, script],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpkit run: error: --nproc-per-node")


def test_ddpkit_version_prints_the_package_version(capsys):
    import ddpkit

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == ddpkit.__version__
    assert main(["no-such-command"]) == 2  # argparse names the choices on stderr
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err
