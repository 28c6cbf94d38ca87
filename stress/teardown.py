"""Teardown stress test: run a 2-rank job N times and count clean exits, aborts and hangs.

    python stress/teardown.py --runs 100 --which ddpkit
    python stress/teardown.py --runs 40 --which handwritten

Not part of CI (minutes long). Each run has a 90 s limit; a run past it counts as a hang.
"""

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100)
    p.add_argument("--which", choices=["ddpkit", "handwritten"], default="ddpkit")
    args = p.parse_args()
    script = HERE / ("ddpkit_script.py" if args.which == "ddpkit" else "handwritten_ddp.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    outcome = collections.Counter()
    start = time.monotonic()
    for i in range(args.runs):
        if args.which == "ddpkit":
            cmd = [sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", "2", str(script)]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90, env=env)
            if proc.returncode == 0:
                kind = "exit 0"
            elif "terminate called" in proc.stderr:
                kind = "abort (terminate called)"
            else:
                kind = f"exit {proc.returncode}"
                print(proc.stderr[-2000:], file=sys.stderr)
        except subprocess.TimeoutExpired:
            kind = "hang (>90 s)"
        outcome[kind] += 1
        print(f"run {i + 1}/{args.runs}: {kind}", flush=True)
    print(f"{args.which}: {dict(outcome)} in {time.monotonic() - start:.0f} s")
    return 0 if outcome["exit 0"] == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
