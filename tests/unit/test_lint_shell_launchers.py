"""DDP007 in a project's shell launch scripts: `python -m torch.distributed.launch ... train.py` that starts a linted
script is reported at the .sh line; shell scripts next to the linted files, and those named among the paths, are read
by lint_files and the command (never parsed as Python)."""

from __future__ import annotations

import textwrap

from ddpkit.lint import lint_files, lint_sources

_TRAIN = textwrap.dedent("""\
    import os

    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.destroy_process_group()
""")

_RUN = textwrap.dedent("""\
    #!/bin/bash
    # python -m torch.distributed.launch train.py   (old way, kept as a note)
    GPUS=4
    PYTHONPATH=.:$PYTHONPATH \\
    CUDA_VISIBLE_DEVICES=0,1,2,3 python -m torch.distributed.launch --nproc_per_node $GPUS \\
        --master_port 29501 $(dirname "$0")/train.py \\
        --lr 0.1
    python -m torch.distributed.launch --nproc_per_node 2 other_program.py
    torchrun --nproc_per_node 4 train.py
""")


def _ddp007(found) -> list[tuple[str, int]]:
    return [(f.path, f.line) for f in found if f.rule == "DDP007"]


def test_a_shell_launch_of_a_linted_script_with_the_old_launcher_is_reported_at_its_line():
    found = lint_sources({"proj/train.py": _TRAIN}, shell={"proj/run.sh": _RUN})
    assert _ddp007(found) == [("proj/run.sh", 5)]
    message = next(f.message for f in found if f.rule == "DDP007")
    assert "train.py" in message and "torchrun" in next(f.fix for f in found if f.rule == "DDP007")


def test_lint_files_reads_the_shell_scripts_beside_the_linted_files(tmp_path):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "train.py").write_text(_TRAIN)
    (tmp_path / "tools" / "dist_train.sh").write_text(_RUN)
    (tmp_path / "run.sh").write_text("python -m torch.distributed.launch --nproc_per_node 8 tools/train.py\n")
    found = _ddp007(lint_files([tmp_path / "tools" / "train.py"]))
    assert found == [(str(tmp_path / "run.sh"), 1), (str(tmp_path / "tools" / "dist_train.sh"), 5)]


def test_the_command_reads_the_shell_scripts_beside_a_linted_directory(tmp_path, capsys):
    from ddpkit.lint.command import main

    (tmp_path / "train.py").write_text(_TRAIN)
    (tmp_path / "run.sh").write_text("python -m torch.distributed.launch --nproc_per_node 8 train.py --lr 0.1\n")
    main([str(tmp_path), "--select", "DDP007"])
    assert "run.sh:1" in capsys.readouterr().out


def test_a_shell_script_named_among_the_files_is_read_as_a_launcher_not_parsed_as_python(tmp_path):
    (tmp_path / "scripts").mkdir()  # below the program's folder: not found by the search upwards
    (tmp_path / "train.py").write_text(_TRAIN)
    (tmp_path / "scripts" / "dist_train.sh").write_text(_RUN)
    found = lint_files([tmp_path / "train.py", tmp_path / "scripts" / "dist_train.sh"])
    assert [f.rule for f in found if f.path.endswith(".sh")] == ["DDP007"]
    assert _ddp007(found) == [(str(tmp_path / "scripts" / "dist_train.sh"), 5)]


def test_the_command_takes_a_shell_script_among_its_paths(tmp_path, capsys):
    from ddpkit.lint.command import main

    (tmp_path / "scripts").mkdir()
    (tmp_path / "train.py").write_text(_TRAIN)
    (tmp_path / "scripts" / "dist_train.sh").write_text(_RUN)
    assert main([str(tmp_path / "train.py"), str(tmp_path / "scripts" / "dist_train.sh")]) == 0  # a warning
    out = capsys.readouterr().out
    assert "dist_train.sh:5" in out and "DDP000" not in out and "1 file checked" in out
