"""Running the checks: files parsed, grouped into programs, each check's hits turned into findings."""

from __future__ import annotations

import ast
import os
import re
from dataclasses import replace

import ddpkit.lint.hangs  # noqa: F401  (registers DDP010 in CHECKS)
import ddpkit.lint.hazards  # noqa: F401  (registers DDP011-DDP013 in CHECKS)
import ddpkit.lint.wrapper  # noqa: F401  (registers DDP015 in CHECKS)
import ddpkit.lint.figures  # noqa: F401  (registers DDP006 in CHECKS)
import ddpkit.lint.echoes  # noqa: F401  (registers DDP008 in CHECKS)
import ddpkit.lint.scaling  # noqa: F401  (registers DDP006's scale checks in CHECKS)
import ddpkit.lint.choices  # noqa: F401  (registers DDP006's checkpoint choice in CHECKS)
import ddpkit.lint.seeding  # noqa: F401  (registers DDP014 in CHECKS)
from ddpkit.lint.analysis import Script
from ddpkit.lint.doubt import doubted
from ddpkit.lint.imports import programs
from ddpkit.lint.launchers import link_launchers
from ddpkit.lint.location import FOLLOWED, call_sites, guard_phrase
from ddpkit.lint.project import Project
from ddpkit.lint.report import Finding
from ddpkit.lint.rules import CHECKS, Hit
from ddpkit.lint.shell import shell_launches

__all__ = ["lint_sources", "analyse"]

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<ids>[A-Za-z0-9_, ]+))?", re.IGNORECASE)


def _suppressed(line: str, rule: str) -> bool:
    """`# noqa` silences every rule on the line; `# noqa: DDP004,DDP008` only those."""
    match = _NOQA.search(line)
    if match is None:
        return False
    ids = match.group("ids")
    return ids is None or rule in {i.strip().upper() for i in ids.split(",")}


def lint_sources(sources: dict[str, str], shell: dict[str, str] | None = None) -> list[Finding]:
    """All findings for files ({path: text}), sorted by position. Never executes them. `shell`: the project's shell
    scripts ({path: text}), read for launches of these files (ddpkit.lint.shell).

    Files that import each other are analysed together as one program (see Project). At most one
    finding per rule and line; a print on every rank that also reports a wrong metric gets both (DDP006 for the
    figure, DDP008 for the output repeated world_size times).
    """
    given = [*sources, *(shell or {})]
    if len({os.path.isabs(p) for p in given}) > 1:
        # some paths relative to the working folder, some absolute (`ddpkit lint train.py /abs/utils.py`, or the
        # port's script beside the modules it found): one spelling to place the files by their folders, and each
        # finding named as it was given
        spelled = {os.path.abspath(p): p for p in given}
        absolute = lint_sources({os.path.abspath(p): t for p, t in sources.items()},
                                {os.path.abspath(p): t for p, t in (shell or {}).items()})
        return sorted((replace(f, path=spelled.get(f.path, f.path)) for f in absolute), key=Finding.sort_key)
    findings: list[Finding] = []
    reported: set[tuple[str, int, str]] = set()  # a helper shared by two programs is reported once
    analysed = analyse(sources, findings)
    moved = _moved(analysed, sources)
    for path, script, hits in analysed:
        lines = sources[path].splitlines()
        seen: dict[tuple[int, str], Finding] = {}
        note = _runtime_note(script, path)
        launcher = script.project.launched_by
        for hit in [*hits, *moved.get(path, ())]:
            line = getattr(hit.node, "lineno", 1)
            text = lines[line - 1] if 0 < line <= len(lines) else ""
            if (line, hit.rule) not in seen and not _suppressed(text, hit.rule):
                seen[(line, hit.rule)] = Finding(path, line, getattr(hit.node, "col_offset", 0) + 1, hit.rule,
                                                 hit.severity, hit.message + note + (
                    f" (the ranks are started by {os.path.basename(launcher[0])}:{launcher[1]}, which shows only rank "
                    f"0's console)" if launcher and hit.rule in ("DDP006", "DDP008") else ""), hit.fix)
        for (line, rule), f in seen.items():
            if (path, line, rule) not in reported:
                reported.add((path, line, rule))
                findings.append(f)
    findings += shell_launches(shell or {}, sources)
    return sorted(findings, key=Finding.sort_key)


