"""`ddpkit port SCRIPT [-o OUT | --in-place] [--diff]`: write the ported script and list what is left to do."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
import tempfile
from pathlib import Path

from ddpkit.port.codemod import PortError, port_source

__all__ = ["main", "default_output"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ddpkit port",
        description="Rewrite a plain single-device PyTorch training script into a ddpkit script "
                    "(ddpkit.init, wrap, loader, reduced metrics, rank-0 printing and saving).",
        epilog="Exit status: 0 fully ported (or already a ddpkit script), 3 ported with TODOs left "
               "(marked `# TODO(ddpkit port): ...` in the output; re-porting such a file exits 3 while they remain), 2 bad input.")
    p.add_argument("script", metavar="SCRIPT", help="the single-device training script (.py)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("-o", "--output", metavar="OUT", help="write the ported script here (default SCRIPT_ddp.py)")
    where.add_argument("--in-place", action="store_true", help="overwrite SCRIPT with the ported script")
    p.add_argument("--diff", action="store_true",
                   help="print a unified diff; writes nothing unless -o or --in-place is given too")
    return p


def default_output(script: Path) -> Path:
    return script.with_name(f"{script.stem}_ddp.py")


def _write_atomically(path: Path, text: str) -> None:
    """Write next to the target and rename, so a failure never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:  # the script's own line endings
            f.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ddpkit port`; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse printed the usage error (or --help)
        return e.code if isinstance(e.code, int) else 2
    script = Path(args.script)
    if not script.is_file():
        print(f"ddpkit port: error: SCRIPT {args.script!r} does not exist or is not a file; pass the path of a "
              ".py training script", file=sys.stderr)
        return 2
    if script.suffix != ".py":
        print(f"ddpkit port: error: SCRIPT {args.script!r} is not a Python file (it does not end in .py); pass "
              "the .py training script", file=sys.stderr)
        return 2
    try:
        source = script.read_bytes().decode("utf-8")  # CRLF line endings and a BOM kept as they are
    except (OSError, UnicodeDecodeError) as e:
        print(f"ddpkit port: error: cannot read {args.script!r} ({e}); pass a readable UTF-8 .py file",
              file=sys.stderr)
        return 2
    try:
        result = port_source(source, str(script))
    except PortError as e:
        print(f"ddpkit port: error: {e}", file=sys.stderr)
        return 2
    if not result.changed:
        for todo in result.todos:
            print(f"{script}:{todo.line}: TODO {todo.message}")
        print(f"ddpkit port: {result.message}")
        return result.exit_code
    target = script if args.in_place else Path(args.output) if args.output else default_output(script)
    if args.diff:
        sys.stdout.writelines(difflib.unified_diff(source.splitlines(keepends=True), result.code.splitlines(
            keepends=True), fromfile=str(script), tofile=str(target)))
    if not args.diff or args.output or args.in_place:
        if target.resolve() == script.resolve() and not args.in_place:
            print(f"ddpkit port: error: -o {args.output!r} is SCRIPT itself; pass --in-place to overwrite it",
                  file=sys.stderr)
            return 2
        try:
            _write_atomically(target, result.code)
        except OSError as e:
            print(f"ddpkit port: error: cannot write {str(target)!r} ({e.strerror}); choose another -o path",
                  file=sys.stderr)
            return 2
        print(f"ddpkit port: wrote {target}", file=sys.stderr if args.diff else sys.stdout)
    out = sys.stderr if args.diff else sys.stdout
    for todo in result.todos:
        print(f"{target if todo.in_output else script}:{todo.line}: TODO {todo.message}", file=out)
    print(f"ddpkit port: {result.message}" + ("; then run `ddpkit lint` and `ddpkit check` on it"
                                               if not result.todos else ""), file=out)
    return result.exit_code
