"""DDP correctness with real gloo ranks: identical replicas, equivalence to one process, accumulation."""

from __future__ import annotations

import torch
from harness import RankInfo, run_ranks

NUM_SAMPLES = 640
STEPS = 24


def _data(seed: int = 0) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(NUM_SAMPLES, 8, generator=g)
    y = (x @ torch.randn(8, 1, generator=g)).squeeze(1) + 0.1 * torch.randn(NUM_SAMPLES, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _model() -> torch.nn.Module:
    torch.manual_seed(123)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _train(info: RankInfo, per_rank_batch: int, accumulation_steps: int, count_allreduce: bool):
    """Train STEPS optimizer steps; return per-step parameter hashes, final params, all-reduce count."""
    import ddpkit

    with info.init(seed=7) as ctx:
        model = ddpkit.wrap(_model(), ctx)
        calls = {"n": 0}
        if count_allreduce and ctx.distributed:
            def counting_hook(state, bucket):
                calls["n"] += 1
                fut = torch.distributed.all_reduce(bucket.buffer(), async_op=True).get_future()
                return fut.then(lambda f: f.value()[0] / ctx.world_size)

            model.register_comm_hook(None, counting_hook)
        data = ddpkit.loader(_data(), ctx, batch_size=per_rank_batch, accumulation_steps=accumulation_steps, seed=3)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        hashes, steps, seen = [], 0, []
        while steps < STEPS:
            for x, y in data:
                seen.append(x[:, 0].tolist())
                with ddpkit.accumulate(model, sync=data.step_end):
                    loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y) / data.accumulation_steps
                    loss.backward()
                if data.step_end:
                    opt.step()
                    opt.zero_grad()
                    steps += 1
                    hashes.append(ddpkit.param_sha256(model))
                    if steps == STEPS:
                        break
        params = [p.detach().clone() for p in ddpkit.unwrap(model).parameters()]
        return {"hashes": hashes, "params": params, "allreduce_calls": calls["n"], "steps": steps}


def _single(per_rank_batch: int, accumulation_steps: int = 1):
    """The same training in this process at world size 1 (no launcher variables set)."""
    return _train(RankInfo(0, 1, "", ""), per_rank_batch, accumulation_steps, False)


def test_replicas_identical_after_every_step_and_equal_to_one_process():
    results = run_ranks(_train, 2, 16, 1, False)
    assert results[0]["hashes"] == results[1]["hashes"]  # bit-identical after every optimizer step
    assert len(results[0]["hashes"]) == STEPS
    single = _single(32)  # 1 process x 2b over the same global order
    for p2, p1 in zip(results[0]["params"], single["params"]):
        torch.testing.assert_close(p2, p1, rtol=1e-5, atol=1e-5)
    # ... and the parameters really moved (the comparison is not of two initial states)
    assert not torch.allclose(single["params"][0], _model()[0].weight)


def test_accumulation_one_allreduce_per_optimizer_step_and_matches_big_batch():
    k = 4
    results = run_ranks(_train, 2, 4, k, True)
    num_buckets = 1  # this model's gradients fit one 25 MB bucket
    for r in results:
        assert r["steps"] == STEPS
        assert r["allreduce_calls"] == STEPS * num_buckets  # not STEPS * k
    assert results[0]["hashes"] == results[1]["hashes"]
    big = _single(32)  # 2 ranks x 4 x 4 micro-steps == one process x 32
    for pa, pb in zip(results[0]["params"], big["params"]):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-5)


def _allreduce_count_without_skip(info: RankInfo):
    """Control: the counting hook does see k all-reduces when accumulate() is not used."""
    import ddpkit

    with info.init() as ctx:
        model = ddpkit.wrap(_model(), ctx)
        calls = {"n": 0}

        def hook(state, bucket):
            calls["n"] += 1
            return torch.distributed.all_reduce(bucket.buffer(), async_op=True).get_future().then(
                lambda f: f.value()[0] / ctx.world_size)

        model.register_comm_hook(None, hook)
        for _ in range(4):
            model(torch.randn(4, 8)).sum().backward()
        return calls["n"]


