"""Packaging conventions: strict typing of the public modules (pyproject [tool.mypy]), py.typed, the version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_passes_on_the_public_modules() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout and "unused section" not in proc.stdout + proc.stderr


def test_the_package_ships_its_typing_marker() -> None:
    assert (ROOT / "src" / "ddpkit" / "py.typed").is_file()
    assert 'ddpkit = ["py.typed"]' in (ROOT / "pyproject.toml").read_text()


def test_version_flag_prints_the_packaged_version(capsys) -> None:
    from importlib.metadata import version

    import ddpkit
    from ddpkit.cli import main

    assert main(["--version"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == ddpkit.__version__ == version("ddpkit")
    assert f"## {printed}" in (ROOT / "CHANGELOG.md").read_text()
