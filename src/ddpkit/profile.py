"""Where each rank's optimizer step goes (data, compute, exposed communication, optimizer, other), and the straggler.

On when `ddpkit.init(profile=True)` or `ddpkit run --profile`. The loop helpers call in here: the
loader marks each step's start and its waits for batches, `Precision.backward` and `Precision.step`
mark backward's return and the optimizer, and `ddpkit.wrap` hooks one parameter of a DDP model, the
one whose gradient comes last (learnt in the warm-up): its gradient makes DDP's last bucket ready,
which ends backward's compute. DDP's own all-reduce runs unchanged (no communication hook). Marks are
host clocks on CPU and CUDA events on a GPU, read in batches once they have completed (no host sync
per step). Each step's phases, in ms:

    data      the waits for the step's batches (request to batch on the device)
    compute   first batch ready to the last gradient (forward and backward), less later data waits
    comm      last gradient to backward's return: the all-reduce time backward did not hide (DDP waits
              for its all-reduces before backward returns; on CUDA the stream waits)
    optimizer Precision.step (unscale, clip, step, zero_grad)
    other     the rest of the step (logging, host syncs, user code)

A step runs from one request of a step's first batch to the next. At `ctx.close()` every rank
sends its medians to rank 0 (a collective), which prints one table, names the straggler and the
suggestions the figures support, and writes the JSON of `--profile-json`.
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from ddpkit.runtime import Context

__all__ = ["PHASES", "WARMUP_STEPS", "STRAGGLER_EXCESS", "StepProfiler", "request", "profiler_for",
           "watch_model", "profiled_batches", "unused_note", "summarize", "format_report"]

PHASES = ("data", "compute", "comm", "optimizer", "other")
"""The phases of a step, in the order they are reported (each `<phase>_ms` in the JSON)."""

WARMUP_STEPS = 3
"""Steps left out at the start of the run (DDP's bucket rebuild, allocator and autotuning warm-up)."""

STRAGGLER_EXCESS = 0.2
"""A rank is the straggler when its busy time (step less exposed communication, i.e. less waiting for
the others) exceeds the other ranks' median by more than this share of its step, and the others
wait for it in the all-reduce at least half that long."""

SHARE_TO_SUGGEST = 0.10
"""A phase suggests a change once it takes this share of the median step."""

READ_EVERY = 16
"""Completed steps kept before their marks are read (on CUDA: only events that have completed)."""

_REQUEST: dict[str, Any] = {}
"""The rank bootstrap's `--profile` request for this process, set before the script runs (as its
argv is): `ddpkit.init` in the script then profiles without being told."""


def request(*, json_path: str | None = None) -> None:
    """Profile every Context this process creates (the rank bootstrap of `ddpkit run --profile`)."""
    _REQUEST.clear()
    _REQUEST.update(on=True, json_path=json_path)


def unused_note() -> str | None:
    """After the script of `ddpkit run --profile`: a line to print when nothing in it was profiled."""
    if not _REQUEST or _REQUEST.get("started"):
        return None
    return ("ddpkit run --profile: nothing was measured: profiling times the optimizer steps of a loop over "
            "ddpkit.loader under ddpkit.init(); this script has none")


def profiler_for(ctx: Context) -> StepProfiler | None:
    """This rank's StepProfiler when profiling is on (created on first use), else None; cheap when off."""
    prof = getattr(ctx, "profiler", None)
    if prof is None and (getattr(ctx, "profile", False) or _REQUEST):
        json_path = ctx.profile_json if ctx.profile_json is not None else _REQUEST.get("json_path")
        prof = ctx.profiler = StepProfiler(ctx, json_path=json_path)
        ctx.at_close(prof.finish)
        _REQUEST["started"] = True
    return prof


def watch_model(ctx: Context, model: torch.nn.Module) -> None:
    """When profiling, watch the gradients of a DDP `model` for the end of backward's compute (`ddpkit.wrap` calls it)."""
    prof = profiler_for(ctx)
    if prof is not None:
        prof.watch([p for p in model.parameters() if p.requires_grad])


def profiled_batches(ctx: Context, batches: Iterator[Any], accumulation_steps: int, *, num_workers: int = 0,
                     pinned: bool = False) -> Iterator[Any]:
    """`batches` (one loop over a training loader), with each step's start and data waits marked when profiling."""
    prof = profiler_for(ctx)
    if prof is None:
        return batches
    prof.num_workers, prof.pinned = num_workers, pinned
    return prof.batches(batches, accumulation_steps)


class _Step:
    """The marks of one step: host seconds on CPU, CUDA events on a GPU."""

    __slots__ = ("start", "waits", "cdone", "bdone", "ostart", "oend", "end", "last_param")

    def __init__(self, start: Any) -> None:
        self.start: Any = start
        self.waits: list[tuple[Any, Any]] = []
        self.cdone: Any = None
        self.bdone: Any = None
        self.ostart: Any = None
        self.oend: Any = None
        self.end: Any = None
        self.last_param: int | None = None


class StepProfiler:
    """One rank's step marks and per-step phase times; `finish()` reports (a collective: all ranks call it)."""

    def __init__(self, ctx: Context, *, json_path: str | None = None) -> None:
        self.ctx = ctx
        self.json_path = json_path
        self.cuda = ctx.device.type == "cuda"
        self.current: _Step | None = None
        self.pending: list[_Step] = []
        self.seen = 0  # steps read, warm-up included
        self.closed = 0  # steps closed, warm-up included
        self.hooks: list[Any] = []
        self.last_param: int | None = None
        self.times = {name: array("d") for name in ("step", *PHASES)}
        self.num_workers = 0
        self.pinned = False

    def now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def batches(self, it: Iterator[Any], accumulation_steps: int) -> Iterator[Any]:
        micro = 0
        try:
            while True:
                asked = self.now()
                if micro == 0:
                    self._close(asked)
                    self.current = _Step(asked)
                try:
                    batch = next(it)
                except StopIteration:  # the loop's end: the last step ended at this request
                    self.current = None
                    return
                if self.current is not None:
                    self.current.waits.append((asked, self.now()))
                micro = (micro + 1) % accumulation_steps
                yield batch
        finally:
            self.current = None  # a loop left early leaves its last step unmeasured
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def mark_optimizer(self, started: bool) -> None:
        """Precision.step's start (`started`) or end."""
        step = self.current
        if step is not None:
            if started:
                step.ostart = self.now()
            else:
                step.oend = self.now()

    def mark_backward(self) -> None:
        """Precision.backward returned: on CPU DDP has waited there for its all-reduce; on CUDA the
        stream has (the mark is an event behind that wait)."""
        if self.current is not None:
            self.current.bdone = self.now()

    def watch(self, params: list[Any]) -> None:
        """A hook after each parameter's gradient is accumulated, until the warm-up has shown which one
        comes last; from then on only that parameter's hook stays (one call per backward)."""
        import functools

        if self.hooks:  # the first model wrapped under this Context is the one watched
            return
        self.last_param = None
        self.hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._grad_ready, i))
                      for i, p in enumerate(params)]

    def _grad_ready(self, index: int, param: Any) -> None:
        step = self.current
        if step is None:
            return
        if self.last_param is None:  # warm-up: learn the order, no mark needed
            step.last_param = index
        else:
            step.cdone = self.now()

    def _close(self, end: Any) -> None:
        step, self.current = self.current, None
        if step is None:
            return
        step.end = end
        self.pending.append(step)
        self.closed += 1
        if self.closed >= WARMUP_STEPS and self.last_param is None and step.last_param is not None:
            # The gradient accumulated last ends backward's compute: it makes DDP's last bucket ready.
            self.last_param = step.last_param
            for i, handle in enumerate(self.hooks):
                if i != self.last_param:
                    handle.remove()
        if len(self.pending) >= READ_EVERY:
            self._read()

    def _read(self) -> None:
        """Turn closed steps into phase times, in order; on CUDA only those whose events have completed
        (`query()` does not wait; the rest wait for the next read)."""
        done = 0
        for step in self.pending:
            if self.cuda and not step.end.query():
                break
            done += 1
            self.seen += 1
            if self.seen > WARMUP_STEPS:
                for name, value in zip(("step", *PHASES), self._phases(step)):
                    self.times[name].append(value)
        del self.pending[:done]

    def _ms(self, step: _Step, mark: Any) -> float:
        if self.cuda:
            return float(step.start.elapsed_time(mark))
        return float(mark - step.start) * 1e3

    def _phases(self, step: _Step) -> tuple[float, ...]:
        total = self._ms(step, step.end)
        waits = [(self._ms(step, a), self._ms(step, b)) for a, b in step.waits]
        data = sum(b - a for a, b in waits)
        ostart = self._ms(step, step.ostart) if step.ostart is not None else None
        optimizer = self._ms(step, step.oend) - ostart if ostart is not None and step.oend is not None else 0.0
        bdone = self._ms(step, step.bdone) if step.bdone is not None else None
        # Backward's compute ends with the last gradient (DDP's last bucket is then ready); without
        # DDP (world size 1, FSDP) when Precision.backward returns, else at the optimizer or step end.
        watched = step.cdone is not None
        cdone = (self._ms(step, step.cdone) if watched else bdone if bdone is not None
                 else ostart if ostart is not None else total)
        first_ready = waits[0][1] if waits else 0.0
        compute = max(0.0, cdone - first_ready - sum(b - a for a, b in waits[1:] if b <= cdone))
        # Exposed communication: from there until backward returns (DDP waits for its all-reduces
        # before it does; on CUDA the stream waits), or until the optimizer starts.
        comm_end = bdone if bdone is not None else ostart
        comm = max(0.0, comm_end - cdone) if watched and comm_end is not None else 0.0
        other = max(0.0, total - data - compute - comm - optimizer)
        return total, data, compute, comm, optimizer, other

    def figures(self) -> dict[str, Any]:
        """This rank's medians in ms (`step_ms`, `data_ms`, ...; None before any measured step), and `steps`."""
        if self.cuda:
            import torch

            torch.cuda.synchronize(self.ctx.device)  # once, at the end
        self._read()
        out: dict[str, Any] = {"rank": self.ctx.rank}
        for name, values in self.times.items():
            out[f"{name}_ms"] = round(_median(values), 3) if values else None
        out["steps"] = len(self.times["step"])
        out["num_workers"], out["pinned"], out["device"] = self.num_workers, self.pinned, self.ctx.device.type
        return out

    def finish(self) -> dict[str, Any] | None:
        """Gather every rank's figures; rank 0 prints the report and writes the JSON. Collective: every
        rank must call it (`ctx.close()` does). Returns the report on rank 0, None elsewhere."""
        from ddpkit.collectives import all_gather_object

        ranks = all_gather_object(self.ctx, self.figures())
        if not self.ctx.is_main:
            return None
        report = summarize(ranks)
        print(format_report(report, ranks), flush=True)
        if self.json_path is not None:
            import json

            tmp = f"{self.json_path}.tmp{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(report, f, indent=1)
            os.replace(tmp, self.json_path)
        return report


