"""ddpkit.profile without processes: phase arithmetic from marks, the straggler rule, suggestions, the table,
the JSON schema; `ddpkit run --profile` settings as bootstrap arguments; init's profile arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpkit.env import LaunchEnv
from ddpkit.profile import PHASES, WARMUP_STEPS, StepProfiler, _Step, format_report, summarize
from ddpkit.run.launcher import LaunchError, build_torchrun_argv, config_from_args
from ddpkit.runtime import Context


def _ctx() -> Context:
    return Context(env=LaunchEnv(rank=0, world_size=1, local_world_size=1), device=torch.device("cpu"),
                   backend="gloo", seed=0)


def _step(**marks: float) -> _Step:
    step = _Step(0.0)
    step.waits = marks.pop("waits", [])
    for name, value in marks.items():
        setattr(step, name, value)
    return step


def test_phases_from_marks_add_up_to_the_step():
    prof = StepProfiler(_ctx())
    prof.last_param, prof.seen = 0, WARMUP_STEPS + 1  # past the warm-up: the watched gradient counts
    # 2 micro-batches: waits 0-0.010 and 0.030-0.035 s; last gradient 0.050, backward returns 0.070,
    # optimizer 0.075-0.085, next request 0.100
    step = _step(waits=[(0.0, 0.010), (0.030, 0.035)], cdone=0.050, bdone=0.070, ostart=0.075, oend=0.085, end=0.100)
    total, data, compute, comm, optimizer, other = prof._phases(step)
    assert total == pytest.approx(100.0) and data == pytest.approx(15.0)
    assert compute == pytest.approx(35.0)  # 10 -> 50 ms, less the 5 ms wait for the second micro-batch
    assert comm == pytest.approx(20.0) and optimizer == pytest.approx(10.0) and other == pytest.approx(20.0)
    assert data + compute + comm + optimizer + other == pytest.approx(total)


def test_without_a_watched_ddp_model_there_is_no_communication_phase():
    prof = StepProfiler(_ctx())  # world size 1: no DDP, so no gradient is watched
    step = _step(waits=[(0.0, 0.010)], bdone=0.070, ostart=0.075, oend=0.085, end=0.100)
    total, data, compute, comm, optimizer, other = prof._phases(step)
    assert (comm, compute, optimizer) == (0.0, pytest.approx(60.0), pytest.approx(10.0))
    assert other == pytest.approx(20.0)


def _figures(rank: int, step: float, **phases: float) -> dict:
    row = {"rank": rank, "step_ms": step, **{f"{p}_ms": phases.get(p, 0.0) for p in PHASES}, "steps": 20}
    row["other_ms"] = step - sum(row[f"{p}_ms"] for p in PHASES if p != "other")
    return row | {"num_workers": 0, "pinned": False, "device": "cpu"}


def test_a_rank_the_others_wait_for_is_the_straggler_with_its_slow_phase():
    ranks = [_figures(0, 50.0, data=1.0, compute=8.0, comm=38.0, optimizer=1.0),
             _figures(1, 50.0, data=39.0, compute=8.0, comm=0.5, optimizer=1.0),
             _figures(2, 50.0, data=1.0, compute=8.5, comm=37.5, optimizer=1.0)]
    report = summarize(ranks)
    assert report["straggler"] == {"rank": 1, "phase": "data"}
    assert set(report) == {"world_size", "steps", "ranks", "straggler", "suggestions"}
    assert report["world_size"] == 3 and report["steps"] == 20
    assert set(report["ranks"][0]) == {"rank", "step_ms", "data_ms", "compute_ms", "comm_ms", "optimizer_ms", "other_ms"}
    assert "rank 1" in report["suggestions"][0] and "38.0 ms" in report["suggestions"][0]
    # the others' exposed communication is the wait for rank 1: no bucket-size advice from it
    assert not any("bucket_cap_mb" in s for s in report["suggestions"])
    json.dumps(report)  # the --profile-json file is this object
    text = format_report(report)
    assert "straggler: rank 1 (data)" in text and "78%" in text  # rank 1's data share: 39 of 50 ms


def test_balanced_ranks_or_noise_without_waiting_name_no_straggler():
    balanced = [_figures(0, 20.0, compute=12.0, comm=4.0), _figures(1, 20.0, compute=12.5, comm=3.8)]
    assert summarize(balanced)["straggler"] is None
    # rank 1's phases are longer, but rank 0 did not wait for it: noise, not a straggler
    noise = [_figures(0, 2.0, data=0.3, compute=0.3, comm=1.0), _figures(1, 2.6, data=0.9, compute=0.3, comm=0.8)]
    assert summarize(noise)["straggler"] is None
    assert "straggler: none" in format_report(summarize(balanced))


def test_each_suggestion_comes_with_its_figure():
    comm_bound = [_figures(r, 40.0, data=0.5, compute=16.0, comm=20.0, optimizer=1.0) for r in range(2)]
    text = " ".join(summarize(comm_bound)["suggestions"])
    assert "20.0 ms per step of gradient communication" in text and "bucket_cap_mb" in text
    loader_bound = [_figures(r, 40.0, data=12.0, compute=26.0, optimizer=1.0) for r in range(2)]
    text = " ".join(summarize(loader_bound)["suggestions"])
    assert "12.0 ms per step for data (30% of the step)" in text and "num_workers" in text
    compute_bound = [_figures(r, 40.0, data=0.5, compute=36.0, optimizer=2.0) for r in range(2)]
    assert any("compile=True" in s and "36.0 ms (90%" in s for s in summarize(compute_bound)["suggestions"])


def test_a_run_without_measured_steps_says_so():
    report = summarize([{"rank": 0, "steps": 0, **{f"{p}_ms": None for p in ("step", *PHASES)}}])
    assert report["steps"] == 0 and report["straggler"] is None and report["suggestions"] == []
    assert "no step measured" in format_report(report)


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_profile_flags_reach_the_ranks_as_bootstrap_arguments(script, tmp_path):
    cfg = config_from_args(["--profile-json", str(tmp_path / "p.json"), script, "--lr", "1"], environ={}, num_gpus=0,
                           num_cpus=2)
    assert cfg.profile and cfg.profile_json == str(tmp_path / "p.json")
    argv = build_torchrun_argv(cfg)
    i = argv.index("ddpkit.bootstrap")
    assert argv[i - 1] == "-m" and argv[i + 1:] == ["--profile", "--profile-json", str(tmp_path / "p.json"),
                                                     script, "--lr", "1"]
    plain = build_torchrun_argv(config_from_args(["--profile", script], environ={}, num_gpus=0, num_cpus=2))
    assert plain[plain.index("ddpkit.bootstrap") + 1:] == ["--profile", script]
    assert "ddpkit.bootstrap" not in build_torchrun_argv(config_from_args([script], environ={}, num_gpus=0, num_cpus=2))


def test_a_profile_json_in_a_missing_directory_is_refused_before_launch(script, tmp_path):
    with pytest.raises(LaunchError, match=r"--profile-json .*missing.* does not exist"):
        config_from_args(["--profile-json", str(tmp_path / "missing" / "p.json"), script], environ={}, num_gpus=0,
                         num_cpus=2)


def test_init_checks_its_profile_arguments(tmp_path):
    import ddpkit

    with pytest.raises(TypeError, match=r"profile='yes' must be True or False"):
        ddpkit.init(profile="yes")
    with pytest.raises(ValueError, match=r"profile_json=.* does not exist"):
        ddpkit.init(profile_json=str(tmp_path / "missing" / "p.json"))


JOB = """
import torch, ddpkit
with ddpkit.init(seed=0) as ctx:
    model = ddpkit.wrap(torch.nn.Linear(8, 1), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prec = ddpkit.Precision(ctx, dtype="fp32")
    data = ddpkit.loader(torch.utils.data.TensorDataset(torch.randn(80, 8), torch.randn(80, 1)), ctx, batch_size=8)
    for x, y in data:
        prec.backward(torch.nn.functional.mse_loss(model(x), y))
        prec.step(opt, model)
"""


def test_the_bootstrap_profiles_a_script_that_calls_init_without_profile(tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    out = tmp_path / "profile.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "ddpkit.bootstrap", "--profile-json", str(out), str(tmp_path / "job.py")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 1 and report["steps"] == 10 - WARMUP_STEPS and report["straggler"] is None
    assert "ddpkit profile: 1 rank(s)" in proc.stdout


def test_the_bootstrap_says_so_when_the_script_has_nothing_to_profile(tmp_path):
    (tmp_path / "plain.py").write_text("print('trained elsewhere')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "ddpkit.bootstrap", "--profile", str(tmp_path / "plain.py")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and "trained elsewhere" in proc.stdout
    assert "ddpkit run --profile: nothing was measured" in proc.stderr
