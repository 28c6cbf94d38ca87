"""Capture and restore a rank's random generators (python, numpy, torch, CUDA) as checkpointable plain data.

The captured state holds only tensors and plain python values, so a checkpoint that carries it
loads with `torch.load(weights_only=True)`: numpy's key array becomes an int64 tensor and python's
state stays a tuple of ints.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["rng_state", "set_rng_state", "resumed_rank_seed"]

_FORMAT = 1


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


def resumed_rank_seed(seed: int, rank: int, step: int) -> int:
    """Seed for a rank that did not exist when the checkpoint was written (the world size grew).

    SeedSequence([seed, rank, step, 1]): reproducible for a given run, distinct from every rank's
    `ddpkit.rank_seed(seed, rank)` stream and from the other new ranks.
    """
    import numpy as np

    return int(np.random.SeedSequence([seed, rank, step, 1]).generate_state(1)[0])
