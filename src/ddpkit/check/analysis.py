"""Compare the ranks' records of a `ddpkit check` run and name each broken DDP invariant (pure functions)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from ddpkit.check.samples import same_data

__all__ = ["Finding", "load_records", "analyse", "check_steps", "check_collectives", "check_data", "check_saves",
           "check_writes", "check_downloads", "check_host_tensors", "check_errors"]

Records = dict[int, list[dict[str, Any]]]
"""Per rank, its events in order (see ddpkit.check.probes)."""

_SHAPED = {"all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "all_gather"}


@dataclass(frozen=True)
class Finding:
    """One broken invariant, where it shows, and what to change."""

    kind: str
    """Short tag: params, grads, collectives, data-overlap, data-order, data-uneven, eval-padding, save, write,
    download, reported, steps, device, error, hang."""
    site: str
    """'file:line' in the user's script."""
    message: str
    """What differs between ranks, in numbers."""
    fix: str
    """What to change."""


def load_records(folder: str | Path) -> Records:
    """rank-N.jsonl files -> {rank: [event, ...]}; a line cut short by a killed rank is skipped."""
    out: Records = {}
    for path in sorted(Path(folder).glob("rank-*.jsonl")):
        events = []
        for line in path.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        out[int(path.stem.split("-")[1])] = events
    return out


def _events(records: Records, kind: str) -> dict[int, list[dict[str, Any]]]:
    return {rank: [e for e in events if e["ev"] == kind] for rank, events in records.items()}


def check_steps(records: Records) -> list[Finding]:
    """Parameters (and the gradients that produced them) must be bit-identical on every rank after each step."""
    steps = _events(records, "step")
    ranks = sorted(steps)
    counts = {r: len(steps[r]) for r in ranks}
    out = []
    for i in range(min(counts.values(), default=0)):
        row = {r: steps[r][i] for r in ranks}
        first = row[ranks[0]]
        site, n = first["site"], first["n"]
        differ = {key: _disagree(row, key) for key in ("params_before", "grads", "params_after")}
        if differ["params_before"]:
            when = "before the first optimizer step" if i == 0 else f"between optimizer steps {n - 1} and {n}"
            out.append(Finding("params", site, f"parameters differ across ranks {when} ({differ['params_before']})",
                               "wrap the model in DistributedDataParallel before training (it copies rank 0's "
                               "weights to every rank) and never change weights on some ranks only"))
        elif differ["grads"]:
            ddp, synced = first.get("ddp_forwards", 0), first.get("synced_forwards", 0)
            if ddp and not synced:
                why = (f"all {ddp} forward passes of this step ran inside no_sync(), so DDP never all-reduced "
                       "the gradients")
                fix = ("leave no_sync() for the last micro-step before optimizer.step() "
                       "(with ddpkit: ddpkit.accumulate(model, sync=loader.step_end))")
            elif not ddp:
                why = "no forward pass of this step went through DistributedDataParallel"
                fix = "call the DDP-wrapped model (not model.module) in the training step, on every rank"
            else:
                why = "they were changed on some ranks after DDP all-reduced them (a rank-local gradient)"
                fix = ("make every rank compute the same loss terms through the DDP model; do not edit .grad "
                       "on some ranks only, and do not branch on the rank around backward")
            out.append(Finding("grads", site, f"gradients differ across ranks at optimizer step {n} "
                               f"({differ['grads']}): {why}", fix))
        elif differ["params_after"]:
            out.append(Finding("params", site, f"optimizer step {n} turned identical gradients into different "
                               f"parameters ({differ['params_after']})",
                               "give every rank the same optimizer settings (learning rate, weight decay) and state"))
        else:
            continue
        break  # later steps differ as a consequence; the first difference is the cause
    if len(set(counts.values())) > 1 and not _joined(records):
        first_site = next((s[0]["site"] for s in steps.values() if s), "<unknown>")
        out.append(Finding("steps", first_site, "ranks made different numbers of optimizer steps ("
                           + ", ".join(f"rank {r}: {c}" for r, c in counts.items()) + ")",
                           "every rank must run the same number of steps per epoch (shard with "
                           "DistributedSampler or ddpkit.loader, drop_last=True)"))
    return out


