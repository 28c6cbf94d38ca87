"""ddpkit.gather_list without processes: world size 1, argument errors, and the join with a stand-in all-gather."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
import torch

import ddpkit
import ddpkit.collectives as collectives
from ddpkit.env import LaunchEnv
from ddpkit.runtime import Context


def _ctx(rank=0, world_size=1) -> Context:
    return Context(env=LaunchEnv(rank=rank, world_size=world_size, local_world_size=world_size, local_rank=rank),
                   device=torch.device("cpu"), backend="gloo", seed=0)


def _peers(monkeypatch, *others, rank=1):
    """Stand in for all_gather_object on `rank` of len(others) + 1 ranks: the peers' payloads are `others`; what
    this rank sends is kept in the returned list."""
    sent = []

    def gather(ctx, obj):
        sent.append(obj)
        parts = list(others)
        parts.insert(rank, obj)
        return parts

    monkeypatch.setattr(collectives, "all_gather_object", gather)
    return sent


def test_world_size_one_returns_the_same_object():
    ctx = _ctx()
    for xs in ([1, 2], [], torch.arange(3), np.arange(3), torch.tensor(5)):
        assert ddpkit.gather_list(ctx, xs) is xs


@pytest.mark.parametrize(("xs", "hint"), [({"a": 1}, "all_gather_object"), ((1, 2), r"pass list\(xs\)"),
                                          ({1, 2}, "all_gather_object"), ("ab", "all_gather_object")])
def test_other_types_are_refused_at_any_world_size(xs, hint):
    with pytest.raises(TypeError, match=rf"gather_list\(ctx, xs\): xs must be a list, a torch tensor or a numpy "
                                        rf"array .*got {type(xs).__name__}.*{hint}"):
        ddpkit.gather_list(_ctx(), xs)


def test_lists_join_in_rank_order_and_keep_this_ranks_own_entries(monkeypatch):
    mine = [torch.tensor([1.0], requires_grad=True) * 2, "b"]  # not a leaf: it could not be pickled as it is
    sent = _peers(monkeypatch, [0, "a"], [3])
    out = ddpkit.gather_list(_ctx(rank=1, world_size=3), mine)
    assert out[:2] == [0, "a"] and out[2] is mine[0] and out[3:] == ["b", 3]
    assert not sent[0][0].requires_grad


def test_tensors_travel_on_the_cpu_and_come_back_where_they_were(monkeypatch):
    """Simulated on CPU, with the meta device standing in for this rank's GPU: a tensor another rank sent from its
    accelerator lands on ctx.device, one it sent from the CPU stays there."""
    Pair = namedtuple("Pair", "x y")
    gpu = collectives._OnDevice(torch.tensor([4]))
    _peers(monkeypatch, [Pair(gpu, torch.tensor([5])), {"k": [gpu]}])
    ctx = Context(env=LaunchEnv(rank=1, world_size=2, local_world_size=2, local_rank=1), device=torch.device("meta"),
                  backend="gloo", seed=0)
    out = ddpkit.gather_list(ctx, [])
    assert isinstance(out[0], Pair) and out[0].x.device.type == "meta" and out[0].x.shape == (1,)
    assert out[0].y.device.type == "cpu" and out[0].y.tolist() == [5]
    assert out[1]["k"][0].device.type == "meta"


def test_what_a_rank_sends_is_on_the_cpu_and_marks_accelerator_tensors():
    class _FakeCuda(torch.Tensor):  # a CPU tensor that says it lives on an accelerator
        @property
        def device(self):
            return torch.device("cuda", 3)

    cuda = torch.tensor([2.0]).as_subclass(_FakeCuda)
    sent = collectives._to_host([torch.tensor([1.0]), (cuda,), {"x": 7}])
    assert isinstance(sent[1][0], collectives._OnDevice) and sent[1][0].tensor.tolist() == [2.0]
    assert isinstance(sent[0], torch.Tensor) and sent[2] == {"x": 7}


def test_tensors_and_arrays_concatenate_and_an_empty_shard_changes_nothing(monkeypatch):
    _peers(monkeypatch, torch.tensor([]), rank=1)  # rank 0 had no samples: the script's float32 start
    out = ddpkit.gather_list(_ctx(rank=1, world_size=2), torch.tensor([[1, 2], [3, 4]]))
    assert out.dtype == torch.long and out.tolist() == [[1, 2], [3, 4]]
    _peers(monkeypatch, torch.tensor([[5, 6]]), rank=0)
    assert ddpkit.gather_list(_ctx(rank=0, world_size=2), torch.tensor([[1, 2]])).tolist() == [[1, 2], [5, 6]]
    _peers(monkeypatch, np.array([]), np.array([7, 8]), rank=1)
    arr = ddpkit.gather_list(_ctx(rank=1, world_size=3), np.array([1, 2], dtype=np.int64))
    assert arr.dtype == np.int64 and arr.tolist() == [1, 2, 7, 8]
    _peers(monkeypatch, torch.tensor([]), rank=1)
    empty = torch.zeros(0, 3)
    assert ddpkit.gather_list(_ctx(rank=1, world_size=2), empty) is empty
    with pytest.raises(ValueError, match="0-d tensor"):
        ddpkit.gather_list(_ctx(rank=1, world_size=2), torch.tensor(1.0))
