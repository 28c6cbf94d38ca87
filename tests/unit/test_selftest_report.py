"""`ddpkit test`'s pure parts: rank plan, bus bandwidth convention, link type, merged verdicts, the table."""

from __future__ import annotations

import pytest

from ddpkit.run.launcher import LaunchError
from ddpkit.selftest.checks import CHECKS, bus_bandwidth
from ddpkit.selftest.command import format_table, link_type, merge_results, plan_ranks

TOPO = """\
        GPU0    GPU1    CPU Affinity    NUMA Affinity
GPU0     X      NV18    0-47            0
GPU1    NV18     X      0-47            0
"""


def test_bus_bandwidth_follows_nccl_tests():
    algbw, busbw = bus_bandwidth(8 * 10**9, 1.0, 8)
    assert algbw == 8.0 and busbw == pytest.approx(8.0 * 2 * 7 / 8)
    assert bus_bandwidth(10**9, 1.0, 1) == (1.0, 0.0)


def test_plan_ranks():
    assert plan_ranks("auto", num_gpus=8, num_cpus=64) == (8, "cuda")
    assert plan_ranks("2", num_gpus=0, num_cpus=2) == (2, "cpu")
    assert plan_ranks("cpu", num_gpus=8, num_cpus=2) == (2, "cpu")
    assert plan_ranks("3", num_gpus=8, num_cpus=2, device="cpu") == (3, "cpu")
    with pytest.raises(LaunchError, match="asks for 9 GPUs but 8 are visible"):
        plan_ranks("9", num_gpus=8, num_cpus=2)


def test_link_type():
    assert link_type("cpu", 2).startswith("shared memory / loopback")
    assert link_type("cuda", 1) == "one GPU (no link crossed)"
    assert link_type("cuda", 2, topo=TOPO) == "NVLink (NV18 between GPU0 and GPU1)"
    assert link_type("cuda", 2, topo=TOPO.replace("NV18", "SYS")).startswith("PCIe: PCIe across NUMA nodes")


def _rank(rank, failing=(), upto=len(CHECKS)):
    return {"rank": rank, "checks": [{"name": n, "ok": n not in failing, "detail": f"{n} on {rank}", "seconds": 0.5}
                                     for n in CHECKS[:upto]]}


def test_a_check_passes_only_on_every_rank_and_missing_results_fail():
    merged = {c["name"]: c for c in merge_results({0: _rank(0), 1: _rank(1, failing=("all-reduce",), upto=5)}, 2)}
    assert merged["rendezvous"]["ok"] and merged["rendezvous"]["detail"] == "rendezvous on 0"
    assert not merged["all-reduce"]["ok"] and merged["all-reduce"]["detail"] == "rank 1: all-reduce on 1"
    assert not merged["teardown"]["ok"] and merged["teardown"]["failed_ranks"] == [1]
    assert "no result from rank(s) [1]" in merged["teardown"]["detail"]
    nothing = merge_results({}, 2)
    assert len(nothing) == len(CHECKS) and not any(c["ok"] for c in nothing)


def test_table_lists_every_check_and_the_verdict():
    checks = merge_results({0: _rank(0, failing=("teardown",))}, 1)
    report = {"world_size": 1, "device": "cpu", "backend": "gloo", "torch": "2.13.0", "link": "x", "checks": checks,
              "bandwidth": [{"bytes": 1 << 20, "time_us": 100.0, "algbw_gbps": 10.0, "busbw_gbps": 15.0}],
              "seconds": 3.0}
    text = format_table(report)
    assert all(name in text for name in CHECKS)
    assert "  FAIL    rank 0: teardown on 0" in text and "FAILED: teardown" in text
    assert text.endswith("ddpkit test: single node: this machine's GPUs (or CPU ranks) only; the network between "
                         "nodes and multi-node rendezvous are not checked")
    assert "1 MiB" in text and "15.00 GB/s" in text


TOPO4 = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV4\tNV4\tSYS\tPIX\t0-23\t0\t\tN/A
GPU1\tNV4\t X \tNV4\tSYS\tPIX\t0-23\t0\t\tN/A
GPU2\tNV4\tNV4\t X \tNV4\tNODE\t0-23\t0\t\tN/A
GPU3\tSYS\tSYS\tNV4\t X \tSYS\t24-47\t1\t\tN/A
NIC0\tPIX\tPIX\tNODE\tSYS\t X \t\t\t\t
"""


def test_link_type_reads_every_pair_of_the_ranks_gpus():
    # GPU0-GPU1 is NVLink, but the ring also crosses GPU0-GPU3 (SYS): the slowest link sets the speed.
    assert link_type("cuda", 4, topo=TOPO4) == ("PCIe: PCIe across NUMA nodes (SMP interconnect) (SYS between GPU0 "
                                                "and GPU3, the slowest of 6 pairs; fastest NV4 between GPU0 and GPU1)")
    assert link_type("cuda", 3, topo=TOPO4) == "NVLink (NV4 between every pair of the 3 GPUs)"
    # CUDA_VISIBLE_DEVICES=2,3: the ranks' GPUs are the physical GPU2 and GPU3
    assert link_type("cuda", 2, topo=TOPO4, visible="2,3") == "NVLink (NV4 between GPU2 and GPU3)"
    assert link_type("cuda", 2, topo=TOPO4, visible="1,3").startswith("PCIe: PCIe across NUMA nodes")
