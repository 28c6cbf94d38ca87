"""Multi-node `ddpkit run` on one machine: two launchers ("nodes") over loopback, node loss, socket binding,
rendezvous failures, node ranks, elastic membership."""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

SCRIPT = str(Path(__file__).parent / "scripts" / "multinode_job.py")
TRAIN = ["train", "16", "6"]  # global batch 16 on 4 ranks (4 each), 6 optimizer steps


def _launcher(flags, job, out: Path, log: Path, *, script: list[str] | None = None, environ: dict | None = None,
              cpus: set[int] | None = None) -> subprocess.Popen:
    """One node's `ddpkit run FLAGS SCRIPT OUT JOB...` (or `ddpkit run FLAGS *script`), with a cluster's
    variables added to its environment and its ranks held to `cpus`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(environ or {})}
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        env.pop(name, None)
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    with open(log, "w") as f:
        argv = script or [SCRIPT, str(out), *job]
        return subprocess.Popen([sys.executable, "-m", "ddpkit.cli", "run", *flags, *argv],
                                stdout=f, stderr=subprocess.STDOUT, env=env, preexec_fn=pin)


def _node(rank: int, port: int, job: list[str], out: Path, log: Path) -> subprocess.Popen:
    return _launcher(["--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "2",
                      "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "60", "--connect-timeout", "60"],
                     job, out, log)


def _flags(port: int, *, nnodes: str = "2", node_rank: int | None = None, timeout: float = 60) -> list[str]:
    rank = ["--node-rank", str(node_rank)] if node_rank is not None else []
    return ["--nnodes", nnodes, *rank, "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-timeout", f"{timeout:g}", "--connect-timeout", "60"]


def _free_port() -> int:
    # Bind-then-release: only node 0's launcher binds it, a moment later, so the race is harmless here.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(out: Path) -> dict[int, dict]:
    return {r["rank"]: r for r in (json.loads(p.read_text()) for p in out.glob("rank*.json"))}


def _wait(procs, timeout):
    deadline = time.monotonic() + timeout
    return [p.wait(max(0.1, deadline - time.monotonic())) for p in procs]


def _descendants(procs) -> set[int]:
    pids = set()
    for p in procs:
        try:
            pids |= {c.pid for c in psutil.Process(p.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
    return pids


def _stop(nodes, workers: set) -> set:
    """Kill what is left of the nodes' launchers, then of their ranks; the ranks that had to be killed."""
    for p in nodes:
        if p.poll() is None:
            p.kill()
        p.wait(10)
    return _kill_leftovers(workers | _descendants(nodes))


