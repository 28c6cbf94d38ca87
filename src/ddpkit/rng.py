"""Every seed ddpkit derives, the seeding of a process's generators, and their checkpointable state.

Seeds are derived from the job's base seed with numpy's SeedSequence (one 32-bit word): each
purpose has its own function below, so every key layout is in this one place. The captured state
(`rng_state`) holds only tensors and plain python values, so a checkpoint that carries it loads
with `torch.load(weights_only=True)`: numpy's key array becomes an int64 tensor and python's state
stays a tuple of ints.

Loader workers seed python's, numpy's and torch's generators once per worker and before every
batch from the batch's place in the run (`SeededBatch`, `SeededFetch`, `WorkerSeeder`), so what a
worker draws depends on that place only.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_SEED", "check_seed", "rank_seed", "resumed_rank_seed", "epoch_seed", "batch_seed", "worker_seed",
           "seed_everything", "rng_state", "set_rng_state",
           "SeededBatch", "SeededFetch", "WorkerSeeder"]

_FORMAT = 1
MAX_SEED = 2**64 - 1
"""The largest base seed: numpy's SeedSequence takes no negative seeds, torch's generators no wider ones."""


def check_seed(seed: object, setting: str = "ddpkit.init") -> int:
    """`seed` as an int, or a one-line TypeError/ValueError naming `setting`, the value, the rule and a fix."""
    import operator

    try:
        value = operator.index(seed) if not isinstance(seed, bool) else None  # type: ignore[call-overload, arg-type, unused-ignore]
    except TypeError:
        value = None
    if value is None:
        raise TypeError(f"{setting}: seed={seed!r} ({type(seed).__name__}) must be an int from 0 to 2**64 - 1, "
                        "e.g. seed=0")
    if not 0 <= value <= MAX_SEED:
        raise ValueError(f"{setting}: seed={value} is out of range; a seed is an int from 0 to 2**64 - 1 (numpy's "
                         "SeedSequence takes no negative seeds, torch's generators no wider ones), e.g. seed=0")
    return value


def _derive(*keys: int) -> int:
    import numpy as np

    return int(np.random.SeedSequence(list(keys)).generate_state(1)[0])


def rank_seed(seed: int, rank: int) -> int:
    """The seed of one rank's python/numpy/torch generators: SeedSequence([seed, rank]) -> 32 bits.

    Ranks get different streams (different dropout and augmentation per rank, which is what
    data parallelism needs), a fixed `seed` reproduces every rank's stream, and unlike
    `seed + rank` two runs with neighbouring seeds never share a rank's stream.
    """
    return _derive(seed, rank)


def resumed_rank_seed(seed: int, rank: int, step: int) -> int:
    """Seed for a rank that did not exist when the checkpoint was written (the world size grew).

    SeedSequence([seed, rank, step, 1]): reproducible for a given run, distinct from every rank's
    `rank_seed(seed, rank)` stream and from the other new ranks.
    """
    return _derive(seed, rank, step, 1)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of one epoch's global data order (the same on every rank): SeedSequence([seed, epoch])."""
    return _derive(seed, epoch)


def batch_seed(seed: int, rank: int, epoch: int, step: int, micro_step: int) -> int:
    """The seed a loader worker uses for one batch, from the batch's place in the run only."""
    return _derive(seed, rank, epoch, step, micro_step)


def worker_seed(seed: int, rank: int, epoch: int, worker_id: int) -> int:
    """The seed of one loader worker at its start, for what it draws outside a batch."""
    return _derive(seed, rank, epoch, worker_id)


def seed_everything(seed: int) -> None:
    """Seed python's `random`, numpy's global generator and torch (CPU and every CUDA device)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device, lazily


def rng_state(device: torch.device | str | None = None) -> dict[str, Any]:
    """This process's generator states: python `random`, numpy's global generator, torch's CPU
    generator and, when `device` is a CUDA device, that device's generator.

    Not a collective. Every value is a CPU tensor or a plain python value.
    """
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "format": _FORMAT,
        "python": random.getstate(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state(device).cpu()
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | str | None = None) -> None:
    """Restore what `rng_state` captured. Not a collective.

    A state captured without CUDA restored on a CUDA device leaves that device's generator as it
    is (it was seeded by `ddpkit.init`).
    """
    import numpy as np
    import torch

    if state.get("format") != _FORMAT:
        raise ValueError(
            f"RNG state format {state.get('format')!r} is not {_FORMAT}; the checkpoint was written by a "
            "different ddpkit version, load it with that version or without RNG states"
        )
    version, internal, gauss_next = state["python"]
    random.setstate((int(version), tuple(int(v) for v in internal), gauss_next))
    np_state = state["numpy"]
    np.random.set_state((
        np_state["kind"],
        np_state["keys"].cpu().numpy().astype(np.uint32),
        int(np_state["pos"]),
        int(np_state["has_gauss"]),
        float(np_state["cached_gaussian"]),
    ))
    torch.set_rng_state(state["torch"].cpu().to(torch.uint8))
    device = torch.device(device) if device is not None else None
    if "cuda" in state and device is not None and device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].cpu().to(torch.uint8), device)


class SeededBatch(list[int]):
    """A batch of dataset indices that carries its place, (epoch, optimizer step, micro-step), to the
    loader worker that fetches it; the worker seeds its random streams from it (see `SeededFetch`)."""

    def __init__(self, indices: list[int], key: tuple[int, int, int]) -> None:
        super().__init__(indices)
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:  # sent to the workers through a pickle
        return SeededBatch, (list(self), self.key)


class SeededFetch:
    """The dataset as loader workers see it: before fetching a batch, the worker seeds python's,
    numpy's and torch's generators from (data seed, rank, epoch, step, micro-step).

    So what a worker draws for a batch (random augmentation) depends on the batch's place only: not
    on which worker fetches it, how many workers there are, whether they persist, or whether the run
    was resumed. One seeding per batch costs about 0.1 ms, in the worker.
    """

    def __init__(self, dataset: Any, seed: int, rank: int) -> None:
        self.dataset, self.seed, self.rank = dataset, seed, rank

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        key = getattr(indices, "key", None)
        if key is not None:
            seed_everything(batch_seed(self.seed, self.rank, *key))
        fetch = getattr(self.dataset, "__getitems__", None)
        return fetch(list(indices)) if fetch else [self.dataset[i] for i in indices]


class WorkerSeeder:
    """Seed each data-loader worker from (seed, rank, epoch, worker id), then run the user's
    worker_init_fn if there is one. Batches reseed anyway (`SeededFetch`); this covers what a
    worker draws outside them."""

    def __init__(self, seed: int, rank: int, sampler: Any, user: Any = None):
        self.seed, self.rank, self.sampler, self.user = seed, rank, sampler, user

    def __call__(self, worker_id: int) -> None:
        seed_everything(worker_seed(self.seed, self.rank, self.sampler.epoch, worker_id))
        if self.user is not None:
            self.user(worker_id)
