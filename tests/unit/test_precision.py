"""ddpkit.Precision on CPU: bf16 autocast, the fp16 GradScaler path (scale, unscale-before-clip, skip on inf)."""

from __future__ import annotations

import math

import pytest
import torch

import ddpkit
from ddpkit import precision
from ddpkit.precision import StepInfo
from ddpkit.precision import Precision, resolve_dtype


@pytest.fixture()
def ctx():
    with ddpkit.init(device="cpu") as c:
        yield c


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _reference_grads(model):
    """fp32 gradients of the same loss, computed by hand."""
    x, y = _batch()
    model.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def test_bf16_autocast_runs_on_cpu_and_keeps_fp32_master_weights(ctx):
    model = _model()
    prec = Precision(ctx, dtype="bf16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch()
    before = _params(model)
    with prec.autocast():
        out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
    assert out.dtype == torch.bfloat16
    prec.backward(loss)
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())
    info = prec.step(opt, model, max_grad_norm=10.0)
    assert info.skipped is False and info.scale == 1.0 and math.isfinite(info.grad_norm) and info.grad_norm > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())  # zero_grad=True by default


def test_fp32_autocast_is_a_no_op_and_auto_is_fp32_on_cpu(ctx, monkeypatch):
    # a CPU without native bf16 (the machine's own flags vary: AMX or AVX512_BF16 make 'auto' bf16)
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    assert resolve_dtype("auto", torch.device("cpu")) == "fp32"
    prec = Precision(ctx, dtype="auto")
    assert prec.dtype == "fp32" and prec.scaler is None
    with prec.autocast():
        assert _model()(_batch()[0]).dtype == torch.float32


def test_fp16_backward_scales_the_loss(ctx):
    model = _model()
    ref = _reference_grads(model)
    prec = Precision(ctx, dtype="fp16", init_scale=1024.0)
    x, y = _batch()
    prec.backward(torch.nn.functional.mse_loss(model(x), y))  # fp32 forward: only the scaling differs
    for p, g in zip(model.parameters(), ref):
        torch.testing.assert_close(p.grad, g * 1024.0)


def test_fp16_gradients_are_unscaled_before_clipping(ctx):
    model = _model()
    ref = _reference_grads(model)
    true_norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in ref])))
    prec = Precision(ctx, dtype="fp16", init_scale=2.0**16)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = _params(model)
    max_norm = true_norm / 4  # clipping must scale the true gradients by exactly 1/4
    x, y = _batch()
    prec.backward(torch.nn.functional.mse_loss(model(x), y))
    info = prec.step(opt, model, max_grad_norm=max_norm)
    # The reported norm is the true one, not 65536x it (which a clip before unscale would see).
    assert info.grad_norm == pytest.approx(true_norm, rel=1e-4)
    assert info.skipped is False and info.scale == 2.0**16
    for b, p, g in zip(before, model.parameters(), ref):
        torch.testing.assert_close(b - p.detach(), g / 4, rtol=1e-3, atol=1e-6)


def test_fp16_step_with_inf_gradient_is_skipped_and_scale_backs_off(ctx):
    model = _model()
    prec = Precision(ctx, dtype="fp16", init_scale=1024.0)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    before = _params(model)
    x, y = _batch()
    prec.backward(torch.nn.functional.mse_loss(model(x), y))
    next(model.parameters()).grad[0, 0] = float("inf")  # an fp16 overflow in one gradient
    info = prec.step(opt, model, max_grad_norm=1.0)
    assert info.skipped is True and not math.isfinite(info.grad_norm)
    assert info.scale == 512.0 and prec.skipped_steps == 1
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert not opt.state  # Adam's moments were never touched
    # The next, finite step goes through.
    prec.backward(torch.nn.functional.mse_loss(model(x), y))
    info = prec.step(opt, model, max_grad_norm=1.0)
    assert info.skipped is False and info.scale == 512.0 and prec.skipped_steps == 1
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_fp16_scale_grows_after_growth_interval_good_steps(ctx):
    model = _model()
    prec = Precision(ctx, dtype="fp16", init_scale=8.0, growth_interval=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = _batch()
    scales = []
    for _ in range(4):
        prec.backward(torch.nn.functional.mse_loss(model(x), y))
        scales.append(prec.step(opt, model).scale)
    assert scales == [8.0, 16.0, 16.0, 32.0]


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_unscaled_modes_skip_a_nan_step_too(ctx, dtype):
    model = _model()
    prec = Precision(ctx, dtype=dtype)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    before = _params(model)
    x, y = _batch()
    with prec.autocast():
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
    prec.backward(loss)
    next(model.parameters()).grad[0, 0] = float("nan")
    info = prec.step(opt, model)
    assert info.skipped is True and prec.skipped_steps == 1
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_clipping_without_a_model_uses_the_optimizers_parameters(ctx):
    model = _model()
    ref = _reference_grads(model)
    true_norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in ref])))
    prec = Precision(ctx, dtype="fp32")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    x, y = _batch()
    prec.backward(torch.nn.functional.mse_loss(model(x), y))
    grads_before = [p.grad.clone() for p in model.parameters()]
    info = prec.step(opt, max_grad_norm=true_norm / 2, zero_grad=False)
    assert info.grad_norm == pytest.approx(true_norm, rel=1e-5)
    for p, g in zip(model.parameters(), grads_before):
        torch.testing.assert_close(p.grad, g / 2, rtol=1e-5, atol=1e-7)


