"""torchrun's everyday flags pass through `ddpkit run`: the argv built, torchrun's own parser reading it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpkit.run.launcher import config_from_args
from ddpkit.run.launcher import (
    DEFAULT_SIGNALS_TO_HANDLE, PASSTHROUGH_FLAGS, LaunchError, build_torchrun_argv, torchrun_flags,
)

ALL = frozenset(PASSTHROUGH_FLAGS)


def _script(tmp_path: Path) -> str:
    script = tmp_path / "train.py"
    script.write_text("")
    return str(script)


def test_the_flags_reach_torchruns_parser_unchanged(tmp_path: Path) -> None:
    from torch.distributed.run import parse_args

    script = _script(tmp_path)
    shutdown = "--shutdown-timeout" in torchrun_flags()  # torchrun has it from 2.12 on, not in 2.11
    cfg = config_from_args(["--log-dir", str(tmp_path / "logs"), "--tee", "3", "--redirects", "0:3,1:1",
                          "--local-ranks-filter", "0", "--signals-to-handle", "SIGTERM,SIGUSR1",
                          *(["--shutdown-timeout", "45"] if shutdown else []),
                          "--nproc-per-node", "2", script, "--epochs", "1"],
                         environ={}, num_gpus=0, num_cpus=2, available_flags=ALL)
    argv = build_torchrun_argv(cfg)
    assert f"--log-dir={tmp_path / 'logs'}" in argv and "--tee=3" in argv and "--redirects=0:3,1:1" in argv
    assert argv[-3:] == [script, "--epochs", "1"]
    args = parse_args(argv)  # what torchrun itself makes of them
    assert args.log_dir == str(tmp_path / "logs") and args.tee == "3" and args.redirects == "0:3,1:1"
    assert args.local_ranks_filter == "0" and args.signals_to_handle == "SIGTERM,SIGUSR1"
    assert args.training_script == script
    if shutdown:
        assert args.shutdown_timeout == 45


def test_signals_to_handle_defaults_to_torchruns_list_plus_sigusr1(tmp_path: Path) -> None:
    cfg = config_from_args([_script(tmp_path)], environ={}, num_gpus=0, num_cpus=2, available_flags=ALL)
    assert f"--signals-to-handle={DEFAULT_SIGNALS_TO_HANDLE}" in build_torchrun_argv(cfg)
    assert DEFAULT_SIGNALS_TO_HANDLE == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    # a torch without the flag: nothing passed, nothing refused (the user did not ask for it)
    older = config_from_args([_script(tmp_path)], environ={}, num_gpus=0, num_cpus=2, available_flags=frozenset())
    assert not [a for a in build_torchrun_argv(older) if a.startswith("--signals-to-handle")]


@pytest.mark.parametrize("flag, value", [("--shutdown-timeout", "10"), ("--numa-binding", "node"),
                                         ("--log-dir", "logs")])
def test_a_flag_the_installed_torch_lacks_is_refused_in_one_line(tmp_path: Path, flag: str, value: str) -> None:
    with pytest.raises(LaunchError) as info:
        config_from_args([flag, value, _script(tmp_path)], environ={}, num_gpus=0, num_cpus=2,
                       available_flags=ALL - {flag})
    assert str(info.value) == (f"{flag} {value}: the installed torch's torchrun has no {flag} flag; upgrade torch "
                               f"to a release that has it, or drop {flag}")


def test_bad_shutdown_timeout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"--shutdown-timeout -3 must be a whole number of seconds >= 0"):
        config_from_args(["--shutdown-timeout", "-3", _script(tmp_path)], environ={}, num_gpus=0, num_cpus=2,
                       available_flags=ALL)


def test_availability_is_read_from_torchruns_parser() -> None:
    from torch.distributed.run import get_args_parser

    found = torchrun_flags()
    assert {"--log-dir", "--tee", "--redirects", "--local-ranks-filter"} <= found  # torchrun has had these long
    help_text = get_args_parser().format_help()
    assert all((flag in found) == (flag in help_text) for flag in PASSTHROUGH_FLAGS)
