"""Score `ddpkit lint` against hand-made labels of real DDP training scripts: precision and recall per rule.

Reads only local files: the scripts that fetch.py copied into cache/ at the commits manifest.json pins.
Each project (a script and the helpers of its own it imports) is linted as one project, as
`ddpkit lint DIR` would. A finding is right when a label of the same file and rule covers its line
(`line`, or `line`..`end` for a statement over several lines); every label is found at most once.
A finding at a place the labels mark `uncertain` (same file and line span, and rule where one is
given) is not scored. Projects whose files are not in the cache are skipped and counted.

    python benchmarks/lint_eval/score.py [--cache DIR] [--show fp,fn] [--held-out]
    python benchmarks/lint_eval/score.py --manifest heldout_a.json --manifest heldout_b.json
    python benchmarks/lint_eval/score.py --heldout-sets     # every heldout_*.json here, one table each
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fetch import CACHE, MANIFEST, cached  # noqa: E402

import ddpkit.lint as lint  # noqa: E402


def _findings(files: list[Path]) -> list:
    if hasattr(lint, "lint_files"):
        return lint.lint_files(files)
    return [f for file in files for f in lint.lint_file(file)]  # the one-file-at-a-time linter


def _end(entry: dict) -> int:
    """The last line an entry covers: `end` where it is a line number, else `line`."""
    end = entry.get("end")
    return end if isinstance(end, int) and end >= entry["line"] else entry["line"]


def _covers(entry: dict, path: str, line: int, rule: str, main: str) -> bool:
    return (entry.get("path", main) == path and entry["line"] <= line <= _end(entry)
            and entry.get("rule", rule) == rule)


def _in_project(path: Path, base: Path) -> str:
    """A file the linter read beside the manifest's files (a launch script, run.sh) by its path in the project."""
    try:
        return path.relative_to(base).as_posix()
    except ValueError:
        return str(path)


def score(projects: list[dict], cache: Path, skipped: list[str] | None = None
          ) -> tuple[Counter, Counter, Counter, list[str]]:
    """(true positives, false positives, false negatives) per rule, and a line per wrong answer.

    A project with a file missing from the cache is left out; its repository is appended to `skipped`
    when a list is given, else the scorer stops with a message naming the file.
    """
    tp, fp, fn, wrong = Counter(), Counter(), Counter(), []
    for project in projects:
        local = {cached(project["repo"], project["commit"], p, cache): p for p in project["files"]}
        missing = [str(p) for p in local if not p.exists()]
        if missing:
            if skipped is None:
                raise SystemExit(f"score: {missing[0]} is not in the cache; run fetch.py first")
            skipped.append(project["repo"])
            continue
        labels = [dict(label, found=False) for label in project["labels"]]
        uncertain = project.get("uncertain") or []
        main = project["files"][0]
        try:
            found = _findings(list(local))
        except Exception as e:  # noqa: BLE001 - a crash on one program is a result: every label missed
            found = []
            wrong.append(f"CRASH {project['repo']}: the linter raised {type(e).__name__}: {str(e)[:80]}")
        for f in sorted(found, key=lambda f: (f.path, f.line, f.rule)):
            base = cached(project["repo"], project["commit"], "", cache)
            path = local.get(Path(f.path)) or _in_project(Path(f.path), base)
            if any(_covers(u, path, f.line, f.rule, main) for u in uncertain if isinstance(u, dict)):
                continue
            match = next((label for label in labels if not label["found"] and label["rule"] == f.rule
                          and _covers(label, path, f.line, f.rule, main)), None)
            if match is None:
                fp[f.rule] += 1
                wrong.append(f"FP {project['repo']}:{path}:{f.line} {f.rule} {f.message[:110]}")
            else:
                match["found"] = True
                tp[f.rule] += 1
        for label in labels:
            if not label["found"]:
                fn[label["rule"]] += 1
                wrong.append(f"FN {project['repo']}:{label.get('path', main)}:{label['line']} {label['rule']} "
                             f"{label.get('note', '')}")
    return tp, fp, fn, wrong


def _ratio(a: int, b: int) -> str:
    return f"{100 * a / b:5.1f}%" if b else "    -"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", type=Path, default=CACHE, help="folder fetch.py filled (default: cache/ here)")
    p.add_argument("--show", default="", help="also list wrong answers: fp, fn or fp,fn")
    p.add_argument("--held-out", action="store_true",
                   help="score only the projects labelled after the rules were final (held_out in the manifest)")
    p.add_argument("--manifest", type=Path, action="append", default=[],
                   help="a manifest to score (repeatable; default: manifest.json here); several are pooled")
    p.add_argument("--heldout-sets", action="store_true",
                   help="score every heldout_*.json here, each on its own, then all of them pooled")
    args = p.parse_args(argv)
    if args.heldout_sets:
        sets = sorted(HERE.glob("heldout_*.json"))
        for one in sets:
            _table([one], args)
        return _table(sets, args) if len(sets) > 1 else 0
    return _table(args.manifest or [MANIFEST], args)


def _table(manifests: list[Path], args: argparse.Namespace) -> int:
    projects = [p for m in manifests for p in json.loads(Path(m).read_text())["projects"]]
    if args.held_out:
        projects = [p for p in projects if p.get("held_out")]
    skipped: list[str] = []
    tp, fp, fn, wrong = score(projects, args.cache, skipped)
    known = set(lint.RULES)
    scored = [p for p in projects if p["repo"] not in skipped]
    print(f"== {' + '.join(Path(m).name for m in manifests)}: {len(scored)} projects, "
          f"{sum(len(p['files']) for p in scored)} files, {sum(len(p['labels']) for p in scored)} labelled mistakes"
          + (f" ({len(skipped)} projects skipped: not in the cache)" if skipped else ""))
    print(f"{'rule':<8} {'labels':>6} {'found':>6} {'wrong':>6} {'precision':>10} {'recall':>7}")
    for rule in sorted(set(tp) | set(fp) | set(fn)):
        has = "" if rule in known else "  (no rule)"
        print(f"{rule:<8} {tp[rule] + fn[rule]:>6} {tp[rule]:>6} {fp[rule]:>6} "
              f"{_ratio(tp[rule], tp[rule] + fp[rule]):>10} {_ratio(tp[rule], tp[rule] + fn[rule]):>7}{has}")
    t, f, n = (sum(c[r] for r in c if r in known) for c in (tp, fp, fn))
    print(f"{'overall':<8} {t + n:>6} {t:>6} {f:>6} {_ratio(t, t + f):>10} {_ratio(t, t + n):>7}"
          "  (classes that have a rule)")
    kinds = {k.strip().upper() for k in args.show.split(",") if k.strip()}
    for line in wrong:
        if line[:2] in kinds or line.startswith("CRASH"):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
