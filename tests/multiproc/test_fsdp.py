"""strategy='fsdp' on real gloo ranks: equal to one process, sharded state, checkpoints across strategies and sizes."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
from harness import RankInfo, run_ranks

VOCAB, DIM, SEQ = 17, 32, 6  # 17 rows: the embedding's shards are uneven (9 + 8)
NUM_SAMPLES, GLOBAL_BATCH = 256, 16  # 16 optimizer steps per epoch
SAVE_AT, TOTAL_STEPS = 10, 20  # a checkpoint mid-epoch; the run goes on into the second epoch
SEED = 5


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(DIM, DIM)

    def forward(self, h):
        return h + torch.tanh(self.fc(h))


class TiedLM(torch.nn.Module):
    """An embedding shared with the output layer, and blocks in a ModuleList."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, DIM)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, x):
        h = self.emb(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _dataset():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (NUM_SAMPLES, SEQ + 1), generator=g)
    return torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])


def _setup(ctx, strategy: str, accumulation_steps: int = 1):
    import ddpkit

    with torch.random.fork_rng():  # the same initial weights in every run; fsdp broadcasts rank 0's anyway
        torch.manual_seed(123)
        net = TiedLM()
    extra = {"shard_modules": (Block,)} if strategy == "fsdp" else {}
    model = ddpkit.wrap(net, ctx, strategy=strategy, **extra)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    per_rank = GLOBAL_BATCH // (ctx.world_size * accumulation_steps)
    data = ddpkit.loader(_dataset(), ctx, batch_size=per_rank, accumulation_steps=accumulation_steps, seed=3)
    return model, opt, data


def _train(ctx, parts, *, start: int, stop: int, ckpt: Path | None = None, reduced: list | None = None) -> list[float]:
    """Optimizer steps start..stop (clipped through Precision.step); checkpoints at SAVE_AT and at the end.

    `reduced` collects, per micro-step, whether its backward produced (reduce-scattered) gradients."""
    import ddpkit

    model, opt, data = parts
    prec = ddpkit.Precision(ctx, "fp32")
    step, norms = start, []
    while step < stop:
        for x, y in data:
            with ddpkit.accumulate(model, sync=data.step_end):
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                prec.backward(loss / data.accumulation_steps)
            if reduced is not None:
                reduced.append(any(p.grad is not None for p in model.parameters()))
            if not data.step_end:
                continue
            norms.append(prec.step(opt, model, max_grad_norm=0.5).grad_norm)
            step += 1
            if ckpt is not None and step in (SAVE_AT, TOTAL_STEPS):
                ddpkit.save_checkpoint(ctx, ckpt, step=step, model=model, optimizer=opt, loader=data)
            if step == stop:
                break
    return norms


def _full(ctx, model, path: Path) -> dict[str, torch.Tensor]:
    import ddpkit
    from ddpkit.checkpoint.sharded import export_state_dict

    export_state_dict(ctx, model, path)
    return torch.load(path, weights_only=True)


def _fresh(ctx) -> None:
    from ddpkit.runtime import rank_seed, seed_everything

    seed_everything(rank_seed(ctx.seed, ctx.rank))


def _single(info: RankInfo, root: str, load_from: str | None):
    """World size 1 (no process group; strategy='fsdp' returns the module): the references, or a resume."""
    import ddpkit

    root_path = Path(root)
    with info.init(seed=SEED) as ctx:
        if load_from is not None:  # 2 -> 1: a sharded checkpoint into an unsharded model
            parts = _setup(ctx, "fsdp")
            meta = ddpkit.load_checkpoint(ctx, load_from, model=parts[0], optimizer=parts[1], loader=parts[2])
            _train(ctx, parts, start=meta["step"], stop=TOTAL_STEPS)
            return {"resumed": _full(ctx, parts[0], root_path / "resumed1.pt"), "saved_world_size": meta["world_size"]}
        out = {}
        for accumulation in (1, 4):
            _fresh(ctx)
            parts = _setup(ctx, "fsdp", accumulation)
            assert parts[0].__class__ is TiedLM  # world size 1: nothing to shard over
            norms = _train(ctx, parts, start=0, stop=TOTAL_STEPS,
                           ckpt=root_path / "one" if accumulation == 1 else None)
            out[accumulation] = {"params": _full(ctx, parts[0], root_path / f"ref{accumulation}.pt"), "norms": norms}
        out["errors"] = _bad_input(ctx)
        return out


