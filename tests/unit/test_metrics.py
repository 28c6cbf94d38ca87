"""Unit tests for ddpkit.metrics.log: JSONL log, progress bar, rank logger, print0."""

from __future__ import annotations

import builtins
import logging
import math
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from ddpkit.metrics.log import MetricsLog, ProgressBar, print0, rank_logger, read_metrics


@dataclass(frozen=True)
class FakeCtx:
    rank: int = 0
    world_size: int = 2
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def test_metrics_log_writes_one_line_per_call_on_rank0(tmp_path):
    run_dir = tmp_path / "run" / "nested"
    with MetricsLog(run_dir, FakeCtx(rank=0)) as log:
        log.log(step=1, epoch=0, loss=0.5, lr=1e-3, phase="train")
        log.log(step=2, epoch=0, loss=0.25)
        # flushed per line: readable before close
        assert len(read_metrics(run_dir / "metrics.jsonl")) == 2
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["phase"] == "train" and records[0]["lr"] == 1e-3
    assert all(isinstance(r["time"], float) and r["time"] > 1e9 for r in records)


def test_metrics_log_appends_when_resuming(tmp_path):
    for step in (1, 2):
        with MetricsLog(tmp_path, FakeCtx(), resume=step > 1) as log:
            log.log(step=step, loss=1.0)
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_fresh_metrics_log_moves_the_old_one_aside(tmp_path):
    for step in (1, 2, 3):
        with MetricsLog(tmp_path, FakeCtx()) as log:
            log.log(step=step, loss=1.0)
    assert [r["step"] for r in read_metrics(tmp_path)] == [3]
    old = sorted(p for p in tmp_path.glob("metrics.*.jsonl"))
    assert len(old) == 2  # both earlier runs kept, none mixed into the new log
    assert sorted(read_metrics(p)[0]["step"] for p in old) == [1, 2]


def test_metrics_log_on_rank1_touches_no_file(tmp_path):
    run_dir = tmp_path / "run"
    with MetricsLog(run_dir, FakeCtx(rank=1)) as log:
        log.log(step=1, loss=0.5)
    assert not run_dir.exists()


def test_metrics_log_converts_tensors_and_numpy_scalars(tmp_path):
    with MetricsLog(tmp_path, FakeCtx()) as log:
        log.log(
            loss=torch.tensor(0.75, requires_grad=True) * 1,
            correct=torch.tensor(7),
            flag=torch.tensor(True),
            single=torch.tensor([2.5]),
            acc=np.float32(0.5),
            count=np.int64(3),
        )
    record = read_metrics(tmp_path)[0]
    assert record["loss"] == pytest.approx(0.75)
    assert record["correct"] == 7 and isinstance(record["correct"], int)
    assert record["flag"] is True
    assert record["single"] == 2.5
    assert record["acc"] == 0.5 and record["count"] == 3


@pytest.mark.parametrize(
    "value, fragment",
    [(torch.zeros(3), "shape (3,)"), ([1, 2], "list"), ({"a": 1}, "dict"), (object(), "object")],
)
def test_metrics_log_rejects_non_scalar_naming_key(tmp_path, value, fragment):
    with MetricsLog(tmp_path, FakeCtx()) as log:
        with pytest.raises(TypeError, match=r"metric 'bad'") as info:
            log.log(step=1, bad=value)
    assert fragment in str(info.value)
    assert not (tmp_path / "metrics.jsonl").read_text()


def test_metrics_log_validates_on_every_rank(tmp_path):
    # A bad value must fail on rank 1 too, or rank 0 dies while rank 1 waits in a collective.
    with MetricsLog(tmp_path / "r1", FakeCtx(rank=1)) as log:
        with pytest.raises(TypeError, match="metric 'x'"):
            log.log(x=torch.ones(2))


def test_metrics_log_keeps_non_finite_values(tmp_path):
    with MetricsLog(tmp_path, FakeCtx()) as log:
        log.log(step=1, loss=float("nan"), grad_norm=float("inf"))
    record = read_metrics(tmp_path)[0]
    assert math.isnan(record["loss"]) and record["grad_norm"] == math.inf


def test_metrics_log_reserved_time_empty_and_closed(tmp_path):
    log = MetricsLog(tmp_path, FakeCtx())
    with pytest.raises(ValueError, match="'time' is reserved"):
        log.log(time=3.0)
    with pytest.raises(ValueError, match="got no values"):
        log.log()
    log.close()
    log.close()
    with pytest.raises(ValueError, match="is closed"):
        log.log(step=1)


