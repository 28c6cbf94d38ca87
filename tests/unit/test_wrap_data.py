"""wrap() option checking, unwrap(), loader index math and input errors: no processes."""

from __future__ import annotations

import pytest
import torch

import ddpkit
from ddpkit.collectives import broadcast_object
from ddpkit.data import ShardedBatchSampler, epoch_permutation, eval_shard
from ddpkit.env import LaunchEnv
from ddpkit.rng import rank_seed
from ddpkit.runtime import Context


def _ctx(rank=0, world_size=1) -> Context:
    return Context(env=LaunchEnv(rank=rank, world_size=world_size, local_world_size=world_size, local_rank=rank),
                   device=torch.device("cpu"), backend="gloo", seed=0)


def test_wrap_rejects_unknown_and_mistyped_options():
    with pytest.raises(TypeError, match="unknown DDP option 'shuffle'.*ddpkit.loader"):
        ddpkit.wrap(torch.nn.Linear(2, 2), _ctx(), shuffle=True)
    with pytest.raises(TypeError, match="device_ids itself"):
        ddpkit.wrap(torch.nn.Linear(2, 2), _ctx(), device_ids=[0])
    with pytest.raises(TypeError, match="find_unused_parameters='yes' must be bool"):
        ddpkit.wrap(torch.nn.Linear(2, 2), _ctx(), find_unused_parameters="yes")
    with pytest.raises(ValueError, match="bucket_cap_mb=0 must be > 0"):
        ddpkit.wrap(torch.nn.Linear(2, 2), _ctx(), bucket_cap_mb=0)
    with pytest.raises(TypeError, match="needs a torch.nn.Module"):
        ddpkit.wrap(lambda x: x, _ctx())


def test_mistyped_arguments_are_named():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"wrap\(model, ctx\) needs the Context ddpkit.init\(\) returned.*NoneType"):
        ddpkit.wrap(model, None)
    with pytest.raises(TypeError, match=r"sync_batchnorm='yes'\) must be True or False"):
        ddpkit.wrap(model, _ctx(), sync_batchnorm="yes")
    with pytest.raises(TypeError, match=r"unwrap\(\) needs a torch.nn.Module.*got int"):
        ddpkit.unwrap(3)
    with pytest.raises(TypeError, match="sync='yes'.*sync=loader.step_end"):
        with ddpkit.accumulate(model, sync="yes"):
            pass
    import numpy as np

    with ddpkit.accumulate(model, sync=np.bool_(True)):  # numpy's bool is a bool
        pass
    ds = torch.utils.data.TensorDataset(torch.arange(8))
    with pytest.raises(TypeError, match="drop_last='no' must be True or False"):
        ddpkit.loader(ds, _ctx(), batch_size=2, drop_last="no")
    for seed in ("x", -1, 1.5, True):
        with pytest.raises((TypeError, ValueError), match=r"ddpkit.loader \(the data-order seed.*seed=.*(must be an int|out of range)"):
            ddpkit.loader(ds, _ctx(), batch_size=2, seed=seed)
    with pytest.raises(TypeError, match="timeout_s='10' must be a number of seconds"):
        ddpkit.init(timeout_s="10")


def test_collectives_check_their_arguments_at_world_size_one():
    ctx = _ctx()
    with pytest.raises(ValueError, match=r"broadcast_object\(src=1\) must be a rank, 0..0"):
        broadcast_object(ctx, "x", src=1)
    with pytest.raises(ValueError, match=r"reduce_mean\(total=...\) must be one number.*shape \(3,\).*reduce_means"):
        ddpkit.reduce_mean(ctx, torch.ones(3), 1)
    assert ddpkit.reduce_mean(ctx, torch.tensor([6.0]), torch.tensor(3)) == 2.0  # one element, any shape
    with pytest.raises(TypeError, match="local must be a tensor of this rank's outputs.*got list"):
        ddpkit.gather_in_order(ctx, [1, 2, 3], [0, 1, 2])


def test_all_reduce_number_keeps_an_int_an_int_and_refuses_what_is_no_number():
    ctx = _ctx()
    from ddpkit.collectives import all_reduce_number

    assert all_reduce_number(ctx, 7) == 7 and isinstance(all_reduce_number(ctx, 7), int)
    assert all_reduce_number(ctx, 0.25) == 0.25 and isinstance(all_reduce_number(ctx, 0.25), float)
    for bad in (True, "3", [1.0]):
        with pytest.raises(TypeError, match="all_reduce_number takes an int or a float"):
            all_reduce_number(ctx, bad)