def _kill_leftovers(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
                proc.kill()
        except psutil.NoSuchProcess:
            pass
    return alive


def _logs(*paths: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in paths if p.exists())


@pytest.mark.timeout(240)
def test_two_nodes_train_like_one_node_of_four(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir(), one.mkdir()
    port = _free_port()
    nodes = [_node(r, port, TRAIN, two, tmp_path / f"node{r}.log") for r in (0, 1)]
    try:
        codes = _wait(nodes, 150)
    finally:
        leftovers = _kill_leftovers(_descendants(nodes) | {p.pid for p in nodes})
    assert codes == [0, 0] and not leftovers, _logs(tmp_path / "node0.log", tmp_path / "node1.log")
    single = _launcher(["--nproc-per-node", "4"], TRAIN, one, tmp_path / "single.log")
    assert _wait([single], 120) == [0], _logs(tmp_path / "single.log")

    ranks, ref = _ranks(two), _ranks(one)
    assert sorted(ranks) == [0, 1, 2, 3] and {r["world_size"] for r in ranks.values()} == {4}
    assert {ranks[r]["node_rank"] for r in (0, 1)} != {ranks[r]["node_rank"] for r in (2, 3)}  # two nodes
    assert [ranks[r]["launcher_pid"] for r in range(4)] == [nodes[0].pid] * 2 + [nodes[1].pid] * 2  # --node-rank
    assert {r["steps"] for r in ranks.values()} == {6}
    assert {r["optimizer"] for r in ranks.values()} == {r["optimizer"] for r in ref.values()} == {"SGD"}
    assert len({r["sha"] for r in ranks.values()}) == 1  # identical on all 4 ranks of both nodes
    assert len({r["sha"] for r in ref.values()}) == 1
    # ... and equal to one node of 4 ranks with the same global batch, up to the order of the float
    # sums (gloo's all-reduce both times, but over two launchers' rendezvous and rank placement)
    for a, b in zip(ranks[0]["params"], ref[0]["params"]):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=1e-6, atol=1e-7)
    assert ranks[0]["params"] != [[[0.0] * 4], [0.0]] and {r["gloo_ifname"] for r in ranks.values()} == {"lo"}


@pytest.mark.timeout(240)
def test_killing_one_node_stops_the_other_and_leaves_no_ranks(tmp_path):
    port = _free_port()
    job = ["train", "16", "1000000", "2", "0.1"]  # trains "forever"; each rank reports after step 2
    nodes = [_node(r, port, job, tmp_path, tmp_path / f"node{r}.log") for r in (0, 1)]
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 150
        while len(_ranks(tmp_path)) < 4 and time.monotonic() < deadline and all(p.poll() is None for p in nodes):
            time.sleep(0.2)
        assert len(_ranks(tmp_path)) == 4, _logs(tmp_path / "node0.log", tmp_path / "node1.log")
        workers = {r["pid"] for r in _ranks(tmp_path).values()} | _descendants(nodes)
        time.sleep(1.0)  # mid-training
        killed_at = time.monotonic()
        nodes[1].send_signal(signal.SIGKILL)  # node 1's launcher dies without a word to anyone
        code = _wait([nodes[0]], 60)[0]
        stopped_after = time.monotonic() - killed_at
        time.sleep(1.0)
    finally:
        leftovers = _stop(nodes, workers)
    log0 = (tmp_path / "node0.log").read_text()
    assert code != 0 and stopped_after < 30, log0[-3000:]
    assert not leftovers, f"rank processes outlived their node: {leftovers}"
    assert "ddpkit run: lost the ranks at 127.0.0.1" in log0, log0[-3000:]
    print(f"node 0 stopped {stopped_after:.1f}s after node 1's launcher was killed")


@pytest.mark.timeout(120)
def test_single_node_listens_on_loopback_only(tmp_path):
    proc = _launcher(["--nproc-per-node", "2"], ["sleep", "20"], tmp_path, tmp_path / "run.log")
    try:
        deadline = time.monotonic() + 90
        while len(_ranks(tmp_path)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(_ranks(tmp_path)) == 2, _logs(tmp_path / "run.log")
        pids = {proc.pid} | _descendants([proc])
        listening = [(c.pid, c.laddr.ip, c.laddr.port) for c in psutil.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN and c.pid in pids]
    finally:
        proc.kill()
        proc.wait(10)
        _kill_leftovers(_descendants([proc]) | {r["pid"] for r in _ranks(tmp_path).values()})
    # the rendezvous store and the ranks' store (launcher), one gloo listener per rank
    assert len(listening) >= 4, listening
    assert {pid for pid, _, _ in listening} >= {r["pid"] for r in _ranks(tmp_path).values()} | {proc.pid}
    exposed = [entry for entry in listening if not ipaddress.ip_address(entry[1]).is_loopback]
    assert not exposed, f"listening beyond loopback: {exposed}"
    assert {r["gloo_ifname"] for r in _ranks(tmp_path).values()} == {"lo"}


def _run_nodes(flags_per_node, job, out: Path, timeout: float) -> tuple[list[int], list[str], list[int]]:
    """Start one launcher per flags list back to back; exit codes, logs and pids once all have exited."""
    logs = [out / f"node{i}.log" for i in range(len(flags_per_node))]
    nodes = [_launcher(flags, job, out, log) for flags, log in zip(flags_per_node, logs)]
    try:
        codes = _wait(nodes, timeout)
    finally:
        leftovers = _kill_leftovers(_descendants(nodes) | {p.pid for p in nodes})
    assert not leftovers, _logs(*logs)
    return codes, [log.read_text() for log in logs], [p.pid for p in nodes]


def _one_error_line(log: str) -> str:
    """ddpkit's one error line, last in the log: no Python traceback. (torch's C++ store client may log
    a warning with its own stack frames when another node's store goes away first; that is torch's.)"""
    lines = log.strip().splitlines()
    ours = [line for line in lines if line.startswith("ddpkit run: error: ")]
    assert len(ours) == 1 and lines[-1] == ours[0] and "Traceback" not in log, log[-3000:]
    return ours[0]


@pytest.mark.timeout(120)
def test_rendezvous_timeout_is_one_line_naming_endpoint_nodes_timeout_and_fix(tmp_path):
    port = _free_port()
    codes, logs, _ = _run_nodes([_flags(port, node_rank=0, timeout=3)], ["sleep", "0"], tmp_path, 60)
    line = _one_error_line(logs[0])  # no traceback
    assert codes == [1]
    assert line.startswith(f"ddpkit run: error: rendezvous at 127.0.0.1:{port} timed out after --rdzv-timeout 3 s: "
                           "--nnodes 2 expects 2 nodes and no other node joined; start every node with the same "
                           f"--nnodes 2 and --rdzv-endpoint 127.0.0.1:{port}"), line
    assert "raise it if nodes start far apart" in line


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nodes, needle", [
    ([("2", 0), ("3", 1)], "this node has --nnodes {n} but localhost"),
    ([("3", 0), ("3", 1), ("3", 1)], "--node-rank 1 was given to two nodes"),
], ids=["nnodes-differ", "same-node-rank"])
def test_nodes_launched_differently_all_fail_at_once_with_one_line(tmp_path, nodes, needle):
    port = _free_port()
    started = time.monotonic()
    # --rdzv-timeout 60: they must fail on sight of each other, not time out
    codes, logs, _ = _run_nodes([_flags(port, nnodes=n, node_rank=r) for n, r in nodes], ["sleep", "0"], tmp_path, 60)
    assert time.monotonic() - started < 40 and codes == [1] * len(nodes), _logs(*tmp_path.glob("node*.log"))
    named = 0
    for log, (n, _) in zip(logs, nodes):
        line = _one_error_line(log)
        assert f"127.0.0.1:{port}" in line, line
        if needle.format(n=n) in line:
            named += 1
        else:  # a node whose peers saw the mismatch first hears it from them: they closed the rendezvous,
            # or the node hosting its store has stopped
            assert "was closed by another node" in line or "lost the rendezvous store" in line, line
    assert named >= 1, logs


