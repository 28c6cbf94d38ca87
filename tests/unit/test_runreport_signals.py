"""A rank that NCCL's watchdog aborts from C++ (SIGABRT) still ends in ddpkit's one line, with the likely cause."""

from __future__ import annotations

import signal

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from ddpkit.run import report as runreport
from ddpkit.run.launcher import RunConfig


def test_sigabrt_is_explained_in_the_ranks_line(capsys, tmp_path):
    failure = ProcessFailure(local_rank=1, pid=4242, exitcode=-int(signal.SIGABRT), error_file=str(tmp_path / "none"))
    runreport.print_failures(ChildFailedError("train.py", {1: failure}), multi_node=False)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "DDP's gradient all-reduces and FSDP's included" in lines[0]
    assert lines[0].startswith("ddpkit run: rank 1 (local rank 1, pid 4242) was killed by SIGABRT (aborted from C++: "
                               "an NCCL collective timed out")


def test_nccl_flight_recorder_dumps_are_pointed_to(capsys, tmp_path):
    (tmp_path / "attempt-0").mkdir()
    (tmp_path / "attempt-0" / "nccl-trace-rank-0").write_bytes(b"\x80\x02}")
    cfg = RunConfig(target="train.py", hang_timeout_s=5.0, hang_report_dir=str(tmp_path))
    runreport.print_hang_reports(cfg.hang_report_dir, hang_timeout_s=cfg.hang_timeout_s)
    assert "NCCL flight recorder dumps of 1 rank(s)" in capsys.readouterr().err


def _failed(tmp_path, rank: int, message: str, timestamp: int) -> ProcessFailure:
    import json

    error_file = tmp_path / f"error-{rank}.json"
    error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": str(timestamp)}}}))
    return ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=1, error_file=str(error_file))


def test_the_rank_that_failed_first_is_named_first_with_its_own_error(capsys, tmp_path):
    # rank 0's follow-on error reached the error file a second sooner than rank 1's own error
    failures = {0: _failed(tmp_path, 0, "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                                        "[127.0.0.1]:4711", 1000),
                1: _failed(tmp_path, 1, "FileExistsError: [Errno 17] File exists: 'out'", 1001)}
    runreport.print_failures(ChildFailedError("train.py", failures), multi_node=False)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == ("ddpkit run: rank 1 (local rank 1, pid 101; the first to fail) failed with exit code 1: "
                        "FileExistsError: [Errno 17] File exists: 'out'")
    assert lines[1].startswith("ddpkit run: rank 0 (local rank 0, pid 100) failed with exit code 1: RuntimeError")
