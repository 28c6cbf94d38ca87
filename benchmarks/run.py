"""Run the benchmark variants interleaved and print/save figures with ratios to hand-written DDP.

    python benchmarks/run.py [--repeats 3] [--steps 50] [--sweep] [--only main,accum]

Every configuration runs once per repeat, in a rotated order (A B C, B C A, ...), so drift of a
shared machine hits all of them alike; figures are medians over repeats, ratios are taken against
the baseline measured in the same invocation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from stats import aggregate, format_table, ratio, summarise_run  # noqa: E402

__all__ = ["Config", "CONFIGS", "main"]


@dataclass(frozen=True)
class Config:
    name: str
    """Row label."""
    group: str
    """Table it belongs to: main, scaling, accum or sweep."""
    variant: str
    """Script in benchmarks/variants/ (without .py)."""
    launcher: str = "torchrun"
    """'torchrun', 'ddpkit' (ddpkit run) or 'python' (one plain process)."""
    nproc: int = 2
    args: tuple[str, ...] = ()
    options: dict = field(default_factory=dict)
    """ddpkit.wrap keyword arguments (ddpkit variant only)."""


_K4 = ("--accumulation-steps", "4")
CONFIGS = [
    Config("single process (no DDP) 1x64", "main", "single", "python", 1),
    Config("hand-written DDP", "main", "torch_ddp"),
    Config("ddpkit", "main", "ddpkit_ddp", "ddpkit"),
    Config("ddpkit comm='shm' (opt-in shared-memory exchange)", "main", "ddpkit_ddp", "ddpkit", options={"comm": "shm"}),
    Config("ddpkit + shard_optimizer", "main", "ddpkit_ddp", "ddpkit", args=("--shard-optimizer",)),
    Config("Accelerate", "main", "accelerate_ddp"),
    Config("Lightning Fabric", "main", "fabric_ddp"),
    Config("1 process x 128, 2 threads", "scaling", "single", "python", 1, ("--batch-size", "128", "--threads", "2")),
    Config("1 process x 128, 1 thread", "scaling", "single", "python", 1, ("--batch-size", "128")),
    Config("ddpkit, no gradient exchange (floor; wrong results)", "scaling", "ddpkit_ddp", "ddpkit",
           args=("--no-exchange",)),
    Config("hand-written DDP, k=4, no_sync", "accum", "torch_ddp", args=_K4),
    Config("hand-written DDP, k=4, all-reduce every micro-step", "accum", "torch_ddp", args=(*_K4, "--no-skip-sync")),
    Config("ddpkit, k=4, accumulate()", "accum", "ddpkit_ddp", "ddpkit", args=_K4),
    Config("ddpkit, k=4, all-reduce every micro-step", "accum", "ddpkit_ddp", "ddpkit", args=(*_K4, "--no-skip-sync")),
]
BASELINES = {"main": "hand-written DDP", "scaling": "1 process x 128, 2 threads",
             "accum": "hand-written DDP, k=4, no_sync"}
IMPORTS = {
    "ddpkit (bare import)": "import ddpkit",
    "ddpkit (+ init, wrap, loader)": "import ddpkit; ddpkit.init, ddpkit.wrap, ddpkit.loader, ddpkit.accumulate",
    "accelerate": "import accelerate; from accelerate import Accelerator",
    "lightning_fabric": "import lightning_fabric; from lightning_fabric import Fabric",
}


def _argv(cfg: Config, out: str, steps: int) -> list[str]:
    script = str(HERE / "variants" / f"{cfg.variant}.py")
    if cfg.launcher == "python":
        head = [sys.executable, script]
    elif cfg.launcher == "torchrun":
        head = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.nproc}", script]
    else:
        head = [sys.executable, "-m", "ddpkit.cli", "run", f"--nproc-per-node={cfg.nproc}", script]
    tail = ["--out", out, "--steps", str(steps), "--launch-time", str(time.time()), *cfg.args]
    if cfg.options:
        tail += ["--options", json.dumps(cfg.options)]
    return head + tail


def _run_one(cfg: Config, steps: int, tmp: Path, tag: str, timeout: float) -> dict:
    out = str(tmp / f"{tag}.{{rank}}.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    error = _call(_argv(cfg, out, steps), env, timeout)
    if error:
        return {"error": error}
    records = [json.loads(Path(out.replace("{rank}", str(r))).read_text()) for r in range(cfg.nproc)]
    return summarise_run(records)


def _run_sweep(steps: int, tmp: Path, tag: str, timeout: float) -> dict:
    """One job of variants/options_ab.py: every DDP option set, steps interleaved in one process group."""
    out = tmp / f"{tag}.sweep.json"
    argv = [sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node=2", str(HERE / "variants" / "options_ab.py"),
            str(out), str(steps)]
    error = _call(argv, {**os.environ, "OMP_NUM_THREADS": "1"}, timeout)
    return {"error": error} if error else json.loads(out.read_text())


def _call(argv: list[str], env: dict, timeout: float) -> str | None:
    """Run one job; on timeout kill every process it started, wherever it was reparented.

    torchrun starts each rank in a session of its own, so killing the launcher's process group
    misses the ranks, and a rank that outlives its launcher keeps our pipes open. Every process of
    the job carries a tag in its environment, and on timeout each process with that tag is killed.
    """
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.Popen(argv, env={**env, "DDPKIT_BENCH_JOB": tag}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _kill_tagged(tag)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        return f"timed out after {timeout:.0f} s"
    if proc.returncode != 0:
        return f"exit {proc.returncode}: " + (stderr or stdout)[-1500:]
    return None


def _kill_tagged(tag: str) -> None:
    import psutil

    for p in psutil.process_iter():
        try:
            if p.environ().get("DDPKIT_BENCH_JOB") == tag:
                p.kill()
        except (psutil.Error, OSError):
            continue


def _sweep_table(sweeps: list[dict]) -> str:
    import statistics as st

    ref = sweeps[0]["reference"]
    rows = []
    for name, first in sweeps[0]["arms"].items():
        ms = [s["arms"][name]["step_ms"] for s in sweeps]
        per_run_ratio = [s["arms"][name]["step_ms"] / s["arms"][ref]["step_ms"] for s in sweeps]
        diff = max(s["arms"][name]["max_abs_diff_vs_reference"] for s in sweeps)
        rows.append([name, json.dumps(first["options"]), f"{st.median(ms):.1f}", f"{st.median(per_run_ratio):.3f}",
                     f"{min(per_run_ratio):.3f}-{max(per_run_ratio):.3f}", f"{diff:.1e}"])
    fetch = {k: st.median(s["fetch_ms"][k] for s in sweeps) for k in sweeps[0]["fetch_ms"]}
    note = "; ".join(f"{k}: {v:.2f} ms" for k, v in fetch.items())
    return format_table(["option set", "wrap() options", "step ms", "x PyTorch defaults (median of runs)",
                         "range over runs", "max |Δθ| vs PyTorch defaults"], rows) + f"\n\nfetching one batch: {note}"


def _import_times(code: str) -> dict:
    probe = ("import time, json; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
             f"{code}; t2 = time.perf_counter(); print(json.dumps([t1 - t0, t2 - t1]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    torch_s, added_s = json.loads(out.stdout.strip().splitlines()[-1])
    return {"torch_s": torch_s, "added_s": added_s}


def _fmt(value, spec: str) -> str | None:
    return None if value is None else format(value, spec)


def _rows(group: str, agg: dict, names: list[str]) -> tuple[list[str], list[list]]:
    base = agg.get(BASELINES[group])
    header = ["configuration", "step ms (±%)", "x base", "samples/s", "x base", "launch->1st step s", "x base",
              "rank start->1st step s", "peak RSS MB/rank", "x base", "import s", "final loss"]
    rows = []
    for name in names:
        a = agg.get(name)
        if a is None:
            rows.append([name, "failed"] + [None] * (len(header) - 2))
            continue
        r = lambda k: _fmt(ratio(a[k], base[k]) if base else None, ".2f")  # noqa: E731
        rows.append([name, f"{a['step_ms']:.1f} (±{a['step_ms_spread_pct']:.0f})", r("step_ms"),
                     f"{a['samples_per_s']:.0f}", r("samples_per_s"), _fmt(a["launch_s"], ".2f"), r("launch_s"),
                     _fmt(a["start_s"], ".2f"), _fmt(a["peak_rss_mb"], ".0f"), r("peak_rss_mb"),
                     _fmt(a["import_s"], ".2f"), _fmt(a["final_loss"], ".4f")])
    return header, rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="runs of every configuration (interleaved)")
    p.add_argument("--steps", type=int, default=40, help="timed optimizer steps per run (accumulation runs: a quarter)")
    p.add_argument("--only", default="main,scaling,accum,imports",
                   help="comma-separated groups: main, scaling, accum, sweep, imports")
    p.add_argument("--sweep", action="store_true", help="also run the DDP-option A/B job (the 'sweep' group)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds one run may take")
    p.add_argument("--out", default=str(HERE / "results" / "latest.json"), help="where the JSON results go")
    args = p.parse_args(argv)
    groups = set(args.only.split(",")) | ({"sweep"} if args.sweep else set())
    configs = [c for c in CONFIGS if c.group in groups]
    if "scaling" in groups:  # the 2-rank side of the scaling comparison
        configs += [c for c in CONFIGS if c.group == "main" and c.nproc == 2 and c not in configs]
    started, load_before = time.time(), os.getloadavg()
    runs: dict[str, list[dict]] = {c.name: [] for c in configs}
    imports: dict[str, list[dict]] = {k: [] for k in IMPORTS} if "imports" in groups else {}
    sweeps: list[dict] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ddpkit-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for rep in range(args.repeats):
            shift = rep % len(configs) if configs else 0
            for i, cfg in enumerate(configs[shift:] + configs[:shift]):
                steps = max(args.steps // 4, 5) if cfg.group == "accum" else args.steps
                result = _run_one(cfg, steps, tmp, f"r{rep}c{i}", args.timeout)
                status = result.get("error") or f"{result['step_ms']:.1f} ms/step"
                print(f"[{rep + 1}/{args.repeats}] {cfg.name}: {status}", file=sys.stderr, flush=True)
                if "error" in result:
                    failures.append(f"{cfg.name}: {result['error']}")
                else:
                    runs[cfg.name].append(result)
            if "sweep" in groups:
                result = _run_sweep(args.steps * 2, tmp, f"r{rep}", args.timeout * 3)
                print(f"[{rep + 1}/{args.repeats}] option sweep: {result.get('error', 'done')}", file=sys.stderr)
                if "error" in result:
                    failures.append(f"option sweep: {result['error']}")
                else:
                    sweeps.append(result)
            for name, code in IMPORTS.items():
                if name in imports:
                    imports[name].append(_import_times(code))
    agg = {name: aggregate(rs) for name, rs in runs.items() if rs}
    report = []
    for group in ("main", "scaling", "accum"):
        if group not in groups:
            continue
        names = [c.name for c in CONFIGS if c.group == group]
        if group == "scaling":
            names += [c.name for c in CONFIGS if c.group == "main" and c.nproc == 2]
        header, rows = _rows(group, agg, names)
        report.append(f"\n### {group} (ratios to: {BASELINES[group]})\n\n" + format_table(header, rows))
    if sweeps:
        report.append("\n### DDP options, interleaved step by step in one job (ratios to PyTorch's defaults)\n\n"
                      + _sweep_table(sweeps))
    if imports:
        import statistics as st

        rows = [[name, f"{1000 * st.median(r['torch_s'] for r in rs):.0f}",
                 f"{1000 * st.median(r['added_s'] for r in rs):.1f}"] for name, rs in imports.items()]
        report.append("\n### imports (fresh process, median; ms)\n\n"
                      + format_table(["after `import torch`", "torch", "added"], rows))
    text = "\n".join(report)
    print(text)
    for failure in failures:
        print(f"FAILED {failure}", file=sys.stderr)
    result = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "wall_s": time.time() - started,
        "argv": sys.argv[1:] if argv is None else argv,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg(), **_versions()},
        "baselines": BASELINES,
        "aggregate": agg,
        "runs": runs,
        "sweeps": sweeps,
        "imports": imports,
        "failures": failures,
        "report_markdown": text,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nwrote {args.out} ({result['wall_s']:.0f} s)", file=sys.stderr)
    return 1 if failures else 0


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("torch", "ddpkit", "accelerate", "lightning-fabric"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


if __name__ == "__main__":
    sys.exit(main())
