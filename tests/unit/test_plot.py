"""Unit tests for ddpkit.metrics.plot: figures from a synthetic metrics log and the CLI's exit codes."""

from __future__ import annotations

import json

import pytest

from ddpkit.metrics.plot import main, plot_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_log(run_dir, records):
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "metrics.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return path


def synthetic_records():
    records = []
    for step in range(1, 41):
        records.append(
            {"step": step, "epoch": step // 10, "loss": 2.0 / step, "lr": 1e-3, "samples_per_s": 900.0 + step}
        )
        if step % 10 == 0:
            records.append(
                {"step": step, "epoch": step // 10, "eval_loss": 2.5 / step, "eval_acc": step / 40, "val_f1": 0.5}
            )
    return records


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC), path
    assert len(data) > 1000, (path, len(data))


def test_plot_run_writes_all_figures(tmp_path):
    write_log(tmp_path, synthetic_records())
    written = plot_run(tmp_path)
    assert [path.name for path in written] == ["loss.png", "eval.png", "throughput.png"]
    for path in written:
        assert path.parent == tmp_path
        assert_png(path)


def test_plot_run_skips_absent_figures_and_honours_out_dir(tmp_path):
    run_dir = tmp_path / "run"
    write_log(run_dir, [{"step": s, "loss": 1.0 / s} for s in range(1, 6)])
    written = plot_run(run_dir, out_dir=tmp_path / "figs")
    assert written == [tmp_path / "figs" / "loss.png"]
    assert_png(written[0])


def test_plot_run_handles_resumed_steps_strings_nan_and_epoch_only_eval(tmp_path):
    records = [{"step": s, "loss": 1.0 / s} for s in range(1, 6)]
    records += [{"step": s, "loss": 0.9 / s, "note": "resumed"} for s in range(3, 8)]
    records += [{"step": 8, "loss": float("nan")}, {"epoch": 0, "val_loss": 0.4}, {"epoch": 1, "val_loss": 0.3}]
    path = write_log(tmp_path, [])
    path.write_text("".join(json.dumps(record) + "\n" for record in records))  # json writes NaN
    written = plot_run(tmp_path)
    # val_loss per epoch cannot share the per-step loss axis, so it gets an eval panel
    assert [p.name for p in written] == ["loss.png", "eval.png"]
    for p in written:
        assert_png(p)


def test_plot_run_with_nothing_plottable_returns_empty(tmp_path):
    write_log(tmp_path, [{"step": 1, "lr": 0.1, "phase": "warmup"}])
    assert plot_run(tmp_path) == []


def test_main_success_prints_paths(tmp_path, capsys):
    write_log(tmp_path, synthetic_records())
    out = tmp_path / "out"
    assert main([str(tmp_path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / name) for name in ("loss.png", "eval.png", "throughput.png")]


def test_main_takes_the_metrics_file_itself_and_names_any_other_file(tmp_path, capsys):
    write_log(tmp_path, synthetic_records())
    out = tmp_path / "out"
    assert main([str(tmp_path / "metrics.jsonl"), "--out", str(out)]) == 0  # plots its run
    assert capsys.readouterr().out.split()[0] == str(out / "loss.png")
    other = tmp_path / "notes.txt"
    other.write_text("x")
    assert main([str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{other} is a file, not a run directory" in err and "metrics.jsonl" in err


def test_main_missing_run_dir(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main([str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpkit plot: error: ") and err.count("\n") == 1
    assert str(missing) in err and "MetricsLog" in err


def test_main_missing_log(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpkit plot: error: ") and err.count("\n") == 1
    assert str(tmp_path / "metrics.jsonl") in err and "run a training with MetricsLog" in err


def test_main_malformed_log_names_file_and_line(tmp_path, capsys):
    path = write_log(tmp_path, [{"step": 1, "loss": 1.0}])
    with open(path, "a") as handle:
        handle.write("{truncated\n")
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpkit plot: error: ") and err.count("\n") == 1
    assert f"{path}:2:" in err


def test_main_nothing_plottable(tmp_path, capsys):
    write_log(tmp_path, [{"step": 1, "lr": 0.1}])
    assert main([str(tmp_path)]) == 2
    assert "no plottable values" in capsys.readouterr().err


def test_main_requires_run_dir(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
