"""Score `ddpkit lint` against hand-made labels of real DDP training scripts: precision and recall per rule.

Reads only local files: the scripts that fetch.py copied into cache/ at the commits manifest.json pins.
Each project (a script and the helpers of its own it imports) is linted as one project, as
`ddpkit lint DIR` would. A finding is right when a label of the same file and rule covers its line
(`line`, or `line`..`end` for a statement over several lines); every label is found at most once.

    python benchmarks/lint_eval/score.py [--cache DIR] [--show fp,fn] [--held-out]
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


def score(projects: list[dict], cache: Path) -> tuple[Counter, Counter, Counter, list[str]]:
    """(true positives, false positives, false negatives) per rule, and a line per wrong answer."""
    tp, fp, fn, wrong = Counter(), Counter(), Counter(), []
    for project in projects:
        local = {cached(project["repo"], project["commit"], p, cache): p for p in project["files"]}
        missing = [str(p) for p in local if not p.exists()]
        if missing:
            raise SystemExit(f"score: {missing[0]} is not in the cache; run fetch.py first")
        labels = [dict(label, found=False) for label in project["labels"]]
        main = project["files"][0]
        for f in sorted(_findings(list(local)), key=lambda f: (f.path, f.line, f.rule)):
            path = local.get(Path(f.path), f.path)
            match = next((label for label in labels if not label["found"] and label["rule"] == f.rule
                          and label.get("path", main) == path
                          and label["line"] <= f.line <= label.get("end", label["line"])), None)
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
    args = p.parse_args(argv)
    projects = json.loads(MANIFEST.read_text())["projects"]
    if args.held_out:
        projects = [p for p in projects if p.get("held_out")]
    tp, fp, fn, wrong = score(projects, args.cache)
    known = set(lint.RULES)
    print(f"{len(projects)} projects, {sum(len(p['files']) for p in projects)} files, "
          f"{sum(len(p['labels']) for p in projects)} labelled mistakes")
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
        if line[:2] in kinds:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
