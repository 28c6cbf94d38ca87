"""Rank-aware reporting: JSONL metrics log, progress bar, rank-prefixed logger and print0."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ddpkit.metrics.trackers import Sink, check_trackers, numeric, open_sinks

__all__ = ["METRICS_FILENAME", "MetricsLog", "ProgressBar", "print0", "rank_logger", "read_metrics"]

METRICS_FILENAME = "metrics.jsonl"
"""Name of the metrics log inside a run directory (read back by ``ddpkit plot``)."""


def _to_plain(key: str, value: Any) -> bool | int | float | str | None:
    """Return ``value`` as a JSON scalar, unwrapping one-element tensors and numpy scalars."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        numel = getattr(value, "numel", None)
        count = numel() if callable(numel) else getattr(value, "size", None)
        if count == 1:
            plain = item()
            if isinstance(plain, (bool, int, float)):
                return plain
        else:
            shape = tuple(getattr(value, "shape", ()))
            raise TypeError(
                f"metric {key!r} is a {type(value).__name__} of shape {shape}; a metric must be one "
                f"number. Reduce it first (e.g. {key}=t.mean(), after summing across ranks)"
            )
    raise TypeError(
        f"metric {key!r} is a {type(value).__name__} ({value!r:.60}); metrics must be numbers, "
        f"strings, None or one-element tensors. Pass float(...) or str(...) of it instead"
    )


class MetricsLog:
    """Append one JSON object per :meth:`log` call to ``run_dir/metrics.jsonl``, on rank 0 only.

    Every rank may construct and call it with the same arguments; only the main rank
    (``ctx.is_main``) creates ``run_dir`` and touches the file, other ranks keep no file open.
    Each line is flushed as it is written, so a crash loses nothing already logged. The file is
    opened for appending when ``resume=True``: a resumed run continues the same log (``ddpkit plot``
    keeps the last value logged for a repeated ``step``); a fresh run moves an old log aside.

    Values must already be reduced across ranks before they are passed here, e.g. with
    ``ddpkit.reduce_mean(ctx, loss_sum, count)`` called by every rank: this logger never issues
    a collective, because rank-0-only code must never call one, so it logs what it is handed
    (rank 0's own shard, if the caller did not reduce).

    Values are validated on every rank, not only on rank 0, so a bad value fails on all ranks
    alike instead of killing rank 0 and leaving the others waiting in their next collective
    (one-element tensors are read with ``.item()`` everywhere, a device sync per value).
    Non-finite floats are kept (written as ``NaN``/``Infinity``, which :func:`read_metrics`
    reads back) so a diverging loss stays visible in the log.
    """

    def __init__(self, run_dir: str | Path, ctx: Any, *, resume: bool = False,
                 trackers: Iterable[str] = ()) -> None:
        """`resume=True` appends to an existing log (a run continued from a checkpoint); otherwise an
        existing log is renamed to `metrics.<time>.jsonl` first, so runs are never mixed nor lost.

        `trackers` also sends every line's numbers to experiment trackers, from rank 0:
        "tensorboard" (scalars in run_dir/tensorboard), "wandb", "mlflow" (see ddpkit.metrics.trackers).
        Each line's `step` is the tracker's step (else the line's number).
        """
        names = check_trackers(trackers)  # on every rank: a missing package fails all ranks alike
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILENAME
        self.is_main = bool(ctx.is_main)
        self._closed = False
        self._file: IO[str] | None = None
        self._sinks: list[Sink] = []
        self._lines = 0
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if not resume and self.path.exists() and self.path.stat().st_size > 0:
                stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.path.stat().st_mtime))
                aside = self.path.with_name(f"metrics.{stamp}.jsonl")
                n = 1
                while aside.exists():
                    aside, n = self.path.with_name(f"metrics.{stamp}-{n}.jsonl"), n + 1
                self.path.rename(aside)
            self._sinks = open_sinks(names, self.run_dir, resume=resume)
            self._file = open(self.path, "a", encoding="utf-8")

    def log(self, **values: Any) -> None:
        """Record one line of metrics, e.g. ``log(step=100, epoch=1, loss=0.42, lr=3e-4)``.

        A wall-clock ``time`` field (seconds since the epoch) is added to each line.
        """
        if self._closed:
            raise ValueError(
                f"MetricsLog for {self.path} is closed; log before close() or open a new MetricsLog"
            )
        if not values:
            raise ValueError("MetricsLog.log() got no values; pass them as keywords, e.g. log(step=1, loss=0.5)")
        if "time" in values:
            raise ValueError(
                "metric 'time' is reserved: MetricsLog adds the wall-clock time to every line; "
                "log your value under another name, e.g. step_time=..."
            )
        record = {key: _to_plain(key, value) for key, value in values.items()}
        record["time"] = time.time()
        if self._file is not None:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        self._lines += 1
        if self._sinks:
            step = record.get("step")
            step = step if isinstance(step, int) and not isinstance(step, bool) else self._lines
            scalars = numeric({k: v for k, v in record.items() if k not in ("step", "time")})
            for sink in self._sinks:
                sink.write(step, scalars)

    def close(self) -> None:
        """Close the file (idempotent)."""
        self._closed = True
        sinks, self._sinks = self._sinks, []
        for sink in sinks:
            sink.close()
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Read a metrics log (a ``metrics.jsonl`` file or a run directory holding one).

    Blank lines are skipped; any other line that is not a JSON object raises ``ValueError``
    naming ``file:line``.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILENAME
    if not path.is_file():
        raise FileNotFoundError(
            f"no metrics log at {path}; run a training with MetricsLog(run_dir, ctx) first, "
            f"or pass the run directory that holds {METRICS_FILENAME}"
        )
    records: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{path}:{line_number}: not valid JSON ({error.msg} at column {error.colno}); "
                    f"each line must be one JSON object as written by MetricsLog; fix or delete the line"
                ) from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}; "
                    f"each line must be one JSON object as written by MetricsLog; fix or delete the line"
                )
            records.append(record)
    return records


