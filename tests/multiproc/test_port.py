"""Ported scripts on 2 gloo ranks: `ddpkit check` passes and the result matches the single-device original.

One `ddpkit check` run per script (it runs the script to its end, so the same launch gives the 2-rank
result); the originals and the ported scripts at world size 1 run in this process.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path

import pytest

from ddpkit.check.command import CheckConfig, run_check
from ddpkit.lint import lint_source
from ddpkit.port import port_source
from ddpkit.port.feeds import NOT_SHARDED

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "port"
# script -> (arguments, the metric its last JSON line reports, tolerance between runs of different data order)
CASES = {
    "argparse_main": ([], "accuracy", 0.06),
    "toplevel_script": (["{tmp}/params.pt"], "accuracy", 0.0),  # shuffle=False: the same global order
    "trainer_class": ([], "accuracy", 0.06),
    "dict_batches": ([], "accuracy", 0.06),
    "amp_scaler": ([], "accuracy", 0.06),
    "checkpoint_resume": (["--ckpt", "{tmp}/ckpt.pt"], "accuracy", 0.06),
    "tqdm_loops": ([], "accuracy", 0.06),
    "running_loss": ([], "accuracy", 0.06),
    "epoch_loss_mean": ([], "accuracy", 0.06),
    # an averaging meter over a sharded evaluation: unreduced, it reports rank 0's half of the test set
    "meter_eval": (["{tmp}/out"], "accuracy", 0.06),
    # two trained modules each: every one must be wrapped, or its copies drift apart and the parameters differ
    "gan_pair": (["{tmp}/params.pt"], "d_real", 1e-4),
    "encoder_decoder": (["--out", "{tmp}/params.pt"], "test_mse", 1e-4),
    "model_list": (["{tmp}/params.pt"], "accuracy", 1e-9),
    "model_passed_in": (["--out", "{tmp}/params.pt"], "mse", 1e-5),
    "digits": (["--epochs", "4", "--batch-size", "64"], "test_accuracy", 0.04),
    # the plain script: an inline test loop, a tensor counter, a split made before seeding, a CSV read back;
    # an unreduced count reports about half the original accuracy on 2 ranks
    "digits_plain": (["--epochs", "3", "--out", "{tmp}/runs"], "test_accuracy", 0.04),
    # no DataLoader: the same full batch on every rank, so the same gradient and the same parameters
    "fullbatch": ([], "accuracy", 1e-6),
    # per-step random draws, one per rank after the script's seed: a global batch of 2 x 16
    "random_batches": (["--steps", "150"], "val_loss", 0.1),
    "device_dataset": ([], "accuracy", 0.06),
    # a loss summed over ranks inside rank 0's log write: every rank joins the sum before the write, or 2 ranks hang
    "rank0_report": (["{tmp}/log.txt"], "loss", 1e-5),
    # a module the optimizer trains but forward never reads: without find_unused_parameters DDP fails at step 2
    "ema_inside": ([], "mse", 1e-4),
    # a writer made on rank 0 only and closed by module-level code after the main block; a file opened by a `with`
    # whose write is rank 0's: every other rank would end on a NameError, or truncate the file
    "rank0_bindings": (["--out", "{tmp}", "--record"], "mse", 1e-5),
    # losses summed over the batch (a criterion's reduction in a constant, size_average=False, torch.sum, .sum()):
    # unscaled, each rank's gradient sums half the batch and DDP averages them: half the original's step
    "summed_loss": (["{tmp}/params.pt"], "loss", 1e-5),
    # an epoch's sum of per-step mean losses reported undivided, and a count made one right answer at a time:
    # summed over ranks the loss would read world_size times the original's; the mean over ranks is it exactly
    "loss_sum_report": ([], "epoch_loss", 1e-4),
    # the model goes to the CPU to be saved after each epoch and back to its device: bound to the bare module on the
    # way out (or left there), training after the first epoch bypasses DDP and the ranks' parameters drift apart
    "device_round_trip": (["{tmp}/params.pt"], "mse", 1e-5),
    "charlm": (["--max-steps", "12", "--eval-every", "6", "--d-model", "32", "--layers", "1", "--heads", "2",
                "--seq-len", "32", "--data-bytes", "60000", "--val-bytes", "8000", "--batch-size", "16"],
               "val_bpc", 0.1),
}
UNSHARDED = {"fullbatch"}
"""Cases with no DataLoader: every rank trains on all of the data (the port says so in one TODO)."""
SAME_ORDER = {"toplevel_script", "gan_pair", "encoder_decoder", "model_list", "model_passed_in", "summed_loss",
              "device_round_trip"}
"""Scripts with shuffle=False and no randomness in the loop: 2 ranks end with the original's parameters."""