@pytest.mark.timeout(240)
def test_node_rank_0_holds_global_rank_0_whichever_node_starts_first(tmp_path):
    # Nodes on one machine share an address, and torch would order them by process id: the node started
    # first would get rank 0. Started back to back, node 1 first in most rounds.
    for attempt, order in enumerate([(1, 0), (0, 1), (1, 0), (1, 0)]):
        out = tmp_path / str(attempt)
        out.mkdir()
        port = _free_port()
        codes, logs, pids = _run_nodes([_flags(port, node_rank=r) for r in order], ["sleep", "0"], out, 90)
        assert codes == [0, 0], "\n".join(logs)
        launcher_of = dict(zip(order, pids))
        ranks = _ranks(out)
        assert {r: ranks[r]["launcher_pid"] for r in ranks} == {0: launcher_of[0], 1: launcher_of[1]}, attempt
        assert {r: ranks[r]["node_rank"] for r in ranks} == {0: 0, 1: 1}
        assert "node_rank is only used for static rdzv_backend" not in "".join(logs)  # torchrun's warning


@pytest.mark.timeout(120)
def test_elastic_1_2_on_one_node_trains_with_a_short_rdzv_timeout(tmp_path):
    # MIN nodes form a group after the last call, which must end within --rdzv-timeout (torch's own is 30 s)
    port = _free_port()
    started = time.monotonic()
    codes, logs, _ = _run_nodes([_flags(port, nnodes="1:2", timeout=10)], ["train", "16", "3"], tmp_path, 60)
    assert codes == [0], logs[0][-3000:]
    ranks = _ranks(tmp_path)
    assert sorted(ranks) == [0] and ranks[0]["world_size"] == 1 and ranks[0]["steps"] == 3
    print(f"1 node of --nnodes 1:2 trained {time.monotonic() - started:.1f}s after its start")


@pytest.mark.timeout(240)
def test_elastic_survivor_trains_on_alone_after_the_other_node_is_killed(tmp_path):
    # The README's recovery recipe under a short --rdzv-timeout: the survivor waits for the rendezvous to
    # drop the lost node (up to DEAD_NODE_S), then the last call, all within the timeout.
    port = _free_port()
    flags = [[*_flags(port, nnodes="1:2", node_rank=r, timeout=24), "--max-restarts", "2"] for r in (0, 1)]
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = [_launcher(f, ["elastic", "3"], tmp_path, log) for f, log in zip(flags, logs)]
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and all(p.poll() is None for p in nodes):
            ranks = _ranks(tmp_path)
            if sorted(ranks) == [0, 1] and {r["world_size"] for r in ranks.values()} == {2}:
                break  # both nodes train together
            time.sleep(0.2)
        ranks = _ranks(tmp_path)
        assert {r["world_size"] for r in ranks.values()} == {2} and len(ranks) == 2, _logs(*logs)
        assert ranks[0]["launcher_pid"] == nodes[0].pid
        workers = {r["pid"] for r in ranks.values()} | _descendants(nodes)
        killed_at = time.monotonic()
        nodes[1].send_signal(signal.SIGKILL)
        code = _wait([nodes[0]], 90)[0]
        recovered_after = time.monotonic() - killed_at
    finally:
        leftovers = _stop(nodes, workers)
    assert code == 0 and not leftovers, _logs(*logs)
    alone = _ranks(tmp_path)[0]
    assert (alone["world_size"], alone["restart"], alone["steps"]) == (1, 1, 3), alone
    assert alone["launcher_pid"] == nodes[0].pid
    print(f"node 0 finished alone {recovered_after:.1f}s after node 1's launcher was killed (--rdzv-timeout 24)")


