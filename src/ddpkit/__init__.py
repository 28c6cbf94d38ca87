"""ddpkit: correct, fast DistributedDataParallel training from a single-device PyTorch script.

Importing ddpkit imports nothing heavy and touches no device: names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ddpkit.version import __version__

_EXPORTS = {
    "init": "ddpkit.runtime",
    "Context": "ddpkit.runtime",
    "rank_seed": "ddpkit.rng",
    "LaunchEnv": "ddpkit.env",
    "read_env": "ddpkit.env",
    "wrap": "ddpkit.parallel",
    "unwrap": "ddpkit.parallel",
    "accumulate": "ddpkit.parallel",
    "loader": "ddpkit.data",
    "eval_loader": "ddpkit.data",
    "eval_shard": "ddpkit.data",
    "EvalLoader": "ddpkit.data",
    "param_sha256": "ddpkit.parallel",
    "DistributedLoader": "ddpkit.data",
    "to_device": "ddpkit.transfer",
    "all_reduce_sum": "ddpkit.collectives",
    "reduce_mean": "ddpkit.collectives",
    "reduce_means": "ddpkit.collectives",
    "all_gather_object": "ddpkit.collectives",
    "broadcast_object": "ddpkit.collectives",
    "gather_in_order": "ddpkit.collectives",
    "barrier": "ddpkit.collectives",
    "MetricsLog": "ddpkit.metrics",
    "ProgressBar": "ddpkit.metrics",
    "print0": "ddpkit.metrics",
    "finish_run": "ddpkit.plot",
    "rank_logger": "ddpkit.metrics",
    "read_metrics": "ddpkit.metrics",
    "save_checkpoint": "ddpkit.checkpoint",
    "load_checkpoint": "ddpkit.checkpoint",
    "latest_checkpoint": "ddpkit.checkpoint",
    "verify_checkpoint": "ddpkit.checkpoint",
    "export_state_dict": "ddpkit.ckptshards",
    "is_sharded": "ddpkit.fsdp",
    "CheckpointError": "ddpkit.checkpoint",
    "CheckpointWarning": "ddpkit.checkpoint",
    "Precision": "ddpkit.precision",
    "StepInfo": "ddpkit.precision",
    "launch": "ddpkit.spawn",
    "RankFailedError": "ddpkit.spawn",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ddpkit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
