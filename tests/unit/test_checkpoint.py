"""Checkpoint files and single-process save/load: atomicity, verification, refusal of pickled code, RNG."""

from __future__ import annotations

import json
import os
import pickle
import random
import shlex

import numpy as np
import pytest
import torch

import ddpkit
from ddpkit.checkpoint.api import latest_checkpoint, verify_checkpoint
from ddpkit.checkpoint.files import FORMAT, CheckpointWarning, list_checkpoints, manifest_path
from ddpkit.checkpoint.api import CheckpointError


@pytest.fixture
def ctx():
    with ddpkit.init(seed=3) as c:  # world size 1: no process group, trivial collectives
        yield c


class _Compiled(torch.nn.Module):
    """Stands in for torch.compile's wrapper: state_dict keys get an `_orig_mod.` prefix."""

    def __init__(self, inner):
        super().__init__()
        self._orig_mod = inner


def _parts(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    return model, opt, sched, scaler


def _dataset():
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(torch.randn(40, 4, generator=g), torch.randn(40, 1, generator=g))


def _train(model, opt, sched, data, steps):
    it = iter(data)
    for _ in range(steps):
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def _save(ctx, directory, step, **kw):
    model, opt, sched, scaler = _parts()
    return ddpkit.save_checkpoint(ctx, directory, step=step, model=model, optimizer=opt, scheduler=sched,
                                  scaler=scaler, **kw)


def test_round_trip_restores_everything_exactly(ctx, tmp_path):
    model, opt, sched, scaler = _parts()
    scaler.scale(torch.ones(()))  # initialises the scale
    scaler.update(64.0)
    data = ddpkit.loader(_dataset(), ctx, batch_size=4)
    _train(model, opt, sched, data, 3)  # mid-epoch: 3 of 10 steps
    path = ddpkit.save_checkpoint(ctx, tmp_path, step=3, model=_Compiled(model), optimizer=opt, scheduler=sched,
                                  scaler=scaler, loader=data, extra={"best": 0.5, "hist": [1, 2]})
    after_save = (random.random(), float(np.random.rand()), torch.rand(3))
    assert path == tmp_path / "ckpt-00000003.pt"
    manifest = json.loads(manifest_path(path).read_text())
    assert manifest["step"] == 3 and manifest["epoch"] == 0 and manifest["world_size"] == 1
    assert manifest["size"] == path.stat().st_size and len(manifest["sha256"]) == 64
    raw = torch.load(path, weights_only=True)
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in raw["model"])

    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # disturb every generator
    model2, opt2, sched2, scaler2 = _parts(seed=1)
    data2 = ddpkit.loader(_dataset(), ctx, batch_size=4)
    meta = ddpkit.load_checkpoint(ctx, tmp_path, model=model2, optimizer=opt2, scheduler=sched2, scaler=scaler2,
                                  loader=data2)
    assert (random.random(), float(np.random.rand())) == after_save[:2]
    assert torch.equal(torch.rand(3), after_save[2])
    assert meta["step"] == 3 and meta["extra"] == {"best": 0.5, "hist": [1, 2]} and meta["path"] == path
    assert ddpkit.param_sha256(model2) == ddpkit.param_sha256(model)
    assert sched2.state_dict() == sched.state_dict() and scaler2.get_scale() == 64.0
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert data2.state_dict() == data.state_dict() == {"epoch": 0, "samples_seen": 12, "seed": 3}
    assert [x.tolist() for x, _ in data2] == [x.tolist() for x, _ in data]  # the same remaining batches


def test_no_checkpoint_yet_returns_none_and_missing_file_raises(ctx, tmp_path):
    model = _parts()[0]
    assert ddpkit.load_checkpoint(ctx, tmp_path / "not-yet", model=model) is None
    assert latest_checkpoint(tmp_path) is None
    with pytest.raises(CheckpointError, match="does not exist"):
        ddpkit.load_checkpoint(ctx, tmp_path / "ckpt-00000001.pt", model=model)


