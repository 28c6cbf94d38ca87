"""Usage errors a new user meets first: each is one line naming the setting and the fix, and exit 2."""

from __future__ import annotations

import pytest
import torch

from ddpkit.check.command import main as check_main
from ddpkit.lint.command import main as lint_main
from ddpkit.run.launcher import LaunchError, config_from_args, resolve_nproc_per_node
from ddpkit.run.nodes import RANK_MEMORY_BYTES, cpu_rank_limit
from ddpkit.selftest.command import plan_ranks


def _script(tmp_path, text="print('hi')\n"):
    path = tmp_path / "train.py"
    path.write_text(text)
    return str(path)


def test_cpu_ranks_well_beyond_the_cores_are_refused_naming_both_numbers(tmp_path):
    with pytest.raises(LaunchError, match=r"--nproc-per-node 99 asks for 99 CPU ranks but this machine has 2 usable "
                                          r"cores \(at most 4 CPU ranks\); pass --nproc-per-node 4 or auto, or add "
                                          r"--oversubscribe"):
        config_from_args(["--nproc-per-node", "99", _script(tmp_path)], environ={}, num_gpus=0, num_cpus=2)
    # 2 ranks per core pass, and so does any number the user insists on
    assert config_from_args(["--nproc-per-node", "4", _script(tmp_path)], environ={}, num_gpus=0,
                            num_cpus=2).nproc_per_node == 4
    assert config_from_args(["--oversubscribe", "--nproc-per-node", "99", _script(tmp_path)], environ={}, num_gpus=0,
                            num_cpus=2).nproc_per_node == 99


def test_cpu_ranks_beyond_the_memory_are_refused():
    assert cpu_rank_limit(64, memory_bytes=3 * RANK_MEMORY_BYTES)[0] == 3
    with pytest.raises(LaunchError, match=r"asks for 8 CPU ranks but this machine has 1.5 GiB of memory available "
                                          r"\(at most 3 CPU ranks of 512 MiB\)"):
        resolve_nproc_per_node("8", num_gpus=0, num_cpus=64, environ={}, memory_bytes=3 * RANK_MEMORY_BYTES)


def test_ddpkit_test_refuses_ninety_nine_cpu_ranks_unless_told():
    with pytest.raises(LaunchError, match="99 CPU ranks but this machine has 2 usable cores"):
        plan_ranks("99", num_gpus=0, num_cpus=2)
    assert plan_ranks("99", num_gpus=0, num_cpus=2, oversubscribe=True) == (99, "cpu")


def test_lint_of_a_folder_without_python_files_says_nothing_was_linted(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("no code here")
    assert lint_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ddpkit lint: error: nothing was linted: no .py file in") and str(tmp_path) in err


def test_check_of_a_script_with_a_syntax_error_is_a_usage_error_naming_file_and_line(tmp_path, capsys):
    path = _script(tmp_path, "import torch\n\ndef f(:\n    pass\n")
    assert check_main([path]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ddpkit check: error: {path}:3: invalid syntax (a syntax error); fix that line, then run again"


def test_wrap_refuses_precision_under_ddp_instead_of_ignoring_it():
    import ddpkit
    from ddpkit.env import LaunchEnv
    from ddpkit.runtime import Context

    ctx = Context(env=LaunchEnv(), device=torch.device("cpu"), backend="gloo", seed=0)
    with pytest.raises(ValueError, match=r"wrap\(precision='bf16'\) applies to strategy='fsdp' only"):
        ddpkit.wrap(torch.nn.Linear(2, 2), ctx, precision="bf16")
    assert isinstance(ddpkit.wrap(torch.nn.Linear(2, 2), ctx), torch.nn.Linear)  # without it, as before


def test_the_strategy_of_a_model_is_read_in_one_place():
    from ddpkit.parallel.strategy import is_dtensor, strategy_of

    assert strategy_of(torch.nn.Linear(2, 2)) is None
    assert not is_dtensor(torch.ones(2))