def test_gather_in_order_keeps_the_dtype_when_a_shard_is_empty(monkeypatch):
    import ddpkit.collectives as collectives

    empty = (torch.tensor([], dtype=torch.long), torch.tensor([]))  # rank 0: no samples, a float32 placeholder
    monkeypatch.setattr(collectives, "all_gather_object", lambda ctx, obj: [empty, obj])
    preds = ddpkit.gather_in_order(_ctx(), torch.tensor([7, 3]), [1, 0])
    assert preds.dtype == torch.long and preds.tolist() == [3, 7]


def test_world_size_one_returns_plain_module_and_unwrap_strips_compile():
    model = torch.nn.Linear(2, 2)
    assert ddpkit.wrap(model, _ctx()) is model
    compiled = torch.compile(model)
    assert ddpkit.unwrap(compiled) is model
    assert set(ddpkit.unwrap(compiled).state_dict()) == {"weight", "bias"}


def test_param_sha256_detects_one_bit():
    model = torch.nn.Linear(3, 2)
    before = ddpkit.param_sha256(model)
    with torch.no_grad():
        model.weight.view(-1)[0] = torch.nextafter(model.weight.view(-1)[0], torch.tensor(10.0))
    assert ddpkit.param_sha256(model) != before


def _indices(world_size, batch, k=1, n=100, epoch=0, drop_last=True, seed=0):
    out = []
    for rank in range(world_size):
        s = ShardedBatchSampler(n, batch_size=batch, rank=rank, world_size=world_size, accumulation_steps=k,
                                seed=seed, drop_last=drop_last)
        s.epoch = epoch
        out.append(list(s))
    return out


def test_sampler_shards_disjoint_and_cover():
    shards = _indices(4, 5)
    flat = [i for shard in shards for batch in shard for i in batch]
    assert sorted(flat) == list(range(100))