def _disagree(row: dict[int, dict[str, Any]], key: str) -> str | None:
    """None when every rank has the same row[r][key]; else which ranks agree, e.g. 'rank 0 vs rank 1'."""
    by_value: dict[Any, list[int]] = {}
    for rank, event in row.items():
        by_value.setdefault(event.get(key), []).append(rank)
    if len(by_value) == 1:
        return None
    return " vs ".join("ranks " + ",".join(map(str, rs)) if len(rs) > 1 else f"rank {rs[0]}"
                       for rs in by_value.values())


def _key(call: dict[str, Any]) -> tuple:
    return (call["op"], tuple(call["shapes"]) if call["op"] in _SHAPED else ())


def _show(rank: int, call: dict[str, Any] | None) -> str:
    if call is None:
        return f"rank {rank} never issued it"
    shapes = f" {', '.join(call['shapes'])}" if call["shapes"] else ""
    return f"rank {rank} {call['op']}{shapes} at {call['site']}"


def check_collectives(records: Records) -> list[Finding]:
    """Every rank must issue the same collectives, in the same order, with the same shapes."""
    calls = _events(records, "collective")
    ranks = sorted(calls)
    longest = max((len(c) for c in calls.values()), default=0)
    for i in range(longest):
        row = {r: calls[r][i] if i < len(calls[r]) else None for r in ranks}
        keys = {_key(c) if c is not None else None for c in row.values()}
        if len(keys) > 1:
            site = next(c["site"] for c in row.values() if c is not None)
            return [Finding("collectives", site,
                            f"ranks issue different collectives at collective #{i + 1}: "
                            + "; ".join(_show(r, c) for r, c in row.items()),
                            "every rank must call the same collectives in the same order with same-shaped "
                            "tensors; move the collective out of the rank-dependent branch (this is what hangs jobs)")]
    return []


def _iterations(records: Records) -> dict[tuple[int, int], dict[int, dict[str, Any]]]:
    """(loader, iteration) -> rank -> {start: event, idx: [...], src: [(dataset, index)], steps: int,
    complete: bool}; `idx` are the loader's indices, `src` the samples they stand for."""
    out: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for rank, events in records.items():
        for e in events:
            if e["ev"] not in ("epoch_start", "batch", "epoch_end", "epoch_cut"):
                continue
            slot = out.setdefault((e["loader"], e["iter"]), {}).setdefault(
                rank, {"start": None, "idx": [], "src": [], "last_step": None, "complete": False})
            if e["ev"] == "epoch_start":
                slot["start"] = e
            elif e["ev"] == "batch":
                slot["idx"].extend(e["idx"])
                # A record without `src` (samples not resolved): the loader's index, dataset unknown.
                slot["src"].extend(tuple(s) for s in e.get("src", ([-1, i] for i in e["idx"])))
                slot["last_step"] = e["step"]
            elif e["ev"] == "epoch_end":
                slot["complete"] = True
                slot["last_step"] = e["steps"]
            else:
                slot["last_step"] = e["steps"]
    return out


def _training(slot: dict[str, Any]) -> bool:
    start = slot["start"]
    return start is not None and slot["last_step"] is not None and slot["last_step"] > start["step"]


def _joined(records: Records) -> bool:
    """Whether the script trains under DDP's join() (or torch's Join), which allows uneven inputs."""
    return any(e["ev"] == "join" for events in records.values() for e in events)


def _datasets(records: Records) -> dict[int, dict[int, dict[str, Any]]]:
    """rank -> dataset ordinal -> its fingerprint (ddpkit.check.samples.fingerprint)."""
    return {rank: {e["ds"]: e for e in events if e["ev"] == "dataset"} for rank, events in records.items()}


def _shared_samples(a: list[tuple[int, int]], fp_a: dict[int, Any], b: list[tuple[int, int]],
                    fp_b: dict[int, Any]) -> int:
    """How many distinct samples of `a` are also in `b`: the same index of datasets whose fingerprints
    match (a dataset without a fingerprint matches any: the comparison falls back to the index)."""
    in_b: dict[int, set[int]] = {}
    for ds, j in b:
        in_b.setdefault(j, set()).add(ds)
    return sum(any(same_data(fp_a.get(ds), fp_b.get(other)) for other in in_b.get(j, ()))
               for ds, j in set(a))


