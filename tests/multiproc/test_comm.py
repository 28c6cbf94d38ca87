"""wrap(comm=...): the shared-memory default matches exact DDP (bit for bit on 2 ranks); 16-bit is close."""

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


def _shm_train(info: RankInfo, steps: int, piece_bytes: int, tso: bool):
    """comm=None, 'auto' and 'shm' copies trained on the same data; a tiny bucket cap gives several buckets."""
    import gc

    import ddpkit
    import ddpkit.comm
    import ddpkit.shm

    ddpkit.comm._PIECE_BYTES = piece_bytes  # buckets span several pieces, the last one a ragged share
    ddpkit.shm._TSO = tso  # False: the gloo barrier other CPUs use
    hashes, calls, names, live = [], {"n": 0}, [], []
    real_shm_state, real_exchange = ddpkit.comm._shm_state, ddpkit.comm._exchange

    def recording_shm_state(*args, **kwargs):  # keeps the segment's name; the state only while its model lives
        state = real_shm_state(*args, **kwargs)
        names.append(state.name)
        live.append(state)
        return state

    def counting_exchange(state, buffer):  # one per bucket per backward
        calls["n"] += 1
        return real_exchange(state, buffer)

    ddpkit.comm._shm_state, ddpkit.comm._exchange = recording_shm_state, counting_exchange
    out = {}
    with info.init(seed=0) as ctx:
        for comm, k in ((None, 1), ("auto", 1), ("shm", 2)):
            model = ddpkit.wrap(_shm_model(), ctx, comm=comm, bucket_cap_mb=0.01)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            calls["n"] = 0
            for step in range(steps):
                for micro in range(k):
                    x, y = _shm_batches(step, ctx.rank, micro)
                    with ddpkit.accumulate(model, sync=micro == k - 1):
                        (torch.nn.functional.mse_loss(model(x), y) / k).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if comm == "auto":
                    hashes.append(ddpkit.param_sha256(model))
            out[(comm, k)] = ([p.detach().clone() for p in ddpkit.unwrap(model).parameters()], calls["n"])
            for state in live:  # the cached plans view the segment only, never a (since rebuilt) DDP bucket
                arena = state.arena.untyped_storage().data_ptr()
                views = [t for plan in state._plans.values() for _, _, mine, terms, share, result in plan
                         for t in (mine, share, result, *(terms or ()))]
                out[comm, "plans view the segment only"] = bool(views) and all(
                    t.untyped_storage().data_ptr() == arena for t in views)
                del state, views  # they hold the mapping, which must go with the model
            live.clear()
            del model, opt
            gc.collect()
            out["mapped"] = sum("/ddpkit-" in line for line in open("/proc/self/maps"))  # freed with the model
    out["names"] = names
    return out, hashes


def _one_process_reference(steps: int, world_size: int) -> list[torch.Tensor]:
    """One process on the global batch (every rank's samples), plain SGD, same initial model."""
    model = _shm_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = (torch.cat(t) for t in zip(*(_shm_batches(step, rank) for rank in range(world_size))))
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return [p.detach() for p in model.parameters()]


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
@pytest.mark.parametrize("world_size,piece_bytes,tso", [(2, 1 << 20, True), (2, 4096, True), (2, 4096, False),
                                                         (3, 4100, True)])
def test_shm_is_the_default_matches_exact_ddp_and_leaves_nothing_in_dev_shm(world_size, piece_bytes, tso):
    steps = 12
    results = run_ranks(_shm_train, world_size, steps, piece_bytes, tso, timeout=180)
    r0, hashes0 = results[0]
    assert len(r0["names"]) == 2 and all(r["names"] == r0["names"] for r, _ in results)
    assert not [n for n in r0["names"] if os.path.exists(os.path.join("/dev/shm", n))]  # unlinked at wrap
    assert len(hashes0) == steps and all(h == hashes0 for _, h in results)  # replicas bit-identical every step
    exact, auto = r0[(None, 1)][0], r0[("auto", 1)][0]
    for s, e, o in zip(auto, exact, _one_process_reference(steps, world_size)):
        if world_size == 2:  # a/2 + b/2 either way: the same bits as PyTorch's all-reduce
            assert torch.equal(s, e)
        torch.testing.assert_close(s, e, rtol=0, atol=1e-6)
        torch.testing.assert_close(s, o, rtol=0, atol=1e-5)
    for r, _ in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r0[("shm", 2)][0], r[("shm", 2)][0]))
    assert r0[(None, 1)][1] == 0  # comm=None: PyTorch's all-reduce, no exchange
    calls, accum_calls = r0[("auto", 1)][1], r0[("shm", 2)][1]
    assert calls > steps  # several buckets
    assert accum_calls == calls  # accumulate(): one exchange per bucket per optimizer step, not per micro-step
    assert all(r["mapped"] == 0 for r, _ in results)
    assert all(r["auto", "plans view the segment only"] and r["shm", "plans view the segment only"] for r, _ in results)