def test_global_order_independent_of_world_size_and_accumulation():
    """Optimizer step t consumes the same samples for 2x16, 1x32 and 1x16x2."""
    def steps(world_size, batch, k):
        shards = _indices(world_size, batch, k, n=200)
        per_step = []
        for t in range(len(shards[0]) // k):
            per_step.append(sorted(i for shard in shards for batch in shard[t * k:(t + 1) * k] for i in batch))
        return per_step
    assert steps(2, 16, 1) == steps(1, 32, 1) == steps(1, 16, 2) == steps(4, 4, 2)


def test_epochs_differ_and_are_reproducible():
    assert epoch_permutation(50, seed=1, epoch=0, shuffle=True) != epoch_permutation(50, seed=1, epoch=1, shuffle=True)
    assert epoch_permutation(50, seed=1, epoch=3, shuffle=True) == epoch_permutation(50, seed=1, epoch=3, shuffle=True)
    assert epoch_permutation(5, seed=1, epoch=3, shuffle=False) == [0, 1, 2, 3, 4]


def test_drop_last_false_pads_equally():
    shards = _indices(3, 4, n=50, drop_last=False)  # 50 samples, global batch 12 -> 5 steps, 10 padded
    assert [len(s) for s in shards] == [5, 5, 5]
    flat = [i for shard in shards for batch in shard for i in batch]
    assert len(flat) == 60 and set(flat) == set(range(50))


def test_eval_shard_unpadded():
    shards = [eval_shard(1001, rank=r, world_size=3) for r in range(3)]
    assert [len(s) for s in shards] == [333, 334, 334]
    assert [i for s in shards for i in s] == list(range(1001))


def test_loader_input_errors():
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    with pytest.raises(TypeError, match="sampler=.*contradict"):
        ddpkit.loader(ds, _ctx(), batch_size=2, sampler=torch.utils.data.SequentialSampler(ds))
    with pytest.raises(TypeError, match="needs a Dataset, got a DataLoader"):
        ddpkit.loader(torch.utils.data.DataLoader(ds), _ctx(), batch_size=2)
    with pytest.raises(ValueError, match="batch_size=0 must be a positive int"):
        ddpkit.loader(ds, _ctx(), batch_size=0)
    with pytest.raises(ValueError, match="fewer than one global batch of 16"):
        ddpkit.loader(ds, _ctx(0, 2), batch_size=8)
    with pytest.raises(TypeError, match="shuffle"):
        ddpkit.eval_loader(ds, _ctx(), batch_size=2, shuffle=True)


def _pairs(items):
    return torch.utils.data.default_collate(items)


def test_loader_answers_the_batch_size_a_script_reads_per_rank():
    ds = torch.utils.data.TensorDataset(torch.arange(40))
    loader = ddpkit.loader(ds, _ctx(1, 2), batch_size=4, accumulation_steps=2)
    assert loader.batch_size == 4 == len(next(iter(loader))[0])  # per rank, per micro-step: what it yields
    assert loader.global_batch_size == 16
    assert ddpkit.eval_loader(ds, _ctx(1, 2), batch_size=3).batch_size == 3


def test_loader_answers_the_dataset_and_sampler_a_script_reads():
    ds = torch.utils.data.TensorDataset(torch.arange(40))
    loader = ddpkit.loader(ds, _ctx(1, 2), batch_size=4)
    assert loader.dataset is ds and len(loader.dataset) == 40  # the whole dataset, as a DataLoader's
    assert [b for b in loader.sampler] == [b[0].tolist() for b in loader]  # this rank's batches of indices
    evaluation = ddpkit.eval_loader(ds, _ctx(1, 2), batch_size=3)
    assert evaluation.dataset is ds
    assert list(evaluation.sampler) == list(range(21, 40)) == list(evaluation.indices)  # batches 7 to 13 of 14


def test_loader_answers_num_workers_drop_last_collate_fn_and_pin_memory():
    ds = torch.utils.data.TensorDataset(torch.arange(40))
    loader = ddpkit.loader(ds, _ctx(), batch_size=4, drop_last=False, collate_fn=_pairs)
    assert loader.num_workers == 0 and loader.drop_last is False
    assert loader.collate_fn is _pairs  # the script's own, not the wrapper ddpkit puts around it
    assert loader.pin_memory is False  # a CPU device copies nothing through pinned memory
    assert ddpkit.loader(ds, _ctx(), batch_size=4).collate_fn is torch.utils.data.default_collate
    evaluation = ddpkit.eval_loader(ds, _ctx(), batch_size=4)
    assert evaluation.num_workers == 0 and evaluation.drop_last is False and evaluation.pin_memory is False
    assert evaluation.collate_fn is torch.utils.data.default_collate


def test_loader_attributes_it_lacks_raise_an_error_naming_the_loader():
    ds = torch.utils.data.TensorDataset(torch.arange(40))
    with pytest.raises(AttributeError, match=r"ddpkit.loader's DistributedLoader has no attribute 'timeout'.*batch_size"):
        ddpkit.loader(ds, _ctx(), batch_size=4).timeout
    with pytest.raises(AttributeError, match=r"ddpkit.eval_loader's EvalLoader has no attribute 'prefetch_factor'"):
        ddpkit.eval_loader(ds, _ctx(), batch_size=4).prefetch_factor
    assert not hasattr(ddpkit.loader(ds, _ctx(), batch_size=4), "batch_sampler_of_mine")


def test_loader_position_state_dict_roundtrip():
    ds = torch.utils.data.TensorDataset(torch.arange(40))
    full = ddpkit.loader(ds, _ctx(), batch_size=4, seed=5)
    order = [b[0].tolist() for _ in range(2) for b in full]  # two epochs, no set_epoch
    part = ddpkit.loader(ds, _ctx(), batch_size=4, seed=5)
    seen = []
    for i, b in enumerate(part):
        seen.append(b[0].tolist())
        if i == 3:
            break
    state = part.state_dict()
    assert state == {"epoch": 0, "samples_seen": 16, "seed": 5}
    resumed = ddpkit.loader(ds, _ctx(), batch_size=4, seed=5)
    resumed.load_state_dict(state)
    seen += [b[0].tolist() for b in resumed] + [b[0].tolist() for b in resumed]
    assert seen == order
    assert resumed.state_dict() == {"epoch": 2, "samples_seen": 0, "seed": 5}


def test_rank_seeds_distinct_and_stable():
    seeds = {rank_seed(0, r) for r in range(8)} | {rank_seed(1, r) for r in range(8)}
    assert len(seeds) == 16
    assert rank_seed(3, 2) == rank_seed(3, 2)


def test_import_is_cheap():
    import subprocess
    import sys

    code = "import sys, ddpkit; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.split() == ["False", "False"]


class _Draws(torch.utils.data.Dataset):
    """Each item is (python, numpy, torch) random draws made inside the worker that loads it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import random

        import numpy as np

        info = torch.utils.data.get_worker_info()
        return torch.tensor([info.id, random.random(), float(np.random.rand()), float(torch.rand(1))],
                            dtype=torch.float64)


def test_worker_seeds_distinct_per_rank_and_worker():
    draws = {}
    for rank in (0, 1):
        ctx = _ctx(rank, 2)
        data = ddpkit.loader(_Draws(), ctx, batch_size=1, num_workers=2, persistent_workers=False, shuffle=False)
        for (row,) in ((b[0],) for b in data):
            draws.setdefault((rank, int(row[0])), row[1:].tolist())
    assert len(draws) == 4  # 2 ranks x 2 workers
    for column in range(3):  # python, numpy, torch streams
        values = [v[column] for v in draws.values()]
        assert len(set(values)) == 4, f"stream {column} repeats across ranks/workers: {values}"



class _Augmented(torch.utils.data.Dataset):
    """Item i with python, numpy and torch draws made where it is fetched (a loader worker)."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        import random

        import numpy as np

        return torch.tensor([i, random.random(), float(np.random.rand()), float(torch.rand(1))], dtype=torch.float64)


def _epochs(data, epochs=2, stop_after=None):
    out = []
    for _ in range(epochs):
        for batch in data:
            out.append(batch)
            if stop_after is not None and len(out) == stop_after:
                return out
    return out


def test_worker_augmentation_depends_on_the_batch_not_on_the_workers():
    runs = {}
    for workers, persistent in ((1, True), (2, True), (2, False)):
        data = ddpkit.loader(_Augmented(), _ctx(1, 2), batch_size=2, accumulation_steps=2, num_workers=workers,
                             persistent_workers=persistent)
        runs[workers, persistent] = _epochs(data)
    first = runs[1, True]
    assert len(first) == 2 * 3 * 2  # 2 epochs x 3 steps x 2 micro-steps
    for batches in runs.values():
        assert all(torch.equal(a, b) for a, b in zip(batches, first))
    draws = torch.cat(first)[:, 1:]
    assert len(set(draws.flatten().tolist())) == draws.numel()  # no batch, epoch or stream repeats another
    other_rank = _epochs(ddpkit.loader(_Augmented(), _ctx(0, 2), batch_size=2, accumulation_steps=2, num_workers=2))
    assert not set(torch.cat(other_rank)[:, 1:].flatten().tolist()) & set(draws.flatten().tolist())


def test_worker_augmentation_is_the_same_after_a_resume():
    def make():
        return ddpkit.loader(_Augmented(), _ctx(), batch_size=4, num_workers=2)

    whole = _epochs(make())
    first = make()
    head = _epochs(first, stop_after=8)  # stops inside epoch 2 (6 steps an epoch)
    resumed = make()  # fresh workers, as in a new process
    resumed.load_state_dict(first.state_dict())
    tail = _epochs(resumed, epochs=1)
    assert len(head) + len(tail) == len(whole) == 12
    assert all(torch.equal(a, b) for a, b in zip(head + tail, whole))


def test_a_worker_init_fn_of_yours_runs_after_ddpkits_seeding():
    data = ddpkit.loader(_TaggedAugmented(), _ctx(), batch_size=4, num_workers=2, worker_init_fn=_tag_worker,
                         persistent_workers=False)
    assert all(float(b[0, 0]) >= 1000 for b in data)


class _TaggedAugmented(_Augmented):
    tag = 0

    def __getitem__(self, i):
        return super().__getitem__(i) + _TaggedAugmented.tag


def _tag_worker(worker_id):
    _TaggedAugmented.tag = 1000


def test_eval_loader_warns_when_iterated_with_gradients_on_several_ranks():
    ds = torch.utils.data.TensorDataset(torch.arange(3.0))
    with pytest.warns(UserWarning, match=r"gradients enabled.*torch.no_grad\(\)"):
        list(ddpkit.eval_loader(ds, _ctx(0, 2), batch_size=1))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            assert len(list(ddpkit.eval_loader(ds, _ctx(0, 2), batch_size=1))) == 1  # rank 0 of 3 samples: 1
        list(ddpkit.eval_loader(ds, _ctx(), batch_size=1))  # one process: nothing to wait for


def test_eval_loop_does_not_draw_from_the_global_generator():
    ds = torch.utils.data.TensorDataset(torch.arange(10))
    data = ddpkit.eval_loader(ds, _ctx(), batch_size=4)
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    for _ in range(3):
        list(data)
    assert torch.equal(torch.rand(1), expected)


def test_tensor_dataset_batches_are_gathered_exactly_as_the_dataloader_builds_them():
    from torch.utils.data import default_collate

    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(50, 3, 2, generator=g), torch.randint(0, 9, (50,), generator=g),
                                        torch.arange(50, dtype=torch.float64))
    for rank in range(2):
        fast = ddpkit.loader(ds, _ctx(rank, 2), batch_size=4, accumulation_steps=2, drop_last=False)
        slow = ddpkit.loader(ds, _ctx(rank, 2), batch_size=4, accumulation_steps=2, drop_last=False,
                             collate_fn=default_collate)  # a collate_fn keeps torch's DataLoader path
        assert fast._gather and not slow._gather
        got = [(b, fast.step_end) for _ in range(2) for b in fast]  # two epochs
        want = [(b, slow.step_end) for _ in range(2) for b in slow]
        assert len(got) == len(want) == 2 * 8
        for (a, end_a), (b, end_b) in zip(got, want):
            assert type(a) is type(b) is list and end_a == end_b
            assert all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))
    # still fetched through a DataLoader iterator, so whatever watches one (ddpkit check's probes) sees it
    from torch.utils.data import dataloader

    real, seen = dataloader._BaseDataLoaderIter._next_index, []
    dataloader._BaseDataLoaderIter._next_index = lambda it: (real(it), seen.append(1))[0]  # counts batches given
    try:
        assert len(list(fast)) == len(fast) == len(seen) == 8
    finally:
        dataloader._BaseDataLoaderIter._next_index = real
    subclass = type("Sub", (torch.utils.data.TensorDataset,), {})(torch.arange(8))
    assert not ddpkit.loader(subclass, _ctx(), batch_size=2)._gather  # its __getitem__ may differ


