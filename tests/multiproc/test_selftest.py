"""`ddpkit test` end to end on 2 CPU ranks: every check passes, the JSON is complete, a real failure exits 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def _ddpkit_test(*args: str, cwd) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "ddpkit.cli", "test", "--nproc-per-node", "2", *args],
                          capture_output=True, text=True, timeout=240, env=env, cwd=cwd)


@pytest.mark.timeout(300)
def test_ddpkit_test_passes_on_two_cpu_ranks_and_reports_json(tmp_path):
    out = _ddpkit_test("--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)  # stdout holds the JSON only: the ranks print to stderr
    assert report["ok"] is True and report["world_size"] == 2 and report["device"] == "cpu"
    assert report["backend"] == "gloo" and report["link"].startswith("shared memory / loopback")
    names = [c["name"] for c in report["checks"]]
    assert names == ["rendezvous", "all-reduce", "bus bandwidth", "DDP equivalence", "batches to device",
                     "mixed precision", "checkpoint round trip", "skipped collective", "teardown"]
    assert all(c["ok"] and c["failed_ranks"] == [] for c in report["checks"]), report["checks"]
    assert "reported after" in next(c["detail"] for c in report["checks"] if c["name"] == "skipped collective")
    assert len(report["bandwidth"]) == 3
    for row in report["bandwidth"]:
        assert row["busbw_gbps"] > 0 and row["busbw_gbps"] == pytest.approx(row["algbw_gbps"], abs=1e-3)  # 2(n-1)/n = 1
    assert report["seconds"] < 200


@pytest.mark.timeout(300)
def test_ddpkit_test_fails_when_a_check_fails(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoint directory should be")
    out = _ddpkit_test("--checkpoint-dir", str(blocker), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    rows = {line.split("  ")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("  ")
            and ("  ok  " in line or "  FAIL  " in line)}
    assert "  FAIL  " in rows["checkpoint round trip"] and str(blocker) in rows["checkpoint round trip"]
    assert "  ok  " in rows["teardown"] and "  ok  " in rows["all-reduce"]
    assert "FAILED: checkpoint round trip" in out.stdout


def _device_collective_order(info) -> list[str]:
    """The collectives `ddpkit test`'s skipped-collective check issues on device communicators (every
    group but those it asks to be gloo, which stay on the host on GPUs too), in this rank's order."""
    import types

    import torch.distributed as dist

    from ddpkit.selftest import checks

    labels: dict[int, str] = {}
    order: list[str] = []
    new_group, all_reduce, barrier = dist.new_group, dist.all_reduce, dist.barrier

    def label(group) -> str:
        return "default" if group is None else labels.get(id(group), "?")

    def made(*args, **kwargs):
        group = new_group(*args, **kwargs)
        labels[id(group)] = "host" if kwargs.get("backend") == "gloo" else f"group{len(labels)}"
        return group

    def logged(op, fn):
        def call(*args, group=None, **kwargs):
            if label(group) != "host":
                order.append(f"{op}@{label(group)}")
            return fn(*args, group=group, **kwargs)
        return call

    dist.new_group, dist.all_reduce, dist.barrier = made, logged("all_reduce", all_reduce), logged("barrier", barrier)
    try:
        with info.init() as ctx:
            checks._skipped_collective(ctx, types.SimpleNamespace(hang_timeout=1.0))
    finally:
        dist.new_group, dist.all_reduce, dist.barrier = new_group, all_reduce, barrier
    return order


@pytest.mark.timeout(120)
def test_the_skipped_collective_check_orders_device_communicators_alike_on_every_rank():
    # NCCL deadlocks when ranks interleave two communicators' collectives in different orders.
    from harness import run_ranks

    rank0, rank1 = run_ranks(_device_collective_order, 2, timeout=90)
    assert rank0 == rank1, (rank0, rank1)
    assert rank0.count("all_reduce@group0") == 2