def _median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return float(ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2)


def summarize(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The report (the `--profile-json` schema) from each rank's `figures()`: medians, straggler, suggestions."""
    keys = ("step_ms", *(f"{p}_ms" for p in PHASES))
    rows = [{"rank": r["rank"], **{k: r.get(k) for k in keys}} for r in ranks]
    steps = min((r.get("steps", 0) for r in ranks), default=0)
    report: dict[str, Any] = {"world_size": len(ranks), "steps": steps, "ranks": rows, "straggler": None,
                              "suggestions": []}
    if steps == 0 or any(row["step_ms"] is None for row in rows):
        return report
    straggler, excess = _straggler(rows)
    report["straggler"] = straggler
    report["suggestions"] = _suggestions(rows, ranks, straggler, excess)
    return report


def _busy(row: dict[str, Any]) -> float:
    # In synchronous DDP every rank's step lasts as long as the slowest rank's: the others wait for it
    # in the gradient all-reduce. A rank's own time is therefore its step less that wait.
    return float(row["step_ms"] - row["comm_ms"])


def _straggler(rows: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, float]]:
    if len(rows) < 2:
        return None, {}
    slowest = max(rows, key=_busy)
    others = [row for row in rows if row is not slowest]
    late = _busy(slowest) - _median(_busy(r) for r in others)
    waited = _median(r["comm_ms"] for r in others) - slowest["comm_ms"]
    # Clearly slower: by a share of the step, and the others spent most of that difference waiting for
    # it (noise that makes one rank's phases longer without making the others wait is not a straggler).
    if late <= STRAGGLER_EXCESS * slowest["step_ms"] or waited < 0.5 * late:
        return None, {}
    excess = {p: slowest[f"{p}_ms"] - _median(r[f"{p}_ms"] for r in others)
              for p in PHASES if p != "comm"}
    phase = max(excess, key=excess.__getitem__)
    return {"rank": slowest["rank"], "phase": phase}, excess


