"""`ddpkit check SCRIPT [ARGS]`: run the script on CPU ranks under probes and report broken DDP invariants."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ddpkit.check.analysis import Finding, Records, analyse, load_records
from ddpkit.run.launcher import check_target

__all__ = ["CheckConfig", "CheckResult", "Interrupted", "main", "parse_check_args", "bootstrap_argv", "run_check",
           "describe_run"]

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True, kw_only=True)
class CheckConfig:
    """One `ddpkit check` run."""

    target: str
    """The script's path, or a module name when `module` is True."""
    target_args: tuple[str, ...] = ()
    """Arguments for the script, passed through untouched."""
    module: bool = False
    """Run `target` as `python -m target`."""
    nproc_per_node: int = 2
    """CPU ranks (gloo) to run the script on."""
    max_steps: int = 20
    """Optimizer steps after which every rank is stopped (0: let the script finish)."""
    epoch_steps: int = 5
    """End each training epoch after this many optimizer steps, so a short check sees several epochs (0: off)."""
    timeout_s: float = 300.0
    """Wall-clock limit of the whole check; ranks still running are killed and reported."""
    hang_timeout_s: float = 60.0
    """A rank blocked in a collective this long without progress is reported as hung."""
    compare: bool = True
    """Run the script again at world size 1 and compare the figures rank 0 reports (ddpkit.check.figures)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ddpkit check", description="Run SCRIPT on CPU ranks (gloo) for a few "
                                "steps and verify the DDP invariants; exit 1 and name file:line when one breaks.")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=2, help="CPU ranks to run (default 2)")
    p.add_argument("--max-steps", type=int, default=20, help="stop after N optimizer steps (0: run to the end)")
    p.add_argument("--epoch-steps", type=int, default=5,
                   help="end each training epoch after N optimizer steps to see several epochs (0: full epochs)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before the check gives up and kills the ranks")
    p.add_argument("--hang-timeout", type=float, default=60.0,
                   help="seconds a rank may wait in a collective without progress before it is reported as hung")
    p.add_argument("--no-compare", dest="compare", action="store_false",
                   help="skip the world-size-1 run that the figures the script reports are compared with")
    p.add_argument("-m", "--module", action="store_true", help="run SCRIPT as a module, like python -m")
    p.add_argument("target", metavar="SCRIPT", help="training script path (or module name with -m)")
    p.add_argument("target_args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to the script unchanged")
    return p


def parse_check_args(argv: list[str]) -> CheckConfig:
    """argv -> CheckConfig, validated (ValueError naming the flag and the fix)."""
    a = _parser().parse_args(argv)
    check_target(a.target, module=a.module)  # LaunchError is a ValueError
    if a.nproc_per_node < 2:
        raise ValueError(f"--nproc-per-node {a.nproc_per_node}: the invariants compare ranks, pass 2 or more")
    for flag, value in (("--max-steps", a.max_steps), ("--epoch-steps", a.epoch_steps)):
        if value < 0:
            raise ValueError(f"{flag} {value} must be >= 0 (0 turns the limit off)")
    for flag, value in (("--timeout", a.timeout), ("--hang-timeout", a.hang_timeout)):
        if value <= 0:
            raise ValueError(f"{flag} {value} must be > 0 seconds")
    return CheckConfig(target=a.target, target_args=tuple(a.target_args), module=a.module,
                       nproc_per_node=a.nproc_per_node, max_steps=a.max_steps, epoch_steps=a.epoch_steps,
                       timeout_s=a.timeout, hang_timeout_s=a.hang_timeout, compare=a.compare)


def bootstrap_argv(cfg: CheckConfig, workdir: str) -> list[str]:
    """The torchrun argv that starts ddpkit.bootstrap around the script on every rank (pure)."""
    from ddpkit.run.launcher import RunConfig, build_torchrun_argv

    inner = ["--record", str(Path(workdir) / "records"), f"--max-steps={cfg.max_steps}",
             f"--epoch-steps={cfg.epoch_steps}", "--cpu", f"--hang-timeout={cfg.hang_timeout_s:g}",
             "--report-dir", str(Path(workdir) / "hang")]
    if cfg.module:
        inner.append("-m")
    run = RunConfig(target="ddpkit.bootstrap", module=True, nproc_per_node=cfg.nproc_per_node,
                    target_args=(*inner, cfg.target, *cfg.target_args))
    return build_torchrun_argv(run)


class Interrupted(Exception):
    """SIGINT or SIGTERM reached `ddpkit check` while the ranks ran; torchrun and the ranks are stopped."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_noted():
    """Within the block, SIGINT/SIGTERM are appended to the yielded list instead of ending this process.

    torchrun runs in its own session (so a Ctrl+C does not reach it and the ranks half-way), which
    means that nothing stops it when this process dies: the caller must stop it itself. A flag,
    not an exception, so that a second Ctrl+C cannot cut that cleanup short.
    """
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield received
        return
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in _STOP_SIGNALS}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)  # None: set outside Python