def test_norm_is_measured_without_clipping(ctx):
    model = _model()
    ref = _reference_grads(model)
    true_norm = float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in ref])))
    prec = Precision(ctx, dtype="fp16", init_scale=256.0)
    x, y = _batch()
    prec.backward(torch.nn.functional.mse_loss(model(x), y))
    info = prec.step(torch.optim.SGD(model.parameters(), lr=0.1), model)
    assert info.grad_norm == pytest.approx(true_norm, rel=1e-5)


def test_state_dict_round_trip_keeps_the_scale(ctx):
    prec = Precision(ctx, dtype="fp16", init_scale=64.0)
    prec.skipped_steps = 3
    other = Precision(ctx, dtype="fp16")
    other.load_state_dict(prec.state_dict())
    assert other.skipped_steps == 3 and other.scaler.get_scale() == 64.0
    with pytest.raises(ValueError, match="dtype='fp16'"):
        Precision(ctx, dtype="bf16").load_state_dict(prec.state_dict())


def test_bad_settings_name_the_fix(ctx):
    with pytest.raises(ValueError, match="dtype='float16'.*bf16"):
        Precision(ctx, dtype="float16")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="max_grad_norm=0"):
        Precision(ctx, dtype="fp32").step(opt, model, max_grad_norm=0)


def test_lazy_export():
    assert ddpkit.Precision is Precision
    assert StepInfo(grad_norm=1.0, skipped=False, scale=1.0).as_dict() == {
        "grad_norm": 1.0, "skipped": False, "scale": 1.0}


_CONVERSIONS = ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy")


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_step_reads_nothing_on_the_host_until_the_info_is_read(ctx, monkeypatch, dtype):
    """On CUDA each of these conversions waits for the device: Precision.step must do none (fused optimizer)."""
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    prec = Precision(ctx, dtype=dtype, init_scale=2.0**10)
    x, y = _batch()
    with prec.autocast():
        loss = torch.nn.functional.mse_loss(model(x), y)
    prec.backward(loss)
    before = _params(model)
    reads = []
    for name in _CONVERSIONS:
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _name=name, _original=original, **kwargs):
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    info = prec.step(opt, model, max_grad_norm=1.0)
    assert reads == []
    assert isinstance(info.grad_norm_tensor, torch.Tensor)
    assert math.isfinite(info.grad_norm) and info.skipped is False and reads  # reading is what converts
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("fused", [True, False])
def test_a_nonfinite_step_is_still_skipped_and_counted(ctx, fused):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    prec = Precision(ctx, dtype="fp32")
    x, y = _batch()
    torch.nn.functional.mse_loss(model(x), y).backward()
    next(model.parameters()).grad[0, 0] = float("nan")
    before = _params(model)
    info = prec.step(opt, model)
    assert info.skipped is True and not math.isfinite(info.grad_norm) and prec.skipped_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    torch.nn.functional.mse_loss(model(x), y).backward()
    assert prec.step(opt, model).skipped is False and prec.skipped_steps == 1
    assert opt.state[next(model.parameters())]["step"].item() == 1  # the skipped step did not count


@pytest.mark.parametrize("fused", [True, False])
def test_step_host_reads_on_cuda_simulated_and_the_unfused_one_is_named(monkeypatch, fused):
    # torch's default AdamW is foreach: it cannot skip an inf/nan step on the device, so step() reads
    # one flag on the host per step (a sync on CUDA); a fused optimizer reads nothing.
    import warnings

    from simcuda import SimCuda

    from ddpkit.env import LaunchEnv
    from ddpkit.runtime import Context

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    gpu = Context(env=LaunchEnv(rank=0, world_size=1, local_world_size=1, local_rank=0),
                  device=torch.device("cuda", 0), backend="nccl", seed=0)
    model = _model()
    for p in model.parameters():
        p._simcuda = True
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **({"fused": True} if fused else {"foreach": True}))
    prec = Precision(gpu, dtype="bf16")
    x, y = _batch()
    syncs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.nn.functional.mse_loss(model(x), y).backward()
            for p in model.parameters():
                p.grad._simcuda = True
            with SimCuda() as sim:
                prec.step(opt, model, max_grad_norm=1.0)
            syncs.append(sim.syncs)
    named = [str(w.message) for w in caught if "not fused" in str(w.message)]
    if fused:
        assert syncs == [[], [], []] and named == []
    else:
        assert syncs == [[("read", "__bool__")]] * 3
        assert len(named) == 1 and "pass fused=True to AdamW" in named[0]
