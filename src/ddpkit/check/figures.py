"""Figures a script reports, compared between a world-size-1 run and a world-size-N run (pure functions).

A metric computed from one rank's shard, or a global sum divided by a per-rank count, comes out
about N times too small or too large on N ranks. `ddpkit check` runs the script at world size N and
again at world size 1, and compares the numbers rank 0 reports at each line (print, logging, tqdm,
JSON, TensorBoard, W&B, MLflow: ddpkit.check.outputs). A series that moves by about a factor N is
reported with its line. Numbers that depend on the world size by design are left out and counted
in the notes: timings and rates (a unit such as s, ms, it/s, tokens/s, or a key such as time,
elapsed, eta, throughput), dates, clock times and timestamps, memory sizes, process ids, integers equal to
the run's structure (world size, a loader's length, batch size or shard size) and figures equal
to a learning rate (linear scaling with the world size).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from statistics import median
from typing import Any

from ddpkit.check.analysis import Finding, Records

__all__ = ["Number", "numbers_in", "n_fold", "structure", "compare_figures", "FigureComparison"]

_TOKEN = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2}(?:[ T_]\d{1,2}[:\-]\d{2}(?:[:\-]\d{2}(?:\.\d+)?)?)?"
                    r"|(?<![\w.:])\d{1,2}:\d{2}(?::\d{2})?(?:\.\d+)?)"
                    r"|(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.]*\d)")
"""A date or clock time (a timing), or a number not glued to a word."""
_UNIT = re.compile(r"\s*(?:%|(?P<time>[a-z]*/s(?:ec)?\b|s/\w+|ms\b|us\b|µs\b|ns\b|s\b|secs?\b|seconds?\b|mins?\b|"
                   r"minutes?\b|h\b|hrs?\b|hours?\b|days?\b)|(?P<memory>[kmgt]i?b\b|bytes?\b))", re.IGNORECASE)
_TIME_WORDS = re.compile(r"time|elapsed|duration|\beta\b|speed|throughput|per[_ ]?s(?:ec|econd)?\b|/s\b|"
                         r"\bfps\b|\btps\b|timestamp|\bdate\b|wall|clock|latency|\bsec\b|_s\b", re.IGNORECASE)
_PROCESS_WORDS = re.compile(r"\bmem|memory|\bram\b|\bpid\b|\bport\b", re.IGNORECASE)


@dataclass(frozen=True)
class Number:
    """One number found in a report."""

    value: float
    is_int: bool
    """Written without a decimal point or exponent."""
    ulp: float
    """Half a unit in the last written digit: how far the written value may be from the computed one."""
    kind: str
    """'figure' (compared), 'timing' (a duration, rate or date) or 'process' (a memory size, process id or
    port), which are not compared."""


def _number(token: str) -> tuple[float, bool, float]:
    mantissa, _, exp = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2]) if "." in mantissa else 0
    value = float(token)
    scale = 10.0 ** (int(exp) if exp else 0)
    return value, "." not in mantissa and not exp, 0.5 * scale * 10.0 ** -decimals


def numbers_in(text: str) -> list[Number]:
    """Every number written in `text`, each with what it is; digits glued to a word (resnet50, fc1, top5)
    are no number."""
    out: list[Number] = []
    previous = 0
    for m in _TOKEN.finditer(text):
        label = text[previous:m.start()]
        previous = m.end()
        if m.group("date"):
            out.append(Number(math.nan, False, 0.0, "timing"))
            continue
        value, is_int, ulp = _number(m.group())
        unit = _UNIT.match(text, m.end())
        if (unit and unit.group("memory")) or _PROCESS_WORDS.search(label):
            kind = "process"
        elif (unit and unit.group("time")) or _TIME_WORDS.search(label) or (is_int and 1.4e9 < abs(value) < 2.5e12):
            kind = "timing"
        else:
            kind = "figure"
        out.append(Number(value, is_int, ulp, kind))
    return out


def n_fold(ratio: float, world_size: int, tolerance: float = 0.2) -> bool:
    """Whether `ratio` (value at world size N / value at world size 1) is about N or about 1/N."""
    return ratio > 0 and (abs(ratio / world_size - 1) <= tolerance or abs(ratio * world_size - 1) <= tolerance)


def structure(records: Records) -> tuple[set[int], list[float]]:
    """(integers that describe the run's shape, learning rates) from rank 0's events: world size, each
    loader's length, batch size, dataset and shard sizes; the optimizer's learning rates."""
    ints: set[int] = set()
    lrs: list[float] = []
    for e in records.get(0, []):
        if e["ev"] == "start":
            ints.add(e.get("world_size", 1))
        elif e["ev"] == "epoch_start":
            ints.update(v for k in ("batches", "batch_size", "dataset_len", "num_samples", "total_size",
                                    "num_replicas") if isinstance(v := e.get(k), int))
        elif e["ev"] == "step":
            lrs.extend(lr for lr in e.get("lrs") or [] if lr is not None)
    return ints, sorted(set(lrs))


def _reports(records: Records) -> dict[str, list[dict[str, Any]]]:
    """site -> rank 0's reports there, in order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in records.get(0, []):
        if e["ev"] == "report":
            out.setdefault(e["site"], []).append(e)
    return out


@dataclass(frozen=True)
class FigureComparison:
    """What comparing the two runs found, and what it could not compare."""

    findings: list[Finding]
    compared: int
    """Numbers compared (pairs of one number at world size 1 and N)."""
    skipped: dict[str, int]
    """Why numbers were not compared -> how many."""
    uncompared_sites: list[str]
    """'site (why)' for lines whose reports could not be paired."""


def _explained(a: Number, b: Number, shape_1: tuple[set[int], list[float]], shape_n: tuple[set[int], list[float]]
               ) -> str | None:
    """Why the pair (a at world size 1, b at world size N) depends on the world size by design, if it does."""
    if a.kind != "figure" or b.kind != "figure":
        return "timings" if "timing" in (a.kind, b.kind) else "memory sizes and process ids"
    if a.is_int and b.is_int and int(a.value) in shape_1[0] and int(b.value) in shape_n[0]:
        return "loop and shard sizes"

    def is_lr(x: Number, lrs: list[float]) -> bool:
        return any(abs(x.value - lr) <= x.ulp + 1e-9 * abs(lr) for lr in lrs) and x.value != 0

    if is_lr(a, shape_1[1] + shape_n[1]) and is_lr(b, shape_1[1] + shape_n[1]):
        return "learning rates"
    return None


_VIA = {"print": "printed", "logging": "logged", "json": "written as JSON", "tqdm": "shown in tqdm",
        "tensorboard": "logged to TensorBoard", "wandb": "logged to W&B", "mlflow": "logged to MLflow"}


def _finding(site: str, text_1: str, text_n: str, a: float, b: float, world_size: int, channel: str) -> Finding:
    via = _VIA.get(channel, channel)
    if b < a:
        why = (f"about 1/{world_size}: it counts rank 0's shard only (a sum or count never reduced across ranks)")
        fix = ("all-reduce the sums and counts before dividing (ddpkit.all_reduce_sum, ddpkit.reduce_mean, or "
               "dist.all_reduce(t, op=SUM) on every rank), or let every rank (or rank 0 alone) evaluate the whole set")
    else:
        why = (f"about {world_size}x: a sum over all ranks divided by a per-rank count (len(loader), this "
               "rank's samples)")
        fix = ("divide by the global count: all-reduce the count with the sum (ddpkit.reduce_mean(ctx, total, count) "
               "or dist.all_reduce on both), or reduce the per-rank mean instead of the sum")
    return Finding("reported", site, f"the figure {via} here depends on the number of ranks: {a:.4g} at world size "
                   f"1, {b:.4g} on rank 0 of {world_size} ranks, {why}; world size 1 {via} "
                   f"{text_1.strip()[:80]!r}, world size {world_size} {text_n.strip()[:80]!r}", fix)


def compare_figures(reference: Records, run: Records, world_size: int) -> FigureComparison:
    """Compare what rank 0 reports at each line in `reference` (world size 1) and `run` (world size N).

    A line is paired when both runs report there the same number of times, each time with the same
    count of numbers; a number's series over the reports is reported when most of its pairs moved by
    about a factor N (n_fold) and not every pair is equal.
    """
    ref, new = _reports(reference), _reports(run)
    shape_1, shape_n = structure(reference), structure(run)
    findings: list[Finding] = []
    skipped: dict[str, int] = {}
    uncompared: list[str] = []
    compared = 0
    for site in list(dict.fromkeys([*new, *ref])):
        a_reports, b_reports = ref.get(site, []), new.get(site, [])
        if not a_reports or not b_reports:
            which = "world size 1" if a_reports else f"world size {world_size}"
            uncompared.append(f"{site} (reported at {which} only)")
            continue
        if len(a_reports) != len(b_reports):
            uncompared.append(f"{site} (reported {len(a_reports)} times at world size 1, {len(b_reports)} at "
                              f"world size {world_size})")
            continue
        series: dict[int, list[tuple[Number, Number, int]]] = {}
        for i, (ra, rb) in enumerate(zip(a_reports, b_reports)):
            na, nb = numbers_in(ra["text"]), numbers_in(rb["text"])
            if len(na) != len(nb):
                skipped["reports whose count of numbers differs"] = skipped.get(
                    "reports whose count of numbers differs", 0) + len(nb)
                continue
            for j, (x, y) in enumerate(zip(na, nb)):
                same = x.kind == y.kind == "figure" and abs(x.value - y.value) <= x.ulp + y.ulp
                why = None if same else _explained(x, y, shape_1, shape_n)
                if why:
                    skipped[why] = skipped.get(why, 0) + 1
                else:
                    series.setdefault(j, []).append((x, y, i))
        for pairs in series.values():
            compared += len(pairs)
            moved = [(x, y, i) for x, y, i in pairs if abs(x.value - y.value) > x.ulp + y.ulp]
            ratios = [y.value / x.value for x, y, _ in moved if x.value and y.value]
            if not ratios or not n_fold(median(ratios), world_size):
                continue
            if sum(n_fold(r, world_size) for r in ratios) * 3 < len(pairs) * 2:
                continue
            x, y, i = next((x, y, i) for x, y, i in moved if x.value and y.value and n_fold(y.value / x.value,
                                                                                        world_size))
            findings.append(_finding(site, a_reports[i]["text"], b_reports[i]["text"], x.value, y.value, world_size,
                                     b_reports[i]["channel"]))
            break
    return FigureComparison(findings=findings, compared=compared, skipped=skipped, uncompared_sites=uncompared)