def _big_bucket(info: RankInfo):
    """A 36 MB gradient bucket through the default exchange; the mapped segment stays the same small size."""
    import ddpkit

    with info.init(seed=0) as ctx:
        grads = {}
        for comm in (None, "auto"):
            torch.manual_seed(3)
            model = ddpkit.wrap(torch.nn.Linear(3000, 3000), ctx, comm=comm)
            g = torch.Generator().manual_seed(ctx.rank)
            model(torch.randn(4, 3000, generator=g)).square().mean().backward()
            grads[comm] = [p.grad.clone() for p in model.parameters()]
            segments = [line.split()[0].split("-") for line in open("/proc/self/maps") if "/ddpkit-" in line]
            grads[comm, "mapped"] = sum(int(b, 16) - int(a, 16) for a, b in segments)
        return grads


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_shm_segment_size_does_not_grow_with_the_bucket():
    import ddpkit.comm

    for grads in run_ranks(_big_bucket, 2, timeout=120):
        assert all(torch.equal(a, b) for a, b in zip(grads[None], grads["auto"]))
        assert grads[None, "mapped"] == 0
        assert 0 < grads["auto", "mapped"] <= 2 * 64 + 3 * ddpkit.comm._PIECE_BYTES + 4096 < 36_000_000 // 8


def _own_hooks(info: RankInfo):
    """A user's hook replaces the default exchange; an explicit comm= keeps the slot and says so."""
    import torch.distributed as dist

    import ddpkit

    out = {}
    with info.init(seed=0) as ctx:
        model = ddpkit.wrap(torch.nn.Linear(8, 8), ctx)
        seen = []

        def my_hook(state, bucket):
            seen.append(state)
            return dist.all_reduce(bucket.buffer().div_(ctx.world_size), async_op=True).get_future().then(
                lambda f: f.value()[0])

        model.register_comm_hook("mine", my_hook)
        model(torch.ones(2, 8)).sum().backward()
        out["user_hook_calls"] = seen
        builtin = ddpkit.wrap(torch.nn.Linear(8, 8), ctx)
        builtin.register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        builtin(torch.ones(2, 8)).sum().backward()
        out["builtin_grad"] = builtin.module.bias.grad.tolist()
        for comm, call in (("shm", lambda m: m.register_comm_hook(None, my_hook)),
                           ("auto", lambda m: m.register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS))):
            try:
                call(ddpkit.wrap(torch.nn.Linear(8, 8), ctx, comm=comm))
            except RuntimeError as e:
                out[comm] = str(e)
    return out


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_a_users_comm_hook_replaces_the_default_exchange():
    for out in run_ranks(_own_hooks, 2):
        assert out["user_hook_calls"] == ["mine"]
        assert out["builtin_grad"] == [2.0] * 8  # d(sum)/d(bias) = batch size 2, averaged over ranks
        assert "wrap(comm='shm')" in out["shm"] and "comm=None" in out["shm"]
        assert "FP16_COMPRESS" in out["auto"] and "comm='fp16'" in out["auto"]


def _peer_dies(info: RankInfo):
    """Rank 1 dies before its backward: rank 0's backward raises, naming it, instead of waiting forever."""
    import ddpkit

    ctx = info.init(seed=0)
    model = ddpkit.wrap(torch.nn.Linear(8, 8), ctx)
    if info.rank == 1:
        os._exit(3)
    model(torch.ones(2, 8)).sum().backward()


def _peer_stalls(info: RankInfo):
    """Rank 1 skips a backward: rank 0 gives up after the context's timeout_s with a message saying so."""
    import dataclasses
    import time

    import ddpkit

    with info.init(seed=0) as ctx:  # gloo keeps its long timeout for the closing barrier
        model = ddpkit.wrap(torch.nn.Linear(8, 8), dataclasses.replace(ctx, timeout_s=2))
        if info.rank == 1:
            time.sleep(5)
            return None
        start = time.monotonic()
        try:
            model(torch.ones(2, 8)).sum().backward()
        except RuntimeError as e:
            return str(e), time.monotonic() - start
        return None


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_shm_exchange_does_not_hang_when_a_peer_dies_or_stalls():
    with pytest.raises(AssertionError, match=r"(?s)rank 0 raised:.*rank 1 \(pid \d+\) exited while rank 0 waited"
                                             r".*rank 1: no result \(exit code 3\)"):
        run_ranks(_peer_dies, 2, timeout=60)
    (message, waited), _ = run_ranks(_peer_stalls, 2, timeout=60)
    assert "rank 0 waited" in message and "skipped a backward()" in message
    assert 2 <= waited < 5


