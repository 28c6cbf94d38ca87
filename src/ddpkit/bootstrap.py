"""Rank entry of `ddpkit check` and `ddpkit run --hang-timeout/--profile`: install the probes, then run the script.

    python -m ddpkit.bootstrap [--hang-timeout S --report-dir D] [--device cpu] [--profile
        [--profile-json PATH]] [--record D
        --max-steps N --epoch-steps N --cpu] [-m] TARGET [ARGS...]

torchrun starts this module on every rank; ddpkit's own settings reach it as these arguments.
The script runs unmodified as `__main__` (runpy), with `sys.argv` = [TARGET, *ARGS].
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ddpkit.bootstrap")
    p.add_argument("--hang-timeout", type=float, default=None, help="start the hang watchdog (seconds)")
    p.add_argument("--report-dir", default=None, help="where the watchdog writes rank-N.json reports")
    p.add_argument("--record", default=None, help="directory for ddpkit check's rank-N.jsonl records")
    p.add_argument("--max-steps", type=int, default=0, help="stop every rank after N optimizer steps (0: never)")
    p.add_argument("--epoch-steps", type=int, default=0, help="end each training epoch after N steps (0: never)")
    p.add_argument("--cpu", action="store_true", help="map CUDA/NCCL calls to CPU/gloo")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto",
                   help="cpu: hide the GPUs from this rank, so the script trains on the CPU (ddpkit run "
                        "--nproc-per-node cpu)")
    p.add_argument("--profile", action="store_true",
                   help="profile each optimizer step of ddpkit's loop helpers; rank 0 reports at ctx.close()")
    p.add_argument("--profile-json", default=None, help="also write the profile report as JSON here")
    p.add_argument("-m", "--module", action="store_true", help="TARGET is a module name")
    p.add_argument("target")
    p.add_argument("target_args", nargs=argparse.REMAINDER)
    return p


def run_target(target: str, target_args: list[str], *, module: bool) -> None:
    """Run a script (or module) as `__main__`, as `python SCRIPT ARGS` would."""
    sys.argv = [target, *target_args]
    if module:
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


def _error_site(exc: BaseException) -> str | None:
    from ddpkit.hang import tracer

    tb, site = exc.__traceback__, None
    while tb is not None:
        if tracer.user_frame(tb.tb_frame) is tb.tb_frame:
            site = tracer.format_site(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return site


def _wait_for_peers(folder: Path, world_size: int, timeout_s: float = 10.0) -> None:
    """Leave together: a rank that exits while a peer still finishes its last step breaks the peer's sockets."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(list(folder.glob("rank-*.done"))) < world_size:
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.device == "cpu":
        # CUDA's own contract, read when CUDA first initialises (nothing has touched it yet): with no
        # GPU visible, ddpkit.init(device='auto') and torch.cuda.is_available() both mean the CPU.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from ddpkit.env import read_env

    env = read_env()
    if args.hang_timeout is not None:
        from ddpkit.hang.watchdog import start_watchdog

        report_dir = None if args.report_dir is None else str(Path(args.report_dir) / f"attempt-{env.restart_count}")
        from ddpkit.hang.flightrecorder import enable

        # before the script creates its process group, which reads torch's recorder switches; set
        # on every device without asking CUDA (that would initialise it before the script, which may
        # still set CUDA_VISIBLE_DEVICES): the recorder sees NCCL's and gloo's collectives alike
        enable(report_dir)
        start_watchdog(timeout_s=args.hang_timeout, rank=env.rank, world_size=env.world_size, report_dir=report_dir)
    if args.profile or args.profile_json is not None:
        from ddpkit.profile import request

        request(json_path=args.profile_json)
    if args.record is None:
        run_target(args.target, args.target_args, module=args.module)
        if args.profile or args.profile_json is not None:
            from ddpkit.profile import unused_note

            note = unused_note()
            if note and env.rank == 0:
                print(note, file=sys.stderr)
        return 0

    from ddpkit.check.probes import Recorder, StopCheck
    from ddpkit.runtime import exit_with_launcher

    # `ddpkit check` stops torchrun on Ctrl+C/SIGTERM, and SIGKILLs it if it does not exit: a plain
    # torch script has no ddpkit.init() to tie its rank to torchrun, so the bootstrap does it here.
    exit_with_launcher()

    folder = Path(args.record)
    rec = Recorder(str(folder / f"rank-{env.rank}.jsonl"), max_steps=args.max_steps, epoch_steps=args.epoch_steps)
    rec.write("start", rank=env.rank, world_size=env.world_size, pid=os.getpid())
    if args.cpu:
        from ddpkit.check.cpumap import CpuMapping

        CpuMapping(lambda what, site: rec.write("map", what=what, site=site),
                   lambda op, site, shapes: rec.write("host_tensor", op=op, site=site, shapes=shapes)).install()
    rec.install()

    def finish(status: str, **fields) -> None:
        rec.close(status, **fields)
        (folder / f"rank-{env.rank}.done").touch()

    status, code = "finished", 0
    try:
        run_target(args.target, args.target_args, module=args.module)
    except StopCheck:
        status = "stopped"
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code:
            finish("error", code=code, error=f"SystemExit({e.code!r})", site=_error_site(e))
            raise
    except BaseException as e:
        finish("error", code=1, error="".join(traceback.format_exception_only(type(e), e)).strip(),
               site=_error_site(e))
        raise
    finish(status, code=code)
    _wait_for_peers(folder, env.world_size)
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything checked is recorded. Skip interpreter teardown: when stopped mid-loop the script's
    # process group is still up, and even after a clean finish torch 2.13 + gloo sometimes aborts
    # while freeing its threads at exit ("terminate called without an active exception"), which
    # would turn a correct script's check into a random failure.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
