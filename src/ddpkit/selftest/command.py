"""`ddpkit test`: check this machine for DDP before a long job - every GPU (or N CPU ranks), in under a minute.

Single node only: the ranks run on this machine; links between nodes are not checked.

    ddpkit test [--nproc-per-node N|auto|cpu] [--format table|json] [--checkpoint-dir DIR]

The ranks run `ddpkit.selftest.checks` under `ddpkit run`'s own launcher (torchrun in this process);
this module picks the ranks, collects their verdicts and prints one table (or one JSON object,
whose fields docs/gpu.md lists). The exit status is 0 when every check passed on every rank, 1
when one failed (or a rank died), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["main", "merge_results", "format_table", "link_type", "plan_ranks"]


def plan_ranks(value: str, *, num_gpus: int, num_cpus: int, device: str = "auto",
               environ: Mapping[str, str] | None = None, oversubscribe: bool = False,
               memory_bytes: int | None = None) -> tuple[int, str]:
    """(ranks, device) for --nproc-per-node: every visible GPU by default; CPU ranks with 'cpu', --device cpu
    or without GPUs (up to 4, one per core, as `ddpkit run`). Raises LaunchError with the fix."""
    from ddpkit.run.launcher import default_nproc_per_node, resolve_nproc_per_node

    environ = os.environ if environ is None else environ
    if value == "cpu" or device == "cpu" or num_gpus == 0:
        if value in ("auto", "cpu"):
            return default_nproc_per_node(0, num_cpus), "cpu"
        return resolve_nproc_per_node(value, num_gpus=0, num_cpus=num_cpus, environ=environ,
                                      oversubscribe=oversubscribe, memory_bytes=memory_bytes), "cpu"
    return resolve_nproc_per_node(value, num_gpus=num_gpus, num_cpus=num_cpus, environ=environ), "cuda"


_PCIE = {"PIX": "one PCIe switch", "PXB": "several PCIe switches", "PHB": "a PCIe host bridge",
         "NODE": "PCIe within a NUMA node", "SYS": "PCIe across NUMA nodes (SMP interconnect)"}
_PCIE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")  # fastest first


def _speed(link: str) -> tuple[int, int]:
    """Sort key, larger is faster: NVLink by its link count (NV18 > NV4), then the PCIe paths."""
    if link.startswith("NV") and link[2:].isdigit():
        return (2, int(link[2:]))
    if link in _PCIE_ORDER:
        return (1, -_PCIE_ORDER.index(link))
    return (0, 0)


def _describe_link(link: str) -> str:
    return f"NVLink ({link}" if link.startswith("NV") else f"PCIe: {_PCIE.get(link, link)} ({link}"


def link_type(device: str, num_ranks: int, *, topo: str | None = None, visible: str | None = None) -> str:
    """The link the ranks' all-reduce crosses, as far as this machine tells (`nvidia-smi topo -m` on GPUs).

    Every pair of the ranks' GPUs is read (`visible`: CUDA_VISIBLE_DEVICES, which picks them by
    physical index; default the first `num_ranks`): a ring all-reduce runs at its slowest link's
    speed, so that link is named, with the fastest when they differ.
    """
    if device == "cpu":
        return "shared memory / loopback (one host)"
    if num_ranks < 2:
        return "one GPU (no link crossed)"
    if topo is None:
        exe = shutil.which("nvidia-smi")
        if exe is None:
            return "unknown (nvidia-smi not found)"
        try:
            topo = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return "unknown (nvidia-smi topo failed)"
    import re

    lines = [line.split() for line in topo.splitlines() if line.strip()]
    header = next((cells for cells in lines if cells and re.fullmatch(r"GPU\d+", cells[0])
                   and len(cells) > 1 and re.fullmatch(r"GPU\d+", cells[1])), None)
    if header is None:
        return "unknown (no GPU columns in nvidia-smi topo -m)"
    columns = [c for c in header if re.fullmatch(r"GPU\d+", c)]
    rows = {cells[0]: cells[1:1 + len(columns)] for cells in lines
            if re.fullmatch(r"GPU\d+", cells[0]) and len(cells) > len(columns) and cells is not header}
    ids = [part.strip() for part in (visible or "").split(",") if part.strip()]
    used = [f"GPU{i}" for i in (ids if ids and all(i.isdigit() for i in ids) else range(num_ranks))][:num_ranks]
    pairs = {}
    for n, a in enumerate(used):
        for b in used[n + 1:]:
            if a not in rows or b not in columns:
                return f"unknown (no {a} row in nvidia-smi topo -m)"
            pairs[(a, b)] = rows[a][columns.index(b)]
    slowest = min(pairs.items(), key=lambda item: _speed(item[1]))
    fastest = max(pairs.items(), key=lambda item: _speed(item[1]))
    (a, b), link = slowest
    if len(pairs) == 1:
        return f"{_describe_link(link)} between {a} and {b})"
    if _speed(link) == _speed(fastest[1]):
        return f"{_describe_link(link)} between every pair of the {len(used)} GPUs)"
    return (f"{_describe_link(link)} between {a} and {b}, the slowest of {len(pairs)} pairs; "
            f"fastest {fastest[1]} between {fastest[0][0]} and {fastest[0][1]})")


def merge_results(per_rank: dict[int, dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
    """One verdict per check: ok only if ok on every rank; the detail of the first rank that failed, else rank 0's."""
    from ddpkit.selftest.checks import CHECKS

    merged = []
    for name in CHECKS:
        entries = {r: next((c for c in res["checks"] if c["name"] == name), None) for r, res in per_rank.items()}
        missing = sorted(set(range(world_size)) - {r for r, c in entries.items() if c is not None})
        failed = sorted(r for r, c in entries.items() if c is not None and not c["ok"])
        if failed:
            detail = f"rank {failed[0]}: {entries[failed[0]]['detail']}"
        elif missing:
            detail = f"no result from rank(s) {missing} (the rank exited or hung before this check)"
        else:
            detail = entries[0]["detail"] if 0 in entries else next(iter(entries.values()))["detail"]
        seconds = max((c["seconds"] for c in entries.values() if c is not None), default=None)
        merged.append({"name": name, "ok": not failed and not missing, "detail": detail, "seconds": seconds,
                       "failed_ranks": failed + missing})
    return merged


