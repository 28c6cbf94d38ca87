"""`ddpkit plot`: PNG figures of loss, eval metrics and throughput from a run's metrics.jsonl; `finish_run`.

`finish_run` ends a training run: it closes the metrics log, writes these figures and prints the result.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from ddpkit.metrics.log import METRICS_FILENAME, MetricsLog, print0, read_metrics

__all__ = ["main", "plot_run", "finish_run"]

TRAIN_LOSS_KEYS = ("loss", "train_loss")
EVAL_PREFIXES = ("eval_", "val_", "test_")
THROUGHPUT_KEYS = ("samples_per_s", "tokens_per_s")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _series(records: list[dict[str, Any]], key: str) -> tuple[str, list[float], list[float]]:
    """Return (x label, xs, ys) for ``key``: against step if every point has one, else epoch.

    Points are keyed by step with the last one winning, so a resumed run that logged some
    steps twice draws one line; against epoch or line number they are kept in file order.
    """
    points = [record for record in records if _is_number(record.get(key))]
    for axis in ("step", "epoch"):
        if points and all(_is_number(record.get(axis)) for record in points):
            if axis == "step":
                last = {record["step"]: record[key] for record in points}
                xs = sorted(last)
                return axis, xs, [last[x] for x in xs]
            return axis, [record[axis] for record in points], [record[key] for record in points]
    return "record", list(range(len(points))), [record[key] for record in points]


def _new_figure(num_axes: int, title: str) -> tuple[Any, list[Any]]:
    # The object-oriented API with an explicit Agg canvas: no pyplot, no global backend switch,
    # so plotting from inside a notebook or a GUI program leaves its backend alone.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = min(num_axes, 3)
    rows = math.ceil(num_axes / columns)
    figure = Figure(figsize=(5 * columns, 3.6 * rows), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, columns, squeeze=False).ravel().tolist()
    for unused in axes[num_axes:]:
        unused.set_visible(False)
    figure.suptitle(title)
    return figure, axes[:num_axes]


def _plot_lines(axes: Any, records: list[dict[str, Any]], keys: list[str]) -> None:
    xlabel = "step"
    for key in keys:
        xlabel, xs, ys = _series(records, key)
        axes.plot(xs, ys, label=key, marker="o" if len(xs) < 30 else None, markersize=3)
    axes.set_xlabel(xlabel)
    axes.grid(True, alpha=0.3)
    if len(keys) > 1:
        axes.legend()


def _present(records: list[dict[str, Any]], keys: list[str] | tuple[str, ...]) -> list[str]:
    return [key for key in keys if any(_is_number(record.get(key)) for record in records)]


def plot_run(run_dir: str | Path, *, out_dir: str | Path | None = None) -> list[Path]:
    """Write ``loss.png``, ``eval.png`` and ``throughput.png`` for a run; return their paths.

    Reads ``run_dir/metrics.jsonl`` (see :class:`ddpkit.metrics.log.MetricsLog`). The loss figure
    draws ``loss``/``train_loss`` and any ``eval_loss``/``val_loss``/``test_loss``; the eval
    figure has one panel per other ``eval_*``/``val_*``/``test_*`` metric; the throughput
    figure draws ``samples_per_s`` and ``tokens_per_s``. A figure with no data is skipped, so
    the list may be empty. Figures go to ``out_dir`` (default: ``run_dir``).
    """
    records = read_metrics(run_dir)
    out = Path(out_dir) if out_dir is not None else Path(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    all_keys = list(dict.fromkeys(key for record in records for key in record))
    eval_keys = [key for key in _present(records, all_keys) if key.startswith(EVAL_PREFIXES)]
    train_keys = _present(records, TRAIN_LOSS_KEYS)
    # An eval loss joins the train loss only when both share an x axis (both carry `step`,
    # say); one logged per epoch against a per-step train loss gets its own eval panel.
    train_axis = _series(records, train_keys[0])[0] if train_keys else None
    eval_losses = [
        key for key in eval_keys
        if key.endswith("loss") and train_axis in (None, _series(records, key)[0])
    ]
    written: list[Path] = []

    loss_keys = train_keys + eval_losses
    if loss_keys:
        figure, (axes,) = _new_figure(1, "loss")
        _plot_lines(axes, records, loss_keys)
        values = [record[key] for record in records for key in loss_keys if _is_number(record.get(key))]
        finite = [value for value in values if math.isfinite(value)]
        if finite and min(finite) > 0 and max(finite) / min(finite) > 100:
            axes.set_yscale("log")
        axes.set_ylabel("loss")
        written.append(_save(figure, out / "loss.png"))

    metric_keys = [key for key in eval_keys if key not in eval_losses]
    if metric_keys:
        figure, panels = _new_figure(len(metric_keys), "evaluation")
        for axes, key in zip(panels, metric_keys):
            _plot_lines(axes, records, [key])
            axes.set_title(key)
        written.append(_save(figure, out / "eval.png"))

    rate_keys = _present(records, THROUGHPUT_KEYS)
    if rate_keys:
        figure, panels = _new_figure(len(rate_keys), "throughput (all ranks)")
        for axes, key in zip(panels, rate_keys):
            _plot_lines(axes, records, [key])
            axes.set_ylabel(key.replace("_per_s", "/s"))
            axes.set_ylim(bottom=0)
        written.append(_save(figure, out / "throughput.png"))
    return written


def finish_run(ctx: Any, result: dict[str, Any], log: MetricsLog | None = None, *, plot: bool = True) -> None:
    """End of a run: close `log`, write its plots and print `result` as one JSON line (rank 0 only).

    Not a collective; every rank may call it.
    """
    if log is not None:
        log.close()
        if plot and ctx.is_main:
            plot_run(log.run_dir)
    print0(ctx, json.dumps(result))


def _save(figure: Any, path: Path) -> Path:
    figure.savefig(path, dpi=110)
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpkit plot",
        description=f"Draw PNG figures (loss, eval metrics, throughput) from RUN_DIR/{METRICS_FILENAME}.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help=f"run directory holding {METRICS_FILENAME}")
    parser.add_argument("--out", metavar="DIR", default=None, help="where to write the PNGs (default: RUN_DIR)")
    return parser


def _error(message: str) -> int:
    print(f"ddpkit plot: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ddpkit plot RUN_DIR [--out DIR]``; returns the exit code."""
    args = _parser().parse_args(argv)
    run_dir = Path(args.run_dir)
    if run_dir.is_file() and run_dir.name == METRICS_FILENAME:  # the log itself: plot its run
        run_dir = run_dir.parent
    elif run_dir.is_file():
        return _error(f"{run_dir} is a file, not a run directory; pass the directory that holds {METRICS_FILENAME}")
    if not run_dir.is_dir():
        return _error(
            f"run directory {run_dir} does not exist; pass the run_dir given to "
            f"MetricsLog(run_dir, ctx), or run a training with MetricsLog first"
        )
    log = run_dir / METRICS_FILENAME
    if not log.is_file():
        return _error(f"no metrics log at {log}; run a training with MetricsLog(run_dir, ctx) first")
    try:
        written = plot_run(run_dir, out_dir=args.out)
    except ValueError as error:
        return _error(str(error))
    except OSError as error:
        return _error(f"cannot write figures: {error}; pass a writable directory with --out DIR")
    except ImportError as error:
        return _error(f"matplotlib is needed to plot ({error}); install it: pip install matplotlib")
    if not written:
        return _error(
            f"{log} holds no plottable values; log numbers under loss, eval_*/val_*/test_*, "
            f"samples_per_s or tokens_per_s, e.g. MetricsLog.log(step=..., loss=...)"
        )
    for path in written:
        print(path)
    return 0
