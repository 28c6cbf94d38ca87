"""`ddpkit lint PATH...`: run the checks over files and directories and print the findings."""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

import ddpkit.lint.hangs  # noqa: F401  (registers DDP010 in CHECKS)
import ddpkit.lint.hazards  # noqa: F401  (registers DDP011-DDP013 in CHECKS)
from ddpkit.lint.analysis import Script
from ddpkit.lint.report import RULES, Finding, format_json, format_text
from ddpkit.lint.rules import CHECKS

__all__ = ["lint_source", "lint_file", "collect_paths", "main"]

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<ids>[A-Za-z0-9_, ]+))?", re.IGNORECASE)
_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}


def _suppressed(line: str, rule: str) -> bool:
    """`# noqa` silences every rule on the line; `# noqa: DDP004,DDP008` only those."""
    match = _NOQA.search(line)
    if match is None:
        return False
    ids = match.group("ids")
    return ids is None or rule in {i.strip().upper() for i in ids.split(",")}


def lint_source(source: str, path: str = "<string>") -> list[Finding]:
    """All findings for one script's text, sorted by position. Never executes the script."""
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        return [Finding(path, e.lineno or 1, e.offset or 1, "DDP000",
                        "error", f"cannot parse the file: {e.msg}",
                        "fix the syntax error (ddpkit lint reads the file with this Python's parser)")]
    script = Script(tree)
    lines = source.splitlines()
    findings: set[Finding] = set()
    for run_check in CHECKS:
        for hit in run_check(script):
            line = getattr(hit.node, "lineno", 1)
            text = lines[line - 1] if 0 < line <= len(lines) else ""
            if not _suppressed(text, hit.rule):
                findings.add(Finding(path, line, getattr(hit.node, "col_offset", 0) + 1, hit.rule,
                                     hit.severity, hit.message, hit.fix))
    return sorted(findings, key=Finding.sort_key)


def lint_file(path: str | Path) -> list[Finding]:
    path = Path(path)
    return lint_source(path.read_text(encoding="utf-8", errors="replace"), str(path))


def collect_paths(paths: list[str]) -> list[Path]:
    """.py files as given, directories searched for *.py (skipping hidden and cache directories).

    FileNotFoundError for a missing path, ValueError for a file that is not a .py file.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"path {raw!r} does not exist; pass a .py file or a directory of them")
        if not path.is_dir():
            if path.suffix != ".py":
                raise ValueError(f"path {raw!r} is not a Python file (it does not end in .py); "
                                 "pass a .py file or a directory of them")
            found.append(path)
            continue
        for file in sorted(path.rglob("*.py")):
            parts = file.relative_to(path).parts[:-1]
            if not any(p.startswith(".") or p in _SKIP_DIRS for p in parts):
                found.append(file)
    return list(dict.fromkeys(found))


def _rule_ids(value: str) -> set[str]:
    ids = {v.strip().upper() for v in value.split(",") if v.strip()}
    unknown = sorted(ids - RULES.keys())
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown rule id {', '.join(unknown)}; known ids are DDP000-DDP{len(RULES) - 1:03d} "
            "(see `ddpkit lint --list-rules`)")
    return ids


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddpkit lint",
        description="Static checks of a DDP training script for the classic mistakes (never runs it).",
        epilog="Exit status: 0 no errors, 1 at least one error finding, 2 usage error. "
               "Silence one line with `# noqa: DDP004`.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="Python files, or directories searched for *.py")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    p.add_argument("--select", type=_rule_ids, metavar="RULE,...", help="report only these rule ids")
    p.add_argument("--ignore", type=_rule_ids, metavar="RULE,...", help="do not report these rule ids")
    p.add_argument("--list-rules", action="store_true", help="print the rule table and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ddpkit lint`; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse already printed the usage error
        return e.code if isinstance(e.code, int) else 2
    if args.list_rules:
        for rule in RULES.values():
            print(f"{rule.id}  {rule.severity:<7}  {rule.summary}")
        return 0
    if not args.paths:
        print("ddpkit lint: error: no PATH given; pass one or more .py files or directories, "
              "e.g. `ddpkit lint train.py`", file=sys.stderr)
        return 2
    try:
        files = collect_paths(args.paths)
    except (FileNotFoundError, ValueError) as e:
        print(f"ddpkit lint: error: {e}", file=sys.stderr)
        return 2
    findings: list[Finding] = []
    for file in files:
        try:
            findings.extend(lint_file(file))
        except OSError as e:
            print(f"ddpkit lint: error: cannot read {str(file)!r} ({e.strerror}); check its permissions",
                  file=sys.stderr)
            return 2
    if args.select:
        findings = [f for f in findings if f.rule in args.select]
    if args.ignore:
        findings = [f for f in findings if f.rule not in args.ignore]
    print(format_json(findings) if args.format == "json" else format_text(findings, len(files)))
    return 1 if any(f.severity == "error" for f in findings) else 0