def check_data(records: Records) -> list[Finding]:
    """Training shards are disjoint within an epoch and equally long, the order changes between epochs,
    eval is unpadded."""
    out: list[Finding] = []
    iterations = _iterations(records)
    fingerprints = _datasets(records)
    joined = _joined(records)
    reported: set[tuple[str, int]] = set()
    for (loader, it), slots in sorted(iterations.items()):
        start = next((s["start"] for s in slots.values() if s["start"] is not None), None)
        if start is None:
            continue
        site = start["site"]
        if any(_training(s) for s in slots.values()):
            batches = {r: s["start"].get("batches") for r, s in sorted(slots.items()) if s["start"] is not None}
            # Uneven inputs are legitimate under DDP's join() (joined ranks shadow the others' all-reduces).
            if len(set(batches.values()) - {None}) > 1 and ("uneven", loader) not in reported and not joined:
                reported.add(("uneven", loader))
                out.append(Finding("data-uneven", site, "ranks have different numbers of batches per epoch ("
                                   + ", ".join(f"rank {r}: {n}" for r, n in batches.items()) + "): DDP pairs "
                                   "each rank's gradient all-reduce with the other ranks', so a rank that runs "
                                   "out of batches starts its next epoch (or leaves) while the others still "
                                   "train, and the job hangs or fails at the end",
                                   "give every rank the same number of batches: the same dataset on every rank "
                                   "with DistributedSampler(dataset) and DataLoader(..., drop_last=True), or "
                                   "equal-sized shards, or ddpkit.loader"))
            padding = max(0, start.get("total_size", 0) - (start.get("dataset_len") or 0))
            pairs = combinations(sorted(slots), 2) if ("overlap", loader) not in reported else ()
            for a, b in pairs:
                shared = _shared_samples(slots[a]["src"], fingerprints.get(a, {}),
                                         slots[b]["src"], fingerprints.get(b, {}))
                if shared > padding:
                    reported.add(("overlap", loader))
                    out.append(Finding("data-overlap", site, f"ranks {a} and {b} trained on {shared} of the "
                                       f"same samples in epoch {it} (of {len(slots[a]['idx'])} each)",
                                       "give each rank a disjoint shard: DataLoader(..., sampler="
                                       "DistributedSampler(dataset)) and no shuffle=, or ddpkit.loader"))
                    break
            previous = iterations.get((loader, it - 1), {})
            for rank, slot in slots.items():
                prev = previous.get(rank)
                if prev is None or ("order", loader) in reported or not _training(prev):
                    continue
                n = min(len(prev["idx"]), len(slot["idx"]))
                shuffled = prev["idx"][:n] != sorted(prev["idx"][:n])
                if n and shuffled and prev["idx"][:n] == slot["idx"][:n]:
                    reported.add(("order", loader))
                    epoch_note = (f" (DistributedSampler.epoch stayed {start.get('epoch')})"
                                  if start.get("distributed") else "")
                    out.append(Finding("data-order", site, f"epochs {it - 1} and {it} shuffled the data in the "
                                       f"same order on rank {rank}{epoch_note}",
                                       "call sampler.set_epoch(epoch) before each epoch's loop (ddpkit.loader "
                                       "does it for you)"))
        elif start.get("distributed") and all(s["complete"] for s in slots.values()):
            total, length = start["total_size"], start["dataset_len"]
            if length is not None and total > length and ("pad", loader) not in reported:
                reported.add(("pad", loader))
                out.append(Finding("eval-padding", site, f"evaluation iterates {total} samples for a dataset of "
                                   f"{length}: DistributedSampler padded {total - length} duplicates "
                                   f"({start['num_replicas']} ranks x {start['num_samples']}), so metrics count "
                                   "them twice", "shard evaluation without padding (ddpkit.eval_loader), or "
                                   "count only the first len(dataset) samples when reducing"))
    return out


def check_saves(records: Records) -> list[Finding]:
    """A checkpoint path must be written by one rank only (usually rank 0)."""
    writers: dict[str, dict[int, str]] = {}
    for rank, events in _events(records, "save").items():
        for e in events:
            if e["path"]:
                writers.setdefault(e["path"], {}).setdefault(rank, e["site"])
    return [Finding("save", next(iter(by_rank.values())), f"{path} is written by {len(by_rank)} ranks "
                    f"({', '.join(map(str, sorted(by_rank)))}): concurrent writes can leave a torn file",
                    "save on rank 0 only (if dist.get_rank() == 0: torch.save(...)), then barrier before "
                    "anyone reads it")
            for path, by_rank in writers.items() if len(by_rank) > 1]