class ProgressBar:
    """tqdm progress bar on rank 0 showing loss and global samples/s; silent on other ranks.

    ``update(samples=...)`` takes the number of samples processed by all ranks together in
    those steps (e.g. ``batch_size * ctx.world_size``), so the rate is the job's throughput.
    The rate is an exponential moving average over recent updates (samples and seconds
    averaged separately, as tqdm does), timed from the first ``update`` call so warm-up before
    it is left out. It is counted on every rank, so :attr:`samples_per_s` can be passed to
    :meth:`MetricsLog.log` from any rank. Without tqdm installed the bar prints nothing and never fails.
    """

    def __init__(
        self,
        ctx: Any,
        *,
        total: int | None = None,
        desc: str | None = None,
        unit: str = "step",
        smoothing: float = 0.3,
        disable: bool = False,
    ) -> None:
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(
                f"ProgressBar(smoothing={smoothing}): smoothing is the weight of the newest update "
                f"in the samples/s average and must be in (0, 1]; pass 1.0 for no smoothing"
            )
        self._bar: Any = None
        self._smoothing = smoothing
        self._last_time: float | None = None
        self._avg_samples = 0.0
        self._avg_seconds = 0.0
        self._rate: float | None = None
        self._next_postfix = 0.0  # when the shown loss may next be read (a device sync on CUDA)
        self._pending: tuple[Any, dict[str, Any]] = (None, {})  # the latest loss and extras passed
        self._stale = False  # _pending not shown yet
        if not ctx.is_main or disable:
            return
        try:
            from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]
        except ImportError:
            return
        self._bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True)

    @property
    def samples_per_s(self) -> float | None:
        """Smoothed global samples per second, or None until two updates carried ``samples``."""
        return self._rate

    def update(
        self, n_steps: int = 1, *, samples: int | None = None, loss: Any = None, **postfix: Any
    ) -> None:
        """Advance by ``n_steps``; ``samples`` is the global sample count for those steps.

        ``loss`` (a float or one-element tensor) is shown as passed: rank 0's own loss unless
        the caller reduced it. Tensors are read with ``.item()`` on rank 0 only, at most once per
        tqdm refresh interval, so no step waits on a device sync for the bar. Extra keywords are
        shown as-is.
        """
        if n_steps < 0 or (samples is not None and samples < 0):
            raise ValueError(
                f"ProgressBar.update(n_steps={n_steps}, samples={samples}): counts must be >= 0; "
                f"pass the steps and the global samples done since the last update"
            )
        now = time.perf_counter()
        if self._last_time is not None and samples is not None and now > self._last_time:
            weight = self._smoothing if self._rate is not None else 1.0
            self._avg_samples += weight * (samples - self._avg_samples)
            self._avg_seconds += weight * (now - self._last_time - self._avg_seconds)
            self._rate = self._avg_samples / self._avg_seconds
        self._last_time = now
        if self._bar is None:
            return
        self._pending, self._stale = (loss, postfix), True
        if now >= self._next_postfix:
            # Read the loss at most as often as tqdm redraws: `.item()` on a CUDA tensor waits for
            # the GPU, and doing that every step would stall rank 0, and through DDP every rank.
            self._next_postfix = now + self._bar.mininterval
            self._show_postfix()
        self._bar.update(n_steps)

    def _show_postfix(self) -> None:
        loss, postfix = self._pending
        self._stale = False
        shown: dict[str, Any] = {}
        if loss is not None:
            shown["loss"] = f"{float(loss.item() if hasattr(loss, 'item') else loss):.4g}"
        if self._rate is not None:
            shown["samples/s"] = f"{self._rate:,.0f}"
        shown.update(postfix)
        if shown:
            self._bar.set_postfix(shown, refresh=False)

    def close(self) -> None:
        """Close the bar (idempotent), showing the latest loss and rate."""
        if self._bar is not None:
            if self._stale:
                self._show_postfix()
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
else:
    _Adapter = logging.LoggerAdapter


class _RankAdapter(_Adapter):
    """Prefix each message with ``[rank R/W]``."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"{(self.extra or {}).get('prefix', '')} {msg}", kwargs


def rank_logger(ctx: Any, name: str = "ddpkit", *, level: int | None = None) -> logging.LoggerAdapter[logging.Logger]:
    """Logger for messages every rank emits, each prefixed with ``[rank R/W]``.

    If neither the named logger nor its ancestors have a handler, one stderr handler is added
    (once: a second call finds it) and the level set to INFO unless already set; configure
    ``logging`` yourself beforehand to route the messages elsewhere. ``level`` sets the
    logger's level explicitly. For messages only rank 0 should print, use :func:`print0`.
    """
    logger = logging.getLogger(name)
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
    if level is not None:
        logger.setLevel(level)
    return _RankAdapter(logger, {"prefix": f"[rank {ctx.rank}/{ctx.world_size}]"})


def print0(ctx: Any, *args: Any, **kwargs: Any) -> None:
    """``print`` on rank 0 only; flushes by default so lines are not held back under torchrun."""
    if ctx.is_main:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)