def _source(name: str) -> Path:
    return ROOT / "examples" / "plain" / f"{name}.py" if name in ("digits", "charlm") else FIXTURES / f"{name}.py"


def _last_json(text: str, key: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{") and f'"{key}"' in line]
    assert lines, f"no JSON line with {key!r} in:\n{text[-3000:]}"
    return json.loads(lines[-1])


def _run_here(script: Path, args: list[str], key: str, monkeypatch) -> dict:
    """Run a script in this process (world size 1: no launcher variables) and return its JSON result."""
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        runpy.run_path(str(script), run_name="__main__")
    return _last_json(out.getvalue(), key)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", sorted(CASES))
def test_ported_script_passes_check_and_matches_the_original_on_2_ranks(name, tmp_path, monkeypatch):
    import torch

    args, key, tolerance = CASES[name]
    original_args = [a.format(tmp=tmp_path / "original") for a in args]
    ported_args = [a.format(tmp=tmp_path / "ported") for a in args]
    for sub in ("original", "ported", "ws1"):
        (tmp_path / sub).mkdir()
    ported = tmp_path / f"{name}_ddp.py"
    result = port_source(_source(name).read_text(), str(_source(name)))
    # (full-batch training ports with one TODO: every rank trains on all of the data, no speed-up; the result
    # stays the original's, which this test checks on 2 ranks)
    left = [t for t in result.todos if not (name in UNSHARDED and t.message.startswith(NOT_SHARDED))]
    assert left == [] and (result.exit_code == 0) == (name not in UNSHARDED), result.todos
    ported.write_text(result.code)
    assert lint_source(result.code, str(ported)) == []

    monkeypatch.chdir(tmp_path)
    original = _run_here(_source(name), original_args, key, monkeypatch)[key]
    alone = _run_here(ported, [a.format(tmp=tmp_path / "ws1") for a in args], key, monkeypatch)[key]
    assert abs(alone - original) <= max(tolerance, 1e-9), (name, "world size 1", alone, original)

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # the check's world-size-1 reference run would write the same parameter file after the 2-rank run: the
    # scripts compared by parameters skip it, so the file read below is the 2-rank result
    check = run_check(CheckConfig(target=str(ported), target_args=tuple(ported_args), max_steps=0, epoch_steps=0,
                                  timeout_s=300, compare=name not in SAME_ORDER))
    assert check.code == 0 and check.findings == [], check.output[-4000:]
    two_ranks = _last_json(check.output, key)[key]
    assert abs(two_ranks - original) <= max(tolerance, 1e-9), (name, "2 ranks", two_ranks, original)
    print(f"{name}: original {original:.6f}, world size 1 {alone:.6f}, 2 ranks {two_ranks:.6f}")
    if name == "random_batches":  # had rank 1 drawn rank 0's batches, 2 ranks would train exactly as 1 does
        assert abs(two_ranks - alone) > 1e-6, (name, "the ranks drew the same batches", two_ranks, alone)
    if name == "meter_eval":  # the meter counts every rank's test samples, not rank 0's half
        assert _last_json(check.output, key)["seen"] == 120, check.output[-2000:]
    if name in SAME_ORDER:  # same global order, same global batch: the same parameters
        ours = torch.load(tmp_path / "ported" / "params.pt", weights_only=True)
        theirs = torch.load(tmp_path / "original" / "params.pt", weights_only=True)
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
