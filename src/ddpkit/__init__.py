"""ddpkit: correct, fast DistributedDataParallel training from a single-device PyTorch script.

The package face holds what a training loop needs (docs/api.md lists each name); everything else
is imported from the module that defines it (docs/architecture.md says which module holds what).
Importing ddpkit imports nothing heavy and touches no device: names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from ddpkit.version import __version__

_EXPORTS = {
    "init": "ddpkit.runtime",
    "Context": "ddpkit.runtime",
    "wrap": "ddpkit.parallel.api",
    "unwrap": "ddpkit.parallel.strategy",
    "accumulate": "ddpkit.parallel.api",
    "param_sha256": "ddpkit.parallel.api",
    "loader": "ddpkit.data",
    "eval_loader": "ddpkit.data",
    "reduce_mean": "ddpkit.collectives",
    "reduce_means": "ddpkit.collectives",
    "all_reduce_sum": "ddpkit.collectives",
    "gather_in_order": "ddpkit.collectives",
    "gather_list": "ddpkit.collectives",
    "barrier": "ddpkit.collectives",
    "print0": "ddpkit.metrics.log",
    "MetricsLog": "ddpkit.metrics.log",
    "Precision": "ddpkit.precision",
    "save_checkpoint": "ddpkit.checkpoint.api",
    "load_checkpoint": "ddpkit.checkpoint.api",
    "launch": "ddpkit.run.spawn",
}

_ELSEWHERE = {
    "rank_seed": "ddpkit.rng", "LaunchEnv": "ddpkit.env", "read_env": "ddpkit.env",
    "eval_shard": "ddpkit.data", "EvalLoader": "ddpkit.data", "DistributedLoader": "ddpkit.data",
    "to_device": "ddpkit.device", "all_gather_object": "ddpkit.collectives", "all_reduce_number": "ddpkit.collectives", "broadcast_object": "ddpkit.collectives",
    "ProgressBar": "ddpkit.metrics.log", "rank_logger": "ddpkit.metrics.log", "read_metrics": "ddpkit.metrics.log",
    "finish_run": "ddpkit.metrics.plot", "latest_checkpoint": "ddpkit.checkpoint.api",
    "verify_checkpoint": "ddpkit.checkpoint.api", "CheckpointError": "ddpkit.checkpoint.api",
    "CheckpointWarning": "ddpkit.checkpoint.api", "export_state_dict": "ddpkit.checkpoint.sharded",
    "is_sharded": "ddpkit.parallel.strategy", "StepInfo": "ddpkit.precision", "RankFailedError": "ddpkit.run.spawn",
}
"""Public names that live in their modules only (before 0.x's move they were on the face): the error says where."""

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        where = _ELSEWHERE.get(name)
        hint = f"; import it from its module: from {where} import {name}" if where else ""
        raise AttributeError(f"module 'ddpkit' has no attribute {name!r}{hint}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
