"""Experiment trackers for MetricsLog: TensorBoard, Weights & Biases, MLflow, behind one small sink protocol."""

from __future__ import annotations

import importlib.util
import uuid
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["TRACKERS", "Sink", "TrackerError", "check_trackers", "numeric", "open_sinks"]

Scalar = bool | int | float | str | None


class TrackerError(ValueError):
    """A tracker that cannot be used here; the message names the fix."""


class Sink(Protocol):
    """Where MetricsLog sends each line besides metrics.jsonl (rank 0 only)."""

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """Record the numeric `values` of one MetricsLog line at optimizer step `step`."""

    def close(self) -> None:
        """Flush and release everything (called once)."""


TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install 'ddpkit[tensorboard]' (or pip install tensorboard)"),
    "wandb": ("wandb", "pip install wandb"),
    "mlflow": ("mlflow", "pip install mlflow-skinny (or mlflow)"),
}
"""Tracker name -> (the module it needs, the command that installs it)."""


def check_trackers(trackers: Iterable[str]) -> tuple[str, ...]:
    """Validate tracker names and that their packages are installed (every rank runs it, so all fail alike)."""
    if isinstance(trackers, str):
        raise TypeError(f"trackers={trackers!r} must be a list or tuple of names, e.g. trackers=({trackers!r},)")
    names = tuple(trackers)
    for name in names:
        if name not in TRACKERS:
            raise TrackerError(f"trackers: {name!r} is not a tracker ddpkit knows; choose from {sorted(TRACKERS)}")
        module, install = TRACKERS[name]
        if importlib.util.find_spec(module) is None:
            raise TrackerError(f"trackers: {name!r} needs the {module} package, which is not installed; {install}")
    if len(set(names)) != len(names):
        raise TrackerError(f"trackers={names!r} names a tracker twice; list each once")
    return names


def open_sinks(trackers: Iterable[str], run_dir: Path, *, resume: bool) -> list[Sink]:
    """Open one sink per tracker name (rank 0 only; names already checked by `check_trackers`)."""
    openers: dict[str, Callable[..., Sink]] = {"tensorboard": TensorBoardSink, "wandb": WandbSink,
                                               "mlflow": MLflowSink}
    sinks: list[Sink] = []
    try:
        for name in trackers:
            sinks.append(openers[name](run_dir, resume=resume))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks


def numeric(values: Mapping[str, Scalar]) -> dict[str, float]:
    """The values a tracker can plot: numbers (bools as 0/1), not strings or None."""
    return {key: float(value) for key, value in values.items() if isinstance(value, (int, float))}


class TensorBoardSink:
    """Scalars in `run_dir/tensorboard`, through torch.utils.tensorboard's SummaryWriter."""

    def __init__(self, run_dir: Path, *, resume: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # A resumed run writes a new event file in the same directory; TensorBoard merges them by step.
        self.log_dir = run_dir / "tensorboard"
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def write(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A Weights & Biases run whose files live in `run_dir/wandb`.

    wandb's own settings apply (WANDB_PROJECT, WANDB_MODE=offline, WANDB_API_KEY, ...): ddpkit chooses
    only the directory, and resumes the same run id (kept in `run_dir/wandb-run-id`) when resume=True.
    """

    def __init__(self, run_dir: Path, *, resume: bool) -> None:
        import wandb

        id_file = run_dir / "wandb-run-id"
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        run_id = run_id or uuid.uuid4().hex[:8]
        id_file.write_text(run_id + "\n")
        (run_dir / "wandb").mkdir(exist_ok=True)
        self._run = wandb.init(dir=str(run_dir), id=run_id, resume="allow" if resume else None,
                               name=run_dir.name, reinit="create_new")

    def write(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def close(self) -> None:
        self._run.finish()


class MLflowSink:
    """An MLflow run in the store MLFLOW_TRACKING_URI names, else in a file store `run_dir/mlruns`.

    MLflow 3 refuses new file stores unless MLFLOW_ALLOW_FILE_STORE=true; set that, or point
    MLFLOW_TRACKING_URI at a server or a database (sqlite:///mlflow.db needs sqlalchemy). The
    experiment is MLFLOW_EXPERIMENT_NAME, else the run directory's name; resume=True continues the
    run whose id is kept in `run_dir/mlflow-run-id`.
    """

    def __init__(self, run_dir: Path, *, resume: bool) -> None:
        import os

        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        try:
            self._client = MlflowClient(tracking_uri=uri)
        except MlflowException as e:
            if "MLFLOW_ALLOW_FILE_STORE" not in str(e):
                raise
            raise TrackerError(
                f"trackers: 'mlflow' would write a file store at {uri}, which this MLflow refuses by default; "
                "set MLFLOW_ALLOW_FILE_STORE=true, or MLFLOW_TRACKING_URI to your server or database"
            ) from None
        id_file = run_dir / "mlflow-run-id"
        run_id = id_file.read_text().strip() if resume and id_file.is_file() else None
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or run_dir.resolve().name
            experiment = self._client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self._client.create_experiment(name)
            run_id = self._client.create_run(experiment_id, run_name=run_dir.resolve().name).info.run_id
            id_file.write_text(run_id + "\n")
        self.run_id = run_id
        self.tracking_uri = uri

    def write(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in values.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)