def _bad_input(ctx) -> dict[str, str]:
    import ddpkit

    errors = {}
    for name, kwargs in {"unknown": {"strategy": "zero3"}, "comm": {"strategy": "fsdp", "comm": "fp16"},
                         "static_graph": {"strategy": "fsdp", "static_graph": True},
                         "find_unused": {"strategy": "fsdp", "find_unused_parameters": True},
                         "not_in_model": {"strategy": "fsdp", "shard_modules": (torch.nn.Conv2d,)},
                         "tied_unit": {"strategy": "fsdp", "shard_modules": (torch.nn.Embedding,)},
                         "ddp_shard_modules": {"shard_modules": (Block,)}}.items():
        try:
            ddpkit.wrap(TiedLM(), ctx, **kwargs)
        except (ValueError, TypeError) as e:
            errors[name] = str(e)
        else:
            errors[name] = "<no error>"
    return errors


def _two(info: RankInfo, root: str):
    import ddpkit
    from ddpkit.parallel.strategy import local_numel

    root_path = Path(root)
    out: dict = {}
    with info.init(seed=SEED) as ctx:
        # Ranks seeded differently build different models; wrap starts every rank from rank 0's.
        own = TiedLM()
        out["own_sha"] = ddpkit.param_sha256(own)
        out["wrapped_sha"] = ddpkit.param_sha256(ddpkit.wrap(own, ctx, strategy="fsdp"))
        for accumulation in (1, 4):
            _fresh(ctx)
            model, opt, data = parts = _setup(ctx, "fsdp", accumulation)
            out[f"reduced{accumulation}"] = reduced = []
            norms = _train(ctx, parts, start=0, stop=TOTAL_STEPS,
                           ckpt=root_path / "two" if accumulation == 1 else None, reduced=reduced)
            out[accumulation] = {"params": _full(ctx, model, root_path / f"two{accumulation}.pt"),
                                 "norms": norms, "sha": ddpkit.param_sha256(model)}
            if accumulation == 1:
                uninterrupted = out[1]["sha"]
                out["state_local"] = sum(local_numel(v) for s in opt.state.values() for k, v in s.items()
                                         if k != "step")
                out["state_full"] = sum(v.numel() for s in opt.state.values() for k, v in s.items() if k != "step")
                out["param_local"] = sum(local_numel(p) for p in model.parameters())
                out["param_types"] = sorted({type(p).__name__ for p in model.parameters()})
        # Stop mid-epoch, resume from the checkpoint in a fresh model: bit-identical.
        _fresh(ctx)
        parts = _setup(ctx, "fsdp")
        meta = ddpkit.load_checkpoint(ctx, root_path / "two" / "ckpt-00000010.dcp", model=parts[0],
                                      optimizer=parts[1], loader=parts[2])
        _train(ctx, parts, start=meta["step"], stop=TOTAL_STEPS)
        out["resumed_sha"], out["uninterrupted_sha"] = ddpkit.param_sha256(parts[0]), uninterrupted
        # ddp -> fsdp: a DDP run's .pt checkpoint continues as FSDP.
        _fresh(ctx)
        ddp = _setup(ctx, "ddp")
        _train(ctx, ddp, start=0, stop=SAVE_AT, ckpt=root_path / "ddp")
        _fresh(ctx)
        parts = _setup(ctx, "fsdp")
        ddpkit.load_checkpoint(ctx, root_path / "ddp", model=parts[0], optimizer=parts[1], loader=parts[2])
        _train(ctx, parts, start=SAVE_AT, stop=TOTAL_STEPS)
        out["from_ddp"] = _full(ctx, parts[0], root_path / "fromddp.pt")
        # fsdp -> ddp: the sharded checkpoint continues in a DDP model.
        _fresh(ctx)
        parts = _setup(ctx, "ddp")
        ddpkit.load_checkpoint(ctx, root_path / "two" / "ckpt-00000010.dcp", model=parts[0], optimizer=parts[1],
                               loader=parts[2])
        _train(ctx, parts, start=SAVE_AT, stop=TOTAL_STEPS)
        out["to_ddp"] = _full(ctx, parts[0], root_path / "toddp.pt")
        # 1 -> 2: the world-size-1 run's .pt checkpoint at step 10 continues on 2 sharded ranks.
        _fresh(ctx)
        parts = _setup(ctx, "fsdp")
        meta = ddpkit.load_checkpoint(ctx, root_path / "one" / "ckpt-00000010.pt", model=parts[0],
                                      optimizer=parts[1], loader=parts[2])
        _train(ctx, parts, start=meta["step"], stop=TOTAL_STEPS)
        out["from_one"] = _full(ctx, parts[0], root_path / "fromone.pt")
        out["corrupt"] = _corrupt(ctx, root_path)
    return out


