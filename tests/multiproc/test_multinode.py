"""Multi-node `ddpkit run` on one machine: two launchers ("nodes") over loopback, node loss, socket binding."""

from __future__ import annotations

import ipaddress
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


def _launcher(flags, job, out: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
        env.pop(name, None)
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "ddpkit.cli", "run", *flags, SCRIPT, str(out), *job],
                                stdout=f, stderr=subprocess.STDOUT, env=env)


def _node(rank: int, port: int, job: list[str], out: Path, log: Path) -> subprocess.Popen:
    return _launcher(["--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "2",
                      "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-timeout", "60", "--connect-timeout", "60"],
                     job, out, log)


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
    assert {r["steps"] for r in ranks.values()} == {6}
    assert {r["optimizer"] for r in ranks.values()} == {"SGD"}
    assert {r["optimizer"] for r in ref.values()} == {"ShardedSGD"}
    assert len({r["sha"] for r in ranks.values()}) == 1  # identical on all 4 ranks of both nodes
    assert len({r["sha"] for r in ref.values()}) == 1
    # ... and equal to one node of 4 ranks with the same global batch, up to the order of the float
    # sums: across nodes gradients go through gloo's all-reduce, on one node through shared memory
    # (and there each rank steps a quarter of the parameters)
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
        for p in nodes:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        leftovers = _kill_leftovers(workers | _descendants(nodes))
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
