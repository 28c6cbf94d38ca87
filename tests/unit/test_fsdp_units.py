"""strategy='fsdp' without processes: unit choice, option errors, precision mapping, sharded-checkpoint files."""

from __future__ import annotations

import json
import os
import pickle
import re

import pytest
import torch

import ddpkit
from ddpkit.checkpoint.api import CheckpointWarning
from ddpkit.checkpoint.files import CheckpointError, file_digest, latest_checkpoint, list_checkpoints, rotate, \
    sharded_path, verify_checkpoint, write_checkpoint_dir
from ddpkit.checkpoint.sharded import check_metadata
from ddpkit.env import LaunchEnv
from ddpkit.parallel.fsdp import mixed_precision_policy, shard_units
from ddpkit.runtime import Context


def _ctx() -> Context:
    return Context(env=LaunchEnv(rank=0, world_size=1, local_world_size=1, local_rank=0),
                   device=torch.device("cpu"), backend="gloo", seed=0)


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.inner = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU())


class Net(torch.nn.Module):
    def __init__(self, width: int = 8, tied: bool = False) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, width)
        self.layers = torch.nn.ModuleList([Block(width) for _ in range(3)])
        self.norm = torch.nn.Sequential(torch.nn.LayerNorm(width))
        self.out = torch.nn.Sequential(torch.nn.Linear(width, 10, bias=False))
        if tied:
            self.out[0].weight = self.emb.weight


def test_default_units_are_the_outermost_blocks_above_the_threshold():
    net = Net()
    block = sum(p.numel() for p in net.layers[0].parameters())  # 144
    names = [n for n, _ in shard_units(net, min_params=block)]
    # The blocks (not their inner Sequential); the LayerNorm (16) and the output layer (80) are too small.
    assert names == ["layers.2", "layers.1", "layers.0"]
    assert [n for n, _ in shard_units(net, min_params=50)] == ["out.0", "layers.2", "layers.1", "layers.0"]
    assert shard_units(net) == []  # the default threshold: a model this small is one unit, the root


def test_default_units_leave_tied_weights_to_the_root():
    assert "out.0" not in [n for n, _ in shard_units(Net(tied=True), min_params=50)]


def test_explicit_units_innermost_first_and_errors_name_the_fix():
    net = Net()
    units = [n for n, _ in shard_units(net, (Block, torch.nn.Sequential))]
    assert units.index("layers.0.inner") < units.index("layers.0")  # fully_shard runs bottom-up
    with pytest.raises(ValueError, match=r"no Conv2d submodule \(its blocks are .*Block.*\); name classes"):
        shard_units(net, (torch.nn.Conv2d,))
    with pytest.raises(ValueError, match="out.0 .* shares a parameter with emb .*tied.*leave Linear out"):
        shard_units(Net(tied=True), (torch.nn.Linear,))


@pytest.mark.parametrize("kwargs, words", [
    ({"strategy": "zero"}, "wrap(strategy='zero') is not one of 'ddp', 'fsdp'"),
    ({"strategy": "fsdp", "comm": "shm"}, "comm= chooses DDP's all-reduce"),
    ({"strategy": "fsdp", "static_graph": True}, "static_graph is a DistributedDataParallel option"),
    ({"strategy": "fsdp", "bucket_cap_mb": 5}, "bucket_cap_mb is a DistributedDataParallel option"),
    ({"strategy": "fsdp", "shard_modules": torch.nn.Linear(2, 2)}, "must be a tuple of module classes"),
    ({"strategy": "fsdp", "reshard_after_forward": 1}, "must be True or False"),
    ({"shard_modules": (Block,)}, "applies to strategy='fsdp' only"),
    ({"strategy": "fsdp", "precision": "fp16"}, "use ddpkit.Precision(ctx, 'bf16')"),
])
def test_wrap_refuses_what_the_strategy_does_not_have(kwargs, words):
    with pytest.raises((ValueError, TypeError), match=re.escape(words)):
        ddpkit.wrap(Net(), _ctx(), **kwargs)


def test_world_size_one_fsdp_returns_the_module_and_keeps_the_loop_helpers():
    net = Net()
    model = ddpkit.wrap(net, _ctx(), strategy="fsdp", shard_modules=(Block,), reshard_after_forward=False)
    assert model is net and ddpkit.unwrap(model) is net
    with ddpkit.accumulate(model, sync=False):
        pass


def test_precision_maps_onto_fsdp_mixed_precision():
    bf16 = mixed_precision_policy(ddpkit.Precision(_ctx(), "bf16"))
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision_policy("fp32") is None and mixed_precision_policy(None) is None
    with pytest.raises(TypeError, match="must be a ddpkit.Precision"):
        mixed_precision_policy("int8")


def _dcp_dir(tmp_path, step=1):
    tmp = tmp_path / f".ckpt-{step:08d}.dcp.tmp-1"
    tmp.mkdir()
    (tmp / "__0_0.distcp").write_bytes(b"shard zero" * 10)
    (tmp / "__1_0.distcp").write_bytes(b"shard one" * 10)
    files = {p.name: file_digest(p) for p in tmp.iterdir()}
    return write_checkpoint_dir(tmp_path, step, tmp, files, {"step": step})


def test_sharded_checkpoint_directory_verifies_and_rotates(tmp_path):
    first = _dcp_dir(tmp_path, 1)
    assert first == sharded_path(tmp_path, 1) and first.is_dir()
    assert verify_checkpoint(first)["step"] == 1
    second = _dcp_dir(tmp_path, 2)
    assert list_checkpoints(tmp_path) == [first, second]
    shard = second / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="__1_0.distcp is 89 bytes but its manifest records 90"):
        verify_checkpoint(second)
    with pytest.warns(CheckpointWarning, match="skipped it"):
        assert latest_checkpoint(tmp_path) == first
    (first / "__0_0.distcp").unlink()
    with pytest.raises(CheckpointError, match="__0_0.distcp is missing"):
        verify_checkpoint(first)
    (tmp_path / ".ckpt-00000009.dcp.tmp-7").mkdir()  # a save killed mid-write
    rotate(tmp_path, second, keep_last=1)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-00000002.dcp", "ckpt-00000002.json"]
    assert json.loads((tmp_path / "ckpt-00000002.json").read_text())["file"] == "ckpt-00000002.dcp"


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_dcp_metadata_carrying_code_is_refused_never_run(tmp_path):
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"x": _Evil()}))
    with pytest.raises(CheckpointError, match=r"GLOBAL (posix|os)\.system.*never runs code"):
        check_metadata(tmp_path)
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"size": torch.Size([2]), "dtype": torch.float32}))
    check_metadata(tmp_path)


def test_a_meta_model_at_world_size_1_gets_memory_and_init_weights_needs_one():
    import ddpkit

    with ddpkit.init(device="cpu") as ctx:
        with torch.device("meta"):
            net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        model = ddpkit.wrap(net, ctx, strategy="fsdp")
        assert not any(p.is_meta for p in model.parameters()) and bool((model[1].weight == 1).all())
        with torch.device("meta"):
            net = torch.nn.Linear(4, 4)
        model = ddpkit.wrap(net, ctx, init_weights=lambda m: torch.nn.init.zeros_(m.weight))
        assert model.weight.abs().sum().item() == 0 and not model.bias.is_meta
        with pytest.raises(ValueError, match="init_weights=.* applies to a model built on the meta device"):
            ddpkit.wrap(torch.nn.Linear(4, 4), ctx, init_weights=lambda m: None)
