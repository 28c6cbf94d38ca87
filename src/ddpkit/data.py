"""Distributed data loading: disjoint shards, automatic epochs, device transfer, resumable position.

The global sample order depends only on (seed, epoch), never on the world size: optimizer step t
of an epoch consumes positions [t*G, (t+1)*G) of one permutation, G = batch_size * world_size *
accumulation_steps (the global batch). Micro-step j of rank r takes the b-sized slice starting at
t*G + (j*world_size + r)*b. So 2 ranks x 32, 1 rank x 64, or 1 rank x 32 x 2 micro-steps all train
on the same samples at every optimizer step, and a checkpoint taken on one world size resumes on
another at the same place. torch's DistributedSampler interleaves by rank and cannot start
mid-epoch, which is why ddpkit samples by itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ddpkit.device import HostPinnedCollate, to_device, unwrap_host_batch
from ddpkit.profile import profiled_batches
from ddpkit.rng import SeededBatch, SeededFetch, WorkerSeeder

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = [
    "DistributedLoader",
    "EvalLoader",
    "ShardedBatchSampler",
    "SeededBatch",
    "loader",
    "eval_loader",
    "eval_shard",
    "to_device",
    "epoch_permutation",
]

_DATALOADER_OWNED = ("sampler", "batch_sampler", "shuffle_seed", "generator")


def epoch_permutation(num_samples: int, *, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The global order of one epoch: the same on every rank and for every world size."""
    if not shuffle:
        return list(range(num_samples))
    import torch

    from ddpkit.rng import epoch_seed

    g = torch.Generator()
    g.manual_seed(epoch_seed(seed, epoch))
    return torch.randperm(num_samples, generator=g).tolist()


