"""Launchers of the project that start another program's ranks, linked to the programs they start."""

from __future__ import annotations

import ast
import os
import re

from ddpkit.lint.analysis import Script, terminal
from ddpkit.lint.project import Project

__all__ = ["link_launchers"]

_OPTION = re.compile(r"^--?([A-Za-z][\w-]*)")
_START = ("subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call")


def link_launchers(projects: list[Project]) -> None:
    """A launcher of the project (`subprocess.Popen(["python3", script, "--rank=%d" % i, ...], stdout=None if i == 0
    else open(os.devnull, "w"))` for each GPU) that sends the console of every rank but 0 away, linked to the
    programs it starts: the script it names (a constant `train.py`), or, where the script is named at run time
    (`args.script`, `sys.argv[1]`), each entry script of the project that parses every option the launcher passes
    and starts the process group. Their ranks' output on those streams reaches no console but rank 0's
    (`launcher_streams`); `launched_by` says which launcher, for the messages, where only one script fits (with
    several, each is a guess: their output findings are dropped and no message claims the link)."""
    starts = [(p, path, found) for p in projects for path, s in p.scripts.items() for found in _starts_ranks(s)]
    if not starts:
        return
    linked: dict[int, list[Project]] = {}
    for project in projects:
        entries = [path for path in project.paths if path not in project.imported]
        if not entries or not any(terminal(c.func) == "init_process_group" for s in project.scripts.values()
                                  for c in s.calls):
            continue
        parsed = {m.group(1).replace("-", "_") for s in project.scripts.values() for c in s.calls
                  if terminal(c.func) == "add_argument" for a in c.args
                  if isinstance(a, ast.Constant) and isinstance(a.value, str) for m in [_OPTION.match(a.value)] if m}
        for i, (launcher, _, (_, options, names, _)) in enumerate(starts):
            if launcher is not project and (any(os.path.basename(e) in names for e in entries) if names
                                            else len(options) >= 2 and options <= parsed):
                linked.setdefault(i, []).append(project)
    for i, found in linked.items():
        _, path, (line, _, _, streams) = starts[i]
        for project in found:
            project.launcher_streams |= streams
            project.silenced_streams |= streams
            if len(found) == 1:  # several scripts fit: which one it starts is a guess, so no message names it
                project.launched_by = (path, line)


def _starts_ranks(s: Script) -> list[tuple[int, set[str], set[str], set[str]]]:
    """(line, options passed, script file names given as constants, streams sent away for ranks but 0) for each
    call of `s` that starts a Python process per rank and sends some ranks' console away."""
    found = []
    for call in s.calls:
        if s.qualname(call.func) not in _START or not call.args:
            continue
        scope = s.context(call).scope
        home = next((d for d in s.defs if id(d) == scope), s.tree)
        # the command's strings, not the launcher's own options (`parser.add_argument("--script")`)
        own = {id(a) for c in ast.walk(home) if isinstance(c, ast.Call) and terminal(c.func) == "add_argument"
               for a in ast.walk(c)}
        texts = [n.value for n in ast.walk(home) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and id(n) not in own]
        options = {m.group(1).replace("-", "_") for t in texts for m in [_OPTION.match(t)] if m}
        names = {os.path.basename(t) for t in texts if t.endswith(".py")}
        assigned: dict[str, list[ast.AST]] = {}
        for n in ast.walk(home):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
                assigned.setdefault(n.targets[0].id, []).append(n.value)
        streams = set()
        for k in call.keywords:
            if k.arg in ("stdout", "stderr") and any(_away_off_rank0(s, v, call)
                                                     for v in assigned.get(getattr(k.value, "id", ""), [k.value])):
                streams.add(k.arg)
        if streams and options:
            found.append((call.lineno, options, names, streams))
    return found


def _away_off_rank0(s: Script, value: ast.AST, call: ast.Call) -> bool:
    """`None if i == 0 else open(os.devnull, "w")` (or DEVNULL, or a file), or one of those under a rank check."""
    def away(v: ast.AST) -> bool:
        return s.qualname(v).endswith("DEVNULL") or isinstance(v, ast.Call) and terminal(v.func) == "open"
    if isinstance(value, ast.IfExp) and isinstance(value.test, ast.Compare) and len(value.test.comparators) == 1 \
            and any(isinstance(x, ast.Constant) and x.value == 0 for x in (value.test.left, value.test.comparators[0])):
        return any(isinstance(arm, ast.Constant) and arm.value is None for arm in (value.body, value.orelse)) \
            and any(away(arm) for arm in (value.body, value.orelse))
    return away(value) and bool(s.context(call).level or any(s.kind(m) for m in ast.walk(value)))
