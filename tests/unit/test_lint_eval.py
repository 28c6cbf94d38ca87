"""The lint evaluation set and benchmarks: a well-formed manifest, a scorer that counts right, a speed script that runs."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ddpkit.lint import RULES, Finding

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH / "lint_eval"))
sys.path.insert(0, str(BENCH))

import fetch  # noqa: E402
import lint_speed  # noqa: E402
import score  # noqa: E402


def test_manifest_pins_at_least_30_programs_with_labels_of_known_rules():
    projects = json.loads(fetch.MANIFEST.read_text())["projects"]
    assert len(projects) >= 30
    assert len({(p["repo"], p["files"][0]) for p in projects}) == len(projects)
    for p in projects:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", p["repo"]) and re.fullmatch(r"[0-9a-f]{40}", p["commit"])
        for label in p["labels"]:
            assert label["rule"] in RULES and label["path"] in p["files"] and label["line"] > 0 and label["note"]


def test_scorer_counts_true_false_positives_and_misses(tmp_path, monkeypatch):
    project = {"repo": "someone/proj", "commit": "a" * 40, "files": ["train.py"],
               "labels": [{"path": "train.py", "line": 3, "rule": "DDP009", "note": "no destroy"},
                          {"path": "train.py", "line": 9, "rule": "DDP004", "note": "missed"}]}
    target = fetch.cached(project["repo"], project["commit"], "train.py", tmp_path)
    target.parent.mkdir(parents=True)
    target.write_text("x = 1\n")
    found = [Finding(str(target), 3, 1, "DDP009", "warning", "m", "f"),
             Finding(str(target), 5, 1, "DDP008", "warning", "m", "f")]
    monkeypatch.setattr(score, "_findings", lambda files: found)
    tp, fp, fn, wrong = score.score([project], tmp_path)
    assert (tp["DDP009"], fp["DDP008"], fn["DDP004"]) == (1, 1, 1)
    assert sum(tp.values()) == 1 and sum(fp.values()) == 1 and sum(fn.values()) == 1
    assert any(w.startswith("FN someone/proj:train.py:9 DDP004") for w in wrong)


def test_scorer_names_a_finding_in_a_file_beside_the_linted_ones_by_its_project_path(tmp_path, monkeypatch):
    """A launch script the linter reads next to the linted files (run.sh) is matched against labels by its path in
    the project, as the linted files are."""
    project = {"repo": "someone/proj", "commit": "a" * 40, "files": ["train.py"],
               "labels": [{"path": "run.sh", "line": 1, "rule": "DDP007", "note": "old launcher"}]}
    target = fetch.cached(project["repo"], project["commit"], "train.py", tmp_path)
    target.parent.mkdir(parents=True)
    target.write_text("x = 1\n")
    shell = fetch.cached(project["repo"], project["commit"], "run.sh", tmp_path)
    monkeypatch.setattr(score, "_findings", lambda files: [Finding(str(shell), 1, 1, "DDP007", "warning", "m", "f")])
    tp, fp, fn, _ = score.score([project], tmp_path)
    assert (sum(tp.values()), sum(fp.values()), sum(fn.values())) == (1, 0, 0)


def test_speed_benchmark_runs_on_a_tiny_project(capsys):
    assert lint_speed.main(["--files", "3", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"project: 3 files, \d+ lines, 0 findings", out)
    assert "lint_files (in process, best of 1):" in out and "(exit 0)" in out


def test_scorer_leaves_uncertain_places_unscored_and_skips_uncached_projects(tmp_path, monkeypatch):
    project = {"repo": "someone/proj", "commit": "b" * 40, "files": ["train.py"],
               "labels": [{"path": "train.py", "line": 3, "rule": "DDP009", "note": "no destroy", "end": "a note"}],
               "uncertain": [{"path": "train.py", "line": 5, "note": "unclear"}]}
    absent = {"repo": "someone/gone", "commit": "c" * 40, "files": ["main.py"], "labels": []}
    target = fetch.cached(project["repo"], project["commit"], "train.py", tmp_path)
    target.parent.mkdir(parents=True)
    target.write_text("x = 1\n")
    found = [Finding(str(target), 3, 1, "DDP009", "warning", "m", "f"),
             Finding(str(target), 5, 1, "DDP008", "warning", "m", "f")]
    monkeypatch.setattr(score, "_findings", lambda files: found)
    skipped: list[str] = []
    tp, fp, fn, wrong = score.score([project, absent], tmp_path, skipped)
    assert (sum(tp.values()), sum(fp.values()), sum(fn.values())) == (1, 0, 0)
    assert skipped == ["someone/gone"]


def test_a_linter_crash_on_one_program_is_scored_as_every_label_missed_and_named(tmp_path, monkeypatch):
    crashing = {"repo": "someone/deep", "commit": "d" * 40, "files": ["train.py"],
                "labels": [{"path": "train.py", "line": 2, "rule": "DDP004", "note": "every rank saves"}]}
    fine = {"repo": "someone/fine", "commit": "e" * 40, "files": ["train.py"],
            "labels": [{"path": "train.py", "line": 3, "rule": "DDP009", "note": "no destroy"}]}
    for project in (crashing, fine):
        target = fetch.cached(project["repo"], project["commit"], "train.py", tmp_path)
        target.parent.mkdir(parents=True)
        target.write_text("x = 1\n")

    def findings(files):
        if "someone+deep" in str(files[0]):
            raise RecursionError("maximum recursion depth exceeded")
        return [Finding(str(files[0]), 3, 1, "DDP009", "warning", "m", "f")]

    monkeypatch.setattr(score, "_findings", findings)
    tp, fp, fn, wrong = score.score([crashing, fine], tmp_path)
    assert (tp["DDP009"], fn["DDP004"], sum(fp.values())) == (1, 1, 0)
    assert any(w.startswith("CRASH someone/deep: the linter raised RecursionError") for w in wrong)
