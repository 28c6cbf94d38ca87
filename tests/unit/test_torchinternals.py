"""Each private torch name ddpkit uses still exists and behaves as ddpkit expects (fails loudly if torch changes it)."""

from __future__ import annotations

import inspect

import torch
from packaging.version import Version

from ddpkit import torchinternals

# --- process-group abort, NCCL flight recorder, GradScaler's scale (runtime, watchdog, precision) ---


def test_torch_is_inside_the_checked_releases():
    minor = Version(".".join(torch.__version__.split("+")[0].split(".")[:2]))
    for low, high in (torchinternals._ABORT_CHECKED, torchinternals._RECORDER_CHECKED, torchinternals._SCALER_CHECKED):
        assert Version(low) <= minor <= Version(high), f"re-check torchinternals against torch {torch.__version__}"


def test_abort_process_group_exists_and_takes_a_group():
    import torch.distributed.distributed_c10d as c10d

    abort = getattr(c10d, "_abort_process_group", None)
    assert callable(abort), "torch removed distributed_c10d._abort_process_group: find its replacement"
    assert list(inspect.signature(abort).parameters) == ["group"]


def test_abort_process_group_aborts_a_real_group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert torchinternals.abort_process_group() is True
    assert not dist.is_initialized()


def test_nccl_flight_record_is_reachable_where_nccl_is_built():
    import torch.distributed as dist

    dump = getattr(getattr(torch._C, "_distributed_c10d", None), "_dump_nccl_trace", None)
    if dist.is_nccl_available():
        assert callable(dump), "torch with NCCL lost torch._C._distributed_c10d._dump_nccl_trace"
    else:
        assert torchinternals.nccl_flight_record() is None


def test_grad_scaler_scale_is_the_live_scale_tensor():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    scaler.scale(torch.ones((), requires_grad=True))
    scale = torchinternals.grad_scaler_scale(scaler)
    assert isinstance(scale, torch.Tensor) and scale.item() == 8.0 == scaler.get_scale()


def test_fused_optimizers_still_skip_on_a_found_inf_tensor():
    p = torch.nn.Parameter(torch.ones(3))
    fused, plain = torch.optim.AdamW([p], lr=0.1, fused=True), torch.optim.AdamW([p], lr=0.1)
    assert getattr(fused, "_step_supports_amp_scaling", None) is True
    assert not getattr(plain, "_step_supports_amp_scaling", False)
    assert torchinternals.step_unless_on_device(plain, torch.tensor(False)) is False
    p.grad = torch.ones(3)
    assert torchinternals.step_unless_on_device(fused, torch.tensor(True)) is True
    assert torch.equal(p.detach(), torch.ones(3)) and not hasattr(fused, "found_inf")
    assert torchinternals.step_unless_on_device(fused, torch.tensor(False)) is True
    assert not torch.equal(p.detach(), torch.ones(3))