def _moved(analysed: list[tuple[str, Script, list[Hit]]], sources: dict[str, str]) -> dict[str, list[Hit]]:
    """Hits of the rules that follow calls, taken out of their helper (in place) and returned by the path of the
    helper's unguarded calls (see ddpkit.lint.location): one finding per call, naming the helper's lines."""
    moved: dict[str, dict[tuple[int, str], tuple[Hit, list[tuple[str, int]]]]] = {}
    for path, script, hits in analysed:
        kept = []
        for hit in hits:
            sites = call_sites(script, hit.node) if hit.rule in FOLLOWED else []
            line = getattr(hit.node, "lineno", 1)
            if not sites or _suppressed(_line(sources[path], line), hit.rule):
                kept.append(hit)
                continue
            for x, call, where in sites:
                name, _, _ = where.partition(" at ")
                key = (call.lineno, hit.rule)
                at = moved.setdefault(x.path, {})
                if key not in at:
                    at[key] = (Hit(call, hit.rule, hit.severity, guard_phrase(x, call), hit.fix), [])
                at[key][1].append((name, hit.message, where))
        hits[:] = kept
    out: dict[str, list[Hit]] = {}
    for path, at in moved.items():
        for (line, rule), (hit, inner) in at.items():
            names = sorted({n for n, _, _ in inner})
            by_file: dict[str, list[int]] = {}
            for place in sorted({w.partition(" at ")[2] for _, _, w in inner}, key=_place_key):
                by_file.setdefault(_place_key(place)[0], []).append(_place_key(place)[1])
            places = "; ".join(f"{file}:{', '.join(map(str, lines))}" for file, lines in by_file.items())
            message = f"{' and '.join(names)} ({places}) is called here {hit.message}: {inner[0][1]}"
            out.setdefault(path, []).append(Hit(hit.node, rule, hit.severity, message, hit.fix))
    return out


def _place_key(place: str) -> tuple[str, int]:
    file, _, line = place.rpartition(":")
    return file, int(line) if line.isdigit() else 0


def _line(source: str, line: int) -> str:
    lines = source.splitlines()
    return lines[line - 1] if 0 < line <= len(lines) else ""


def _runtime_note(script: Script, path: str) -> str:
    """Where a file runs only because the program imports it at run time, the finding says so (why it is linted as
    part of the program)."""
    via = script.project.reached_at_run_time.get(path)
    if via is None:
        return ""
    return f" (this file runs in the program through a run-time import at {os.path.basename(via[0])}:{via[1]})"


def analyse(sources: dict[str, str], errors: list[Finding] | None = None) -> list[tuple[str, Script, list[Hit]]]:
    """(path, Script, hits of every check) for each file that parses; a DDP000 finding into `errors` for the rest."""
    trees: dict[str, ast.Module] = {}
    for path, source in sources.items():
        try:
            # a UTF-8 byte-order mark read as text is U+FEFF before the first line: Python skips it when it runs the file
            trees[path] = ast.parse(source.removeprefix("\ufeff"), filename=path)
        except SyntaxError as e:
            if errors is not None:
                errors.append(Finding(path, e.lineno or 1, e.offset or 1, "DDP000", "error",
                                      f"cannot parse the file: {e.msg}",
                                      "fix the syntax error (ddpkit lint reads the file with this Python's parser)"))
    projects = [Project(program) for program in programs(trees)]
    link_launchers(projects)
    # a program that does nothing when run, linted beside one that does, is reached through code not linted (a
    # factory, a package __init__): who calls it, and under which rank check, is unknown, so the findings that
    # rest on the callers (a rank guard, a seed, set_epoch or destroy elsewhere) are left out
    entry = any(p.acts for p in projects)
    scripts = [(path, script) for p in projects for path, script in p.scripts.items()]
    # code no rank runs (a helper's own __main__, a function nothing calls) is not every rank's code
    return [(path, script, [hit for run_check in CHECKS for hit in run_check(script)
                            if script.project.runs(script, hit.node)
                            and not (entry and not script.project.acts and hit.rule in _CALLER_RULES
                                     and not _rank_code(script, hit.node))
                            and not doubted(script, hit)])
            for path, script in scripts]


def _rank_code(script: Script, node: ast.AST) -> bool:
    """Code known to run in the ranks whoever calls it: under its own rank check, or in a function that makes a
    collective or wraps a model in DDP (every rank must run those, so no caller can guard them by rank)."""
    ctx = script.context(node)
    if ctx.level or not ctx.functions:
        return bool(ctx.level)
    name = ctx.functions[-1]
    wrapping = script.project.memo("wrapping functions", lambda: {
        d.name for s in script.project.scripts.values() for d in s.defs
        if any(isinstance(c, ast.Call) and s.qualname(c.func).endswith("DistributedDataParallel") for c in ast.walk(d))})
    return name in script.project.reducing_functions or name in wrapping


_CALLER_RULES = frozenset({"DDP001", "DDP004", "DDP006", "DDP008", "DDP009", "DDP010", "DDP012", "DDP014"})
"""Rules whose finding depends on code that calls the file or runs beside it."""