def test_loads_with_weights_only_to_the_cpu(ctx, tmp_path, monkeypatch):
    _save(ctx, tmp_path, 1)
    seen = {}
    real_load = torch.load

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    ddpkit.load_checkpoint(ctx, tmp_path, model=_parts()[0])
    # load_state_dict places each tensor (see test_gpu_paths: Adam's step counters stay on the CPU)
    assert seen["weights_only"] is True and seen["map_location"] == "cpu"


def test_keep_last_rotation_and_rollback_removes_abandoned_future(ctx, tmp_path):
    for step in range(1, 6):
        _save(ctx, tmp_path, step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000004.pt", "ckpt-00000005.pt"]
    assert not list(tmp_path.glob(".ckpt-*"))  # no temporary files left
    with pytest.warns(CheckpointWarning, match="ckpt-00000005.pt"):
        _save(ctx, tmp_path, 3, keep_last=2)  # a run rolled back to an older state writes step 3
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000003.pt"]
    assert latest_checkpoint(tmp_path).name == "ckpt-00000003.pt"


def _corrupt_truncate(p):
    p.write_bytes(p.read_bytes()[:-100])


def _corrupt_flip(p):
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 0x01
    p.write_bytes(bytes(b))


def _corrupt_manifest(p):
    manifest_path(p).unlink()


@pytest.mark.parametrize("corrupt,reason", [(_corrupt_truncate, "bytes but its manifest records"),
                                            (_corrupt_flip, "sha256"), (_corrupt_manifest, "no manifest")])
def test_damaged_latest_is_detected_and_previous_used(ctx, tmp_path, corrupt, reason):
    _save(ctx, tmp_path, 1)
    good = _parts()[0]
    ddpkit.save_checkpoint(ctx, tmp_path, step=2, model=torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1)))
    latest = tmp_path / "ckpt-00000002.pt"
    corrupt(latest)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(CheckpointError, match=reason) as info:
        verify_checkpoint(latest)
    assert "\n" not in str(info.value) and str(latest) in str(info.value)
    model = _parts(seed=5)[0]
    with pytest.warns(CheckpointWarning) as record:
        meta = ddpkit.load_checkpoint(ctx, tmp_path, model=model)
    messages = [str(w.message) for w in record if issubclass(w.category, CheckpointWarning)]
    assert len(messages) == 1 and str(latest) in messages[0] and reason in messages[0] and "\n" not in messages[0]
    assert meta["step"] == 1 and ddpkit.param_sha256(model) == ddpkit.param_sha256(good)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing overwritten or removed
    with pytest.raises(CheckpointError, match=reason):  # naming the damaged file explicitly refuses it
        ddpkit.load_checkpoint(ctx, latest, model=model)


