"""MetricsLog's trackers: TensorBoard, wandb (offline) and MLflow (file store) read back with their own readers."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from ddpkit.metrics.log import MetricsLog, read_metrics
from ddpkit.metrics.trackers import TrackerError, check_trackers

MAIN = types.SimpleNamespace(is_main=True)
OTHER = types.SimpleNamespace(is_main=False)


def _log_three(run_dir: Path, trackers: tuple[str, ...], ctx=MAIN, *, resume: bool = False, first: int = 0) -> None:
    with MetricsLog(run_dir, ctx, trackers=trackers, resume=resume) as log:
        for i in range(first, first + 3):
            log.log(step=10 * i, epoch=i, loss=1.0 / (i + 1), note="text is kept out of trackers", flag=True)


def test_tensorboard_scalars_read_back_with_tensorboards_reader(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _log_three(tmp_path, ("tensorboard",))
    _log_three(tmp_path, ("tensorboard",), resume=True, first=3)  # a resumed run adds to the same directory
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["epoch", "flag", "loss"]
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == [0, 10, 20, 30, 40, 50]
    assert [round(e.value, 6) for e in loss] == [round(1.0 / (i + 1), 6) for i in range(6)]
    # the JSONL log is unchanged by the tracker
    assert [r["loss"] for r in read_metrics(tmp_path)] == [1.0 / (i + 1) for i in range(6)]
    assert read_metrics(tmp_path)[0]["note"] == "text is kept out of trackers"


def test_other_ranks_write_nothing(tmp_path: Path) -> None:
    _log_three(tmp_path / "run", ("tensorboard",), ctx=OTHER)
    assert not (tmp_path / "run").exists()


def test_bad_names_and_missing_packages_are_one_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TrackerError, match=r"'tensorbord' is not a tracker ddpkit knows; choose from"):
        check_trackers(["tensorbord"])
    with pytest.raises(TypeError, match=r"must be a list or tuple of names, e.g. trackers=\('wandb',\)"):
        check_trackers("wandb")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(TrackerError) as info:
        MetricsLog("unused", OTHER, trackers=("tensorboard",))  # every rank checks, so all fail alike
    assert "pip install 'ddpkit[tensorboard]'" in str(info.value) and "\n" not in str(info.value)


def _wandb_records(path: Path):
    """The records of a .wandb file: LevelDB log blocks of wandb's own protobuf Records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_history_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # offline: nothing leaves the machine; no code/git capture, no console wrapping, no stats thread
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                       "WANDB_DISABLE_CODE": "true", "WANDB_DISABLE_GIT": "true", "WANDB__DISABLE_STATS": "true",
                       "WANDB_PROJECT": "ddpkit-test"}.items():
        monkeypatch.setenv(key, value)
    import wandb

    try:
        _log_three(tmp_path, ("wandb",))
    finally:
        wandb.teardown()  # its service process, which would otherwise outlive the test
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    history = [r.history for r in _wandb_records(runs[0]) if r.WhichOneof("record_type") == "history"]
    rows = [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in h.item} for h in history]
    assert [(row["_step"], row["loss"], row["epoch"]) for row in rows] == [(0, 1.0, 0), (10, 0.5, 1), (20, 1 / 3, 2)]
    assert all("note" not in row for row in rows)
    assert (tmp_path / "wandb-run-id").read_text().strip() in runs[0].name


def test_mlflow_file_store_read_back_with_mlflows_client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    with pytest.raises(TrackerError, match="set MLFLOW_ALLOW_FILE_STORE=true, or MLFLOW_TRACKING_URI"):
        _log_three(tmp_path / "refused", ("mlflow",))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    _log_three(tmp_path, ("mlflow",))
    _log_three(tmp_path, ("mlflow",), resume=True, first=3)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    run_id = (tmp_path / "mlflow-run-id").read_text().strip()
    loss = client.get_metric_history(run_id, "loss")
    assert [(m.step, m.value) for m in sorted(loss, key=lambda m: m.step)] == [(10 * i, 1.0 / (i + 1)) for i in range(6)]
    assert client.get_run(run_id).info.status == "FINISHED"
    assert "note" not in client.get_run(run_id).data.metrics


def test_digits_example_writes_tensorboard_scalars(tmp_path: Path) -> None:
    import importlib.util

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    spec = importlib.util.spec_from_file_location("digits_example", Path(__file__).parents[2] / "examples" / "digits.py")
    assert spec is not None and spec.loader is not None
    digits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(digits)
    result = digits.main(["--epochs", "1", "--run-dir", str(tmp_path), "--tensorboard", "--device", "cpu"])
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"loss", "test_accuracy", "lr"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("test_accuracy")] == [result["steps"]]
    assert acc.Scalars("test_accuracy")[0].value == pytest.approx(result["test_accuracy"])
