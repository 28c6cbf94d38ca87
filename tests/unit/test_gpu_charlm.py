"""benchmarks/gpu_charlm.py's logic, run on CPU with a tiny model: the arms, the figures, the JSON.

The script is meant for one GPU; what it computes from the timings (tokens/s, model FLOPs, MFU,
the ratios) and that its ddpkit arm trains the same model as the plain loop are checked here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_charlm.py"
TINY = ["--device", "cpu", "--d-model", "32", "--layers", "1", "--heads", "2", "--seq-len", "16",
        "--batch-size", "2", "--steps", "2", "--warmup", "1", "--peak-tflops", "0.5"]


def _run(tmp_path, *extra, timeout=120):
    out = tmp_path / "gpu_charlm.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=timeout)
    return proc, out


def test_four_arms_train_the_same_model_and_their_figures_follow_from_the_timings(tmp_path):
    proc, out = _run(tmp_path, "--compile-backend", "aot_eager")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    arms = [(a["arm"], a["compile"]) for a in result["arms"]]
    assert arms == [("plain PyTorch", "no"), ("ddpkit", "no"), ("plain PyTorch", "aot_eager"),
                    ("ddpkit", "aot_eager")]
    # ddpkit at world size 1 adds no wrapper: same weights, same batches, same losses, compiled or not
    assert len({a["final_loss"] for a in result["arms"]}) == 1
    d, layers, seq, batch = 32, 1, 16, 2
    for a in result["arms"]:
        params = round(a["params_m"] * 1e6)
        assert a["tokens_per_s"] == pytest.approx(batch * seq / (a["step_ms"] / 1000))
        # PaLM/nanoGPT's 6N + attention, causal: half of the full 12 * L * T * d; N without the position table
        assert a["matmul_params"] == params - seq * d
        flops_per_token = 6 * (params - seq * d) + 6 * layers * d * seq
        assert a["flops_per_token"] == flops_per_token
        assert a["model_tflops"] == pytest.approx(flops_per_token * a["tokens_per_s"] / 1e12)
        assert a["mfu"] == pytest.approx(a["model_tflops"] / 0.5)
        assert a["peak_mem_gb"] is None  # CUDA memory only
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| loop | compile | step ms (batch fetch included) | tokens/s")
    assert len(table) == 2 + 4
    plain, ddp = result["arms"][0], result["arms"][1]
    assert f"{ddp['tokens_per_s'] / plain['tokens_per_s']:.3f}" in table[3]  # x plain, same compile


def test_time_limit_skips_later_arms_but_always_runs_the_first(tmp_path):
    proc, out = _run(tmp_path, "--compile-backend", "", "--time-limit", "0")
    assert proc.returncode == 0, proc.stderr
    arms = json.loads(out.read_text())["arms"]
    assert [(a["arm"], a["compile"]) for a in arms] == [("plain PyTorch", "no")]
    assert "skipped ddpkit compile=no: past --time-limit" in proc.stderr


@pytest.mark.parametrize("flag, value", [("--steps", "0"), ("--heads", "-1"), ("--warmup", "-2")])
def test_bad_sizes_are_refused_in_one_line(tmp_path, flag, value):
    proc, out = _run(tmp_path, "--compile-backend", "", flag, value, timeout=60)
    assert proc.returncode == 2
    assert f"{flag} must be" in proc.stderr.strip().splitlines()[-1]
    assert not out.exists()



def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_charlm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peaks_tell_the_pcie_and_nvl_cards_from_the_sxm_parts():
    peak = _bench().peak_tflops
    assert peak("NVIDIA H100 80GB HBM3") == 989.0  # SXM
    assert peak("NVIDIA H100 PCIe") == 756.0
    assert peak("NVIDIA H100 NVL") == 835.0
    assert peak("NVIDIA H200") == 989.0  # SXM
    assert peak("NVIDIA H200 NVL") == 835.0
    assert peak("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak("Tesla V100-SXM2-32GB") is None


def test_causal_attention_counts_half_the_score_matrix():
    flops = _bench().flops_per_token
    full = 6 * 1000 + 12 * 2 * 128 * 64  # PaLM's count, for attention over the whole sequence
    assert flops(matmul_params=1000, layers=2, d_model=64, seq_len=128) == full - 6 * 2 * 128 * 64
