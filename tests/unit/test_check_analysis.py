"""ddpkit check's analysis: synthetic per-rank records -> findings; which sample an index names (no processes)."""

from __future__ import annotations

import json

from ddpkit.check.analysis import (analyse, check_collectives, check_data, check_downloads, check_saves, check_steps,
                                   check_writes, load_records)


def _step(n, *, before="p", grads="g", after="q", ddp=1, synced=1, site="train.py:30"):
    return {"ev": "step", "n": n, "site": site, "params_before": before, "grads": grads, "params_after": after,
            "ddp_forwards": ddp, "synced_forwards": synced}


def _call(i, op="all_reduce", shapes=("float32[4]",), site="train.py:40"):
    return {"ev": "collective", "i": i, "op": op, "shapes": list(shapes), "site": site, "step": 0}


def _iteration(loader, it, indices, *, step0=0, steps=1, site="train.py:20", complete=True, **info):
    events = [{"ev": "epoch_start", "loader": loader, "iter": it, "step": step0, "site": site, **info}]
    events += [{"ev": "batch", "loader": loader, "iter": it, "step": step0, "idx": list(indices)}]
    events += [{"ev": "epoch_end" if complete else "epoch_cut", "loader": loader, "iter": it, "steps": step0 + steps}]
    return events


def test_identical_ranks_have_no_findings():
    rank = [_step(1), _step(2, before="q", after="r"), _call(0), _call(1, op="barrier", shapes=())]
    assert analyse({0: list(rank), 1: list(rank)}) == []


def test_params_differing_before_the_first_step_is_named_with_the_step_site():
    [f] = check_steps({0: [_step(1, before="a")], 1: [_step(1, before="b")]})
    assert (f.kind, f.site) == ("params", "train.py:30")
    assert "before the first optimizer step" in f.message and "DistributedDataParallel" in f.fix


def test_gradients_differing_under_no_sync_blame_no_sync():
    [f] = check_steps({0: [_step(1, grads="a", synced=0, ddp=2)], 1: [_step(1, grads="b", synced=0, ddp=2)]})
    assert f.kind == "grads" and "no_sync" in f.message and "rank 0 vs rank 1" in f.message


def test_gradients_differing_after_synced_backward_blame_a_rank_local_edit():
    [f] = check_steps({0: [_step(1, grads="a")], 1: [_step(1, grads="b")]})
    assert "rank-local gradient" in f.message


def test_only_the_first_divergent_step_is_reported_and_step_counts_are_compared():
    out = check_steps({0: [_step(1, grads="a"), _step(2, grads="c")], 1: [_step(1, grads="b")]})
    assert [f.kind for f in out] == ["grads", "steps"]
    assert "rank 0: 2, rank 1: 1" in out[1].message


def test_collective_mismatch_names_each_rank_and_site():
    [f] = check_collectives({0: [_call(0), _call(1, site="train.py:88")],
                             1: [_call(0), _call(1, op="barrier", shapes=(), site="train.py:91")]})
    assert f.site == "train.py:88"
    assert "collective #2" in f.message and "rank 1 barrier at train.py:91" in f.message


def test_collective_shape_mismatch_and_missing_call():
    [shape] = check_collectives({0: [_call(0, shapes=("float32[4]",))], 1: [_call(0, shapes=("float32[5]",))]})
    assert "float32[5]" in shape.message
    [missing] = check_collectives({0: [_call(0)], 1: []})
    assert "rank 1 never issued it" in missing.message
    assert check_collectives({0: [_call(0, op="all_gather_object", shapes=())],
                              1: [_call(0, op="all_gather_object", shapes=())]}) == []


def test_overlapping_training_shards_are_reported_but_padding_is_allowed():
    records = {0: _iteration(0, 0, [0, 1, 2, 3]), 1: _iteration(0, 0, [2, 3, 4, 5])}
    [f] = check_data(records)
    assert f.kind == "data-overlap" and "2 of the same samples" in f.message
    padded = {r: _iteration(0, 0, idx, distributed=True, total_size=6, dataset_len=5, shuffle=True, epoch=0)
              for r, idx in ((0, [0, 2, 4]), (1, [1, 3, 0]))}
    assert check_data(padded) == []


def test_same_shuffled_order_in_two_epochs_is_reported_and_a_new_order_is_not():
    same = {r: _iteration(0, 0, [3, 1, 2], steps=1) + _iteration(0, 1, [3, 1, 2], step0=1, steps=1)
            for r in (0,)}
    [f] = check_data(same)
    assert f.kind == "data-order" and "epochs 0 and 1" in f.message and "set_epoch" in f.fix
    changed = {0: _iteration(0, 0, [3, 1, 2]) + _iteration(0, 1, [2, 3, 1], step0=1)}
    assert check_data(changed) == []
    unshuffled = {0: _iteration(0, 0, [0, 1, 2]) + _iteration(0, 1, [0, 1, 2], step0=1)}
    assert check_data(unshuffled) == []


