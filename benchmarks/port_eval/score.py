"""Score `ddpkit port` on public single-device training scripts (not kept here: a local, git-ignored cache).

    python benchmarks/port_eval/score.py fill --repo pytorch/examples --git-dir /path/to/clone/.git
    python benchmarks/port_eval/score.py score            # port each cached script, print the table
    python benchmarks/port_eval/score.py heldout --out DIR  # the held-out set: tool outcome and judged verdict
    python benchmarks/port_eval/score.py heldout --set benchmarks/port_eval/heldout2.json  # another held-out set

manifest.json lists each script by repository, path and commit, with the outcome recorded last time
(ported / todo / refused / crashed) and why. `score` recomputes the outcomes from the cache, checks that
each ported file parses and lints without errors, and exits 1 when an outcome differs from the manifest.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).parent
MANIFEST = HERE / "manifest.json"
HELDOUT = HERE / "heldout.json"
"""Scripts labelled (what a correct port needs) before any tool ran on them; `judged` is each port's verdict."""
CACHE = HERE / ".cache"


def cached(entry: dict, cache: Path | None = None) -> Path:
    return (cache or CACHE) / entry["repo"].replace("/", "+") / entry["commit"][:12] / entry["path"]


def fill(repo: str, git_dir: str) -> int:
    """Copy the manifest's files of one repository out of a local clone into the cache."""
    missing = 0
    for entry in json.loads(MANIFEST.read_text()):
        if entry["repo"] != repo:
            continue
        out = subprocess.run(["git", "--git-dir", git_dir, "show", f"{entry['commit']}:{entry['path']}"],
                             capture_output=True)
        if out.returncode:
            print(f"missing {entry['repo']}:{entry['path']}@{entry['commit'][:12]}", file=sys.stderr)
            missing += 1
            continue
        path = cached(entry)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(out.stdout)
    return 1 if missing else 0


def outcome(source: str, name: str) -> tuple[str, str, list[str]]:
    """(outcome, detail, lint errors in the output) for one script."""
    from ddpkit.lint import lint_source
    from ddpkit.port import PortError, port_source

    try:
        result = port_source(source, name)
    except PortError as e:
        if type(e).__name__ == "PortBug":  # the port's own output did not parse: a crash of the tool
            return "crashed", str(e).split(": ", 1)[-1], []
        return "refused", str(e).split(": ", 1)[-1], []
    except Exception as e:  # a crash is a bug in the codemod: recorded, not hidden
        return "crashed", f"{type(e).__name__}: {e}", []
    try:
        ast.parse(result.code)
    except SyntaxError as e:  # the port wrote a file Python cannot run: a bug in the codemod, like a crash
        return "crashed", f"the port's output does not parse (line {e.lineno}: {e.msg})", []
    errors = [f"{f.rule} {f.message}" for f in lint_source(result.code, name) if f.severity == "error"]
    if not result.changed:
        return "unchanged", result.message, errors
    if result.todos:
        return "todo", "; ".join(sorted({t.message.split(":")[0] for t in result.todos})), errors
    return "ported", "; ".join(result.notes), errors  # "ported fully" with its notes (no speed-up), as the CLI says


def score(update: bool) -> int:
    entries = json.loads(MANIFEST.read_text())
    counts: Counter[str] = Counter()
    differ = 0
    for entry in entries:
        path = cached(entry)
        if not path.exists():
            print(f"{entry['repo']}:{entry['path']}: not cached (run `fill`)", file=sys.stderr)
            return 2
        # the cached file's own path: the port reads the modules of the script's project beside it
        got, detail, errors = outcome(path.read_text(encoding="utf-8", errors="replace"), str(path))
        counts[got] += 1
        mark = "" if got == entry.get("outcome") else f"  (manifest: {entry.get('outcome')})"
        differ += bool(mark)
        lint = f"  LINT ERRORS: {errors}" if errors else ""
        print(f"{got:9} {entry['repo']}:{entry['path']}  {detail[:150]}{mark}{lint}")
        if update:
            entry["outcome"], entry["why"] = got, detail
    total = len(entries)
    print("\n" + ", ".join(f"{k} {v}/{total}" for k, v in sorted(counts.items())))
    if update:
        MANIFEST.write_text(json.dumps(entries, indent=1) + "\n")
    return 1 if differ and not update else 0


def heldout(out_dir: str | None, labels: Path = HELDOUT, cache: Path | None = None) -> int:
    """Port every cached held-out script; print the tool's outcome beside the judged one (heldout.json)."""
    entries = json.loads(labels.read_text())
    judged: Counter[str] = Counter()
    tool: Counter[str] = Counter()
    first: Counter[str] = Counter()
    for entry in entries:
        path = cached(entry, cache)
        if not path.exists():
            print(f"{entry['repo']}:{entry['path']}: not cached", file=sys.stderr)
            return 2
        source = path.read_bytes().decode("utf-8", errors="replace")  # line endings as the CLI reads them
        got, detail, errors = outcome(source, str(path))
        tool[got] += 1
        if out_dir:
            from ddpkit.port import port_source

            target = Path(out_dir) / entry["repo"].replace("/", "+") / entry["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                target.write_text(port_source(source, str(path)).code, newline="")
            except Exception as e:  # refused or crashed: the outcome above says which
                target.with_suffix(".txt").write_text(f"{type(e).__name__}: {e}\n")
        verdict = entry.get("judged", {})
        judged[verdict.get("outcome", "not judged")] += 1
        first[entry.get("judged_first", {}).get("outcome", "not judged")] += 1
        lint = f"  LINT ERRORS: {errors}" if errors else ""
        print(f"{got:8} {verdict.get('outcome', '-'):12} {entry['repo']}:{entry['path']}  {detail[:120]}{lint}")
        if verdict.get("why"):
            print(f"{'':22}{verdict['why'][:300]}")
    total = len(entries)
    print("\ntool: " + ", ".join(f"{k} {v}/{total}" for k, v in sorted(tool.items())))
    print("judged: " + ", ".join(f"{k} {v}/{total}" for k, v in sorted(judged.items())))
    print("judged on the first pass (code written before reading these scripts): " + ", ".join(
        f"{k} {v}/{total}" for k, v in sorted(first.items())))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fill", help="copy a repository's listed files from a local git clone into the cache")
    f.add_argument("--repo", required=True, help="owner/name as in manifest.json")
    f.add_argument("--git-dir", required=True, help="the clone's .git directory (or a bare repository)")
    s = sub.add_parser("score", help="port every cached script and print the outcomes")
    s.add_argument("--update", action="store_true", help="write the outcomes into manifest.json")
    h = sub.add_parser("heldout", help="port every cached held-out script (heldout.json) and print the tool's "
                                      "outcome beside the judged one")
    h.add_argument("--out", metavar="DIR", help="also write each ported script under DIR (to judge it)")
    h.add_argument("--set", type=Path, default=HELDOUT, metavar="FILE",
                   help="the labelled set to port (default: heldout.json here)")
    h.add_argument("--cache", type=Path, default=None, metavar="DIR",
                   help="where the set's sources are (default: .cache/ here)")
    args = p.parse_args(argv)
    if args.cmd == "heldout":
        return heldout(args.out, args.set, args.cache)
    return fill(args.repo, args.git_dir) if args.cmd == "fill" else score(args.update)


if __name__ == "__main__":
    sys.exit(main())
