"""`ddpkit run`: argv -> RunConfig -> torchrun argv, and its input errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddpkit.cli import main, parse_run_args
from ddpkit.launch import LaunchError, RunConfig, build_torchrun_argv, default_nproc_per_node, threads_per_rank


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_single_node_argv_uses_loopback_and_a_port_the_os_picks(script):
    cfg = parse_run_args(["--nproc-per-node", "2", script, "--lr", "0.1", "-m", "x"], num_gpus=0, num_cpus=2)
    argv = build_torchrun_argv(cfg)
    assert "--nproc-per-node=2" in argv
    assert "--rdzv-endpoint=127.0.0.1:0" in argv  # port 0: bound by the store itself, no probe race
    assert "--rdzv-backend=c10d" in argv and "--local-addr=127.0.0.1" in argv
    # script args pass through untouched, after the script, even ones that look like our flags
    assert argv[-5:] == [script, "--lr", "0.1", "-m", "x"]


def test_two_runs_get_distinct_rendezvous_ids(script):
    a = build_torchrun_argv(parse_run_args([script], num_gpus=0, num_cpus=2))
    b = build_torchrun_argv(parse_run_args([script], num_gpus=0, num_cpus=2))
    ids = [x for x in a + b if x.startswith("--rdzv-id=")]
    assert len(ids) == 2 and ids[0] != ids[1]


def test_module_mode(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
    cfg = parse_run_args(["-m", "pkg.train", "--epochs", "1"], num_gpus=0, num_cpus=2)
    argv = build_torchrun_argv(cfg)
    assert argv[-4:] == ["-m", "pkg.train", "--epochs", "1"]


def test_default_nproc(script):
    assert default_nproc_per_node(num_gpus=8, num_cpus=2) == 8
    assert default_nproc_per_node(num_gpus=0, num_cpus=2) == 2
    assert default_nproc_per_node(num_gpus=0, num_cpus=64) == 4
    assert default_nproc_per_node(num_gpus=0, num_cpus=1) == 1
    assert parse_run_args([script], num_gpus=3, num_cpus=2).nproc_per_node == 3
    assert parse_run_args(["--nproc-per-node", "gpu", script], num_gpus=3, num_cpus=2).nproc_per_node == 3
    assert parse_run_args(["--nproc-per-node", "cpu", script], num_gpus=0, num_cpus=6).nproc_per_node == 6


def test_threads_per_rank():
    assert threads_per_rank(2, 2) == 1
    assert threads_per_rank(4, 16) == 4
    assert threads_per_rank(8, 2) == 1


def test_multi_node_argv():
    cfg = RunConfig(target="t.py", nproc_per_node=8, nnodes="2", node_rank=1, rdzv_endpoint="head:29400", rdzv_id="j")
    argv = build_torchrun_argv(cfg)
    assert "--nnodes=2" in argv and "--rdzv-endpoint=head:29400" in argv and "--node-rank=1" in argv
    assert "--rdzv-id=j" in argv and "--local-addr=127.0.0.1" not in argv


def test_max_restarts_passed(script):
    argv = build_torchrun_argv(parse_run_args(["--max-restarts", "3", script], num_gpus=0, num_cpus=2))
    assert "--max-restarts=3" in argv


@pytest.mark.parametrize("args, needle", [
    (["--nproc-per-node", "0"], "--nproc-per-node 0 must be at least 1"),
    (["--nproc-per-node", "two"], "--nproc-per-node 'two' is not a number"),
    (["--nproc-per-node", "8"], "--nproc-per-node 8 asks for 8 GPUs but 2 are visible"),
    (["--max-restarts", "-1"], "--max-restarts -1 must be >= 0"),
])
def test_bad_input_errors(script, args, needle):
    with pytest.raises(LaunchError, match=needle):
        parse_run_args([*args, script], num_gpus=2, num_cpus=2)


def test_missing_script_is_one_line_error_and_exit_2(capsys, tmp_path):
    rc = main(["run", str(tmp_path / "nope.py")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.count("\n") == 0 and "does not exist" in err and "nope.py" in err


def test_missing_module_is_one_line_error_and_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('imported: the check must not import')\n")
    (tmp_path / "mypkg" / "train.py").write_text("")
    from ddpkit.launch import check_target

    check_target("mypkg.train", module=True)  # found in the current directory, nothing imported
    check_target("json.tool", module=True)  # or installed
    for missing in ("mypkg.nosuch", "nosuch_pkg_xyz.train", "mypkg.train.deeper", "not a name"):
        rc = main(["run", "-m", missing])
        err = capsys.readouterr().err.strip()
        assert rc == 2, missing
        assert err.count("\n") == 0 and f"module {missing!r} is not importable from {tmp_path}" in err


@pytest.mark.parametrize("value", ["0", "abc"])
def test_cli_process_bad_nproc_exits_nonzero(script, value):
    proc = subprocess.run([sys.executable, "-m", "ddpkit.cli", "run", "--nproc-per-node", value, script],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddpkit run: error: --nproc-per-node")