def test_padded_evaluation_is_reported_only_for_eval_iterations():
    info = dict(distributed=True, total_size=102, dataset_len=101, num_samples=51, num_replicas=2, shuffle=False)
    evaluation = {r: _iteration(0, 0, range(r, 102, 2), steps=0, **info) for r in (0, 1)}
    [f] = check_data(evaluation)
    assert f.kind == "eval-padding" and "1 duplicates" in f.message
    even = dict(info, total_size=100, dataset_len=100, num_samples=50)
    assert check_data({r: _iteration(0, 0, range(r, 100, 2), steps=0, **even) for r in (0, 1)}) == []


def test_checkpoint_written_by_two_ranks():
    save = {"ev": "save", "path": "/ckpt/model.pt", "site": "train.py:50"}
    [f] = check_saves({0: [save], 1: [save]})
    assert f.site == "train.py:50" and "2 ranks" in f.message
    assert check_saves({0: [save], 1: [dict(save, path="/ckpt/model-1.pt")]}) == []


def test_a_file_or_tracker_run_written_by_two_ranks_and_a_file_per_rank():
    csv = {"ev": "write", "path": "/out/losses.csv", "what": "open(mode='w')", "site": "train.py:18"}
    [f] = check_writes({0: [csv], 1: [dict(csv, site="train.py:19")]})
    assert (f.kind, f.site) == ("write", "train.py:18") and "/out/losses.csv is written by 2 ranks (0, 1)" in f.message
    assert "rank 0 only" in f.fix and "barrier" in f.fix
    assert check_writes({0: [csv], 1: [dict(csv, path="/out/losses-1.csv")]}) == []
    run = {"ev": "write", "path": "<W&B run of project 'p'>", "what": "wandb.init", "site": "train.py:5"}
    [f] = check_writes({0: [run], 1: [run]})
    assert "W&B run of project 'p' is started by 2 ranks" in f.message
    # a torch.save checkpoint is the save check's finding, not a second one
    saved = {"ev": "save", "path": "/out/losses.csv", "site": "train.py:18"}
    assert check_writes({0: [csv, saved], 1: [csv]}) == []


def test_a_download_run_by_every_rank_is_reported_once_per_url():
    get = {"ev": "download", "url": "https://example.com/data.zip", "what": "GET request", "site": "train.py:9"}
    [f] = check_downloads({0: [get], 1: [get], 2: [get]})
    assert (f.kind, f.site) == ("download", "train.py:9") and "downloaded by 3 ranks (0, 1, 2)" in f.message
    assert "rank 0 only, then barrier" in f.fix
    assert check_downloads({0: [get], 1: []}) == []
    assert [x.kind for x in analyse({0: [get], 1: [get]})] == ["download"]


def test_load_records_skips_a_line_cut_short(tmp_path):
    (tmp_path / "rank-0.jsonl").write_text(json.dumps(_step(1)) + "\n" + '{"ev": "st')
    (tmp_path / "rank-1.jsonl").write_text(json.dumps(_step(1)) + "\n")
    records = load_records(tmp_path)
    assert sorted(records) == [0, 1] and len(records[0]) == 1


def test_a_cuda_only_call_is_reported_as_not_mappable_with_its_line():
    from ddpkit.check.analysis import check_errors

    end = {"ev": "end", "status": "error", "steps": 0, "site": "train.py:12",
           "error": "AssertionError: Torch not compiled with CUDA enabled"}
    [f] = check_errors({0: [end], 1: [dict(end, status="stopped")]})
    assert (f.kind, f.site) == ("error", "train.py:12") and "needs CUDA" in f.message


def _batches(loader, it, src, *, batches, site="train.py:20"):
    """One training iteration whose batch names the samples (dataset ordinal, index) behind it."""
    return [{"ev": "epoch_start", "loader": loader, "iter": it, "step": 0, "site": site, "batches": batches},
            {"ev": "batch", "loader": loader, "iter": it, "step": 0, "idx": [j for _, j in src],
             "src": [list(s) for s in src]},
            {"ev": "epoch_cut", "loader": loader, "iter": it, "steps": 5}]


def _dataset(ds=0, *, h="abc", n=64, kind="TensorDataset"):
    return {"ev": "dataset", "ds": ds, "type": kind, "len": n, "hash": h}


