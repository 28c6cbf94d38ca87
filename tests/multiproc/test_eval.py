"""Exact distributed evaluation: 1001 samples on 2 and 3 ranks give the single-process metrics and predictions."""

from __future__ import annotations

import pytest
import torch
from harness import RankInfo, run_ranks

NUM_SAMPLES = 1001  # odd, prime-ish: every world size here gets uneven shards
NUM_CLASSES = 5


def _dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_SAMPLES, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, NUM_CLASSES, (NUM_SAMPLES,), generator=g)
    return torch.utils.data.TensorDataset(x, y)


def _model() -> torch.nn.Module:
    # float64 so per-sample losses do not depend on how samples are batched; only the
    # reduction could then make distributed results differ from one process.
    torch.manual_seed(1)
    return torch.nn.Linear(8, NUM_CLASSES).double()


def _single_process() -> dict:
    x, y = _dataset().tensors
    with torch.no_grad():
        logits = _model()(x)
    losses = torch.nn.functional.cross_entropy(logits, y, reduction="none")
    preds = logits.argmax(1)
    return {"loss": float(losses.sum()) / NUM_SAMPLES, "accuracy": int((preds == y).sum()) / NUM_SAMPLES,
            "preds": preds, "losses": losses}


def _evaluate(info: RankInfo, batch_size: int) -> dict:
    import ddpkit

    with info.init(seed=0) as ctx:
        model = _model()
        data = ddpkit.eval_loader(_dataset(), ctx, batch_size=batch_size)
        loss_sum, correct, count, batches = 0.0, 0, 0, 0
        preds, losses = [], []
        with torch.no_grad():
            for x, y in data:
                logits = model(x)
                per_sample = torch.nn.functional.cross_entropy(logits, y, reduction="none")
                loss_sum += float(per_sample.sum())
                correct += int((logits.argmax(1) == y).sum())
                count += len(y)
                batches += 1
                preds.append(logits.argmax(1))
                losses.append(per_sample)
        # Collectives only after the loop: ranks with fewer batches must not wait inside it.
        means = ddpkit.reduce_means(ctx, {"loss": loss_sum, "accuracy": correct}, count)
        gathered_preds = ddpkit.gather_in_order(ctx, torch.cat(preds), data.indices)
        gathered_losses = ddpkit.gather_in_order(ctx, torch.cat(losses), data.indices)
        gathered_idx = ddpkit.gather_in_order(ctx, torch.as_tensor(data.indices), data.indices)
        # What a padded DistributedSampler would report, to show the exact path is not trivially equal.
        sampler = torch.utils.data.DistributedSampler(_dataset(), num_replicas=ctx.world_size, rank=ctx.rank,
                                                      shuffle=False)
        padded = [i for i in sampler]
        x, y = _dataset()[padded]
        with torch.no_grad():
            padded_sum = float(torch.nn.functional.cross_entropy(model(x), y, reduction="sum"))
        padded_mean = ddpkit.reduce_mean(ctx, padded_sum, len(padded))
        # Overlapping shards are refused on every rank alike (all see the same gathered indices).
        try:
            ddpkit.gather_in_order(ctx, torch.zeros(2), [0, 1])
            duplicate_error = None
        except ValueError as e:
            duplicate_error = str(e)
        return {**means, "preds": gathered_preds, "losses": gathered_losses, "indices": gathered_idx,
                "count": count, "batches": batches, "padded_mean": padded_mean, "duplicate_error": duplicate_error}


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world_size", "batch_size"), [(2, 50), (3, 111)])
def test_eval_on_uneven_shards_equals_single_process(world_size, batch_size):
    results = run_ranks(_evaluate, world_size, batch_size, timeout=90)
    ref = _single_process()
    # The shards are uneven and so are the batch counts: a collective inside the loop would hang.
    assert sum(r["count"] for r in results) == NUM_SAMPLES
    assert len({r["count"] for r in results}) == 2
    assert len({r["batches"] for r in results}) == 2
    for r in results:
        assert r["accuracy"] == ref["accuracy"]  # integer counts: exactly equal
        assert r["loss"] == pytest.approx(ref["loss"], rel=1e-13, abs=0)  # float64 sums, only reordered
        assert torch.equal(r["indices"], torch.arange(NUM_SAMPLES))  # every sample once, in dataset order
        assert torch.equal(r["preds"], ref["preds"])
        torch.testing.assert_close(r["losses"], ref["losses"], rtol=1e-12, atol=0)
        assert r["duplicate_error"] is not None and "two ranks" in r["duplicate_error"]
    # Padding with duplicates (DistributedSampler) would have been measurably wrong here.
    assert abs(results[0]["padded_mean"] - ref["loss"]) > 1e-6


NUM_SMALL = 11  # 3 batches of 4 on 2 ranks: 4 and 7 samples, the shards differ by a batch


def _collect(data, model) -> dict:
    """What an evaluation loop of a script collects, in the shapes scripts use."""
    import numpy as np

    preds, batches, labels, losses = [], [], [], []
    stacked = torch.tensor([])
    with torch.no_grad():
        for x, y in data:
            logits = model(x)
            preds.extend(logits.argmax(1).tolist())  # per sample
            batches.append(logits)  # per batch, a tensor of per-sample rows
            labels.append(y.numpy())
            stacked = torch.cat([stacked, logits])
            losses.append((len(y), float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))))
    return {"preds": preds, "batches": batches, "labels": labels, "stacked": stacked, "losses": losses}


def _small() -> torch.utils.data.TensorDataset:
    x, y = _dataset().tensors
    return torch.utils.data.TensorDataset(x[:NUM_SMALL], y[:NUM_SMALL])


def _gather_lists(info: RankInfo) -> dict:
    import ddpkit

    with info.init(seed=0) as ctx:
        local = _collect(ddpkit.eval_loader(_small(), ctx, batch_size=4), _model())
        # after the loop, every list in the same order on every rank
        return {"local": len(local["preds"]), **{k: ddpkit.gather_list(ctx, v) for k, v in local.items()}}


@pytest.mark.timeout(120)
def test_gather_list_over_uneven_eval_shards_equals_the_single_process_lists():
    import numpy as np

    results = run_ranks(_gather_lists, 2, timeout=90)
    ref = _collect(torch.utils.data.DataLoader(_small(), batch_size=4), _model())
    assert [r["local"] for r in results] == [4, 7]
    for r in results:
        assert r["preds"] == ref["preds"]  # per-sample entries: exactly the single-process list
        # float64 products may differ in the last bit
        torch.testing.assert_close(torch.cat(r["batches"]), torch.cat(ref["batches"]), rtol=1e-12, atol=0)
        assert np.array_equal(np.concatenate(r["labels"]), np.concatenate(ref["labels"]))
        assert r["stacked"].dtype == torch.float64  # the empty start (float32) promotes as it did in one process
        torch.testing.assert_close(r["stacked"], ref["stacked"], rtol=1e-12, atol=0)
        # per-batch entries: the script's own batches (shards are whole batches), covering every sample once
        assert [n for n, _ in r["losses"]] == [4, 4, 3]
        assert sum(s for _, s in r["losses"]) == pytest.approx(sum(s for _, s in ref["losses"]), rel=1e-13)
