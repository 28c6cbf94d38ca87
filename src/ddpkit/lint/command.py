"""`ddpkit lint PATH...`: run the checks over files and directories and print the findings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ddpkit.lint.linter import lint_sources
from ddpkit.lint.report import RULES, Finding, format_json, format_sarif, format_text
from ddpkit.lint.shell import launch_scripts

__all__ = ["lint_source", "lint_file", "lint_files", "lint_sources", "collect_paths", "main"]

_SKIP_DIRS = {"__pycache__", "node_modules", "site-packages"}


def lint_source(source: str, path: str = "<string>") -> list[Finding]:
    """All findings for one script's text, sorted by position. Never executes the script."""
    return lint_sources({path: source})


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8-sig", errors="replace")  # (a byte-order mark is not code)


def lint_file(path: str | Path) -> list[Finding]:
    path = Path(path)
    return lint_source(_read(path), str(path))


def lint_files(paths: list[str | Path]) -> list[Finding]:
    """Findings for several files, those that import each other analysed as one program. Shell scripts among
    `paths` (`*.sh`) and those beside the Python files (launch_scripts) are read for the launches of these files."""
    scripts = [p for p in paths if not _is_shell(p)]
    given = {str(p): _read(Path(p)) for p in paths if _is_shell(p)}
    return lint_sources({str(p): _read(Path(p)) for p in scripts}, shell=_launch_texts(scripts, given))


def _is_shell(path: str | Path) -> bool:
    return Path(path).suffix == ".sh"


def _launch_texts(scripts: list, given: dict[str, str] | None = None) -> dict[str, str]:
    """{path: text} of the shell scripts the user gave (`given`) and the launch scripts beside `scripts` that can
    be read (one found beside them that cannot is not the lint's subject: it is left out)."""
    texts = dict(given or {})
    for script in launch_scripts([Path(p) for p in scripts]):
        try:
            texts.setdefault(str(script), _read(script))
        except OSError:
            continue
    return texts


def collect_paths(paths: list[str]) -> list[Path]:
    """.py files and shell launch scripts (.sh) as given, directories searched for *.py (skipping hidden and cache
    directories).

    FileNotFoundError for a missing path, ValueError for a file that is neither a .py file nor a .sh script.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"path {raw!r} does not exist; pass a .py file or a directory of them")
        if not path.is_dir():
            if path.suffix not in (".py", ".sh"):
                raise ValueError(f"path {raw!r} is not a Python file (it does not end in .py) or a shell launch "
                                 "script (.sh); pass a .py file, a .sh script that starts one, or a directory")
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
        description="Static checks of a DDP training script for the classic mistakes (never runs it). "
                    "Files that import each other are linted as one program (their imports are followed).",
        epilog="Exit status: 0 no errors, 1 at least one error finding, 2 usage error. "
               "Silence one line with `# noqa: DDP004`.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="Python files, or directories searched for *.py")
    p.add_argument("--format", choices=("text", "json", "sarif"), default="text",
                   help="output format: text (default), json, or sarif (SARIF 2.1.0 for code-scanning UIs)")
    p.add_argument("--select", type=_rule_ids, metavar="RULE,...", help="report only these rule ids")
    p.add_argument("--ignore", type=_rule_ids, metavar="RULE,...", help="do not report these rule ids")
    p.add_argument("--fix", action="store_true",
                   help="rewrite the mechanical mistakes in place (DDP001-DDP003, DDP005, DDP007, DDP009, DDP011), "
                        "then report what is left")
    p.add_argument("--diff", action="store_true", help="print the changes --fix would make, write nothing")
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
        paths = collect_paths(args.paths)
        sources = [{str(f): _read(f) for f in paths if not _is_shell(f)}]
        given_shell = {str(f): _read(f) for f in paths if _is_shell(f)}
    except (FileNotFoundError, ValueError) as e:
        print(f"ddpkit lint: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"ddpkit lint: error: cannot read {e.filename!r} ({e.strerror}); check its permissions",
              file=sys.stderr)
        return 2
    if not any(sources[0]):
        print(f"ddpkit lint: error: nothing was linted: no .py file in {' '.join(args.paths)}; pass a training "
              "script or a directory that holds one", file=sys.stderr)
        return 2
    if args.fix or args.diff:
        try:
            from ddpkit.lint.fixes import apply_fixes  # libcst is imported only when rewriting
        except ImportError as e:
            print(f"ddpkit lint: error: --fix/--diff need libcst ({e}); install it: pip install 'libcst>=1.1'",
                  file=sys.stderr)
            return 2
        try:
            sources = [apply_fixes(group, write=args.fix and not args.diff, show_diff=args.diff)
                       for group in sources]
        except OSError as e:
            print(f"ddpkit lint: error: cannot write {e.filename!r} ({e.strerror}); nothing else was changed "
                  "after it", file=sys.stderr)
            return 2
    findings = [f for group in sources for f in lint_sources(group, shell=_launch_texts(list(group), given_shell))]
    if args.select:
        findings = [f for f in findings if f.rule in args.select]
    if args.ignore:
        findings = [f for f in findings if f.rule not in args.ignore]
    if args.diff:
        return 0
    num_files = sum(len(group) for group in sources)
    out = {"json": format_json, "sarif": format_sarif}.get(args.format)
    print(out(findings) if out else format_text(findings, num_files))
    return 1 if any(f.severity == "error" for f in findings) else 0