DIGITS = [str(Path(__file__).resolve().parents[2] / "examples" / "digits.py"), "--run-dir", "", "--epochs", "12",
          "--device", "cpu"]


def _digits_result(log: str) -> dict:
    return json.loads([line for line in log.splitlines() if line.startswith('{"test_loss"')][-1])


def _engine_nodes(environ_of_node, tmp_path: Path) -> tuple[dict, str]:
    """Two launchers, each given only its node's cluster variables and one core (so that `auto` means one
    rank): the digits job's result printed by global rank 0, and node 1's log."""
    cores = sorted(os.sched_getaffinity(0))
    flags_free = [[], []]  # `ddpkit run digits.py`: nothing on the command line
    logs = [tmp_path / f"node{r}.log" for r in (0, 1)]
    nodes = [_launcher(flags_free[r], [], tmp_path, logs[r], script=DIGITS, environ=environ_of_node(r),
                       cpus={cores[r % len(cores)]}) for r in (0, 1)]
    try:
        codes = _wait(nodes, 300)
    finally:
        leftovers = _kill_leftovers(_descendants(nodes) | {p.pid for p in nodes})
    assert codes == [0, 0] and not leftovers, _logs(*logs)
    return _digits_result(logs[0].read_text()), logs[1].read_text()


@pytest.fixture(scope="module")
def digits_on_one_node(tmp_path_factory) -> dict:
    """The reference: `ddpkit run --nproc-per-node 2 digits.py` on one node."""
    log = tmp_path_factory.mktemp("one") / "single.log"
    proc = _launcher(["--nproc-per-node", "2"], [], log.parent, log, script=DIGITS)
    try:
        assert _wait([proc], 300) == [0], _logs(log)
    finally:
        _kill_leftovers(_descendants([proc]) | {proc.pid})
    return _digits_result(log.read_text())


@pytest.mark.timeout(600)
def test_kubeflow_trainjob_variables_alone_make_two_launchers_one_digits_job(tmp_path, digits_on_one_node):
    port = _free_port()
    # Trainer v2's torch runtime: one pod per node, `ddpkit run digits.py` its whole command
    result, _ = _engine_nodes(lambda r: {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": str(r),
                                         "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}, tmp_path)
    ref = digits_on_one_node
    assert (result["world_size"], ref["world_size"]) == (2, 2)
    assert result["test_accuracy"] >= 0.97, result
    # one rank on each of two nodes sums the same two gradients as two ranks on one node: bit-identical
    assert result["param_sha256"] == ref["param_sha256"] and result["test_accuracy"] == ref["test_accuracy"]


@pytest.mark.timeout(600)
def test_skypilot_variables_alone_make_two_launchers_one_digits_job(tmp_path, digits_on_one_node):
    from ddpkit.run.nodes import skypilot_port

    def port_is_free(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) != 0

    task_id = next(t for t in (f"sky-2026-12-01-00-00-00-{i:06d}_digits_1" for i in itertools.count())
                   if port_is_free(skypilot_port(t)))
    result, log1 = _engine_nodes(lambda r: {
        "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": str(r), "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1\n",
        "SKYPILOT_NUM_GPUS_PER_NODE": "0", "SKYPILOT_TASK_ID": task_id}, tmp_path)
    ref = digits_on_one_node
    assert result["world_size"] == 2 and result["test_accuracy"] >= 0.97, result
    assert result["param_sha256"] == ref["param_sha256"] and result["test_accuracy"] == ref["test_accuracy"]
    print(f"digits, 12 epochs, 2 ranks: test_accuracy {ref['test_accuracy']:.4f} under ddpkit run, Kubeflow "
          f"and SkyPilot variables alike (param_sha256 {ref['param_sha256'][:12]})")
