"""ddpkit.init() adopts a process group its launcher created (Ray Train, Lightning, a custom launcher):
rank and world size from the group, everything works the same, and the group outlives close and abort."""

from __future__ import annotations

import os

from harness import RankInfo, run_ranks


def _group(info: RankInfo):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=info.init_method, rank=info.rank, world_size=info.world_size)
    return dist


def _still_works(dist) -> float:
    import torch

    t = torch.ones(1)
    dist.all_reduce(t)  # the creator's group after ddpkit let go of it
    return float(t)


def _adopt_and_train(info: RankInfo, ckpt_dir: str):
    import torch

    import ddpkit
    from ddpkit.metrics.log import MetricsLog

    dist = _group(info)
    out = {}
    with ddpkit.init(seed=3, hang_timeout_s=60) as ctx:
        out["ctx"] = (ctx.rank, ctx.world_size, ctx.local_rank, ctx.backend, str(ctx.device), ctx.owns_group)
        data = torch.utils.data.TensorDataset(torch.arange(64.0).view(32, 2), torch.arange(32.0))
        train = ddpkit.loader(data, ctx, batch_size=4)
        torch.manual_seed(0)
        model = ddpkit.wrap(torch.nn.Linear(2, 1), ctx)
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        steps = 0
        for x, y in train:
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
            if ctx.should_stop():
                break
        ddpkit.save_checkpoint(ctx, ckpt_dir, step=steps, model=model, optimizer=opt, loader=train)
        meta = ddpkit.load_checkpoint(ctx, ckpt_dir, model=model, optimizer=opt, loader=train)
        out["steps"], out["loaded_step"] = steps, meta["step"]
        out["mean_loss"] = ddpkit.reduce_mean(ctx, float(loss.detach()) * len(y), len(y))
        out["sha"] = ddpkit.param_sha256(model)
        MetricsLog(os.path.join(ckpt_dir, "run"), ctx).log(step=steps, loss=out["mean_loss"])
    out["after close"] = (dist.is_initialized(), _still_works(dist))
    ctx = ddpkit.init()
    ctx.abort(RuntimeError("a step failed"))
    out["after abort"] = (dist.is_initialized(), _still_works(dist))
    dist.destroy_process_group()
    return out


def test_an_existing_group_is_adopted_trained_on_and_left_to_its_creator(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    outs = run_ranks(_adopt_and_train, 2, ckpt, timeout=180)
    for rank, out in enumerate(outs):
        assert out["ctx"] == (rank, 2, rank, "gloo", "cpu", False)
        assert out["steps"] == out["loaded_step"] == 4  # 32 samples, global batch 8
        assert out["after close"] == (True, 2.0) and out["after abort"] == (True, 2.0)
    assert outs[0]["sha"] == outs[1]["sha"] and outs[0]["mean_loss"] == outs[1]["mean_loss"]
    assert (tmp_path / "ckpt" / "run" / "metrics.jsonl").exists()


def _adopt_without_launcher_variables(info: RankInfo):
    import ddpkit

    dist = _group(info)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name)  # a notebook or custom launcher that passed rank and world size as arguments
    with ddpkit.init() as ctx:
        got = (ctx.rank, ctx.world_size, ctx.local_rank, ctx.env.launcher, float(ddpkit.all_reduce_sum(ctx, 1.0)))
    from ddpkit.env import LaunchEnv

    # two machines of one rank each, said with env=: kept as given
    with ddpkit.init(env=LaunchEnv(rank=info.rank, world_size=2, node_rank=info.rank)) as ctx:
        got += (ctx.local_rank, ctx.env.node_rank)
    try:
        ddpkit.init(init_method=info.init_method + "-second")  # meant to create a group: one exists
    except ValueError as e:
        refused = str(e)
    dist.destroy_process_group()
    return got, refused


def test_a_group_without_launcher_variables_gives_rank_and_world_size():
    outs = run_ranks(_adopt_without_launcher_variables, 2, timeout=120)
    assert [got for got, _ in outs] == [(0, 2, 0, "none", 2.0, 0, 0), (1, 2, 1, "none", 2.0, 0, 1)]
    for rank, (_, refused) in enumerate(outs):
        assert refused.startswith(f"ddpkit.init: init_method='file://") and refused.endswith(
            f"but a default process group already exists (rank {rank} of 2, gloo); drop init_method to adopt "
            "that group, or call ddpkit.init before anything else creates one"), refused


def _adopt_with_wrong_rank(info: RankInfo):
    import ddpkit

    dist = _group(info)
    os.environ["RANK"] = str(1 - info.rank)  # the variables describe another rank than the group
    try:
        ddpkit.init()
    except ValueError as e:
        return str(e), dist.is_initialized()
    finally:
        dist.destroy_process_group()
    return None


def test_launcher_variables_that_disagree_with_the_group_are_one_line_naming_both():
    for rank, (message, initialized) in enumerate(run_ranks(_adopt_with_wrong_rank, 2, timeout=120)):
        assert message == (
            f"ddpkit.init: the existing process group has rank {rank} of world size 2 but the environment says "
            f"RANK={1 - rank} WORLD_SIZE=2; the launcher that created the group and these variables disagree: "
            f"unset them, or pass env=ddpkit.env.LaunchEnv(rank={rank}, world_size=2, ...)")
        assert initialized
