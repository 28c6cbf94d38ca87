"""Figures a script reports, compared between world size 1 and N: number extraction and comparison (no processes)."""

from __future__ import annotations

import math

from ddpkit.check.figures import compare_figures, n_fold, numbers_in, structure


def _figures(text):
    return [(n.value, n.is_int) for n in numbers_in(text) if n.kind == "figure"]


def _kinds(text):
    return [n.kind for n in numbers_in(text)]


def test_numbers_are_read_with_their_precision_and_names_with_digits_are_skipped():
    assert _figures("epoch 3 acc 0.4900 loss=1.5e-3 tensor(0.25) top5 resnet50 [12/40]") == [
        (3, True), (0.49, False), (0.0015, False), (0.25, False), (12, True), (40, True)]
    [n] = numbers_in("acc 0.49")
    assert math.isclose(n.ulp, 0.005)
    [n] = numbers_in("loss 1.25e-3")
    assert math.isclose(n.ulp, 0.5e-5)
    assert _figures('{"test_accuracy": 0.96, "correct": 9600}') == [(0.96, False), (9600, True)]


def test_timings_rates_dates_and_memory_are_not_figures():
    assert _kinds("step 5 took 0.31s") == ["figure", "timing"]
    assert _kinds("12.5 it/s, 0.08 s/it, 3000 tokens/s, 40 ms") == ["timing"] * 4
    assert _kinds('{"loss": 0.5, "elapsed": 12.0, "throughput": 512}') == ["figure", "timing", "timing"]
    assert _kinds("2026-12-01 16:24:58 loss 0.5") == ["timing", "figure"]
    assert _kinds("eta 00:12 acc 0.9") == ["timing", "figure"]
    assert _kinds("at 1764606298 max memory 812 MB, pid 4242") == ["timing", "process", "process"]
    assert _kinds("acc 97.5%") == ["figure"]


def test_n_fold_is_about_n_or_about_one_over_n():
    assert n_fold(0.49 / 0.97, 2) and n_fold(2.1, 2) and n_fold(0.26, 4)
    assert not n_fold(1.0, 2) and not n_fold(1.3, 2) and not n_fold(-2.0, 2) and not n_fold(0.0, 2)


def _run(world_size, texts, *, site="train.py:40", channel="print", batches=20, batch_size=16, lr=0.1):
    """rank 0's records of a run that reported `texts` at `site` (one per report)."""
    events = [{"ev": "start", "rank": 0, "world_size": world_size},
              {"ev": "epoch_start", "loader": 0, "iter": 0, "step": 0, "site": "train.py:20",
               "batches": batches, "batch_size": batch_size, "dataset_len": 640, "num_samples": 640 // world_size},
              {"ev": "step", "n": 1, "site": "train.py:30", "lrs": [lr]}]
    events += [{"ev": "report", "channel": channel, "site": site, "text": t} for t in texts]
    return {0: events}


def test_a_shard_count_over_the_whole_set_is_reported_with_its_line():
    result = compare_figures(_run(1, ["epoch 0 test accuracy 0.9700", "epoch 1 test accuracy 0.9800"]),
                             _run(2, ["epoch 0 test accuracy 0.4900", "epoch 1 test accuracy 0.4850"]), 2)
    [f] = result.findings
    assert (f.kind, f.site) == ("reported", "train.py:40")
    assert "0.97" in f.message and "0.49" in f.message and "1/2" in f.message
    assert "all-reduce the sums and counts" in f.fix
    assert result.compared == 4


def test_a_global_sum_divided_by_a_per_rank_count_is_reported_as_n_times_too_high():
    [f] = compare_figures(_run(1, ["test loss 0.3768"], channel="logging"),
                          _run(2, ["test loss 0.7436"], channel="logging"), 2).findings
    assert "about 2x" in f.message and "figure logged here" in f.message and "global count" in f.fix


def test_equal_and_noisy_figures_stay_silent():
    same = compare_figures(_run(1, ["acc 0.9700 loss 0.12"]), _run(2, ["acc 0.9700 loss 0.12"]), 2)
    assert same.findings == [] and same.compared == 2
    # a different training trajectory (another global batch): close, or far but not about N times
    noisy = compare_figures(_run(1, [f"loss {v}" for v in (0.9, 0.7, 0.5, 0.4)]),
                            _run(2, [f"loss {v}" for v in (0.91, 0.5, 0.26, 0.33)]), 2)
    assert noisy.findings == []


def test_one_coincidental_factor_in_a_series_is_not_enough():
    result = compare_figures(_run(1, [f"loss {v}" for v in (0.8, 0.6, 0.4)]),
                             _run(2, [f"loss {v}" for v in (0.4, 0.62, 0.41)]), 2)
    assert result.findings == []


def test_structure_timings_and_learning_rates_are_left_out_and_counted():
    ref = _run(1, ["step 5/40 batch 16 lr 0.10 took 2.0s"], batches=40, batch_size=16, lr=0.1)
    new = _run(2, ["step 5/20 batch 8 lr 0.20 took 1.0s"], batches=20, batch_size=8, lr=0.2)
    result = compare_figures(ref, new, 2)
    assert result.findings == []
    assert result.skipped == {"loop and shard sizes": 2, "learning rates": 1, "timings": 1}
    assert structure(new) == ({2, 20, 8, 640, 320}, [0.2])


def test_lines_that_cannot_be_paired_are_named_not_compared():
    ref = _run(1, ["acc 0.9", "acc 0.9"])
    ref[0].append({"ev": "report", "channel": "print", "site": "train.py:50", "text": "only once 3"})
    new = _run(2, ["acc 0.45"])
    result = compare_figures(ref, new, 2)
    assert result.findings == [] and result.compared == 0
    assert result.uncompared_sites == ["train.py:40 (reported 2 times at world size 1, 1 at world size 2)",
                                       "train.py:50 (reported at world size 1 only)"]
    shapes = compare_figures(_run(1, ["acc 0.9 (10 of 11)"]), _run(2, ["acc 0.45"]), 2)
    assert shapes.findings == [] and shapes.skipped == {"reports whose count of numbers differs": 1}


def test_only_rank_zero_is_compared():
    ref = _run(1, ["acc 0.9"])
    new = _run(2, ["acc 0.9"])
    new[1] = [{"ev": "report", "channel": "print", "site": "train.py:40", "text": "acc 0.45"}]
    assert compare_figures(ref, new, 2).findings == []