def _auto_falls_back(info: RankInfo):
    """'auto' keeps PyTorch's all-reduce, on every rank, where shared memory cannot serve: no error."""
    import ddpkit
    import ddpkit.comm
    import ddpkit.shm

    calls = []
    real_exchange = ddpkit.comm._exchange
    ddpkit.comm._exchange = lambda state, buffer: calls.append(1) or real_exchange(state, buffer)
    if info.rank == 1:
        ddpkit.shm._SHM_DIR = info.tmp  # looks for the segment where it is not, as a rank on another host would
    with info.init(seed=0) as ctx:
        model = ddpkit.wrap(torch.nn.Linear(4, 4), ctx)
        model(torch.ones(2, 4)).sum().backward()
        ddpkit.shm._SHM_DIR = "/dev/shm"
        sparse = ddpkit.wrap(torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=True), ctx)
        sparse(torch.tensor([[1, 2]])).sum().backward()
        return len(calls), model.module.bias.grad.tolist(), sparse.module.weight.grad.is_sparse


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_auto_falls_back_to_allreduce_on_every_rank():
    assert run_ranks(_auto_falls_back, 2) == [(0, [2.0] * 4, True)] * 2


def test_auto_resolves_to_shm_only_for_cpu_ranks_on_one_host():
    import types

    from ddpkit.comm import resolve_comm

    def fake_ctx(device: str, world_size: int, local_world_size: int):
        env = types.SimpleNamespace(local_world_size=local_world_size)
        return types.SimpleNamespace(distributed=world_size > 1, device=torch.device(device), world_size=world_size,
                                     env=env)

    dense = torch.nn.Linear(2, 2)
    assert resolve_comm("auto", fake_ctx("cpu", 4, 4), dense) == "shm"
    assert resolve_comm("auto", fake_ctx("cpu", 4, 2), dense) is None  # two hosts
    assert resolve_comm("auto", fake_ctx("cuda:0", 4, 4), dense) is None
    assert resolve_comm("auto", fake_ctx("cpu", 1, 1), dense) is None
    assert resolve_comm("auto", fake_ctx("cpu", 4, 4), torch.nn.Embedding(5, 2, sparse=True)) is None
    for explicit in (None, "bf16", "shm"):
        assert resolve_comm(explicit, fake_ctx("cuda:0", 4, 2), dense) == explicit


def test_shm_refuses_ranks_on_several_hosts_and_cuda():
    import ddpkit
    from ddpkit.env import LaunchEnv
    from ddpkit.runtime import Context

    def fake_ctx(device: str, local_world_size: int):  # rank 0 of 4, without a process group
        env = LaunchEnv(rank=0, world_size=4, local_world_size=local_world_size, local_rank=0)
        return Context(env=env, device=torch.device(device), backend="gloo", seed=0)

    with pytest.raises(ValueError, match="comm='shm'.*LOCAL_WORLD_SIZE=2 != WORLD_SIZE=4.*comm=None"):
        ddpkit.wrap(torch.nn.Linear(2, 2), fake_ctx("cpu", 2), comm="shm")
    with pytest.raises(ValueError, match="comm='shm'.*CPU ranks.*cuda:0.*comm=None"):
        ddpkit.wrap(torch.nn.Linear(2, 2), fake_ctx("cuda:0", 4), comm="shm")


def _shm_unreachable(info: RankInfo):
    """Rank 1 looks for the segment where it is not (as a rank on another host would): every rank raises."""
    import ddpkit
    import ddpkit.comm
    import ddpkit.shm

    if info.rank == 1:
        ddpkit.shm._SHM_DIR = info.tmp
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


class _Branchy(torch.nn.Module):
    """A frozen layer, a float64 head (its own bucket), and a branch that gets no gradient on odd steps."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(11)
        self.frozen = torch.nn.Linear(6, 6).requires_grad_(False)
        self.body = torch.nn.Linear(6, 6)
        self.branch = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 2).double()

    def forward(self, x, use_branch: bool):
        h = self.body(self.frozen(x)).tanh()
        if use_branch:
            h = h + self.branch(h)
        return self.head(h.double())


def _unusual_models(info: RankInfo):
    """The default exchange on unused parameters, frozen layers, float64 buckets and uneven inputs (Join)."""
    from torch.distributed.algorithms.join import Join

    import ddpkit

    out = {}
    with info.init(seed=0) as ctx:
        for comm in (None, "auto"):
            model = ddpkit.wrap(_Branchy(), ctx, comm=comm, find_unused_parameters=True)
            opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
            steps = 6 if ctx.rank == 0 else 4  # rank 1 runs out of data first: Join shadows its backward passes
            with Join([model]):
                for step in range(steps):
                    g = torch.Generator().manual_seed(100 * step + ctx.rank)
                    model(torch.randn(4, 6, generator=g), use_branch=step % 2 == 0).square().mean().backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            out[comm] = [p.detach().clone() for p in ddpkit.unwrap(model).parameters()]
    return out


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_default_exchange_handles_unused_frozen_float64_and_uneven_inputs():
    results = run_ranks(_unusual_models, 2, timeout=120)
    for r in results:
        assert all(torch.equal(a, b) for a, b in zip(r[None], r["auto"]))  # same bits as PyTorch's all-reduce
    assert all(torch.equal(a, b) for a, b in zip(results[0]["auto"], results[1]["auto"]))
    assert results[0]["auto"][-1].dtype == torch.float64
    assert not torch.equal(results[0]["auto"][2], _Branchy().body.weight)  # it trained
