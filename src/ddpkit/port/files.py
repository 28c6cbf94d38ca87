"""Files every rank writes under names it counts itself, figures made on every rank, trackers made at import.

After the port each rank runs its own shard of a loader. A loop that saves one file per sample or batch under a
number it counts itself (`Image.fromarray(x).save("results/%d.png" % img_id)`, `img_id += 1`) writes the same names
on every rank (each overwrites the others' files); guarding it writes rank 0's shard alone. A figure made with
`fig = plt.figure()` / `ax = plt.gca()` on every rank, whose drawing calls the port runs on rank 0 only, is left open
on the others. A tracker built at import (`writer = SummaryWriter()` at module level) starts on every rank.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, root_name, walk

__all__ = ["plan_rank_files"]

_SAVES = re.compile(r"(^|\.)(save|savefig|imsave|imwrite|save_image|savetxt|to_csv)$")
_TRACKER = re.compile(r"(^|\.)(SummaryWriter|Visdom)$|^wandb\.init$")


def plan_rank_files(plan: Any) -> None:
    """TODOs for per-rank numbered files and trackers made at import; figure handles of guarded drawing go to rank 0."""
    pyplot = pyplot_names(plan.f.module)
    for key in sorted(plan.f.ported):
        nodes = list(plan.nodes(key))
        for loop in (n for n in nodes if isinstance(n, cst.For) and plan.loop_role(key, n) == "eval"):
            _numbered_files(plan, loop)
        if pyplot:
            _figure_handles(plan, key, nodes, pyplot)
    _trackers_at_import(plan)


def pyplot_names(module: cst.Module) -> set[str]:
    """What `matplotlib.pyplot` is bound to: `import matplotlib.pyplot as plt`, `from matplotlib import pyplot`."""
    names = set()
    for n in walk(module):
        if isinstance(n, cst.Import):
            names |= {dotted(a.asname.name) if a.asname else "matplotlib" for a in n.names
                      if dotted(a.name) == "matplotlib.pyplot"}
        elif isinstance(n, cst.ImportFrom) and n.module is not None and dotted(n.module) == "matplotlib" and \
                not isinstance(n.names, cst.ImportStar):
            names |= {dotted(a.asname.name) if a.asname else "pyplot" for a in n.names if dotted(a.name) == "pyplot"}
    return names


def _save_call(call: cst.Call) -> bool:
    """`x.save(path)`, `Image.fromarray(a).save(path)`, `plt.savefig(path)`, `cv2.imwrite(path, a)`."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("save", "savefig", "imsave", "imwrite"):
        return not dotted(call.func).startswith(("torch.", "self.", "model."))
    return bool(_SAVES.search(dotted(call.func))) and not dotted(call.func).startswith("torch.")


def _formatted_names(expr: cst.BaseExpression) -> set[str]:
    """Names a path is built from: `'r/%d.png' % i`, `f'r/{i}.png'`, `'r/{}.png'.format(i)`, `os.path.join(d, n)`."""
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Modulo):
        return {x.value for x in walk(expr.right) if isinstance(x, cst.Name)}
    if isinstance(expr, cst.FormattedString):
        return {x.value for p in expr.parts if isinstance(p, cst.FormattedStringExpression)
                for x in walk(p.expression) if isinstance(x, cst.Name)}
    if isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "format":
            return {x.value for a in expr.args for x in walk(a.value) if isinstance(x, cst.Name)}
        if dotted(expr.func) in ("os.path.join", "join"):
            return set().union(*(_formatted_names(a.value) for a in expr.args)) if expr.args else set()
    return set()


def _numbered_files(plan: Any, loop: cst.For) -> None:
    """A save inside a loop over a sharded evaluation loader (per-sample results), to a path numbered by a counter the loop advances or by the loop's
    own index: each rank numbers its own shard from the same start, so the ranks write the same names."""
    counters = {n.target.value for n in walk(loop.body) if isinstance(n, cst.AugAssign)
                and isinstance(n.target, cst.Name) and isinstance(n.operator, cst.AddAssign)}
    counters |= {x.value for x in walk(loop.target) if isinstance(x, cst.Name)}
    files = []
    for call in (n for n in walk(loop.body) if isinstance(n, cst.Call) and _save_call(n)):
        for arg in call.args:
            numbered = _formatted_names(arg.value) & counters
            if numbered:
                files.append((call, plan.f.code(arg.value), sorted(numbered)[0]))
                break
    if not files:
        return
    call, path, counter = files[0]
    more = f" (and {len(files) - 1} more file(s) in this loop)" if len(files) > 1 else ""
    _todo(plan, call, f"every rank writes `{path}`{more} numbered by `{counter}`, which each rank counts over its own "
              "shard of the data from the same start: the ranks overwrite each other's files, and under "
              "`if ctx.is_main:` only rank 0's shard is written; put ctx.rank in the names (or offset the "
              "number by it), or write these files from rank 0 over the whole data")


