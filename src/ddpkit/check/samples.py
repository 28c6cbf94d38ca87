"""Name the sample behind a DataLoader index for `ddpkit check`: unwrap Subset/ConcatDataset, fingerprint datasets.

Two ranks train on the same sample only when they read the same index of the same data. A loader's
index says neither on its own: `Subset(ds, range(r * 128, (r + 1) * 128))` maps index 0 to a
different row on each rank, and ranks that each load their own pre-sharded file share indices but
not data. `source` resolves an index to (underlying dataset, its index); `fingerprint` describes
that dataset's content so that the parent can compare datasets across ranks.
"""

from __future__ import annotations

import bisect
import hashlib
from typing import Any

__all__ = ["source", "fingerprint", "same_data"]

_SEED = 0x5EED
"""The seed every rank's generators get while a sample is fetched for a fingerprint."""


def source(dataset: Any, index: int) -> tuple[Any, int]:
    """(the dataset that holds the sample, its index there) for `dataset[index]`, through nested
    Subset and ConcatDataset; any other dataset (or an index those cannot resolve) is returned as is."""
    from torch.utils.data import ConcatDataset, Subset

    for _ in range(64):  # nesting depth; a cycle would be a bug in the user's wrappers
        try:
            if isinstance(dataset, Subset):
                dataset, index = dataset.dataset, int(dataset.indices[index])
            elif isinstance(dataset, ConcatDataset):
                sizes = dataset.cumulative_sizes
                if index < 0:
                    index += len(dataset)
                part = bisect.bisect_right(sizes, index)
                dataset, index = dataset.datasets[part], index - (sizes[part - 1] if part else 0)
            else:
                break
        except (IndexError, TypeError, ValueError):
            break
    return dataset, index


def fingerprint(dataset: Any) -> dict[str, Any]:
    """{type, len, hash}: equal for datasets with the same content on two ranks, different (with
    high probability) when their content differs; `len`/`hash` are None when they cannot be known.

    The hash covers the first, middle and last samples. Random augmentation in `__getitem__` must
    not make two ranks' copies of one dataset look different (each rank's generators are seeded
    differently), so every sample is fetched with python's, numpy's and torch's global generators
    set to one fixed seed, and the caller's generator states are restored afterwards: the script's
    random streams are left exactly as they were. Each sample is fetched twice; if the two fetches
    differ, the dataset draws from state of its own (its own generator, a counter), so its content
    cannot be compared and `hash` is None, which makes the check fall back to comparing indices
    only (it may then report overlap for ranks that hold different data: the conservative side).
    """
    out: dict[str, Any] = {"type": f"{type(dataset).__module__}.{type(dataset).__qualname__}", "len": None,
                           "hash": None}
    try:
        n = len(dataset)
    except Exception:  # no __len__ (an iterable dataset): nothing to compare
        return out
    out["len"] = n
    h = hashlib.sha256(f"{out['type']}:{n}".encode())
    for index in sorted({0, n // 2, n - 1}) if n else []:
        first, second = _fetch_hash(dataset, index), _fetch_hash(dataset, index)
        if first is None or first != second:
            return out
        h.update(first.encode())
    out["hash"] = h.hexdigest()[:16]
    return out


def same_data(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two fingerprints may describe the same data (unknown counts as the same)."""
    if a is None or b is None:
        return True
    if a["type"] != b["type"] or a["len"] != b["len"]:
        return False
    return a["hash"] is None or b["hash"] is None or a["hash"] == b["hash"]


def _fetch_hash(dataset: Any, index: int) -> str | None:
    from ddpkit.rng import rng_state, seed_everything, set_rng_state

    saved = rng_state()
    try:
        seed_everything(_SEED)
        h = hashlib.sha256()
        return h.hexdigest() if _update(h, dataset[index]) else None
    except Exception:  # a dataset that cannot be read here (closed file, needs a worker): unknown
        return None
    finally:
        set_rng_state(saved)


def _update(h, value: Any) -> bool:
    """Feed `value` into `h`; False for a value whose content cannot be hashed reliably."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        return True
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        h.update(f"{type(value).__name__}:{value!r};".encode())
        return True
    if isinstance(value, dict):
        h.update(f"D{len(value)}".encode())
        return all(_update(h, k) and _update(h, v) for k, v in sorted(value.items(), key=lambda kv: repr(kv[0])))
    if isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}".encode())
        return all(_update(h, v) for v in value)
    tobytes = getattr(value, "tobytes", None)  # numpy arrays and scalars, PIL images
    if callable(tobytes):
        h.update(f"B{type(value).__name__}{getattr(value, 'dtype', '')}{getattr(value, 'shape', '')}"
                 f"{getattr(value, 'size', '')}{getattr(value, 'mode', '')}".encode())
        h.update(tobytes())
        return True
    return False
