"""GPU-path behaviour that real gloo ranks can show: DDP's first gradient bucket."""

from __future__ import annotations

import torch
from harness import RankInfo, run_ranks


def _bucket_sizes(info: RankInfo, options: dict) -> tuple[list[int], bool]:
    """Bytes of each gradient bucket DDP all-reduces in the second backward (in order; DDP puts every
    parameter in one bucket for the first and rebuilds its buckets after it), and whether DDP considers its
    bucket size its own default."""
    import ddpkit

    with info.init(seed=0) as ctx:
        torch.manual_seed(0)
        # 8 x 256 KiB of weights: more than the 1 MiB first bucket, much less than 25 MiB.
        model = ddpkit.wrap(torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(8)]), ctx, comm=None,
                            **options)
        sizes = []

        def recording_hook(state, bucket):
            sizes.append(bucket.buffer().numel() * bucket.buffer().element_size())
            fut = torch.distributed.all_reduce(bucket.buffer(), async_op=True).get_future()
            return fut.then(lambda f: f.value()[0] / ctx.world_size)

        model.register_comm_hook(None, recording_hook)
        for _ in range(2):
            sizes.clear()
            model(torch.randn(4, 256)).sum().backward()
        return sizes, bool(model.bucket_bytes_cap_default)


def test_ddp_keeps_its_small_first_bucket_unless_a_bucket_size_is_given():
    default, explicit = (run_ranks(_bucket_sizes, 2, options, timeout=180) for options in ({}, {"bucket_cap_mb": 25}))
    sizes, is_default = default[0]
    # The 1 MiB first bucket: it closes with the layer that takes it past 1 MiB.
    assert is_default and len(sizes) >= 2 and sizes[0] <= 1024 * 1024 + 257 * 256 * 4, sizes
    sizes, is_default = explicit[0]
    assert not is_default and len(sizes) == 1, sizes  # 25 MiB given: everything in one bucket


# ddpkit check on scripts written for GPUs: what it maps, what it says it did not check, what it reports.

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[1] / "fixtures" / "check"


def _check(script: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", CKPT=str(tmp_path / "snapshot.pt"))
    return subprocess.run([sys.executable, "-m", "ddpkit.cli", "check", str(FIXTURES / script)],
                          capture_output=True, text=True, timeout=160, env=env, cwd=FIXTURES)


def _at(script: str, text: str) -> str:
    lines = (FIXTURES / script).read_text().splitlines()
    return f"{script}:{next(i for i, line in enumerate(lines, 1) if text in line)}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("script, mapped", [
    ("good_tutorial_trainer.py", [("Module.to(0) -> cpu", "self.model = model.to(self.gpu_id)"),
                                  ("DistributedDataParallel device_ids= dropped (CPU)", "self.model = DDP("),
                                  ("Tensor.to(0) -> cpu", "source = source.to(self.gpu_id)")]),
    ("good_tutorial_accelerator.py", [
        ("torch.accelerator.current_accelerator() -> cuda (then cpu)", "current_accelerator()"),
        ("init_process_group backend 'nccl' -> 'gloo'", "dist.init_process_group(backend)"),
        ("torch.accelerator.set_device_index() skipped", "set_device_index(local_rank)"),
        ("torch.device(0) -> cuda:0 (then cpu)", "device = torch.device(local_rank)"),
        ("torch.accelerator.current_device_index() -> 0 (then cpu)", "device_ids=[torch.accelerator"),
        ("torch.cuda.current_device() -> 0 (then cpu)", ".to(torch.cuda.current_device())")]),
    ("good_sync_batchnorm.py", [
        ("nn.SyncBatchNorm -> BatchNorm (per-rank statistics: cross-rank synchronisation not checked)",
         "nn.SyncBatchNorm(8)"),
        ("SyncBatchNorm.convert_sync_batchnorm() skipped (BatchNorm keeps per-rank statistics: cross-rank "
         "synchronisation not checked)", "convert_sync_batchnorm(model)")]),
])
def test_scripts_written_for_gpus_run_mapped_with_each_mapping_at_its_line(script, mapped, tmp_path):
    out = _check(script, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no problems found" in out.stdout
    for what, line_text in mapped:
        assert f"  mapped for CPU: {what} at {_at(script, line_text)}\n" in out.stdout, out.stdout


@pytest.mark.timeout(180)
def test_a_cpu_tensor_given_to_an_nccl_collective_is_reported_at_its_line(tmp_path):
    script = "bad_cpu_tensor_collective.py"
    out = _check(script, tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    site = f"{_at(script, 'dist.all_reduce(total)')}: [device]"
    [finding] = [line for line in out.stdout.splitlines() if site in line]
    assert "ranks 0,1 pass a CPU tensor (float32[1]) to all_reduce" in finding
    assert "No backend type associated with device type cpu" in finding
    assert "1 problem found" in out.stdout  # the tensors moved with .to(device) are not reported


@pytest.mark.timeout(180)
def test_cpu_tensors_given_to_nccl_groups_and_single_tensor_collectives_are_reported(tmp_path):
    # A collective with group= went unchecked; a group made with new_group has its default's backend
    # (or the one named), and a gloo group takes CPU tensors.
    script = "bad_cpu_tensor_group_collectives.py"
    out = _check(script, tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    for op, line in [("all_reduce", "dist.all_reduce(stats, group=everyone)"),
                     ("all_gather_into_tensor", "dist.all_gather_into_tensor("),
                     ("reduce_scatter_tensor", "dist.reduce_scatter_tensor("),
                     ("all_to_all_single", "dist.all_to_all_single("),
                     ("broadcast", "dist.broadcast(stats, 0, named)")]:
        assert f"{_at(script, line)}: [device] ranks 0,1 pass a CPU tensor" in out.stdout, (op, out.stdout)
    named = _at(script, "named = dist.new_group")
    assert f"mapped for CPU: new_group backend 'nccl' -> 'gloo' at {named}" in out.stdout, out.stdout
    assert "5 problems found" in out.stdout, out.stdout  # not the gloo group's, nor the GPU tensor's