def test_overlap_needs_the_same_index_of_the_same_data():
    same_idx = [(0, i) for i in range(8)]
    # each rank's own data (pre-sharded files): equal indices, different fingerprints -> no overlap
    own = {r: _batches(0, 0, same_idx, batches=8) + [_dataset(h=f"shard{r}")] for r in (0, 1)}
    assert check_data(own) == []
    # the same data on both ranks -> overlap, also when a rank's fingerprint is unknown (index only)
    shared = {r: _batches(0, 0, same_idx, batches=8) + [_dataset()] for r in (0, 1)}
    [f] = check_data(shared)
    assert f.kind == "data-overlap" and "8 of the same samples" in f.message
    unknown = {0: _batches(0, 0, same_idx, batches=8) + [_dataset(h=None)], 1: _batches(0, 0, same_idx, batches=8)}
    assert [f.kind for f in check_data(unknown)] == ["data-overlap"]
    # Subset halves: the loader indices repeat, the underlying samples do not
    halves = {r: _batches(0, 0, [(0, 64 * r + i) for i in range(8)], batches=8) + [_dataset()] for r in (0, 1)}
    assert check_data(halves) == []
    # a different length or type is different data whatever the hashes say
    other = {0: _batches(0, 0, same_idx, batches=8) + [_dataset(h=None)],
             1: _batches(0, 0, same_idx, batches=8) + [_dataset(h=None, n=65)]}
    assert check_data(other) == []


def test_ranks_with_different_numbers_of_batches_are_named_unless_they_join():
    records = {0: _batches(0, 0, [(0, 1)], batches=17) + [_dataset()],
               1: _batches(0, 0, [(0, 2)], batches=15) + [_dataset()]}
    [f] = check_data(records)
    assert (f.kind, f.site) == ("data-uneven", "train.py:20")
    assert "(rank 0: 17, rank 1: 15)" in f.message and "drop_last=True" in f.fix
    joined = {r: [{"ev": "join", "site": "train.py:19"}, *events] for r, events in records.items()}
    assert check_data(joined) == []


def test_source_resolves_nested_subset_and_concat_dataset():
    import torch
    from torch.utils.data import ConcatDataset, Subset, TensorDataset

    from ddpkit.check.samples import source

    a, b = TensorDataset(torch.arange(10)), TensorDataset(torch.arange(10, 15))
    both = ConcatDataset([a, b])
    assert source(a, 3) == (a, 3)
    assert source(both, 12) == (b, 2) and source(both, -1) == (b, 4) and source(both, 9) == (a, 9)
    nested = Subset(Subset(both, [14, 13, 2, 1]), [1, 2])
    assert source(nested, 0) == (b, 3) and source(nested, 1) == (a, 2)
    assert source(Subset(a, torch.tensor([7, 8])), 1) == (a, 8)


class _Augmented:
    """Same rows on every rank; each sample gets noise from torch's, numpy's and python's global generators."""

    def __init__(self, rows):
        import torch

        self.rows = torch.tensor(rows, dtype=torch.float32)

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        import random

        import numpy as np
        import torch

        return {"x": self.rows[i] + torch.rand(1), "np": np.random.rand(2), "py": random.random(), "label": i}


def test_fingerprint_sees_through_random_augmentation_and_leaves_the_generators_as_they_were():
    import random

    import numpy as np
    import torch

    from ddpkit.check.samples import fingerprint, same_data

    prints = []
    for rank_seed in (1, 2):  # two ranks: same data, different generator states
        torch.manual_seed(rank_seed)
        np.random.seed(rank_seed)
        random.seed(rank_seed)
        prints.append(fingerprint(_Augmented([1.0, 2.0, 3.0])))
        after = (torch.rand(1).item(), np.random.rand(), random.random())
        torch.manual_seed(rank_seed)
        np.random.seed(rank_seed)
        random.seed(rank_seed)
        assert after == (torch.rand(1).item(), np.random.rand(), random.random())  # streams untouched
    assert prints[0]["hash"] is not None and prints[0] == prints[1] and same_data(*prints)
    different = fingerprint(_Augmented([1.0, 2.0, 4.0]))
    assert different["len"] == 3 and different["hash"] != prints[0]["hash"] and not same_data(prints[0], different)


def test_a_dataset_drawing_from_its_own_generator_has_no_hash():
    import torch

    from ddpkit.check.samples import fingerprint, same_data

    class OwnGenerator:
        def __init__(self):
            self.g = torch.Generator().manual_seed(0)

        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.rand(2, generator=self.g)

    fp = fingerprint(OwnGenerator())
    assert fp["len"] == 4 and fp["hash"] is None
    assert same_data(fp, dict(fp, hash="abc"))  # unknown content: compared by index, as before
    assert fingerprint(object())["len"] is None
