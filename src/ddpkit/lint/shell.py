"""DDP007 in the project's shell launch scripts: `python -m torch.distributed.launch ... train.py` of linted files."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from ddpkit.lint.report import Finding

__all__ = ["launch_scripts", "shell_launches"]

_LAUNCHER_LEVELS = 2
"""How far above a linted file's folder its launch scripts are looked for (`tools/train.py` started by `run.sh` at
the project's root)."""


def launch_scripts(paths: list[Path]) -> list[Path]:
    """The `*.sh` files in the folders of `paths` and up to _LAUNCHER_LEVELS folders above each (not above a
    folder holding `.git`, a repository's root), not searched further down."""
    folders: list[Path] = []
    for path in paths:
        folder = path.absolute().parent
        for _ in range(_LAUNCHER_LEVELS + 1):
            if folder not in folders:
                folders.append(folder)
            if (folder / ".git").exists() or folder.parent == folder:
                break
            folder = folder.parent
    return sorted({f for folder in folders for f in folder.glob("*.sh") if f.is_file()})


_OLD_LAUNCHER = re.compile(r"torch\.distributed\.launch\b")


def _commands(text: str) -> Iterator[list[tuple[int, str]]]:
    """The commands of a shell script, each as its (line number, text) lines: a line ending in a backslash goes on
    on the next one. Comment lines are left out."""
    command: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not command and line.lstrip().startswith("#"):
            continue
        command.append((number, line))
        if not line.rstrip().endswith("\\"):
            yield command
            command = []
    if command:
        yield command


def _launched(command: list[tuple[int, str]], scripts: set[str]) -> str | None:
    """The linted script a command starts: a word ending in one of their file names (`$(dirname "$0")/train.py`)."""
    words = " ".join(text.rstrip("\\") for _, text in command).replace('"', " ").replace("'", " ").split()
    return next((os.path.basename(w) for w in words if os.path.basename(w) in scripts), None)


def shell_launches(shell: dict[str, str], sources: dict[str, str]) -> list[Finding]:
    """A DDP007 warning at each line of a shell script ({path: text}) that starts one of the linted files
    (`sources`) with the deprecated `python -m torch.distributed.launch`."""
    scripts = {os.path.basename(p) for p in sources}
    found = []
    for path, text in shell.items():
        for command in _commands(text):
            at = next(((n, line) for n, line in command if _OLD_LAUNCHER.search(line)), None)
            script = _launched(command, scripts) if at else None
            if at is None or script is None:
                continue
            found.append(Finding(
                path, at[0], _OLD_LAUNCHER.search(at[1]).start() + 1, "DDP007", "warning",
                f"{os.path.basename(path)} starts {script} with the deprecated `python -m torch.distributed.launch`: "
                "it passes `--local-rank=N` to the script (torch >= 2.0), which a parser declaring `--local_rank` "
                "refuses, and PyTorch is removing it",
                f"launch with torchrun (`torchrun --nproc_per_node=N {script} ...`) and read the local rank from "
                "os.environ['LOCAL_RANK']"))
    return found