def _corrupt(ctx, root: Path) -> dict:
    """A truncated shard: named directly, every rank refuses it; in a directory, the older checkpoint is used."""
    import ddpkit
    from ddpkit.checkpoint.api import CheckpointError, CheckpointWarning

    bad = root / "bad"
    if ctx.is_main:
        shutil.copytree(root / "two", bad)
        shard = sorted((bad / "ckpt-00000020.dcp").glob("*.distcp"))[-1]
        shard.write_bytes(shard.read_bytes()[:-7])
    ddpkit.barrier(ctx)
    _fresh(ctx)
    model, opt, data = _setup(ctx, "fsdp")
    before = ddpkit.param_sha256(model)
    out = {}
    try:
        ddpkit.load_checkpoint(ctx, bad / "ckpt-00000020.dcp", model=model, optimizer=opt, loader=data)
        out["named"] = "<loaded>"
    except CheckpointError as e:
        out["named"] = str(e)
    out["unchanged"] = ddpkit.param_sha256(model) == before and not opt.state
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        meta = ddpkit.load_checkpoint(ctx, bad, model=model, optimizer=opt, loader=data)
    out["fallback_step"] = meta["step"]
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]
    return out


def _close(a: dict, b: dict, tol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=tol, atol=tol, msg=name)


@pytest.mark.timeout(600)
def test_fsdp_trains_checkpoints_and_resumes_like_one_process(tmp_path):
    single = _single(RankInfo(0, 1, "", ""), str(tmp_path), None)
    two = run_ranks(_two, 2, str(tmp_path), timeout=480)
    resumed1 = _single(RankInfo(0, 1, "", ""), str(tmp_path), str(tmp_path / "two" / "ckpt-00000010.dcp"))

    r0, r1 = two
    for accumulation in (1, 4):  # 20 AdamW steps on 2 sharded ranks == 1 process with the same global batch
        _close(r0[accumulation]["params"], single[accumulation]["params"])
        assert r0[accumulation]["sha"] == r1[accumulation]["sha"]  # the full parameters agree on both ranks
        torch.testing.assert_close(torch.tensor(r0[accumulation]["norms"]),
                                   torch.tensor(single[accumulation]["norms"]), rtol=1e-5, atol=1e-6)
        assert r0[accumulation]["norms"] == r1[accumulation]["norms"]  # global norm, identical on every rank
    assert max(single[1]["norms"]) > 0.5  # clipping was active
    # accumulate(): micro-steps 1-3 of each 4 keep their gradients local; the 4th reduce-scatters.
    assert r0["reduced4"] == [False, False, False, True] * TOTAL_STEPS and r0["reduced1"] == [True] * TOTAL_STEPS
    assert r0["own_sha"] != r1["own_sha"] and r0["wrapped_sha"] == r1["wrapped_sha"] == r0["own_sha"]
    # The training moved the tied weights, and they stayed tied.
    assert not torch.allclose(single[1]["params"]["emb.weight"], _initial()["emb.weight"])
    assert torch.equal(r0[1]["params"]["emb.weight"], r0[1]["params"]["head.weight"])
    # Sharded: each rank holds about half the optimizer state and parameters (uneven rows round up).
    assert r0["param_types"] == ["DTensor"]
    assert r0["state_full"] == r1["state_full"]
    assert r0["state_local"] + r1["state_local"] == r0["state_full"]
    for r in two:
        assert abs(r["state_local"] - r0["state_full"] / 2) <= 2 * DIM  # one row of emb's two state tensors
    # Resume: bit-identical on the same world size; within float tolerance across strategies and sizes.
    assert r0["resumed_sha"] == r0["uninterrupted_sha"] and r1["resumed_sha"] == r1["uninterrupted_sha"]
    _close(r0["from_ddp"], r0[1]["params"])
    _close(r0["to_ddp"], r0[1]["params"])
    _close(r0["from_one"], single[1]["params"])
    assert resumed1["saved_world_size"] == 2
    _close(resumed1["resumed"], r0[1]["params"])
    # A truncated shard: refused when named (nothing loaded), skipped for the older one in a directory.
    for r in two:
        assert "ckpt-00000020.dcp" in r["corrupt"]["named"] and "truncated" in r["corrupt"]["named"]
        assert r["corrupt"]["unchanged"]
    assert r0["corrupt"]["fallback_step"] == SAVE_AT and len(r0["corrupt"]["warnings"]) == 1
    assert "skipped" in r0["corrupt"]["warnings"][0] and "\n" not in r0["corrupt"]["warnings"][0]
    # Bad input: one line naming the fix.
    errors = single["errors"]
    assert "strategy='zero3'" in errors["unknown"] and "strategy='fsdp'" in errors["unknown"]
    assert "comm=" in errors["comm"] and "drop comm=" in errors["comm"]
    assert "static_graph" in errors["static_graph"] and "drop it" in errors["static_graph"]
    assert "find_unused_parameters" in errors["find_unused"]
    assert "no Conv2d" in errors["not_in_model"] and "Block" in errors["not_in_model"]
    assert "tied" in errors["tied_unit"] and "leave Embedding out" in errors["tied_unit"]
    assert "strategy='fsdp'" in errors["ddp_shard_modules"]
    assert all("\n" not in e for e in errors.values())


