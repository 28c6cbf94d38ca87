"""ddpkit check's argv handling, the rank bootstrap's argv, and `ddpkit run --hang-timeout` (no processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpkit.check.command import CheckConfig, bootstrap_argv, parse_check_args
from ddpkit.run.launcher import LaunchError, RunConfig, build_torchrun_argv, config_from_args


def test_importing_ddpkit_check_stays_cheap():
    code = "import sys, ddpkit.check; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_parse_check_args_defaults_and_passthrough(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    cfg = parse_check_args([str(script), "--lr", "0.1"])
    assert cfg == CheckConfig(target=str(script), target_args=("--lr", "0.1"))
    assert cfg.nproc_per_node == 2 and cfg.max_steps == 20 and cfg.compare
    assert not parse_check_args(["--no-compare", str(script)]).compare


@pytest.mark.parametrize("argv, words", [
    (["missing.py"], "does not exist"),
    (["--nproc-per-node", "1", "{s}"], "pass 2 or more"),
    (["--max-steps", "-1", "{s}"], "--max-steps -1"),
    (["--hang-timeout", "0", "{s}"], "--hang-timeout 0"),
])
def test_parse_check_args_errors_name_the_flag(tmp_path, argv, words):
    script = tmp_path / "t.py"
    script.write_text("")
    with pytest.raises(ValueError, match=words.replace("-", r"\-")):
        parse_check_args([a.format(s=script) for a in argv])


def test_bootstrap_argv_wraps_the_script_with_the_probes():
    argv = bootstrap_argv(CheckConfig(target="train.py", target_args=("--x", "1"), nproc_per_node=3), "/w")
    assert "--nproc-per-node=3" in argv
    i = argv.index("ddpkit.bootstrap")
    assert argv[i - 1] == "-m"
    tail = argv[i + 1:]
    assert tail[-3:] == ["train.py", "--x", "1"]
    assert {"--record", "/w/records", "--cpu", "--max-steps=20", "--epoch-steps=5"} <= set(tail)
    module = bootstrap_argv(CheckConfig(target="pkg.train", module=True), "/w")
    assert module[-2:] == ["-m", "pkg.train"]


def test_run_argv_with_hang_timeout_goes_through_the_bootstrap():
    plain = build_torchrun_argv(RunConfig(target="train.py", target_args=("--a",)))
    assert plain[-2:] == ["train.py", "--a"] and "ddpkit.bootstrap" not in plain
    argv = build_torchrun_argv(RunConfig(target="train.py", target_args=("--a",), hang_timeout_s=30,
                                         hang_report_dir="/r"))
    assert argv[-7:] == ["-m", "ddpkit.bootstrap", "--hang-timeout=30", "--report-dir", "/r",
                         "train.py", "--a"]
    module = build_torchrun_argv(RunConfig(target="pkg.train", module=True, hang_timeout_s=5))
    assert module[-5:] == ["-m", "ddpkit.bootstrap", "--hang-timeout=5", "-m", "pkg.train"]


def test_ddpkit_run_hang_timeout_flag(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    cfg = config_from_args(["--hang-timeout", "12", "--nproc-per-node", "2", str(script)], num_gpus=0, num_cpus=2,
                         environ={})
    assert cfg.hang_timeout_s == 12.0
    assert config_from_args([str(script)], num_gpus=0, num_cpus=2, environ={}).hang_timeout_s is None
    with pytest.raises(LaunchError, match="--hang-timeout 0 must be > 0"):
        config_from_args(["--hang-timeout", "0", str(script)], num_gpus=0, num_cpus=2, environ={})


def test_init_rejects_a_bad_hang_timeout_before_anything_starts():
    import ddpkit

    with pytest.raises(ValueError, match="hang_timeout_s=-1"):
        ddpkit.init(hang_timeout_s=-1)


def test_exit_after_every_rank_finished_is_not_a_finding():
    from ddpkit.check.command import _all_ranks_finished

    done = {0: [{"ev": "end", "status": "stopped"}], 1: [{"ev": "end", "status": "finished", "code": 0}]}
    assert _all_ranks_finished(done, 2)
    assert not _all_ranks_finished({0: done[0]}, 2)  # a rank that never recorded its end
    assert not _all_ranks_finished({**done, 1: [{"ev": "end", "status": "error", "code": 1}]}, 2)
    assert not _all_ranks_finished({**done, 1: [{"ev": "step"}]}, 2)


def test_the_header_says_how_many_steps_ran_and_how_the_run_ended():
    from ddpkit.check.command import describe_run

    def ranks(steps, status, cut=False):
        events = [{"ev": "step"}] * steps + [{"ev": "epoch_cut"}] * cut
        return events + ([{"ev": "end", "status": status}] if status else [])

    def describe(records, max_steps=20):
        return describe_run(records, world_size=2, max_steps=max_steps, epoch_steps=5)

    assert describe({r: ranks(20, "stopped") for r in (0, 1)}) == "stopped after 20 optimizer steps (--max-steps 20)"
    assert describe({r: ranks(12, "finished") for r in (0, 1)}) == "the script ended after 12 optimizer steps"
    assert describe({r: ranks(1, "finished") for r in (0, 1)}, 0) == "the script ended after 1 optimizer step"
    assert describe({r: ranks(0, "finished") for r in (0, 1)}) == "the script ended before any optimizer step"
    assert describe({0: ranks(3, "error"), 1: ranks(2, "stopped")}) == (
        "a rank failed after different numbers of optimizer steps (rank 0: 3, rank 1: 2)")
    assert describe({0: ranks(4, None), 1: ranks(4, "stopped")}) == (
        "the ranks were stopped unfinished after 4 optimizer steps")
    assert describe({r: ranks(15, "finished", cut=True) for r in (0, 1)}) == (
        "the script ended after 15 optimizer steps; each epoch cut after 5 steps (--epoch-steps 5)")
    assert describe({}) == "no rank started the script"


def test_cuda_autocast_and_grad_scaler_are_noted_as_not_checked():
    import torch

    from ddpkit.check.cpumap import CpuMapping

    notes = []
    mapping = CpuMapping(lambda what, site: notes.append((what, site)))
    mapping.install()
    try:
        line = sys._getframe().f_lineno + 2
        with pytest.warns(UserWarning):
            _, scaler = torch.autocast("cuda", dtype=torch.float16), torch.amp.GradScaler()
        torch.autocast("cuda", enabled=False)  # switched off by the script itself: nothing to say
        torch.amp.GradScaler("cuda", enabled=False)
        torch.autocast("cpu", dtype=torch.bfloat16)  # runs on CPU as written
    finally:
        mapping.uninstall()
    assert not scaler.is_enabled()
    site = f"test_check_cli.py:{line}"
    assert [(what, where.endswith(site)) for what, where in notes] == [
        ("torch.autocast('cuda', float16) -> off (ran in float32: mixed precision not checked)", True),
        ("GradScaler('cuda') -> disabled (loss not scaled: loss scaling not checked)", True),
    ]
    with pytest.warns(UserWarning):
        torch.autocast("cuda")  # uninstalled: no more notes
    assert len(notes) == 2
