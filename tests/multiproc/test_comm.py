"""wrap(comm=...): 16-bit all-reduce matches exact DDP up to rounding; shared-memory sums match it exactly."""

from __future__ import annotations

import os

import pytest
import torch
from harness import RankInfo, run_ranks


def _grads(info: RankInfo):
    """Gradients of the same model and data under each comm option, in one process group."""
    import ddpkit

    out = {}
    with info.init(seed=0) as ctx:
        for comm in (None, "fp16", "bf16"):
            torch.manual_seed(5)
            model = ddpkit.wrap(torch.nn.Linear(32, 8), ctx, comm=comm)
            g = torch.Generator().manual_seed(100 + ctx.rank)  # different data on each rank
            model(torch.randn(16, 32, generator=g)).pow(2).sum().backward()
            out[comm] = [p.grad.clone() for p in ddpkit.unwrap(model).parameters()]
    return out


def test_compressed_allreduce_matches_exact_average_within_16_bit_rounding():
    results = run_ranks(_grads, 2)
    exact = results[0][None]
    assert all(torch.equal(a, b) for a, b in zip(exact, results[1][None]))
    for comm, rtol in (("fp16", 2e-3), ("bf16", 1e-2)):
        for rank in range(2):
            for g, e in zip(results[rank][comm], exact):
                torch.testing.assert_close(g, e, rtol=rtol, atol=rtol * float(e.abs().max()))
        assert all(torch.equal(a, b) for a, b in zip(results[0][comm], results[1][comm]))  # replicas agree
        assert any(not torch.equal(g, e) for g, e in zip(results[0][comm], exact))  # it did round


def test_comm_rejects_unknown_value_and_is_harmless_at_world_size_1():
    import ddpkit

    ctx = ddpkit.init(env=ddpkit.read_env())
    with pytest.raises(ValueError, match="comm='int8'.*'fp16' or 'bf16'"):
        ddpkit.wrap(torch.nn.Linear(2, 2), ctx, comm="int8")
    assert isinstance(ddpkit.wrap(torch.nn.Linear(2, 2), ctx, comm="fp16"), torch.nn.Linear)
    ctx.close()


def _shm_batches(step: int, rank: int, micro: int = 0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(8, 64, generator=g), torch.randn(8, 4, generator=g)


def _shm_model() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 96), torch.nn.Tanh(),
                               torch.nn.Linear(96, 4))


def _shm_train(info: RankInfo, steps: int):
    """comm=None and comm='shm' copies trained on the same data; a tiny bucket cap gives several buckets."""
    import gc

    import torch.distributed as dist

    import ddpkit
    import ddpkit.comm

    hashes, calls, names = [], {"n": 0}, []
    real_shm_state = ddpkit.comm._shm_state

    def recording_shm_state(model):  # keeps the segment's name, not the state (which holds the mapping)
        state = real_shm_state(model)
        names.append(state.name)
        return state

    ddpkit.comm._shm_state = recording_shm_state
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(*args, **kwargs):  # the shm hook's barrier: one per bucket
        calls["n"] += 1
        return real_all_reduce(*args, **kwargs)

    out = {}
    with info.init(seed=0) as ctx:
        for comm, k in ((None, 1), ("shm", 1), ("shm", 2)):
            model = ddpkit.wrap(_shm_model(), ctx, comm=comm, bucket_cap_mb=0.01)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            dist.all_reduce = counting_all_reduce
            calls["n"] = 0
            for step in range(steps):
                for micro in range(k):
                    x, y = _shm_batches(step, ctx.rank, micro)
                    with ddpkit.accumulate(model, sync=micro == k - 1):
                        (torch.nn.functional.mse_loss(model(x), y) / k).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if comm == "shm" and k == 1:
                    hashes.append(ddpkit.param_sha256(model))
            dist.all_reduce = real_all_reduce
            out[(comm, k)] = ([p.detach().clone() for p in ddpkit.unwrap(model).parameters()], calls["n"])
            del model, opt
            gc.collect()
            out["mapped"] = sum("/ddpkit-" in line for line in open("/proc/self/maps"))  # freed with the model
    out["names"] = names
    return out, hashes


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_shm_matches_exact_ddp_and_one_process_and_leaves_nothing_in_dev_shm():
    steps = 20
    (r0, hashes0), (r1, hashes1) = run_ranks(_shm_train, 2, steps, timeout=180)
    assert len(r0["names"]) == 2 and r0["names"] == r1["names"]
    assert not [n for n in r0["names"] if os.path.exists(os.path.join("/dev/shm", n))]  # unlinked at wrap
    assert hashes0 == hashes1 and len(hashes0) == steps  # replicas bit-identical after every step
    # one process on the global batch (both ranks' samples), plain SGD, same initial model
    model = _shm_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = (torch.cat(t) for t in zip(*(_shm_batches(step, rank) for rank in range(2))))
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    single = [p.detach() for p in model.parameters()]
    exact, shm = r0[(None, 1)][0], r0[("shm", 1)][0]
    for s, e, o in zip(shm, exact, single):
        torch.testing.assert_close(s, e, rtol=0, atol=1e-5)
        torch.testing.assert_close(s, o, rtol=0, atol=1e-5)
    for a, b in zip(r0[("shm", 2)][0], r1[("shm", 2)][0]):
        assert torch.equal(a, b)
    calls, accum_calls = r0[("shm", 1)][1], r0[("shm", 2)][1]
    assert calls > steps  # several buckets, so the two slot sets alternate within a step
    assert accum_calls == calls  # accumulate(): one hook call per bucket per optimizer step, not per micro-step
    assert r0["mapped"] == r1["mapped"] == 0


def test_shm_refuses_ranks_on_several_hosts_and_cuda():
    import types

    import ddpkit

    def fake_ctx(device: str, local_world_size: int):
        env = types.SimpleNamespace(local_world_size=local_world_size)
        return types.SimpleNamespace(distributed=True, device=torch.device(device), world_size=4, env=env)

    with pytest.raises(ValueError, match="comm='shm'.*LOCAL_WORLD_SIZE=2 != WORLD_SIZE=4.*comm=None"):
        ddpkit.wrap(torch.nn.Linear(2, 2), fake_ctx("cpu", 2), comm="shm")
    with pytest.raises(ValueError, match="comm='shm'.*CPU ranks.*cuda:0.*comm=None"):
        ddpkit.wrap(torch.nn.Linear(2, 2), fake_ctx("cuda:0", 4), comm="shm")


def _shm_unreachable(info: RankInfo):
    """Rank 1 looks for the segment where it is not (as a rank on another host would): every rank raises."""
    import ddpkit
    import ddpkit.comm

    if info.rank == 1:
        ddpkit.comm._SHM_DIR = info.tmp
    with info.init(seed=0) as ctx:
        try:
            ddpkit.wrap(torch.nn.Linear(4, 4), ctx, comm="shm")
        except RuntimeError as e:
            return str(e)
    return "no error"


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_shm_fails_on_every_rank_without_hanging_when_a_rank_cannot_map_the_segment():
    messages = run_ranks(_shm_unreachable, 2, timeout=60)
    assert all("1 rank(s) could not map" in m and "comm=None" in m for m in messages), messages
    assert "FileNotFoundError" in messages[1]
    name = messages[0].split("segment ")[1].split(" ")[0].strip("'")
    assert name.startswith("ddpkit-") and not os.path.exists(os.path.join("/dev/shm", name))
