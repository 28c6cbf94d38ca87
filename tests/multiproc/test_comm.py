"""wrap(comm=...): the default is PyTorch's DDP all-reduce with no hook; opt-in 'shm' matches it (bit for bit on
2 ranks); 16-bit is close."""

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
    from ddpkit.env import read_env

    ctx = ddpkit.init(env=read_env())
    with pytest.raises(ValueError, match="comm='int8'.*'fp16' or 'bf16'"):
        ddpkit.wrap(torch.nn.Linear(2, 2), ctx, comm="int8")
    assert isinstance(ddpkit.wrap(torch.nn.Linear(2, 2), ctx, comm="fp16"), torch.nn.Linear)
    ctx.close()


def _hooks_registered(info: RankInfo):
    """Which comm hooks ddpkit registers for the default, comm=None and the deprecated comm='auto'."""
    import warnings

    import ddpkit

    DDP = torch.nn.parallel.DistributedDataParallel
    calls = []
    real_register = DDP.register_comm_hook

    def spy_register(self, state, hook):  # DDP's one public way in; its builtin hooks are private
        calls.append(getattr(hook, "__name__", repr(hook)))
        return real_register(self, state, hook)

    DDP.register_comm_hook = spy_register
    out = {}
    with info.init(seed=0) as ctx:
        for label, kwargs in (("default", {}), ("None", {"comm": None}), ("auto", {"comm": "auto"})):
            calls.clear()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = ddpkit.wrap(torch.nn.Linear(8, 8), ctx, **kwargs)
            g = torch.Generator().manual_seed(ctx.rank)
            model(torch.randn(4, 8, generator=g)).sum().backward()
            out[label] = {
                "hooks": list(calls),
                "patched": sorted(n for n in vars(model) if "register" in n),  # methods set on the instance
                "warnings": [f"{w.category.__name__}: {w.message} @ {os.path.basename(w.filename)}" for w in caught],
                "grad": model.module.weight.grad.clone(),
            }
        calls.clear()
        ddpkit.wrap(torch.nn.Linear(8, 8), ctx, comm="bf16")
        out["bf16"] = list(calls)  # the spy does see ddpkit's own registrations
    return out


def test_default_wrap_registers_no_comm_hook_and_patches_nothing():
    for out in run_ranks(_hooks_registered, 2):
        for label in ("default", "None", "auto"):
            assert out[label]["hooks"] == [], (label, out[label]["hooks"])
            assert out[label]["patched"] == [], label
            assert torch.equal(out[label]["grad"], out["default"]["grad"])
        assert out["default"]["warnings"] == [] and out["None"]["warnings"] == []
        (warning,) = out["auto"]["warnings"]
        assert warning.startswith("FutureWarning: wrap(comm='auto') is deprecated") and "comm='shm'" in warning
        assert warning.endswith("@ test_comm.py")  # points at the caller's line, not ddpkit's
        assert out["bf16"] == ["ddpkit_bfloat16_compress_hook"]


def test_auto_is_a_deprecated_alias_of_none_at_world_size_1():
    import ddpkit
    from ddpkit.env import read_env

    ctx = ddpkit.init(env=read_env())
    with pytest.warns(FutureWarning, match=r"comm='auto'.*default is now comm=None.*comm='shm'"):
        assert isinstance(ddpkit.wrap(torch.nn.Linear(2, 2), ctx, comm="auto"), torch.nn.Linear)
    ctx.close()


def _shm_batches(step: int, rank: int, micro: int = 0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    return torch.randn(8, 64, generator=g), torch.randn(8, 4, generator=g)


def _shm_model() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Tanh(), torch.nn.Linear(96, 96), torch.nn.Tanh(),
                               torch.nn.Linear(96, 4))