def _initial() -> dict[str, torch.Tensor]:
    with torch.random.fork_rng():
        torch.manual_seed(123)
        return TiedLM().state_dict()


class _NoReset(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(DIM))

    def forward(self, h):
        return h * self.scale


def _meta_built(info: RankInfo) -> dict:
    """A model built on the meta device, sharded by wrap, trained a few steps."""
    import ddpkit
    from ddpkit.parallel.strategy import local_numel

    out: dict = {}
    with info.init(seed=SEED) as ctx:
        with torch.device("meta"):
            net = TiedLM()
        full = sum(p.numel() for p in net.parameters())
        model = ddpkit.wrap(net, ctx, strategy="fsdp", shard_modules=(Block,))
        out["meta_left"] = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        out["param_local"], out["param_full"] = sum(local_numel(p) for p in model.parameters()), full
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        data = ddpkit.loader(_dataset(), ctx, batch_size=GLOBAL_BATCH // ctx.world_size, seed=3)
        losses = []
        x, y = next(iter(data))
        for _ in range(8):  # the same batch again and again: the loss must fall
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(ddpkit.reduce_mean(ctx, loss.detach(), 1))
        out["losses"] = losses
        out["hash"] = ddpkit.param_sha256(model)

        def init_weights(m):
            for p in m.parameters():
                p.fill_(0.5)

        with torch.device("meta"):
            net = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), _NoReset())
        try:
            ddpkit.wrap(net, ctx, strategy="fsdp")
        except ValueError as e:
            out["refused"] = str(e)
        with torch.device("meta"):
            net = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), _NoReset())
        model = ddpkit.wrap(net, ctx, strategy="fsdp", init_weights=init_weights)
        out["custom_init"] = all(bool((p.full_tensor() == 0.5).all()) for p in model.parameters())
    return out


@pytest.mark.timeout(200)
def test_a_model_built_on_the_meta_device_is_sharded_then_materialised_per_rank():
    results = run_ranks(_meta_built, 2, timeout=180)
    for r in results:
        assert r["meta_left"] == []
        # each rank holds its shards only: 1/W of the parameters (the 17-row embedding splits 9 + 8)
        assert abs(r["param_local"] - r["param_full"] / 2) <= DIM, r
        assert all(torch.isfinite(torch.tensor(r["losses"]))) and r["losses"][-1] < 0.9 * r["losses"][0], r["losses"]
        assert "_NoReset" in r["refused"] and "init_weights=fn" in r["refused"]
        assert r["custom_init"]
    assert results[0]["hash"] == results[1]["hash"] and results[0]["losses"] == results[1]["losses"]
