"""Minimal reproductions of the torch gaps ddpkit's rendezvous patches answer, on the installed torch.

    python tools/torch_bug_repros.py                  # every case
    python tools/torch_bug_repros.py restart node-rank  # some
    python tools/torch_bug_repros.py --keep /tmp/logs restart  # and keep the launchers' logs

Each case runs plain torchrun (torch's own c10d rendezvous, no ddpkit), then, as the control, the same
job under `ddpkit run` (ddpkit's patched backend), on loopback CPU ranks (gloo), and prints one line:
whether torch alone still shows the problem. docs/releases.md keeps the results per torch release.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = r'''
import json, os, sys, time
import torch, torch.distributed as dist

out, case = sys.argv[1], sys.argv[2]
rank, attempt = int(os.environ["RANK"]), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
record = {"rank": rank, "attempt": attempt, "launcher": os.getppid(), "group_rank": os.environ.get("GROUP_RANK")}
if case == "restart" and attempt == 1 and rank == 1:
    time.sleep(3)  # a rank that starts late after the restart (slow import, busy host)
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
record["sum"] = t.item()
with open(os.path.join(out, f"rank{rank}.attempt{attempt}.json"), "w") as f:
    json.dump(record, f)
if case == "restart" and attempt == 0:
    dist.barrier()
    if rank == 1:
        os._exit(3)  # dies after the group is up: torchrun restarts both ranks
    time.sleep(30)
if case == "listen":
    time.sleep(4)
dist.destroy_process_group()
'''


TORCH_NODES = ["--rdzv-backend=c10d", "--local-addr=127.0.0.1", "--monitor-interval=0.1"]
"""Plain torchrun's flags for "nodes" on one machine (ddpkit run sets the same by itself)."""
TORCH_ONE_NODE = [*TORCH_NODES, "--rdzv-endpoint=127.0.0.1:0"]
JOIN_TIMEOUT_S = 40
"""nnodes-mismatch: failing before this, naming the mismatch, is failing at once (process start-up included)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    return env


def _launcher(ddpkit: bool, flags: list[str], worker: Path, out: Path, case: str, log: Path) -> subprocess.Popen:
    head = [sys.executable, "-m", "ddpkit.cli", "run"] if ddpkit else [sys.executable, "-m", "torch.distributed.run"]
    with open(log, "w") as f:
        return subprocess.Popen([*head, *flags, str(worker), str(out), case], stdout=f, stderr=subprocess.STDOUT,
                                env=_env(), start_new_session=True)


def _finish(procs: list[subprocess.Popen], timeout: float) -> list[int | None]:
    deadline = time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    return codes


def _records(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]


def _tail(log: Path, needles: tuple[str, ...]) -> str:
    """The last log line holding the first of `needles` that occurs (most telling first)."""
    lines = log.read_text(errors="replace").splitlines()
    for needle in needles:
        found = [line.strip() for line in lines if needle in line]
        if found:
            return found[-1][:200]
    return ""


def restart(tmp: Path, worker: Path, ddpkit: bool) -> tuple[bool, str]:
    """pytorch/pytorch#135712: after --max-restarts restarts the ranks, they reuse the old store."""
    out = tmp / "out"
    out.mkdir()
    flags = ["--nnodes=1", "--nproc-per-node=2", "--max-restarts=1", *([] if ddpkit else TORCH_ONE_NODE)]
    log = tmp / "log"
    (code,) = _finish([_launcher(ddpkit, flags, worker, out, "restart", log)], 120)
    done = [r for r in _records(out) if r["attempt"] == 1]
    ok = code == 0 and len(done) == 2
    why = (_tail(log, ("connectFullMesh", "Connection refused", "Timed out", "Error:")) if not ok
           else "both ranks trained after the restart")
    return not ok, f"exit {code}, {len(done)}/2 ranks done after the restart; {why}"


