"""Interface choice, pre-flight endpoint checks and their one-line errors (netcheck.py, `ddpkit run`)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from ddpkit.run.netcheck import (LauncherNetwork, NetworkError, launcher_network, lost_peer, loopback_interface,
                             plan_network, probe_endpoint, split_endpoint)

ADDRS = {"lo": ["127.0.0.1", "::1"], "eth0": ["10.0.0.5"], "ib0": ["192.168.7.5"]}


def test_split_endpoint():
    assert split_endpoint("node0:29400") == ("node0", 29400)
    assert split_endpoint("[fd00::1]:29400") == ("fd00::1", 29400)
    with pytest.raises(NetworkError, match="'node0' has no port; pass HOST:PORT, e.g. node0:29400"):
        split_endpoint("node0")


def test_plan_uses_named_interface_and_leaves_user_settings_alone():
    plan = plan_network("10.0.0.9", 29400, iface="ib0", node_rank=1, environ={"NCCL_SOCKET_IFNAME": "ib1"},
                        addresses=ADDRS, resolved=["10.0.0.9"])
    assert (plan.iface, plan.address, plan.is_host) == ("ib0", "192.168.7.5", False)
    assert plan.env == {"GLOO_SOCKET_IFNAME": "ib0", "TP_SOCKET_IFNAME": "ib0"}


def test_plan_routes_to_the_endpoint_and_knows_the_host_node():
    plan = plan_network("127.0.0.1", 29400, iface=None, node_rank=None, environ={}, addresses=ADDRS,
                        resolved=["127.0.0.1"])
    assert plan.iface == "lo" and plan.is_host and plan.env["GLOO_SOCKET_IFNAME"] == "lo"
    # two "nodes" on one machine: the loopback endpoint is hosted by node rank 0 only
    assert not plan_network("127.0.0.1", 1, iface=None, node_rank=1, environ={}, addresses=ADDRS,
                            resolved=["127.0.0.1"]).is_host
    # a real address of this machine hosts the store whatever rank SLURM gave this node
    assert plan_network("10.0.0.5", 1, iface="eth0", node_rank=3, environ={}, addresses=ADDRS,
                        resolved=["10.0.0.5"]).is_host


def test_plan_unknown_interface():
    with pytest.raises(NetworkError, match="--iface 'eth9' is not an interface of this node; pick one of eth0, ib0, lo"):
        plan_network("10.0.0.9", 1, iface="eth9", node_rank=1, environ={}, addresses=ADDRS, resolved=["10.0.0.9"])


def test_loopback_interface_name():
    assert loopback_interface(ADDRS) == "lo"
    assert loopback_interface({"lo0": ["127.0.0.1"], "en0": ["10.1.1.1"]}) == "lo0"
    assert loopback_interface() in {name for _, name in socket.if_nameindex()}


def test_lost_peer_from_gloo_messages():
    assert lost_peer("[pair.cc:537] Read error [10.0.0.7]:19135: Connection reset by peer. This") == "10.0.0.7"
    assert lost_peer("[pair.cc:553] Connection closed by peer [10.0.0.8]:46780. This is") == "10.0.0.8"
    assert lost_peer("ValueError: loss is nan") is None


def _closed_port() -> int:
    with socket.socket() as s:  # nothing listens on it once closed (a refused connect is what we want)
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe_closed_port_fails_within_its_timeout():
    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(NetworkError) as e:
        probe_endpoint("127.0.0.1", port, iface="lo", timeout_s=1.0)
    assert time.monotonic() - start < 3
    assert f"127.0.0.1:{port} is not reachable" in str(e.value) and "interface lo" in str(e.value)
    assert "connection refused" in str(e.value)


def test_probe_open_port_returns():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        probe_endpoint("127.0.0.1", s.getsockname()[1], iface="lo", timeout_s=1.0)


def _run(args, timeout=60):
    return subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", *args], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("endpoint, needles", [
    ("no-such-host.invalid:29400", ["host 'no-such-host.invalid' does not resolve"]),
    (None, ["is not reachable from this node over interface lo", "connection refused"]),
])
def test_wrong_endpoint_is_a_one_line_error_within_seconds(tmp_path, endpoint, needles):
    script = tmp_path / "t.py"
    script.write_text("raise SystemExit('must not run')\n")
    endpoint = endpoint or f"127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    proc = _run(["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1", "--rdzv-endpoint", endpoint,
                 "--connect-timeout", "2", str(script)])
    elapsed = time.monotonic() - start
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"ddpkit run: error: --rdzv-endpoint {endpoint}"), proc.stderr
    assert all(n in lines[0] for n in needles), lines[0]
    # interpreter + torch import + 2 s of retries, never torchrun's 60-600 s waits (under 20 s on an idle 2-core
    # machine; the bound leaves room for a loaded one, where the import alone has taken 15 s)
    assert elapsed < 45


def test_launcher_network_binds_what_it_hosts_and_lets_torch_decide_the_rest():
    lo = loopback_interface()
    one = launcher_network(None, single_node=True, iface=None, node_rank=None, connect_timeout_s=1, environ={})
    assert (one.bind_addr, one.is_host, one.local_addr) == ("127.0.0.1", True, None)
    assert one.env["GLOO_SOCKET_IFNAME"] == lo
    with socket.socket() as server:  # the rendezvous node that a non-host node probes
        server.bind(("127.0.0.1", 0))
        server.listen()
        endpoint = f"127.0.0.1:{server.getsockname()[1]}"

        def plan(**kw) -> LauncherNetwork:
            return launcher_network(endpoint, single_node=False, connect_timeout_s=5, environ={}, **kw)

        # --iface: the stores it hosts listen there only, and the node advertises that address
        assert plan(iface=lo, node_rank=1) == LauncherNetwork(env={name: lo for name in ("GLOO_SOCKET_IFNAME",
                                                              "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")},
                                                              local_addr="127.0.0.1", bind_addr="127.0.0.1",
                                                              is_host=False)
        assert plan(iface=None, node_rank=0).is_host is True and plan(iface=None, node_rank=0).bind_addr is None
        assert plan(iface=None, node_rank=None).is_host is None  # torch finds out by binding the endpoint
    with pytest.raises(NetworkError, match="has no port"):
        launcher_network("head", single_node=False, iface=None, node_rank=None, connect_timeout_s=1, environ={})