SCOPE = ("single node: this machine's GPUs (or CPU ranks) only; the network between nodes and "
         "multi-node rendezvous are not checked")
"""What `ddpkit test` covers, printed under the table and given as `scope` in the JSON."""


def format_table(report: dict[str, Any]) -> str:
    """The terminal table: one line per check, then the bandwidth rows and the verdict."""
    width = max(len(c["name"]) for c in report["checks"])
    lines = [f"ddpkit test: {report['world_size']} rank(s) on {report['device']} ({report['backend']}), "
             f"torch {report['torch']}, link: {report['link']}", ""]
    lines.append(f"  {'check'.ljust(width)}  result  detail")
    for c in report["checks"]:
        lines.append(f"  {c['name'].ljust(width)}  {'ok' if c['ok'] else 'FAIL':6}  {c['detail']}")
    if report["bandwidth"]:
        lines += ["", f"  all-reduce (nccl-tests convention, busbw = algbw * 2(n-1)/n; link: {report['link']})",
                  f"  {'size':>10}  {'time':>10}  {'algbw':>11}  {'busbw':>11}"]
        for row in report["bandwidth"]:
            size = f"{row['bytes'] / 2**20:g} MiB"
            lines.append(f"  {size:>10}  {row['time_us']:>8.0f}us  {row['algbw_gbps']:>6.2f} GB/s  "
                         f"{row['busbw_gbps']:>6.2f} GB/s")
    failed = [c["name"] for c in report["checks"] if not c["ok"]]
    verdict = f"all {len(report['checks'])} checks passed" if not failed else "FAILED: " + ", ".join(failed)
    lines += ["", f"ddpkit test: {verdict} in {report['seconds']:.1f} s", f"ddpkit test: {SCOPE}"]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddpkit test", description="Check this machine's GPUs (or CPU ranks), "
                                "backend and DDP path end to end, in under a minute (this node only).")
    p.add_argument("--nproc-per-node", default="auto",
                   help="ranks: a number, 'auto' (every visible GPU; without GPUs up to 4 CPU ranks) or 'cpu'")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto",
                   help="cpu: run CPU ranks (gloo) even where GPUs are visible")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output on stdout")
    p.add_argument("--checkpoint-dir", default=None,
                   help="where the checkpoint round trip writes (default: a temporary directory, removed afterwards)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="start more CPU ranks than this machine's cores or memory hold (refused otherwise)")
    p.add_argument("--hang-timeout", type=float, default=2.0,
                   help="seconds within which the injected skipped collective must be reported")
    p.add_argument("--deadline", type=float, default=120.0, help="a rank still running after this many seconds fails")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    from ddpkit.run.launcher import LaunchError, RunConfig, run_torchrun
    from ddpkit.run.nodes import available_memory, usable_cpus

    if not args.hang_timeout > 0 or not args.deadline > 0:
        print(f"ddpkit test: error: --hang-timeout {args.hang_timeout:g} and --deadline {args.deadline:g} must be "
              "> 0 seconds", file=sys.stderr)
        return 2
    num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        nproc, device = plan_ranks(args.nproc_per_node, num_gpus=num_gpus, num_cpus=usable_cpus(), device=args.device,
                                   oversubscribe=args.oversubscribe, memory_bytes=available_memory())
    except LaunchError as e:
        print(f"ddpkit test: error: {e}", file=sys.stderr)
        return 2
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ddpkit-test-") as tmp:
        rank_args = ["--out", tmp, "--device", device, "--hang-timeout", f"{args.hang_timeout:g}",
                     "--deadline", f"{args.deadline:g}"]
        if args.checkpoint_dir is not None:
            rank_args += ["--checkpoint-dir", args.checkpoint_dir]
        cfg = RunConfig(target="ddpkit.selftest.checks", module=True, target_args=tuple(rank_args), nproc_per_node=nproc)
        code = run_torchrun(cfg)
        per_rank = {}
        for path in Path(tmp).glob("rank-*.json"):
            result = json.loads(path.read_text())
            per_rank[int(result["rank"])] = result
    first = per_rank.get(0, {})
    report = {
        "ok": False, "world_size": nproc, "device": device, "backend": first.get("backend", "?"),
        "torch": torch.__version__,
        "link": link_type(device, nproc, visible=os.environ.get("CUDA_VISIBLE_DEVICES")), "launcher_exit_code": code,
        "seconds": round(time.monotonic() - start, 2), "scope": SCOPE,
        "checks": merge_results(per_rank, nproc), "bandwidth": first.get("bandwidth", []),
    }
    report["ok"] = code == 0 and all(c["ok"] for c in report["checks"])
    print(json.dumps(report, indent=1) if args.format == "json" else format_table(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