class ShardedBatchSampler:
    """Batches of dataset indices for one rank; see the module docstring for the layout."""

    def __init__(self, num_samples: int, *, batch_size: int, rank: int, world_size: int,
                 accumulation_steps: int = 1, shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                 tag_batches: bool = False):
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.accumulation_steps = accumulation_steps
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.tag_batches = tag_batches
        """Yield each batch as a `SeededBatch` that knows its (epoch, step, micro-step)."""
        self.epoch = 0
        self.start_step = 0

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size * self.accumulation_steps

    @property
    def steps_per_epoch(self) -> int:
        """Optimizer steps per epoch (every rank runs the same number: no rank waits alone)."""
        g = self.global_batch_size
        return self.num_samples // g if self.drop_last else -(-self.num_samples // g)

    def __len__(self) -> int:
        return (self.steps_per_epoch - self.start_step) * self.accumulation_steps

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_permutation(self.num_samples, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle)
        g, b, w = self.global_batch_size, self.batch_size, self.world_size
        needed = self.steps_per_epoch * g
        if needed > len(order):  # drop_last=False: pad the last global batch from the epoch's start
            order = order + (order * (needed // max(len(order), 1) + 1))[: needed - len(order)]
        for t in range(self.start_step, self.steps_per_epoch):
            for j in range(self.accumulation_steps):
                start = t * g + (j * w + self.rank) * b
                batch = order[start:start + b]
                yield SeededBatch(batch, (self.epoch, t, j)) if self.tag_batches else batch


_DATALOADER_ATTRIBUTES = ("batch_size", "dataset", "sampler", "num_workers", "drop_last", "collate_fn", "pin_memory")
"""The torch DataLoader attributes both loaders answer (scripts read `loader.batch_size`, `loader.dataset`)."""


def _collate_of(dataloader_kwargs: dict) -> Any:
    """The collate function the script asked for (torch's default when none): what `DataLoader.collate_fn` gives."""
    from torch.utils.data import default_collate

    return dataloader_kwargs.get("collate_fn") or default_collate


def _no_attribute(loader: Any, name: str) -> AttributeError:
    kind = "ddpkit.loader" if isinstance(loader, DistributedLoader) else "ddpkit.eval_loader"
    return AttributeError(
        f"{kind}'s {type(loader).__name__} has no attribute {name!r}: of torch's DataLoader attributes it answers "
        f"{', '.join(_DATALOADER_ATTRIBUTES)}; read the dataset or option you passed to {kind}(...) instead")


class DistributedLoader:
    """Iterate this rank's shard on its device; each complete `for` loop over it is one epoch.

    A loop that stops early (break) leaves the loader mid-epoch and the next loop continues from
    there; `set_epoch(e)` restarts at epoch e's beginning.

    Build it with `ddpkit.loader(...)`. Attributes: `epoch` (the epoch being or last iterated),
    `step_end` (True when the last yielded micro-batch ends an optimizer step),
    `global_batch_size`, `steps_per_epoch`. `state_dict()`/`load_state_dict()` save and restore
    the exact position, also across world sizes that keep the global batch.

    It answers torch DataLoader's attributes too: `batch_size` (the per-rank micro-batch it
    yields, not the global batch), `dataset` (the whole dataset), `sampler` (this rank's
    ShardedBatchSampler), `num_workers`, `drop_last`, `collate_fn` (yours, or torch's
    default_collate) and `pin_memory` (True when batches are copied through pinned memory).
    Any other name raises an AttributeError that names the loader.
    """

    def __init__(self, dataset: Any, ctx: Context, sampler: ShardedBatchSampler, dataloader_kwargs: dict,
                 pin_memory: bool = True):
        import torch

        self.dataset = dataset
        self.ctx = ctx
        self.sampler = sampler
        self.step_end = False
        self._epoch, self._step = 0, 0  # position: the next optimizer step to run
        self._micro = 0  # micro-batches yielded into the current optimizer step
        self._pin = pin_memory and ctx.device.type == "cuda"
        self.collate_fn = _collate_of(dataloader_kwargs)
        # In-memory tensors, nothing to run per sample: one indexed read per tensor gives the batch the
        # DataLoader would build row by row and stack (same values, same list), in half the time. It
        # still goes through the DataLoader, so everything that watches one (ddpkit check) sees it.
        self._gather = (type(dataset) is torch.utils.data.TensorDataset and not self._pin
                        and not dataloader_kwargs.get("num_workers") and "collate_fn" not in dataloader_kwargs)
        if self._gather:
            dataloader_kwargs = {**dataloader_kwargs, "collate_fn": _the_batch}
        if self._pin:
            dataloader_kwargs = {**dataloader_kwargs, "collate_fn": HostPinnedCollate(dataloader_kwargs.get("collate_fn"))}
        # A private generator: DataLoader draws a base seed from the global torch generator each
        # time a loop starts, so a run resumed mid-epoch (one extra loop start) would otherwise get
        # different dropout than the uninterrupted run. Worker seeds come from WorkerSeeder anyway.
        workers = bool(dataloader_kwargs.get("num_workers"))
        sampler.tag_batches = workers
        dataloader_kwargs = {**dataloader_kwargs,
                             "worker_init_fn": WorkerSeeder(ctx.seed, ctx.rank, sampler,
                                                             dataloader_kwargs.get("worker_init_fn"))}
        if self._gather:
            fetched = _GatheredTensors(dataset)
        elif workers:
            fetched = SeededFetch(dataset, sampler.seed, ctx.rank)
        else:
            fetched = dataset
        self._loader = torch.utils.data.DataLoader(
            fetched, batch_sampler=sampler, pin_memory=self._pin,
            generator=torch.Generator().manual_seed(ctx.seed), **dataloader_kwargs,
        )

    @property
    def epoch(self) -> int:
        """The epoch being iterated (or last iterated)."""
        return self.sampler.epoch

    @property
    def global_batch_size(self) -> int:
        return self.sampler.global_batch_size

    @property
    def batch_size(self) -> int:
        """Samples per batch this rank yields (per micro-step): the `batch_size` given to ddpkit.loader."""
        return self.sampler.batch_size

    @property
    def drop_last(self) -> bool:
        return self.sampler.drop_last

    @property
    def num_workers(self) -> int:
        return self._loader.num_workers

    @property
    def pin_memory(self) -> bool:
        return self._pin

    def __getattr__(self, name: str) -> Any:
        raise _no_attribute(self, name)

    @property
    def accumulation_steps(self) -> int:
        return self.sampler.accumulation_steps

    @property
    def steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch

    def __len__(self) -> int:
        """Micro-batches this rank yields in a whole epoch."""
        return self.sampler.steps_per_epoch * self.sampler.accumulation_steps

    def set_epoch(self, epoch: int) -> None:
        """Make the next loop iterate `epoch` from its start (optional: epochs advance by themselves)."""
        self._epoch, self._step, self._micro = int(epoch), 0, 0

    def _position(self) -> tuple[int, int]:
        if self._step >= self.sampler.steps_per_epoch:
            return self._epoch + 1, 0
        return self._epoch, self._step

    def __iter__(self) -> Iterator[Any]:
        return profiled_batches(self.ctx, self._batches(), self.accumulation_steps,
                                num_workers=self._loader.num_workers, pinned=self._pin)

    def _batches(self) -> Iterator[Any]:
        s = self.sampler
        self._epoch, self._step = self._position()
        s.epoch, s.start_step = self._epoch, self._step
        self._micro = 0
        if self.ctx.should_stop():
            return
        for batch in self._loader:
            self._micro += 1
            self.step_end = self._micro == s.accumulation_steps
            if self.step_end:
                self._micro, self._step = 0, self._step + 1
            yield to_device(unwrap_host_batch(batch), self.ctx.device, non_blocking=self._pin)
            # A step boundary every rank reaches at the same step: a preemption signal caught by any
            # rank ends every rank's loop here, mid-epoch, with the position of the step just done.
            if self.step_end and self.ctx.should_stop():
                return
        self._epoch, self._step = s.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        """The position after the last completed optimizer step: save when `step_end` is True."""
        if self._micro:
            raise ValueError(
                f"loader.state_dict() called after micro-step {self._micro} of {self.sampler.accumulation_steps}; "
                "save checkpoints when loader.step_end is True"
            )
        epoch, step = self._position()
        return {"epoch": epoch, "samples_seen": step * self.sampler.global_batch_size, "seed": self.sampler.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from `state` (from any world size with the same global batch size and seed)."""
        s = self.sampler
        if int(state["seed"]) != s.seed:
            raise ValueError(
                f"checkpoint's data seed {state['seed']} differs from this loader's seed {s.seed}; "
                "build the loader with the seed the run started with"
            )
        seen = int(state["samples_seen"])
        if seen % s.global_batch_size:
            raise ValueError(
                f"checkpoint position {seen} samples is not a multiple of the global batch "
                f"{s.global_batch_size}; keep batch_size * world_size * accumulation_steps as in the saved run"
            )
        self._epoch, self._step, self._micro = int(state["epoch"]), seen // s.global_batch_size, 0


class _GatheredTensors:
    """A TensorDataset whose batches the DataLoader fetches with one indexed read per tensor
    (`__getitems__`), as a one-element list that `_the_batch` unwraps instead of collating."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[list[Any]]:
        import torch

        index = torch.tensor(indices, dtype=torch.long)
        return [[t[index] for t in self.dataset.tensors]]


def _the_batch(items: list[Any]) -> Any:
    return items[0]


def loader(dataset: Any, ctx: Context, *, batch_size: int, shuffle: bool = True, seed: int | None = None,
           accumulation_steps: int = 1, drop_last: bool = True, num_workers: int = 0, pin_memory: bool = True,
           **dataloader_kwargs: Any) -> DistributedLoader:
    """A training loader: this rank's disjoint shard, a new order every epoch, batches on the device.

    Args:
        batch_size: samples per rank per micro-step. The global batch of one optimizer step is
            batch_size * world_size * accumulation_steps.
        shuffle: a new permutation of the whole dataset every epoch, from (seed, epoch).
        seed: data-order seed, the same on every rank; default ctx.seed.
        accumulation_steps: micro-steps per optimizer step (see `loader.step_end`, `ddpkit.accumulate`).
        drop_last: True drops the final incomplete global batch, so every rank runs the same number
            of equal steps; False pads it with samples from the epoch's start (a few samples are seen
            twice, as with DistributedSampler).
        pin_memory: on a CUDA device, copy CPU batches through pinned memory, asynchronously
            (tensors already on the GPU are never pinned); False copies them as they are. No effect on CPU.
        num_workers, **dataloader_kwargs: passed to torch.utils.data.DataLoader (collate_fn,
            persistent_workers, prefetch_factor, worker_init_fn, ...). Sampling options are ddpkit's
            own. Workers persist by default, and seed python's, numpy's and torch's generators before
            each batch from (seed, rank, epoch, step, micro-step): random augmentation drawn in them
            is the same with 1 worker or 8, persistent or not, and after a resume. A worker_init_fn
            of yours runs once per worker, after ddpkit's own seeding.
    """
    import torch

    if isinstance(dataset, torch.utils.data.DataLoader):
        raise TypeError("ddpkit.loader needs a Dataset, got a DataLoader; pass loader.dataset and the batch size")
    if isinstance(dataset, torch.utils.data.IterableDataset):
        raise TypeError("ddpkit.loader shards by index and needs a map-style Dataset (with __len__ and __getitem__)")
    for name in _DATALOADER_OWNED:
        if name in dataloader_kwargs:
            raise TypeError(
                f"ddpkit.loader got {name}=: ddpkit shards and orders the data itself (a sampler beside "
                f"shuffle would contradict it); remove {name}= and use shuffle=/seed="
            )
    if not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory={pin_memory!r} must be True or False")
    for name, value in (("batch_size", batch_size), ("accumulation_steps", accumulation_steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            hint = ("; a script from `ddpkit port` passes its original batch divided by the world size "
                    "(B // ctx.world_size), which is 0 when B < world_size: launch at most B ranks or raise B"
                    if name == "batch_size" and value == 0 else "")
            raise ValueError(f"{name}={value!r} must be a positive int{hint}")
    for name, value in (("shuffle", shuffle), ("drop_last", drop_last)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}={value!r} must be True or False")
    if seed is not None:
        from ddpkit.rng import check_seed

        seed = check_seed(seed, "ddpkit.loader (the data-order seed; None means ctx.seed)")
    num_samples = len(dataset)
    sampler = ShardedBatchSampler(
        num_samples, batch_size=batch_size, rank=ctx.rank, world_size=ctx.world_size,
        accumulation_steps=accumulation_steps, shuffle=shuffle, seed=ctx.seed if seed is None else seed,
        drop_last=drop_last,
    )
    if sampler.steps_per_epoch == 0:
        raise ValueError(
            f"dataset has {num_samples} samples, fewer than one global batch of {sampler.global_batch_size} "
            f"(batch_size {batch_size} x world_size {ctx.world_size} x accumulation_steps {accumulation_steps}); "
            "lower batch_size or pass drop_last=False"
        )
    if num_workers > 0:
        dataloader_kwargs.setdefault("persistent_workers", True)
    return DistributedLoader(dataset, ctx, sampler, {"num_workers": num_workers, **dataloader_kwargs}, pin_memory)


def eval_shard(num_samples: int, *, rank: int, world_size: int, batch_size: int = 1) -> range:
    """Rank's contiguous, unpadded slice of an eval set, made of whole batches of `batch_size` as one process would
    batch the set in order: shards differ by at most one batch, none repeats, and together they cover the set.

    Whole batches keep every batch exactly as one process forms it: a metric that reads positions within a batch
    (`item[0]` of a batch that is one user's group) or averages batch means sees the same batches at any world
    size. `batch_size=1` cuts by samples (sizes differ by at most one sample)."""
    num_batches = -(-num_samples // batch_size)
    start, stop = rank * num_batches // world_size, (rank + 1) * num_batches // world_size
    return range(min(start * batch_size, num_samples), min(stop * batch_size, num_samples))


class EvalLoader:
    """This rank's unpadded eval shard of whole batches (`eval_shard`), in dataset order, on its device.

    Unlike DistributedSampler nothing is padded, so sums and counts reduced across ranks give
    exactly the single-process metrics, and every batch is the one a single process would form
    (only the set's last batch is short). Shards may differ in length by one batch: evaluate the
    unwrapped model (`ddpkit.unwrap(model)`) under `torch.no_grad()` and call collectives only
    after the loop, so no rank waits on a peer that has already finished. `indices` lists the
    dataset indices of this shard in the order batches come (for `ddpkit.gather_in_order`).

    Of torch DataLoader's attributes it answers `batch_size` (per rank), `dataset`, `sampler` (this
    shard's dataset indices, as `indices`), `num_workers`, `drop_last` (False: nothing is dropped),
    `collate_fn` and `pin_memory`; any other name raises an AttributeError that names the loader.
    """

    def __init__(self, dataset: Any, ctx: Context, batch_size: int, dataloader_kwargs: dict, pin_memory: bool = True):
        import torch

        self.ctx = ctx
        self.dataset = dataset
        """The whole dataset (every rank's shard): `correct / len(loader.dataset)` after a reduction is exact."""
        self.indices = eval_shard(len(dataset), rank=ctx.rank, world_size=ctx.world_size, batch_size=batch_size)
        self._pin = pin_memory and ctx.device.type == "cuda"
        self.batch_size = batch_size
        """Samples per batch on this rank (the last may be smaller)."""
        self.collate_fn = _collate_of(dataloader_kwargs)
        self.drop_last = False
        if self._pin:
            dataloader_kwargs = {**dataloader_kwargs, "collate_fn": HostPinnedCollate(dataloader_kwargs.get("collate_fn"))}
        self._loader = torch.utils.data.DataLoader(
            torch.utils.data.Subset(dataset, self.indices), batch_size=batch_size, shuffle=False,
            pin_memory=self._pin, generator=torch.Generator().manual_seed(ctx.seed), **dataloader_kwargs,
        )

    @property
    def sampler(self) -> range:
        return self.indices

    @property
    def num_workers(self) -> int:
        return self._loader.num_workers

    @property
    def pin_memory(self) -> bool:
        return self._pin

    def __getattr__(self, name: str) -> Any:
        raise _no_attribute(self, name)

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        import torch

        if self.ctx.distributed and torch.is_grad_enabled():
            import warnings

            warnings.warn(
                "ddpkit.eval_loader iterated with gradients enabled: shards may differ by a batch, and a DDP model "
                "run with gradients synchronises with its peers on every forward, so the rank with fewer batches "
                "leaves the others waiting until the timeout; evaluate under torch.no_grad() (or ddpkit.unwrap(model))",
                stacklevel=2)
        for batch in self._loader:
            yield to_device(unwrap_host_batch(batch), self.ctx.device, non_blocking=self._pin)


def eval_loader(dataset: Any, ctx: Context, *, batch_size: int, pin_memory: bool = True,
                **dataloader_kwargs: Any) -> EvalLoader:
    """An evaluation loader over an exact, duplicate-free shard (see EvalLoader); `pin_memory` as in `loader`."""
    import torch

    if isinstance(dataset, (torch.utils.data.DataLoader, torch.utils.data.IterableDataset)):
        raise TypeError("ddpkit.eval_loader needs a map-style Dataset (with __len__ and __getitem__)")
    # A private generator (above): evaluating more or less often must not shift training's RNG streams.
    for name in ("sampler", "batch_sampler", "shuffle", "drop_last", "generator"):
        if name in dataloader_kwargs:
            raise TypeError(f"ddpkit.eval_loader got {name}=: evaluation shards are fixed, ordered and unpadded; remove it")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive int")
    if not isinstance(pin_memory, bool):
        raise TypeError(f"pin_memory={pin_memory!r} must be True or False")
    return EvalLoader(dataset, ctx, batch_size, dataloader_kwargs, pin_memory)
