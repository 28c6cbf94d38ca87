"""ddpkit.init refuses bad arguments with a one-line error before any process group or device exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist

import ddpkit
from ddpkit.env import LaunchEnv
from ddpkit.rng import MAX_SEED, check_seed

_TWO_RANKS = LaunchEnv(rank=0, world_size=2, local_world_size=2, local_rank=0, master_port=29400)


@pytest.fixture
def no_process_group(monkeypatch):
    """Fail loudly if init gets as far as creating a process group (which, for rank 0 of 2, would wait)."""
    created = []

    def refuse(*args, **kwargs):
        created.append(kwargs)
        raise AssertionError("init_process_group was called: the bad argument was not caught first")

    monkeypatch.setattr(dist, "init_process_group", refuse)
    yield created
    assert created == []
    assert not dist.is_initialized()


@pytest.mark.parametrize("kwargs,error,words", [
    ({"seed": -1}, ValueError, ["seed=-1", "0 to 2**64 - 1", "seed=0"]),
    ({"seed": 2**64}, ValueError, ["seed=18446744073709551616", "out of range"]),
    ({"seed": True}, TypeError, ["seed=True", "bool", "int"]),
    ({"seed": 1.5}, TypeError, ["seed=1.5", "float", "int"]),
    ({"seed": "0"}, TypeError, ["seed='0'", "str"]),
    ({"timeout_s": 0}, ValueError, ["timeout_s=0", "> 0", "timeout_s=600"]),
    ({"timeout_s": -5}, ValueError, ["timeout_s=-5"]),
    ({"timeout_s": float("nan")}, ValueError, ["timeout_s=nan"]),
    ({"timeout_s": float("inf")}, ValueError, ["timeout_s=inf", "at most"]),
    ({"timeout_s": 1e300}, ValueError, ["timeout_s=1e+300"]),
    ({"timeout_s": None}, TypeError, ["timeout_s=None", "number of seconds"]),
    ({"timeout_s": "600"}, TypeError, ["timeout_s='600'"]),
    ({"timeout_s": True}, TypeError, ["timeout_s=True"]),
    ({"hang_timeout_s": 0}, ValueError, ["hang_timeout_s=0", "None: no watchdog"]),
    ({"hang_timeout_s": float("inf")}, ValueError, ["hang_timeout_s=inf"]),
    ({"hang_timeout_s": "5"}, TypeError, ["hang_timeout_s='5'"]),
    ({"device": 0}, TypeError, ["device=0", "'cpu'"]),
    ({"device": "tpu"}, ValueError, ["device='tpu'", "auto"]),
    ({"init_method": 29500}, TypeError, ["init_method=29500", "file://"]),
    ({"env": {"RANK": "0"}}, TypeError, ["env=dict", "LaunchEnv"]),
])
def test_bad_init_arguments_fail_in_one_line_before_a_process_group(no_process_group, kwargs, error, words):
    kwargs = {"env": _TWO_RANKS, "init_method": "file:///nonexistent/ddpkit-rendezvous", **kwargs}
    with pytest.raises(error) as info:
        ddpkit.init(**kwargs)
    message = str(info.value)
    assert "\n" not in message
    for word in words:
        assert word in message, (word, message)
    assert info.type in (TypeError, ValueError)


def test_the_seed_rule_accepts_numpy_integers_and_the_whole_range():
    assert check_seed(np.int64(7)) == 7 and type(check_seed(np.int64(7))) is int
    assert check_seed(0) == 0 and check_seed(MAX_SEED) == MAX_SEED
    for bad in (np.float32(1.0), np.bool_(True)):
        with pytest.raises(TypeError, match=r"^ddpkit.loader: seed=.* must be an int from 0 to 2\*\*64 - 1"):
            check_seed(bad, "ddpkit.loader")


def test_a_good_seed_still_seeds_at_world_size_1():
    import torch

    ctx = ddpkit.init(seed=np.int64(3), env=LaunchEnv())
    assert ctx.seed == 3 and type(ctx.seed) is int
    first = torch.rand(1)
    ddpkit.init(seed=3, env=LaunchEnv()).close()
    assert torch.equal(torch.rand(1), first)  # the same rank seed, the same stream
    ctx.close()