def test_hook_counts_every_backward_without_accumulate():
    assert run_ranks(_allreduce_count_without_skip, 2) == [4, 4]


def _shards(info: RankInfo, epochs: int):
    import ddpkit

    with info.init(seed=11) as ctx:
        ds = torch.utils.data.TensorDataset(torch.arange(103))
        data = ddpkit.loader(ds, ctx, batch_size=5, drop_last=False)
        out = []
        for _ in range(epochs):  # no set_epoch call: the loader advances epochs itself
            out.append([int(v) for (batch,) in data for v in batch])
        return out


def test_shards_disjoint_cover_and_reshuffle_each_epoch_without_set_epoch():
    a = run_ranks(_shards, 2, 3)
    b = run_ranks(_shards, 2, 3)
    assert a == b  # reproducible for a fixed seed
    for epoch in range(3):
        r0, r1 = set(a[0][epoch]), set(a[1][epoch])
        # 103 samples, global batch 10, drop_last=False: 11 steps, 7 padded slots from the epoch start
        assert r0 | r1 == set(range(103))
        assert len(a[0][epoch]) == len(a[1][epoch]) == 55
        assert len(r0 & r1) <= 110 - 103
    assert a[0][0] != a[0][1] != a[0][2]


def _shards_drop_last(info: RankInfo):
    import ddpkit

    with info.init(seed=11) as ctx:
        data = ddpkit.loader(torch.utils.data.TensorDataset(torch.arange(100)), ctx, batch_size=5)
        return [int(v) for (batch,) in data for v in batch]


def test_shards_disjoint_with_drop_last():
    r0, r1 = run_ranks(_shards_drop_last, 2)
    assert not set(r0) & set(r1)
    assert set(r0) | set(r1) == set(range(100))



def _syncbn_on_cpu(info: RankInfo):
    import warnings

    import ddpkit

    with info.init() as ctx:
        net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = ddpkit.wrap(net, ctx, sync_batchnorm=True)
        model(torch.randn(8, 4)).sum().backward()  # trains instead of DDP's "only work with GPU modules"
        return type(ddpkit.unwrap(model)[1]).__name__, [str(w.message) for w in caught]


def test_sync_batchnorm_on_cpu_warns_and_keeps_training():
    for name, messages in run_ranks(_syncbn_on_cpu, 2):
        assert name == "BatchNorm1d"
        assert any("sync_batchnorm=True) is skipped on CPU" in m for m in messages)


def _frozen(info: RankInfo):
    import warnings

    import ddpkit

    with info.init() as ctx:
        torch.manual_seed(info.rank)  # each rank builds different values: wrap must hand out rank 0's
        fixed = torch.nn.Linear(4, 3).requires_grad_(False)  # a module with nothing to train
        fixed.register_buffer("scale", torch.full((3,), float(info.rank + 1)))
        empty = torch.nn.ReLU()  # a module with no parameters at all
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            models = [ddpkit.wrap(fixed, ctx), ddpkit.wrap(empty, ctx)]
        out = models[0](torch.ones(2, 4)) * models[0].scale
        return ([type(m).__name__ for m in models], out.tolist(), ddpkit.param_sha256(models[0]),
                [str(w.message) for w in caught])


def test_wrap_of_a_module_with_nothing_to_train_returns_it_with_rank_zero_state():
    results = run_ranks(_frozen, 2)
    assert results[0][1:3] == results[1][1:3]  # same outputs and bit-identical state on both ranks
    for names, _, _, messages in results:
        assert names == ["Linear", "ReLU"]  # DDP raises for both; wrap returns them as they are
        assert sum("no parameter that requires grad" in m for m in messages) == 2