def _by_rank(records: Records, kind: str, key: str) -> dict[str, dict[int, dict[str, Any]]]:
    """event[key] -> rank -> that rank's first such event."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for rank, events in sorted(records.items()):
        for e in events:
            if e["ev"] == kind and e.get(key):
                out.setdefault(e[key], {}).setdefault(rank, e)
    return out


def _ranks(by_rank: dict[int, Any]) -> str:
    return f"{len(by_rank)} ranks ({', '.join(map(str, sorted(by_rank)))})"


def check_writes(records: Records) -> list[Finding]:
    """A file, log directory or tracker run must be written by one rank only (torch.save: check_saves)."""
    saved = {e["path"] for events in records.values() for e in events if e["ev"] == "save"}
    out = []
    for path, by_rank in _by_rank(records, "write", "path").items():
        if len(by_rank) < 2 or path in saved:
            continue
        first = next(iter(by_rank.values()))
        if path.startswith("<"):  # a W&B or MLflow run
            message = f"{path[1:-1]} is started by {_ranks(by_rank)} ({first['what']}): one run per rank"
            fix = "start the run and log on rank 0 only (if rank == 0: ...), or use ddpkit.MetricsLog"
        else:
            message = (f"{path} is written by {_ranks(by_rank)} ({first['what']}): the ranks overwrite or "
                       "interleave each other's writes, and a rank that reads it back may see a torn file")
            fix = ("write it on rank 0 only (if rank == 0: ...), then barrier before any rank reads it; or give "
                   "each rank its own file (a name with the rank in it)")
        out.append(Finding("write", first["site"], message, fix))
    return out


def check_downloads(records: Records) -> list[Finding]:
    """A download must run on one rank (then a barrier), not on every rank at once."""
    out = []
    for url, by_rank in _by_rank(records, "download", "url").items():
        if len(by_rank) < 2:
            continue
        first = next(iter(by_rank.values()))
        out.append(Finding("download", first["site"], f"{url} is downloaded by {_ranks(by_rank)} ({first['what']}): "
                           "every rank fetches and writes the same files at once",
                           "download on rank 0 only, then barrier, then load on every rank: if rank == 0: "
                           "fetch (torchvision: Dataset(..., download=True)); dist.barrier(); then "
                           "Dataset(..., download=False) on every rank"))
    return out


def check_host_tensors(records: Records) -> list[Finding]:
    """Under NCCL a collective's tensors must be on the GPU: a tensor that stays in host memory there fails."""
    by_site: dict[tuple[str, str], dict[int, list[str]]] = {}
    for rank, events in sorted(records.items()):
        for e in events:
            if e["ev"] == "host_tensor":
                by_site.setdefault((e["site"], e["op"]), {})[rank] = e["shapes"]
    out = []
    for (site, op), ranks in by_site.items():
        shapes = ", ".join(next(iter(ranks.values())))
        who = f"rank {next(iter(ranks))}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))
        out.append(Finding("device", site, f"{who} pass a CPU tensor ({shapes}) to {op}, but the process group is "
                           "NCCL, which takes GPU tensors only: on GPUs this call fails with \"No backend type "
                           "associated with device type cpu\"",
                           "create the tensor on the rank's device (torch.tensor(..., device=device)) or move it "
                           "there (.to(device)) before the collective"))
    return out


def check_errors(records: Records) -> list[Finding]:
    """A rank that raised; CUDA-only code is named as such (it cannot be checked on CPU ranks)."""
    out = []
    for rank, events in sorted(records.items()):
        end = next((e for e in events if e["ev"] == "end"), None)
        if end is None or end["status"] != "error":
            continue
        error = end.get("error", "")
        if "cuda" in error.lower() or "nccl" in error.lower():
            out.append(Finding("error", end.get("site") or "<unknown>", f"rank {rank} needs CUDA here, which "
                               f"ddpkit check cannot map to CPU: {error}",
                               "guard the call with torch.cuda.is_available(), or run the check on a GPU machine"))
        else:
            out.append(Finding("error", end.get("site") or "<unknown>", f"rank {rank} failed: {error}",
                               "fix the error (the script's own traceback is above)"))
    return out


def analyse(records: Records) -> list[Finding]:
    """All findings, causes first: collectives, gradients/parameters, data, saves, other writes, downloads,
    host tensors, then errors."""
    return (check_collectives(records) + check_steps(records) + check_data(records) + check_saves(records)
            + check_writes(records) + check_downloads(records) + check_host_tensors(records) + check_errors(records))