def _shm_train(info: RankInfo, steps: int, piece_bytes: int, tso: bool):
    """comm=None and 'shm' copies trained on the same data; a tiny bucket cap gives several buckets."""
    import gc

    import ddpkit
    import ddpkit.parallel.shm

    ddpkit.parallel.shm.PIECE_BYTES = piece_bytes  # buckets span several pieces, the last one a ragged share
    ddpkit.parallel.shm._TSO = tso  # False: the gloo barrier other CPUs use
    hashes, calls, names, live = [], {"n": 0}, [], []
    real_state, real_exchange = ddpkit.parallel.shm._ShmState, ddpkit.parallel.shm._exchange

    class RecordingState(real_state):  # keeps the segment's name; the state only while its model lives
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            names.append(self.name)
            live.append(self)

    def counting_exchange(state, buffer):  # one per bucket per backward
        calls["n"] += 1
        return real_exchange(state, buffer)

    ddpkit.parallel.shm._ShmState, ddpkit.parallel.shm._exchange = RecordingState, counting_exchange
    out = {}
    with info.init(seed=0) as ctx:
        for comm, k in ((None, 1), ("shm", 1), ("shm", 2)):
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
                if (comm, k) == ("shm", 1):
                    hashes.append(ddpkit.param_sha256(model))
            out[(comm, k)] = ([p.detach().clone() for p in ddpkit.unwrap(model).parameters()], calls["n"])
            for state in live:  # the cached plans view the segment only, never a (since rebuilt) DDP bucket
                arena = state.arena.untyped_storage().data_ptr()
                views = [t for plan in state._plans.values() for _, _, mine, terms, share, result in plan
                         for t in (mine, share, result, *(terms or ()))]
                out[(comm, k), "plans view the segment only"] = bool(views) and all(
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
def test_shm_matches_exact_ddp_and_leaves_nothing_in_dev_shm(world_size, piece_bytes, tso):
    steps = 12
    results = run_ranks(_shm_train, world_size, steps, piece_bytes, tso, timeout=180)
    r0, hashes0 = results[0]
    assert len(r0["names"]) == 2 and all(r["names"] == r0["names"] for r, _ in results)
    assert not [n for n in r0["names"] if os.path.exists(os.path.join("/dev/shm", n))]  # unlinked at wrap
    assert len(hashes0) == steps and all(h == hashes0 for _, h in results)  # replicas bit-identical every step
    exact, shm = r0[(None, 1)][0], r0[("shm", 1)][0]
    for s, e, o in zip(shm, exact, _one_process_reference(steps, world_size)):
        if world_size == 2:  # a/2 + b/2 either way: the same bits as PyTorch's all-reduce
            assert torch.equal(s, e)
        torch.testing.assert_close(s, e, rtol=0, atol=1e-6)
        torch.testing.assert_close(s, o, rtol=0, atol=1e-5)
    for r, _ in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r0[("shm", 2)][0], r[("shm", 2)][0]))
    assert r0[(None, 1)][1] == 0  # comm=None: PyTorch's all-reduce, no exchange
    calls, accum_calls = r0[("shm", 1)][1], r0[("shm", 2)][1]
    assert calls > steps  # several buckets
    assert accum_calls == calls  # accumulate(): one exchange per bucket per optimizer step, not per micro-step
    assert all(r["mapped"] == 0 for r, _ in results)
    assert all(r[("shm", 1), "plans view the segment only"] and r[("shm", 2), "plans view the segment only"]
               for r, _ in results)


def _big_bucket(info: RankInfo):
    """A 36 MB gradient bucket through the shm exchange; the mapped segment stays the same small size."""
    import ddpkit

    with info.init(seed=0) as ctx:
        grads = {}
        for comm in (None, "shm"):
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
    import ddpkit.parallel.shm

    for grads in run_ranks(_big_bucket, 2, timeout=120):
        assert all(torch.equal(a, b) for a, b in zip(grads[None], grads["shm"]))
        assert grads[None, "mapped"] == 0
        assert 0 < grads["shm", "mapped"] <= 2 * 64 + 3 * ddpkit.parallel.shm.PIECE_BYTES + 4096 < 36_000_000 // 8


