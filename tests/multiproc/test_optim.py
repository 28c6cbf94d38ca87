"""shard_optimizer: each rank steps its share of the parameters, and the run equals the unsharded one."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
import torch
from harness import RankInfo, run_ranks

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory at /dev/shm (Linux)")

# Every shardable class, with settings that make it keep each kind of state it can keep.
OPTIMIZERS = [
    ("SGD", {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {}),  # no state at all
    ("SGD", {"momentum": 0.9, "foreach": False}),  # the per-tensor implementation
    ("Adam", {"amsgrad": True}),
    ("AdamW", {"weight_decay": 0.1}),
    ("AdamW", {"fused": True}),  # within float rounding only: see FUSED
    ("Adamax", {}),
    ("NAdam", {}),
    ("RAdam", {}),
    ("RMSprop", {"momentum": 0.5, "centered": True}),
    ("Adadelta", {}),
    ("ASGD", {"t0": 2}),
    ("Rprop", {}),
]

FUSED = "fused"
"""A fused kernel's vectorised body and scalar tail round differently (FMA), and sharding moves where
a piece starts inside a parameter, so fused=True agrees within float rounding, not bit for bit."""


def _model() -> torch.nn.Module:
    torch.manual_seed(11)
    # 37 * 16 + 37 + 37 * 5 + 5 = 819 elements: the split between ranks falls inside a weight
    return torch.nn.Sequential(torch.nn.Linear(16, 37), torch.nn.Tanh(), torch.nn.Linear(37, 5))


def _train(ctx, name: str, options: dict, shard: bool, steps: int = 4, model=None, opt=None):
    import ddpkit

    if model is None:
        model = ddpkit.wrap(_model(), ctx)
        inner = ddpkit.unwrap(model)
        lr = 0.02 if name != "Adadelta" else 1.0
        opt = getattr(torch.optim, name)([{"params": [inner[0].weight, inner[0].bias]},
                                          {"params": [inner[2].weight, inner[2].bias], "lr": lr / 3}], lr=lr, **options)
        if shard:
            opt = ddpkit.shard_optimizer(opt, model, ctx)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + ctx.rank)  # different data on every rank
        model(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return model, opt


def _every_optimizer(info: RankInfo):
    import ddpkit

    out = []
    with info.init(seed=0) as ctx:
        for name, options in OPTIMIZERS:
            runs = {}
            for shard in (False, True):
                model, opt = _train(ctx, name, options, shard)
                state = opt.state_dict()  # sharded: read on each rank alone
                owned = sum(t.numel() for s in opt.state.values() for t in s.values()
                            if isinstance(t, torch.Tensor) and t.dim() > 0)
                runs[shard] = ([p.detach().clone() for p in ddpkit.unwrap(model).parameters()], state, owned,
                               type(opt).__name__)
            out.append(runs)
    return out


def _same(a: torch.Tensor, b: torch.Tensor, exact: bool) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-5, atol=1e-7)


def _same_state(a: dict, b: dict, exact: bool) -> bool:
    if a["param_groups"] != b["param_groups"] or a["state"].keys() != b["state"].keys():
        return False
    for k in a["state"]:
        sa, sb = a["state"][k], b["state"][k]
        if sa.keys() != sb.keys():
            return False
        if not all(_same(sa[key], sb[key], exact) for key in sa):
            return False
    return True


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_step_equals_unsharded_for_every_supported_optimizer(world_size):
    results = run_ranks(_every_optimizer, world_size, timeout=240)
    for (name, options), *per_rank in zip(OPTIMIZERS, *results):
        label, exact = f"{name}{options}", not options.get(FUSED)
        for runs in per_rank:
            full, sharded = runs[False], runs[True]
            assert sharded[3] == f"Sharded{name}" and full[3] == name
            assert all(_same(a, b, exact) for a, b in zip(full[0], sharded[0])), label  # parameters, bit for bit
            assert _same_state(full[1], sharded[1], exact), label  # the unsharded state dict, from every rank alone
            assert full[1]["state"] or not options  # the settings made it keep state (plain SGD keeps none)
        if per_rank[0][False][2]:
            # each rank holds the per-element state of its share only: together exactly one copy
            assert sum(runs[True][2] for runs in per_rank) == per_rank[0][False][2], label
            assert all(runs[True][2] < per_rank[0][False][2] for runs in per_rank), label


def _checkpoint_round_trip(info: RankInfo, directory: str):
    """Sharded -> checkpoint -> unsharded (and back) continues exactly like an uninterrupted run."""
    import ddpkit

    with info.init(seed=0) as ctx:
        straight, _ = _train(ctx, "Adam", {}, shard=False, steps=6)
        want = [p.detach().clone() for p in ddpkit.unwrap(straight).parameters()]
        results = []
        for first, second in ((True, False), (False, True), (True, True)):
            model, opt = _train(ctx, "Adam", {}, shard=first, steps=3)
            ddpkit.save_checkpoint(ctx, f"{directory}/{first}{second}", step=3, model=model, optimizer=opt)
            model2, opt2 = _train(ctx, "Adam", {}, shard=second, steps=0)
            ddpkit.load_checkpoint(ctx, f"{directory}/{first}{second}", model=model2, optimizer=opt2)
            # the learning rate comes back from the optimizer's state (lr/2 after 3 steps); halve it once more
            # after step 3, as StepLR(2) did in the uninterrupted run
            for step in range(3, 6):
                g = torch.Generator().manual_seed(100 * step + ctx.rank)
                model2(torch.randn(8, 16, generator=g)).pow(2).mean().backward()
                opt2.step()
                opt2.zero_grad()
                if step == 3:
                    for group in opt2.param_groups:
                        group["lr"] *= 0.5
            got = [p.detach().clone() for p in ddpkit.unwrap(model2).parameters()]
            results.append(all(torch.equal(a, b) for a, b in zip(want, got)))
        saved = torch.load(f"{directory}/TrueTrue/ckpt-00000003.pt", weights_only=True)
        return results, sum(t.numel() * t.element_size() for t in saved["model"].values()), \
            sum(p.numel() * p.element_size() for p in ddpkit.unwrap(model2).parameters())


def test_checkpoints_move_between_sharded_and_unsharded_runs(tmp_path):
    for results, saved_bytes, param_bytes in run_ranks(_checkpoint_round_trip, 2, str(tmp_path), timeout=120):
        assert results == [True, True, True]
        assert saved_bytes == param_bytes  # the model is saved compactly, not as its shared segment


def _misuse(info: RankInfo):
    import ddpkit

    errors = {}
    with info.init(seed=0) as ctx:
        model = ddpkit.wrap(_model(), ctx)
        params = list(model.parameters())

        def catch(key, fn):
            try:
                fn()
            except (TypeError, ValueError, RuntimeError) as e:
                errors[key] = f"{type(e).__name__}: {e}"

        catch("lbfgs", lambda: ddpkit.shard_optimizer(torch.optim.LBFGS(params), model, ctx))
        catch("adagrad", lambda: ddpkit.shard_optimizer(torch.optim.Adagrad(params), model, ctx))
        stepped = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        model(torch.ones(2, 16)).sum().backward()
        stepped.step()
        catch("stepped", lambda: ddpkit.shard_optimizer(stepped, model, ctx))
        stranger = torch.nn.Parameter(torch.zeros(3))
        catch("stranger", lambda: ddpkit.shard_optimizer(torch.optim.SGD(params + [stranger], lr=0.1), model, ctx))
        catch("plain", lambda: ddpkit.shard_optimizer(torch.optim.SGD(params, lr=0.1), ddpkit.unwrap(model), ctx))

        original = torch.optim.SGD(params, lr=0.1)
        opt = ddpkit.shard_optimizer(original, model, ctx)
        catch("twice", lambda: ddpkit.shard_optimizer(opt, model, ctx))
        catch("old", original.step)
        catch("closure", lambda: opt.step(lambda: None))
        catch("group", lambda: opt.add_param_group({"params": [stranger]}))
        catch("fp16", lambda: ddpkit.Precision(ctx, "fp16").step(opt))
        with torch.no_grad():
            params[0].data = params[0].detach().clone()  # what load_state_dict(assign=True) or .to() would do
        catch("moved", opt.step)
    return errors


def test_misuse_fails_early_with_a_message_naming_the_fix():
    errors = run_ranks(_misuse, 2, timeout=120)[0]
    assert "LBFGS" in errors["lbfgs"] and errors["lbfgs"].startswith("TypeError") and "unsharded" in errors["lbfgs"]
    assert "Adagrad" in errors["adagrad"]
    assert "not stepped" in errors["stepped"] and "load_checkpoint" in errors["stepped"]
    assert "not a parameter of the model" in errors["stranger"]
    assert "model ddpkit.wrap returned" in errors["plain"]
    assert "already sharded" in errors["twice"]
    assert "replaced by ddpkit.shard_optimizer" in errors["old"]
    assert "no closure" in errors["closure"]
    assert "cannot take new parameters" in errors["group"]
    assert "fp16" in errors["fp16"] and "bf16" in errors["fp16"]
    assert "shared segment" in errors["moved"] and "in place" in errors["moved"]


def _skips_a_step(info: RankInfo):
    import ddpkit

    with info.init(seed=0) as ctx:
        model = ddpkit.wrap(_model(), ctx)
        opt = ddpkit.shard_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                     dataclasses.replace(ctx, timeout_s=2))
        model(torch.ones(2, 16)).sum().backward()
        if info.rank == 1:  # e.g. a rank-local "skip the step on a bad loss"
            time.sleep(5)
            return None
        start = time.monotonic()
        try:
            opt.step()
        except RuntimeError as e:
            return str(e), time.monotonic() - start
        return None


def test_a_rank_that_skips_step_is_reported_not_waited_for_forever():
    (message, waited), _ = run_ranks(_skips_a_step, 2, timeout=60)
    assert "in optimizer.step() for rank 1" in message and "skipped a step()" in message
    assert 2 <= waited < 5


def _precision_clip(info: RankInfo):
    import ddpkit

    out = []
    with info.init(seed=0) as ctx:
        for shard in (False, True):
            model = ddpkit.wrap(_model(), ctx)
            opt = torch.optim.AdamW(model.parameters(), lr=0.01)
            if shard:
                opt = ddpkit.shard_optimizer(opt, model, ctx)
            prec = ddpkit.Precision(ctx, "fp32")
            norms = []
            for step in range(3):
                g = torch.Generator().manual_seed(step + 10 * ctx.rank)
                prec.backward(model(torch.randn(8, 16, generator=g)).pow(2).sum())
                norms.append(prec.step(opt, max_grad_norm=0.5).grad_norm)  # no model: the optimizer's parameters
            out.append((norms, [p.detach().clone() for p in model.parameters()]))
    return out


def test_precision_clips_by_the_global_norm_with_a_sharded_optimizer():
    for (norms, params), (norms_s, params_s) in run_ranks(_precision_clip, 2):
        assert norms == norms_s and norms[0] > 0.5  # it clipped, by the norm over all parameters
        assert all(torch.equal(a, b) for a, b in zip(params, params_s))


def test_world_size_1_returns_the_optimizer_after_the_checks():
    import ddpkit

    ctx = ddpkit.init(env=ddpkit.read_env({}))
    model = ddpkit.wrap(torch.nn.Linear(3, 3), ctx)
    opt = torch.optim.Adam(model.parameters())
    assert ddpkit.shard_optimizer(opt, model, ctx) is opt
    with pytest.raises(TypeError, match="LBFGS"):
        ddpkit.shard_optimizer(torch.optim.LBFGS(model.parameters()), model, ctx)
    # a scheduler made before sharding would drive the old optimizer: refused here already, not only on 2 ranks
    held = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(held, step_size=2)
    with pytest.raises(ValueError, match="scheduler already holds.*create the scheduler from the optimizer"):
        ddpkit.shard_optimizer(held, model, ctx)
    ctx.close()


def _save_sharded(info: RankInfo, directory: str):
    import ddpkit

    with info.init(seed=0) as ctx:
        model, opt = _train(ctx, "AdamW", {"weight_decay": 0.1}, shard=True, steps=3)
        ddpkit.save_checkpoint(ctx, directory, step=3, model=model, optimizer=opt)


def _load_sharded(info: RankInfo, directory: str):
    import ddpkit

    with info.init(seed=0) as ctx:
        model, opt = _train(ctx, "AdamW", {"weight_decay": 0.1}, shard=True, steps=0)
        ddpkit.load_checkpoint(ctx, directory, model=model, optimizer=opt)
        return opt.state_dict(), [p.detach().clone() for p in ddpkit.unwrap(model).parameters()]


def test_a_sharded_checkpoint_loads_on_another_world_size(tmp_path):
    run_ranks(_save_sharded, 2, str(tmp_path), timeout=120)
    saved = torch.load(next(tmp_path.glob("ckpt-*.pt")), weights_only=True)
    for state, params in run_ranks(_load_sharded, 3, str(tmp_path), timeout=120):  # each of 3 ranks: its third
        assert _same_state(saved["optimizer"], state, exact=True)  # read back whole, from every rank alone
        assert all(torch.equal(p, saved["model"][k]) for p, k in zip(params, saved["model"]))