def node_rank(tmp: Path, worker: Path, ddpkit: bool) -> tuple[bool, str]:
    """c10d numbers the nodes by address, then process id, ignoring --node-rank."""
    out = tmp / "out"
    out.mkdir()
    port = _free_port()
    procs = []
    for rank in (1, 0):  # node rank 1 starts first: the lower process id
        flags = ["--nnodes=2", f"--node-rank={rank}", "--nproc-per-node=1", f"--rdzv-endpoint=127.0.0.1:{port}",
                 *(["--rdzv-timeout=60"] if ddpkit else [*TORCH_NODES, "--rdzv-conf=join_timeout=60"])]
        procs.append(_launcher(ddpkit, flags, worker, out, "node-rank", tmp / f"log{rank}"))
        time.sleep(1.5)
    codes = _finish(procs, 150)
    by_launcher = {r["launcher"]: r["rank"] for r in _records(out)}
    first = by_launcher.get(procs[1].pid)  # the global rank of a rank of the --node-rank 0 launcher
    if codes != [0, 0] or first is None:
        return True, f"exits {codes}: did not train"
    return first != 0, f"the --node-rank 0 launcher holds global rank {first}"


def nnodes_mismatch(tmp: Path, worker: Path, ddpkit: bool) -> tuple[bool, str]:
    """Nodes launched with different --nnodes: torch waits out the join timeout (or trains a wrong world)."""
    out = tmp / "out"
    out.mkdir()
    port = _free_port()
    procs = []
    start = time.monotonic()
    for rank, nnodes in ((0, 2), (1, 3)):
        flags = [f"--nnodes={nnodes}", f"--node-rank={rank}", "--nproc-per-node=1",
                 f"--rdzv-endpoint=127.0.0.1:{port}",
                 *([f"--rdzv-timeout={JOIN_TIMEOUT_S}"] if ddpkit
                   else [*TORCH_NODES, f"--rdzv-conf=join_timeout={JOIN_TIMEOUT_S}"])]
        procs.append(_launcher(ddpkit, flags, worker, out, "nnodes", tmp / f"log{rank}"))
        time.sleep(1.5)
    codes = _finish(procs, 120)
    elapsed = time.monotonic() - start
    named = any("--nnodes" in (tmp / f"log{r}").read_text(errors="replace") for r in (0, 1))
    fast = all(c not in (0, None) for c in codes) and elapsed < JOIN_TIMEOUT_S and named
    trained = len(_records(out))
    return not fast, (f"exits {codes} after {elapsed:.0f} s (join timeout {JOIN_TIMEOUT_S} s), {trained} rank(s) "
                      f"trained, mismatch named: {'yes' if named else 'no'}")


def listen(tmp: Path, worker: Path, ddpkit: bool) -> tuple[bool, str]:
    """torch's TCPStore servers (rendezvous store, the ranks' shared store) listen on every interface."""
    import psutil

    out = tmp / "out"
    out.mkdir()
    flags = ["--nnodes=1", "--nproc-per-node=2", *([] if ddpkit else TORCH_ONE_NODE)]
    proc = _launcher(ddpkit, flags, worker, out, "listen", tmp / "log")
    exposed: set[tuple[str, int]] = set()
    loopback = 0
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                for c in psutil.Process(proc.pid).net_connections(kind="inet"):
                    if c.status == psutil.CONN_LISTEN:
                        if c.laddr.ip.startswith("127.") or c.laddr.ip == "::1":
                            loopback += 1
                        else:
                            exposed.add((c.laddr.ip, c.laddr.port))
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
    finally:
        code = _finish([proc], 60)[0]
    if code != 0 or (not exposed and not loopback):
        return True, f"exit {code}: did not run"
    return bool(exposed), f"the launcher listens on {sorted(exposed) or 'loopback only'}"


CASES = {"restart": restart, "node-rank": node_rank, "nnodes-mismatch": nnodes_mismatch, "listen": listen}


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", metavar="CASE", help=f"cases to run: {', '.join(CASES)} (default: all)")
    p.add_argument("--keep", metavar="DIR", help="keep each run's launcher logs in a folder under DIR")
    args = p.parse_args(argv)
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        p.error(f"no case {', '.join(unknown)}; pick from {', '.join(CASES)}")
    for name in args.cases or CASES:
        for ddpkit in (False, True):
            who = "ddpkit run" if ddpkit else "torchrun"
            tmp = Path(tempfile.mkdtemp(prefix=f"ddpkit-repro-{name}-{who.replace(' ', '-')}-", dir=args.keep))
            try:
                worker = tmp / "worker.py"
                worker.write_text(WORKER)
                started = time.monotonic()
                present, evidence = CASES[name](tmp, worker, ddpkit)
                print(f"torch {torch.__version__} | {name:15} | {who:10} | problem: {'yes' if present else 'no '} | "
                      f"{evidence} ({time.monotonic() - started:.0f} s)", flush=True)
            finally:
                if args.keep is None:
                    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
