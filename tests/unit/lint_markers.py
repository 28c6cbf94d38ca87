"""The `# lint-expect: DDPxxx severity` markers of a fixture program, and a check that the linter reports exactly
them (shared by the program-model tests)."""

from __future__ import annotations

import re
from pathlib import Path

from ddpkit.lint import lint_files

PROGRAMS = Path(__file__).resolve().parents[1] / "fixtures" / "lint" / "programs"
_EXPECT = re.compile(r"lint-expect: (DDP\d{3}) (error|warning|note)")


def expected(files: list[Path], root: Path) -> set[tuple[str, int, str, str]]:
    """(path under root, line, rule, severity) of every marker in these files."""
    return {(f.relative_to(root).as_posix(), number, rule, severity) for f in files
            for number, line in enumerate(f.read_text().splitlines(), 1) for rule, severity in _EXPECT.findall(line)}


def check_program(name: str) -> None:
    """Lint every file of the fixture program `name` together: the findings are exactly its markers."""
    root = PROGRAMS / name
    files = sorted(root.rglob("*.py"))
    found = {(Path(f.path).relative_to(root).as_posix(), f.line, f.rule, f.severity) for f in lint_files(files)}
    marks = expected(files, root)
    assert marks and found == marks