class _Payload:
    """A pickle that runs a shell command when loaded without weights_only."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _write_with_manifest(path, obj):
    torch.save(obj, path)
    import hashlib

    manifest_path(path).write_text(json.dumps({
        "format": FORMAT, "file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "size": path.stat().st_size, "step": 7}))


def test_checkpoint_carrying_pickled_code_is_refused_never_executed(ctx, tmp_path):
    marker = tmp_path / "EXECUTED"
    evil = tmp_path / "ckpt" / "ckpt-00000007.pt"
    evil.parent.mkdir()
    _write_with_manifest(evil, {"format": FORMAT, "step": 7, "model": {}, "extra": _Payload(marker)})
    verify_checkpoint(evil)  # its checksum is fine: integrity is not safety
    for source in (evil, evil.parent):
        with pytest.raises(CheckpointError) as info:
            ddpkit.load_checkpoint(ctx, source, model=_parts()[0])
        message = str(info.value)
        assert "refused to load" in message and str(evil) in message and "\n" not in message
        assert "system" in message  # names the global it refused
    assert not marker.exists()
    with open(evil, "rb") as f:  # control: the file really does run code when unpickled unsafely
        torch.load(f, weights_only=False)
    assert marker.exists()


def test_save_refuses_values_weights_only_cannot_load(ctx, tmp_path):
    with pytest.raises(CheckpointError, match=r"checkpoint\['extra'\]\['obj'\] is a builtins.object"):
        _save(ctx, tmp_path, 1, extra={"obj": object()})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("target", ["torch.save", "fsync"])
def test_failed_write_leaves_previous_checkpoint_intact(ctx, tmp_path, monkeypatch, target):
    first = _save(ctx, tmp_path, 1)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if target == "torch.save":
        monkeypatch.setattr(torch, "save", fail)
    else:
        monkeypatch.setattr("ddpkit.checkpoint.files.os.fsync", fail)
    with pytest.raises(CheckpointError, match="No space left on device.*previous checkpoints are intact"):
        _save(ctx, tmp_path, 2)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporary file, no step 2
    assert latest_checkpoint(tmp_path) == first


def test_missing_state_is_reported_with_the_fix(ctx, tmp_path):
    model, opt, _, _ = _parts()
    ddpkit.save_checkpoint(ctx, tmp_path, step=1, model=model)
    with pytest.raises(CheckpointError, match="holds no optimizer state"):
        ddpkit.load_checkpoint(ctx, tmp_path, model=model, optimizer=opt)


def test_another_optimizer_or_scheduler_class_is_named_not_a_keyerror(ctx, tmp_path):
    _save(ctx, tmp_path, step=1)  # Adam + StepLR
    model = _parts()[0]
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match=r"holds the state of a Adam optimizer but load_checkpoint got "
                                              r"optimizer=SGD; build the optimizer the run was saved with"):
        ddpkit.load_checkpoint(ctx, tmp_path, model=model, optimizer=sgd)
    model, opt, _, _ = _parts()
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=5)
    with pytest.raises(CheckpointError, match="a StepLR scheduler but load_checkpoint got scheduler=CosineAnnealingLR"):
        ddpkit.load_checkpoint(ctx, tmp_path, model=model, optimizer=opt, scheduler=cosine)
    model, opt, sched, _ = _parts()
    assert ddpkit.load_checkpoint(ctx, tmp_path, model=model, optimizer=opt, scheduler=sched)["step"] == 1


def test_argument_checks(ctx, tmp_path):
    model = _parts()[0]
    with pytest.raises(ValueError, match="step=-1"):
        ddpkit.save_checkpoint(ctx, tmp_path, step=-1, model=model)
    with pytest.raises(ValueError, match="keep_last=0"):
        ddpkit.save_checkpoint(ctx, tmp_path, step=1, model=model, keep_last=0)
    with pytest.raises(TypeError, match="nn.Module"):
        ddpkit.save_checkpoint(ctx, tmp_path, step=1, model={"w": 1})


def test_rng_state_survives_weights_only_round_trip(tmp_path):
    from ddpkit.rng import rng_state, set_rng_state

    np.random.seed(4)
    np.random.randn()  # leaves a cached gaussian in numpy's legacy state
    state = rng_state("cpu")
    torch.save(state, tmp_path / "rng.pt")
    expected = (random.random(), np.random.randn(), torch.randn(2))
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True), "cpu")
    got = (random.random(), np.random.randn(), torch.randn(2))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])
    assert pickle.dumps(state)  # plain data all the way down


def test_importing_the_parallel_module_keeps_ddpkit_wrap_the_function():
    """Importing ddpkit.parallel.api (as ddpkit.checkpoint.api does) leaves `ddpkit.wrap` the function."""
    import subprocess
    import sys

    code = ("import sys; from ddpkit.parallel.strategy import unwrap; import ddpkit; "
            "assert callable(ddpkit.wrap) and ddpkit.wrap.__name__ == 'wrap', ddpkit.wrap; "
            "assert 'torch' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_a_child_named_module_round_trips(ctx, tmp_path):
    """Keys are never rewritten on load: a user's own `self.module` child is not a DDP prefix."""

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.module = torch.nn.Linear(3, 2)

    saved = Holder()
    ddpkit.save_checkpoint(ctx, tmp_path, step=1, model=saved)
    loaded = Holder()
    assert ddpkit.load_checkpoint(ctx, tmp_path, model=loaded)["step"] == 1
    assert torch.equal(loaded.module.weight, saved.module.weight)
