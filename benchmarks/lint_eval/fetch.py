"""Copy the evaluation scripts named in manifest.json from local git mirrors into the cache folder.

The scripts are other people's code: they live only in the git-ignored cache/, never in the repository.
Each mirror is a git directory of the repository (as `git clone --mirror` or a snapshot tool leaves it);
the file is read at the pinned commit, so the cache holds exactly the labelled text.

    python benchmarks/lint_eval/fetch.py --mirrors DIR   # DIR/<owner>+<name>/repo is the git directory
    python benchmarks/lint_eval/fetch.py --mirrors DIR --manifest heldout_b.json --cache OTHER
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
CACHE = HERE / "cache"


def cached(repo: str, commit: str, path: str, cache: Path = CACHE) -> Path:
    """Where one pinned file lives in the cache."""
    return cache / repo.replace("/", "+") / commit[:12] / path


def _git_dir(mirrors: Path, repo: str) -> Path:
    base = mirrors / repo.replace("/", "+") / "repo"
    return base / ".git" if (base / ".git").is_dir() else base


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mirrors", type=Path, required=True, help="folder of git mirrors, one per repository")
    p.add_argument("--manifest", type=Path, action="append", default=[],
                   help="manifest to copy the files of (repeatable; default: manifest.json here)")
    p.add_argument("--cache", type=Path, default=CACHE, help="folder to copy into (default: cache/ here)")
    args = p.parse_args(argv)
    projects = [q for m in args.manifest or [MANIFEST] for q in json.loads(Path(m).read_text())["projects"]]
    missing = 0
    for project in projects:
        for path in project["files"]:
            target = cached(project["repo"], project["commit"], path, args.cache)
            if target.exists():
                continue
            git = _git_dir(args.mirrors, project["repo"])
            done = subprocess.run(["git", "--git-dir", str(git), "show", f"{project['commit']}:{path}"],
                                  capture_output=True)
            if done.returncode:
                print(f"fetch: cannot read {project['repo']}@{project['commit'][:12]}:{path} from {git}: "
                      f"{done.stderr.decode().strip()}", file=sys.stderr)
                missing += 1
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(done.stdout)
    print(f"{sum(len(p['files']) for p in projects) - missing} files in {args.cache}, {missing} missing")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
