"""benchmarks/gpu_check.py's CPU logic: the item runner, its child-process protocol, the verdicts, the table, the JSON.

The CUDA items themselves only run on a GPU; here they must be reported as "needs GPU", never skipped.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_check", None)


def test_every_cuda_item_is_reported_as_needing_a_gpu_on_cpu(gc, tmp_path, capsys):
    out = tmp_path / "gpu_check.json"
    code = gc.main(["--skip", "selftest,first_bucket", "--out", str(out)])
    assert code == 0  # nothing failed: nothing could run
    report = json.loads(out.read_text())
    names = [r["item"] for r in report["items"]]
    assert names == [i.name for i in gc.ITEMS if i.name not in ("selftest", "first_bucket")]
    assert {r["verdict"] for r in report["items"]} == {"needs GPU"}
    assert report["summary"] == {"OK": 0, "BUG": 0, "ERROR": 0, "needs GPU": len(names)}
    assert report["device"].startswith("cpu") and report["date"] and report["torch"]
    text = capsys.readouterr().out
    assert "needs GPU: 12" in text and "1 hang forensics on NCCL" in text and "charlm throughput / MFU" in text


def test_the_runner_turns_every_outcome_into_a_verdict(gc, tmp_path):
    item = gc.Item("x", "0 example", needs_gpu=False)

    def broken(tmp):
        raise RuntimeError("the item itself failed")

    assert gc.run_item(item, has_gpu=False, tmp=str(tmp_path), runner=lambda tmp: ("BUG", "shown", {"n": 1})) \
        | {"seconds": 0} == {"item": "x", "checks": "0 example", "verdict": "BUG", "detail": "shown",
                             "figures": {"n": 1}, "seconds": 0}
    assert gc.run_item(item, has_gpu=False, tmp=str(tmp_path), runner=broken)["detail"] == \
        "RuntimeError: the item itself failed"
    gpu_item = gc.Item("y", "1 gpu only", needs_gpu=True)
    result = gc.run_item(gpu_item, has_gpu=False, tmp=str(tmp_path), runner=broken)  # never called
    assert result["verdict"] == "needs GPU"


def test_an_item_runs_in_its_own_process_and_reports_back(gc, tmp_path):
    item = next(i for i in gc.ITEMS if i.name == "first_bucket")  # the one item that also runs on CPU
    result = gc.run_item(item, has_gpu=False, tmp=str(tmp_path))
    assert result["verdict"] in ("OK", "BUG"), result
    assert "bucket_bytes_cap_default" in result["detail"]
    assert result["figures"]["bucket_bytes_cap_default"]["bucket_cap_mb=25 passed"] is False
    slow = gc.Item("first_bucket", "5 DDP first bucket", needs_gpu=False, timeout_s=0.01)
    assert gc.run_item(slow, has_gpu=False, tmp=str(tmp_path)) | {"seconds": 0} == {
        "item": "first_bucket", "checks": "5 DDP first bucket", "verdict": "ERROR", "detail": "timed out after 0.01 s",
        "figures": {}, "seconds": 0}


def test_a_bug_makes_the_command_fail(gc, tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "run_item", lambda item, **kw: {"item": item.name, "checks": item.defect, "verdict": "BUG",
                                                            "detail": "d", "figures": {}, "seconds": 0.0})
    out = tmp_path / "r.json"
    assert gc.main(["--skip", "selftest,charlm", "--out", str(out)]) == 1
    assert json.loads(out.read_text())["summary"]["BUG"] == len(gc.ITEMS) - 2
    with pytest.raises(SystemExit):
        gc.main(["--skip", "nonsense"])


def test_verdict_table(gc):
    rows = [{"checks": "1 hang forensics on NCCL", "verdict": "OK", "detail": "named train.py:3"},
            {"checks": "2 abort", "verdict": "needs GPU", "detail": "not run"}]
    lines = gc.verdict_table(rows).splitlines()
    assert lines[1].split()[-3:] == ["OK", "named", "train.py:3"]
    assert lines[-1] == "OK: 1  BUG: 0  ERROR: 0  needs GPU: 1"


def test_the_busy_stream_keeps_its_work_in_few_long_kernels(gc):
    # CUDA queues about a thousand launches before the host blocks: 4 s of 0.2 ms matmuls (20,000
    # launches) would leave the host waiting at launch and only ~0.2 s of work queued afterwards.
    with pytest.raises(ValueError, match="more than the 256 the launch queue takes"):
        gc.busy_plan(0.0002, 4.0)
    assert gc.busy_plan(0.1, 4.0) == 40 and gc.busy_plan(5.0, 4.0) == 1
    assert gc.busy_plan(4.0 / gc.QUEUE_KERNELS, 4.0) <= gc.QUEUE_KERNELS


def test_charlm_gets_what_the_budget_leaves(gc):
    assert gc.charlm_time_limit(30.0, 225.0) == 90.0
    assert gc.charlm_time_limit(120.0, 225.0) == 60.0
    assert gc.charlm_time_limit(220.0, 225.0) == 10.0


def test_a_torch_outside_the_gate_is_checked_against_the_documented_fallback(gc, monkeypatch):
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from ddpkit import torchinternals

    monkeypatch.setattr(torchinternals, "torch_version", lambda: Version("2.11.0"))
    monkeypatch.setattr(torchinternals, "READ_AGAINST", SpecifierSet(">=2.13"))
    gated, why = gc._gated()
    assert not gated and "torch 2.11.0 is outside" in why
    monkeypatch.setattr(torchinternals, "torch_version", lambda: Version("2.13.0"))
    assert gc._gated() == (True, "")