def test_read_metrics_reports_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n\n{"step": 2, "loss": \n')
    with pytest.raises(ValueError, match=rf"{path}:3: not valid JSON"):
        read_metrics(path)
    path.write_text('{"step": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=rf"{path}:2: expected a JSON object, got list"):
        read_metrics(path)


def test_read_metrics_missing_file_names_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"MetricsLog\(run_dir, ctx\)"):
        read_metrics(tmp_path)


def test_progress_bar_rank0_shows_loss_and_rate(capsys):
    with ProgressBar(FakeCtx(rank=0), total=3, desc="train") as bar:
        for _ in range(3):
            bar.update(samples=64, loss=torch.tensor(0.123456))
        assert bar.samples_per_s is not None and bar.samples_per_s > 0
    err = capsys.readouterr().err
    assert "train" in err and "3/3" in err
    assert "loss=0.1235" in err and "samples/s=" in err


def test_progress_bar_rate_is_smoothed_from_first_update(monkeypatch):
    clock = iter([100.0, 101.0, 102.0, 104.0])
    monkeypatch.setattr("ddpkit.metrics.log.time.perf_counter", lambda: next(clock))
    bar = ProgressBar(FakeCtx(rank=1), smoothing=0.5)
    bar.update(samples=10)  # starts the clock: warm-up before it is not counted
    assert bar.samples_per_s is None
    bar.update(samples=10)
    assert bar.samples_per_s == pytest.approx(10.0)
    bar.update(samples=10)
    assert bar.samples_per_s == pytest.approx(10.0)
    bar.update(samples=10)  # 2 s interval: seconds average 1 -> 1.5
    assert bar.samples_per_s == pytest.approx(10.0 / 1.5)
    with pytest.raises(ValueError, match="smoothing"):
        ProgressBar(FakeCtx(), smoothing=0.0)


def test_progress_bar_rank1_is_silent_but_counts(capsys):
    with ProgressBar(FakeCtx(rank=1), total=3, desc="train") as bar:
        for _ in range(3):
            bar.update(samples=64, loss=0.5)
        assert bar.samples_per_s is not None
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_bar_without_tqdm_is_silent(monkeypatch, capsys):
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name == "tqdm" or name.startswith("tqdm."):
            raise ImportError("No module named 'tqdm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    with ProgressBar(FakeCtx(rank=0), total=2) as bar:
        bar.update(samples=8, loss=1.0)
        bar.update(samples=8, loss=1.0)
    assert capsys.readouterr().err == ""


def test_progress_bar_rejects_negative_counts():
    with ProgressBar(FakeCtx(rank=1)) as bar, pytest.raises(ValueError, match="must be >= 0"):
        bar.update(samples=-1)


def test_import_does_not_load_tqdm_or_matplotlib():
    code = (
        "import sys, ddpkit.metrics.log, ddpkit.metrics.plot; "
        "assert 'tqdm' not in sys.modules and 'matplotlib' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.fixture
def fresh_logger():
    name = "ddpkit.test_metrics"
    logger = logging.getLogger(name)
    yield name
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)


def test_rank_logger_prefixes_and_installs_one_handler(fresh_logger, capsys, monkeypatch):
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # pytest's capture handlers would count as configured
    first = rank_logger(FakeCtx(rank=1, world_size=4), fresh_logger)
    second = rank_logger(FakeCtx(rank=1, world_size=4), fresh_logger)
    assert len(logging.getLogger(fresh_logger).handlers) == 1
    # the handler was bound to the stderr of its creation; send it to the captured one
    logging.getLogger(fresh_logger).handlers[0].setStream(sys.stderr)
    first.info("hello %s", "world")
    second.debug("hidden at INFO")
    err = capsys.readouterr().err
    assert err.count("[rank 1/4] hello world") == 1
    assert "hidden" not in err


def test_rank_logger_respects_existing_configuration(fresh_logger, caplog):
    logger = logging.getLogger(fresh_logger)
    logger.addHandler(logging.NullHandler())
    adapter = rank_logger(FakeCtx(rank=0, world_size=2), fresh_logger, level=logging.DEBUG)
    assert len(logger.handlers) == 1
    with caplog.at_level(logging.DEBUG, logger=fresh_logger):
        adapter.debug("details")
    assert caplog.messages == ["[rank 0/2] details"]


def test_print0_only_on_rank0(capsys):
    print0(FakeCtx(rank=1), "from rank 1")
    print0(FakeCtx(rank=0), "from", "rank 0", sep="-")
    assert capsys.readouterr().out == "from-rank 0\n"