def _stop(proc: subprocess.Popen) -> None:
    """Stop torchrun and its ranks: on SIGTERM torchrun terminates the ranks and exits; if it has not
    within 5 s, SIGKILL, and the ranks die with it (the bootstrap ties each rank's life to torchrun's)."""
    for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def _run_ranks(cfg: CheckConfig, workdir: str, log_path: Path) -> tuple[int | None, str]:
    """Start torchrun; returns (exit code or None if killed at the timeout, log text).

    Raises Interrupted, after stopping torchrun and the ranks, when SIGINT or SIGTERM arrives.
    """
    (Path(workdir) / "records").mkdir(parents=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "torch.distributed.run", *bootstrap_argv(cfg, workdir)]
    with open(log_path, "w") as log, _signals_noted() as received:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + cfg.timeout_s
        code: int | None = None
        while not received and time.monotonic() < deadline:
            try:
                code = proc.wait(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                continue
        if code is None:
            _stop(proc)
        if received:
            raise Interrupted(received[0])
    return code, log_path.read_text(errors="replace")


def _all_ranks_finished(records, world_size: int) -> bool:
    ends = [next((e for e in events if e["ev"] == "end"), None) for events in records.values()]
    return len(ends) == world_size and all(e is not None and e["status"] != "error" and not e.get("code")
                                           for e in ends)


def describe_run(records: Records, *, world_size: int, max_steps: int, epoch_steps: int) -> str:
    """What the ranks did, for the report's first line: how many optimizer steps, and how it ended."""
    if not any(records.get(r) for r in range(world_size)):
        return "no rank started the script"
    steps = {r: sum(e["ev"] == "step" for e in records.get(r, [])) for r in range(world_size)}
    counts = set(steps.values())
    if len(counts) > 1:
        when = "after different numbers of optimizer steps (" + ", ".join(
            f"rank {r}: {n}" for r, n in steps.items()) + ")"
    else:
        n = counts.pop()
        when = f"after {n} optimizer step{'s' * (n != 1)}" if n else "before any optimizer step"
    ends = {next((e["status"] for e in records.get(r, []) if e["ev"] == "end"), None) for r in range(world_size)}
    if ends == {"stopped"}:
        out = f"stopped {when} (--max-steps {max_steps})"
    elif ends <= {"stopped", "finished"}:
        out = f"the script ended {when}"
    elif "error" in ends:
        out = f"a rank failed {when}"
    else:
        out = f"the ranks were stopped unfinished {when}"
    if any(e["ev"] == "epoch_cut" for events in records.values() for e in events):
        out += f"; each epoch cut after {epoch_steps} steps (--epoch-steps {epoch_steps})"
    return out


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """What one `ddpkit check` run found."""

    findings: list[Finding]
    """Broken invariants, causes first."""
    notes: list[str]
    """Report lines: CPU mappings ('mapped for CPU: what at file:line') and remarks on what was not checked
    ('note: ...')."""
    code: int | None
    """torchrun's exit code; None when the ranks were killed at --timeout."""
    output: str
    """The ranks' stdout and stderr."""
    summary: str
    """How the run went (describe_run), for the report's first line."""


def _compare_figures(cfg: CheckConfig, records: Records, findings: list[Finding], workdir: str
                     ) -> tuple[list[Finding], list[str]]:
    """Run the script at world size 1 and compare what rank 0 reports with `records` (world size N).

    Raises Interrupted like _run_ranks.
    """
    from ddpkit.check.figures import compare_figures

    if not cfg.compare:
        return [], ["figures the script reports were not compared with a world-size-1 run (--no-compare)"]
    if not any(e["ev"] == "report" for e in records.get(0, [])):
        return [], []
    if any(f.kind in ("error", "hang") for f in findings):
        return [], ["figures the script reports were not compared with a world-size-1 run: the run failed"]
    folder = Path(workdir) / "reference"
    code, _ = _run_ranks(replace(cfg, nproc_per_node=1), str(folder), folder / "output.log")
    reference = load_records(folder / "records")
    if code != 0 and not _all_ranks_finished(reference, 1):
        why = "timed out" if code is None else f"failed with exit code {code}"
        return [], [f"figures the script reports were not compared: its world-size-1 run {why}"]
    result = compare_figures(reference, records, cfg.nproc_per_node)
    notes = [f"figures rank 0 reports: {result.compared} compared with a world-size-1 run"
             + (" (" + ", ".join(f"{n} {why}" for why, n in sorted(result.skipped.items())) + " not compared)"
                if result.skipped else "")]
    if result.uncompared_sites:
        shown = result.uncompared_sites[:5]
        more = len(result.uncompared_sites) - len(shown)
        notes.append("not compared: " + "; ".join(shown) + (f"; and {more} more lines" if more > 0 else ""))
    return result.findings, notes


def run_check(cfg: CheckConfig) -> CheckResult:
    """Run the check (raises Interrupted on SIGINT/SIGTERM, after the ranks are stopped)."""
    from ddpkit.hang.watchdog import collect_reports, summarize

    with tempfile.TemporaryDirectory(prefix="ddpkit-check-") as workdir:
        code, output = _run_ranks(cfg, workdir, Path(workdir) / "output.log")
        records = load_records(Path(workdir) / "records")
        reports = collect_reports(Path(workdir) / "hang")  # no folder: no reports
        findings = analyse(records)
        if reports:
            findings.append(Finding("hang", next((r["site"] for r in reports.values() if r.get("site")),
                                                 "<unknown>"),
                                    "ranks stopped making progress: "
                                    + "; ".join(summarize(reports, cfg.nproc_per_node)),
                                    "make every rank reach the same collectives (see the collective finding, if any)"))
        elif code is None:
            findings.append(Finding("hang", "<unknown>", f"the ranks did not finish within --timeout "
                                    f"{cfg.timeout_s:g} s and were killed",
                                    "raise --timeout if the script is just slow to start"))
        notes = []
        if code not in (0, None) and not findings:
            if _all_ranks_finished(records, cfg.nproc_per_node):
                # Every rank recorded a clean end before exiting: a non-zero exit after that is torch's
                # teardown at interpreter exit (gloo sometimes aborts there), not what the check verifies.
                notes.append(f"note: every rank finished its checked steps, then the job exited with code {code} "
                             "during process teardown")
            else:
                findings.append(Finding("error", "<unknown>", f"the ranks failed with exit code {code}",
                                        "see the script's output above"))
        figures, figure_notes = _compare_figures(cfg, records, findings, workdir)
    findings += figures
    notes += [f"mapped for CPU: {e['what']} at {e['site']}" for e in records.get(0, []) if e["ev"] == "map"]
    notes += [f"note: {n}" for n in figure_notes]
    steps = max((sum(e["ev"] == "step" for e in ev) for ev in records.values()), default=0)
    if steps == 0 and not findings:
        notes.append("note: no optimizer step was seen: the parameter and gradient checks did not run")
    summary = describe_run(records, world_size=cfg.nproc_per_node, max_steps=cfg.max_steps,
                           epoch_steps=cfg.epoch_steps)
    return CheckResult(findings=findings, notes=notes, code=code, output=output, summary=summary)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cfg = parse_check_args(argv)
    except ValueError as e:
        print(f"ddpkit check: error: {e}", file=sys.stderr)
        return 2
    try:
        result = run_check(cfg)
    except Interrupted as e:
        print(f"ddpkit check: stopped by {signal.Signals(e.signum).name}; all ranks were terminated",
              file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:  # before the ranks started or after they ended: nothing is left running
        print("ddpkit check: interrupted", file=sys.stderr)
        return 130
    findings, notes, output = result.findings, result.notes, result.output
    print(f"ddpkit check: {cfg.target} on {cfg.nproc_per_node} CPU ranks (gloo), {result.summary}")
    for note in notes:
        print(f"  {note}")
    if not findings:
        print("ddpkit check: no problems found")
        return 0
    if any(f.kind in ("error", "hang") for f in findings):
        tail = output.strip().splitlines()[-40:]
        print("--- last lines of the ranks' output ---\n" + "\n".join(tail) + "\n---")
    print(f"ddpkit check: {len(findings)} problem{'s' * (len(findings) > 1)} found")
    for f in findings:
        print(f"  {f.site}: [{f.kind}] {f.message}\n      fix: {f.fix}")
    return 1