def _figure_handles(plan: Any, key: str, nodes: list[cst.CSTNode], pyplot: set[str]) -> None:
    """`fig = plt.figure()`, `ax = plt.gca()`, `ax2 = ax.twinx()` where the port runs the pyplot drawing on rank 0
    only: the handles and every line that uses them go to rank 0 as well (else each other rank keeps a figure open,
    never closed). A figure's handles move together or not at all (a handle used any other way keeps them all where
    they are: one bound on rank 0 alone would be unbound where the others use it)."""
    lines = [n for n in nodes if isinstance(n, cst.SimpleStatementLine)]
    guarded = [s for s in lines if id(s) in plan.guard and root_name(s.body[0].value if isinstance(
        s.body[0], cst.Expr) else s.body[0]) in pyplot]
    if not guarded:
        return
    owner: dict[str, int] = {}  # handle -> its group (a figure and the handles made from it)
    groups: dict[int, list[cst.SimpleStatementLine]] = {}
    for _ in range(3):  # handles made from handles: `ax2 = ax1.twiny()`
        for s in lines:
            small = s.body[0] if len(s.body) == 1 else None
            if any(s in g for g in groups.values()) or not isinstance(small, cst.Assign) or not isinstance(
                    small.value, cst.Call) or id(s) in plan.guard:
                continue
            root = root_name(small.value.func)
            if root in pyplot:
                group = len(groups)
            elif root in owner:
                group = owner[root]
            else:
                continue
            groups.setdefault(group, []).append(s)
            owner.update({x.value: group for t in small.targets for x in walk(t.target) if isinstance(x, cst.Name)})
    handles = set(owner)
    for group, bindings in groups.items():
        mine = {h for h, g in owner.items() if g == group}
        uses = [s for s in lines if s not in bindings and _names(s) & mine]
        if all(id(s) in plan.guard or _draws_only(plan, key, s, handles | pyplot) for s in uses):
            plan.guard.update(id(s) for s in bindings + uses)
        # else: a handle used some other way (`Axes3D(fig)`): the figure stays where it is, on every rank


def _names(stmt: cst.CSTNode) -> set[str]:
    """The names a statement reads or binds (not the attribute names after a dot, not text in strings)."""
    attrs = {id(n.attr) for n in walk(stmt) if isinstance(n, cst.Attribute)}
    return {n.value for n in walk(stmt) if isinstance(n, cst.Name) and id(n) not in attrs}


def _draws_only(plan: Any, key: str, stmt: cst.SimpleStatementLine, owners: set[str]) -> bool:
    """A line of calls on figure handles or pyplot alone (`ax.xaxis.set_major_locator(...)`), no model."""
    return all(isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and
               root_name(s.value.func) in owners for s in stmt.body) and not any(
        isinstance(c, cst.Call) and plan.role(key, dotted(c.func)) == "model" for c in walk(stmt))


def _trackers_at_import(plan: Any) -> None:
    """`writer = SummaryWriter(...)` at module level of a script whose training runs in a function: made on every
    rank when the module is imported, before ddpkit.init (nothing there can ask for the rank)."""
    if plan.f.ctx_global:
        return
    for stmt in plan.f.module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        call = next((c for c in walk(stmt) if isinstance(c, cst.Call) and _TRACKER.search(dotted(c.func))), None)
        if call is not None:
            _todo(plan, stmt, f"`{dotted(call.func)}(...)` is made at import, on every rank (each writes its own "
                      "copy of the logs): make it in the training function under `if ctx.is_main:` and log "
                      "through it on rank 0 only")


def _todo(plan: Any, node: cst.CSTNode, message: str) -> None:
    plan.todo(node, " ".join(message.split()))  # code quoted from several lines stays on the comment's one line