_STRAGGLER_FIX = {
    "data": "its loader is slower: check its disk or shard, raise ddpkit.loader(num_workers=)",
    "compute": "its device computes slower: a slower or shared GPU, thermal throttling, another process on it",
    "optimizer": "its optimizer step is slower: a slower or shared device",
    "other": "its loop does more outside the training step: rank-specific logging, evaluation or host syncs",
}


def _suggestions(rows: list[dict[str, Any]], ranks: list[dict[str, Any]], straggler: dict[str, Any] | None,
                 excess: dict[str, float]) -> list[str]:
    out = []
    if straggler is not None:
        r, p = straggler["rank"], straggler["phase"]
        row = next(row for row in rows if row["rank"] == r)
        out.append(f"rank {r} spends {excess[p]:.1f} ms more per step in {p} than the other ranks "
                   f"({row[f'{p}_ms']:.1f} ms), and they wait for it in the all-reduce: {_STRAGGLER_FIX[p]}")
    step = _median(row["step_ms"] for row in rows)

    def share(phase: str, fn: Any = _median) -> tuple[float, float]:
        ms = fn(row[f"{phase}_ms"] for row in rows)
        return ms, ms / step if step > 0 else 0.0

    data_ms, data_share = share("data", max)
    if data_share >= SHARE_TO_SUGGEST and (straggler is None or straggler["phase"] != "data"):
        info = ranks[0]
        pin = ("" if info.get("device") != "cuda" or info.get("pinned")
               else " and pin_memory=True")
        out.append(f"the loop waits up to {data_ms:.1f} ms per step for data ({data_share:.0%} of the step): raise "
                   f"ddpkit.loader(num_workers=) (now {info.get('num_workers', 0)}){pin}")
    comm_ms, comm_share = share("comm", min if straggler is not None else _median)
    if comm_share >= SHARE_TO_SUGGEST:
        out.append(f"{comm_ms:.1f} ms per step of gradient communication is not hidden behind backward "
                   f"({comm_share:.0%} of the step): try ddpkit.wrap(..., bucket_cap_mb=50) or static_graph=True, "
                   "or comm='bf16' (half the bytes)")
    fixed = _median(row["comm_ms"] + row["optimizer_ms"] + row["other_ms"] for row in rows)
    if straggler is None and fixed / step >= 0.4 and step > 0:
        out.append(f"communication, optimizer and other take {fixed:.1f} ms of a {step:.1f} ms step "
                   f"({fixed / step:.0%}) whatever the batch: a larger per-rank batch_size spreads them over more samples")
    compute_ms, compute_share = share("compute")
    if compute_share >= 0.5:
        out.append(f"forward and backward take {compute_ms:.1f} ms ({compute_share:.0%} of the step): "
                   "ddpkit.wrap(..., compile=True) may shorten them")
    other_ms, other_share = share("other")
    if other_share >= SHARE_TO_SUGGEST and straggler is None:
        out.append(f"{other_ms:.1f} ms per step ({other_share:.0%}) is spent outside data, compute, communication "
                   "and the optimizer: logging or host syncs (.item(), float(loss)) every step; log every N steps")
    return out


def format_report(report: dict[str, Any], ranks: list[dict[str, Any]] | None = None) -> str:
    """The table rank 0 prints: per rank the median step and each phase's share of it."""
    head = (f"ddpkit profile: {report['world_size']} rank(s), {report['steps']} steps measured per rank "
            f"(medians; the first {WARMUP_STEPS} left out)")
    if report["steps"] == 0 or any(row["step_ms"] is None for row in report["ranks"]):
        return (head + f"\n  no step measured: profiling times the steps of a loop over ddpkit.loader, "
                f"and needs more than {WARMUP_STEPS} of them")
    lines = [head, f"  {'rank':>4}  {'step ms':>8}" + "".join(f"  {p:>9}" for p in PHASES)]
    for row in report["ranks"]:
        step = row["step_ms"]
        cells = "".join(f"  {(row[f'{p}_ms'] / step if step else 0):>9.0%}" for p in PHASES)
        lines.append(f"  {row['rank']:>4}  {step:>8.2f}{cells}")
    s = report["straggler"]
    lines.append(f"  straggler: rank {s['rank']} ({s['phase']})" if s else "  straggler: none")
    lines += [f"  - {text}" for text in report["suggestions"]] or ["  no change suggested by these figures"]
    return "\n".join(lines)
