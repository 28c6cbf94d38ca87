"""A rank that NCCL's watchdog aborts from C++ (SIGABRT) still ends in ddpkit's one line, with the likely cause."""

from __future__ import annotations

import signal

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddpkit import runreport
from ddpkit.launcher import RunConfig


def test_sigabrt_is_explained_in_the_ranks_line(capsys, tmp_path):
    failure = ProcessFailure(local_rank=1, pid=4242, exitcode=-int(signal.SIGABRT), error_file=str(tmp_path / "none"))
    runreport.print_failures(ChildFailedError("train.py", {1: failure}), multi_node=False)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("ddpkit run: rank 1 (local rank 1, pid 4242) was killed by SIGABRT (aborted from C++: "
                               "an NCCL collective timed out")


def test_nccl_flight_recorder_dumps_are_pointed_to(capsys, tmp_path):
    (tmp_path / "attempt-0").mkdir()
    (tmp_path / "attempt-0" / "nccl-trace-rank-0").write_bytes(b"\x80\x02}")
    cfg = RunConfig(target="train.py", hang_timeout_s=5.0, hang_report_dir=str(tmp_path))
    runreport.print_hang_reports(cfg.hang_report_dir, hang_timeout_s=cfg.hang_timeout_s)
    assert "NCCL flight recorder dumps of 1 rank(s)" in capsys.readouterr().err