def test_compile_reaches_a_model_whose_module_is_not_importable_by_name():
    # a class from a file loaded with importlib without registering its module (benchmarks load
    # examples/charlm.py so): torch.compile's tracer cannot import it by name from ddpkit's frame
    import types

    import ddpkit

    source = types.ModuleType("not_registered_anywhere")
    exec("import torch\nclass Net(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
         "        self.fc = torch.nn.Linear(3, 2)\n    def forward(self, x):\n        return torch.relu(self.fc(x))\n",
         source.__dict__)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with ddpkit.init(device="cpu") as ctx:
        model = ddpkit.wrap(source.Net(), ctx, compile={"backend": backend})
        assert model(torch.ones(4, 3)).shape == (4, 2) and len(graphs) == 1
        seq = ddpkit.wrap(torch.nn.Sequential(torch.nn.Linear(3, 2)), ctx, compile={"backend": backend})
        assert seq(torch.ones(4, 3)).shape == (4, 2) and len(graphs) == 2
    torch._dynamo.reset()


def test_eval_shards_are_whole_batches_of_the_single_process_order():
    # 610 groups of 100 (one user's positive item first, then its negatives) batched by 100: any world size keeps
    # each group one batch, where cutting by samples would split one at offsets 33, 50 and 25 for 3, 4 and 8 ranks
    for world_size in (2, 3, 4, 8):
        shards = [eval_shard(61000, rank=r, world_size=world_size, batch_size=100) for r in range(world_size)]
        assert [i for s in shards for i in s] == list(range(61000))  # exact cover, no padding, in order
        assert all(s.start % 100 == 0 for s in shards)
        assert max(map(len, shards)) - min(map(len, shards)) <= 100  # differ by at most one batch
    # 11 batches over 3 ranks: 3, 4 and 4 of them, the set's last, short batch whole and last; a rank without a
    # batch of its own gets nothing
    shards = [eval_shard(1001, rank=r, world_size=3, batch_size=100) for r in range(3)]
    assert [(s.start, s.stop) for s in shards] == [(0, 300), (300, 700), (700, 1001)]
    shards = [eval_shard(250, rank=r, world_size=4, batch_size=100) for r in range(4)]
    assert [(s.start, s.stop) for s in shards] == [(0, 0), (0, 100), (100, 200), (200, 250)]


def test_eval_loader_batches_are_the_single_process_batches():
    ds = torch.utils.data.TensorDataset(torch.arange(1001))
    whole = [b[0].tolist() for b in torch.utils.data.DataLoader(ds, batch_size=100)]
    for world_size in (2, 3, 4, 8):
        with torch.no_grad():
            batches = [b[0].tolist() for r in range(world_size)
                       for b in ddpkit.eval_loader(ds, _ctx(r, world_size), batch_size=100)]
        assert batches == whole


def test_wrap_keeps_a_model_whose_own_to_returns_none():
    class PartMover(torch.nn.Module):  # its own .to() moves its children and returns None
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(2, 2)
            self.scale = torch.nn.Parameter(torch.ones(2))
            self.moved = False

        def to(self, device):
            self.body.to(device)
            self.moved = True

    model = PartMover()
    wrapped = ddpkit.wrap(model, _ctx())
    assert wrapped is model and model.moved  # the model itself, its own .to() run
    assert {p.device.type for p in model.parameters()} == {"cpu"}