def _own_hooks(info: RankInfo):
    """A user's hook on a default-wrapped model is DDP's own business; an opt-in comm= holds DDP's one slot."""
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
        out["grad"] = model.module.bias.grad.tolist()
        for comm in ("shm", "bf16"):
            try:
                ddpkit.wrap(torch.nn.Linear(8, 8), ctx, comm=comm).register_comm_hook(None, my_hook)
                out[comm] = "no error"
            except RuntimeError as e:
                out[comm] = type(e).__name__
    return out


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_a_users_comm_hook_works_on_the_default_and_an_opt_in_hook_holds_the_slot():
    for out in run_ranks(_own_hooks, 2):
        assert out["user_hook_calls"] == ["mine"]
        assert out["grad"] == [2.0] * 8  # d(sum)/d(bias) = batch size 2, averaged over ranks
        assert out["shm"] == out["bf16"] == "RuntimeError"  # DDP's own "can only be called once"


def _peer_dies(info: RankInfo):
    """Rank 1 dies before its backward: rank 0's backward raises, naming it, instead of waiting forever."""
    import ddpkit

    ctx = info.init(seed=0)
    model = ddpkit.wrap(torch.nn.Linear(8, 8), ctx, comm="shm")
    if info.rank == 1:
        os._exit(3)
    model(torch.ones(2, 8)).sum().backward()


def _peer_stalls(info: RankInfo):
    """Rank 1 skips a backward: rank 0 gives up after the context's timeout_s with a message saying so."""
    import dataclasses
    import time

    import ddpkit

    with info.init(seed=0) as ctx:  # gloo keeps its long timeout for the closing barrier
        model = ddpkit.wrap(torch.nn.Linear(8, 8), dataclasses.replace(ctx, timeout_s=2), comm="shm")
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


def _shm_sparse(info: RankInfo):
    """comm='shm' on a model with sparse gradients: the sparse bucket takes PyTorch's all-reduce."""
    import ddpkit
    import ddpkit.parallel.shm

    calls = []
    real_exchange = ddpkit.parallel.shm._exchange
    ddpkit.parallel.shm._exchange = lambda state, buffer: calls.append(1) or real_exchange(state, buffer)
    with info.init(seed=0) as ctx:
        sparse = ddpkit.wrap(torch.nn.EmbeddingBag(10, 4, mode="sum", sparse=True), ctx, comm="shm")
        sparse(torch.tensor([[1, 2 + ctx.rank]])).sum().backward()
        grad = sparse.module.weight.grad
        return len(calls), grad.is_sparse, grad.to_dense()[1:4, 0].tolist()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")
def test_shm_sends_sparse_gradients_through_allreduce():
    # rows 1 and 2 on rank 0, rows 1 and 3 on rank 1: row 1 averages to 1, rows 2 and 3 to 1/2
    assert run_ranks(_shm_sparse, 2) == [(0, True, [1.0, 0.5, 0.5])] * 2


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
    import ddpkit.parallel.shm

    if info.rank == 1:
        ddpkit.parallel.shm._SHM_DIR = info.tmp
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
    """The shm exchange on unused parameters, frozen layers, float64 buckets and uneven inputs (Join)."""
    from torch.distributed.algorithms.join import Join

    import ddpkit

    out = {}
    with info.init(seed=0) as ctx:
        for comm in (None, "shm"):
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
def test_shm_exchange_handles_unused_frozen_float64_and_uneven_inputs():
    results = run_ranks(_unusual_models, 2, timeout=120)
    for r in results:
        assert all(torch.equal(a, b) for a, b in zip(r[None], r["shm"]))  # same bits as PyTorch's all-reduce
    assert all(torch.equal(a, b) for a, b in zip(results[0]["shm"], results[1]["shm"]))
    assert results[0]["shm"][-1].dtype == torch.float64
    assert not torch.equal(results[0]["shm"][2], _Branchy().body.weight)  # it trained
