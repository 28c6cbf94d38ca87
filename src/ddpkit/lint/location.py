"""Where a finding is reported: a mistake inside a small helper is reported at the training code's calls of it.

`def save_checkpoint(...): torch.save(...)` is the same code for every caller; whether every rank runs it is decided
where the training code calls it, and that call is where the fix (a rank check) goes. So a finding of a rule that
follows calls, on a statement of such a helper that is not under a rank check of its own, is reported once at each
call of the helper that no rank check guards (calls under a rank check are fine and get nothing), climbing through
helpers of helpers to the outermost such call. A finding the helper has because its callers test the local rank only
(DDP004's multi-node warning) is reported likewise at those calls: their check is the one to change. The helper stays
the place when its callers are not all known.
"""

from __future__ import annotations

import ast
import os

from ddpkit.lint.analysis import LOCAL, NONE, Script, terminal

__all__ = ["FOLLOWED", "call_sites", "guard_phrase"]

FOLLOWED = frozenset({"DDP004", "DDP014"})
"""Rules whose finding in a helper is reported at the helper's unguarded calls: the fix (a rank check around the
call, a seed that adds the rank) goes there. Not DDP005 (map_location is added to the torch.load itself) nor
DDP008 (a print is silenced where it is, or by the logging set-up of each rank)."""


def call_sites(script: Script, node: ast.AST) -> list[tuple[Script, ast.Call, str]]:
    """(script, call, where) for each outermost call with no rank check that reaches `node` through helpers; `where`
    names the helper and the line (`save_checkpoint() at utils.py:12`). Empty when the finding stays at `node`."""
    project = script.project
    out: list[tuple[Script, ast.Call, str]] = []
    frontier = [(script, node, "")]
    for _ in range(4):  # (a helper of a helper of a helper: deeper chains stay where they are)
        following = []
        for x, n, where in frontier:
            calls = _unguarded_calls(project, x, n)
            if calls is None:
                out.append((x, n, where))
                continue
            here = where or f"{x.context(n).functions[0]}() at {os.path.basename(x.path)}:{n.lineno}"
            following += [(cx, c, here) for cx, c in calls]
        frontier = following
        if not frontier:
            break
    out += frontier
    if [(x, n) for x, n, _ in out] == [(script, node)]:
        return []
    return [(x, n, where) for x, n, where in out if isinstance(n, ast.Call)]


def _unguarded_calls(project, script: Script, node: ast.AST) -> list[tuple[Script, ast.Call]] | None:
    """The calls with no rank check of the helper that holds `node`, or None where `node` is not in such a helper:
    a module-level function without loops (a loop of work is training code, not a helper), with no decorator, that
    returns no value and that the program only calls as a statement of its own (a result the caller uses, as of
    `ckpt = load_checkpoint(...)`, is needed on every rank: the call cannot go under a rank check), never passes
    along (as to mp.spawn); whose calls all resolve to it, sit in functions or in module code that loops itself
    (a call from module code that does not makes it the entry point) and run; that tests no rank itself; and
    `node` under no rank check in it, nor under or after a test of a parameter that decides whether it runs (the
    body is then the same for every caller). Where `node` is
    under a local-rank check only, which the helper gets from its callers, the calls are those under that check."""
    ctx = script.context(node)
    if ctx.level not in (NONE, LOCAL) or ctx.single or len(ctx.functions) != 1:
        return None
    name = ctx.functions[0]
    d = next((d for d in script.tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
              and d.name == name), None)
    if d is None or d.decorator_list or [e for e in script.tree.body if getattr(e, "name", None) == name] != [d] \
            or any(isinstance(n, (ast.For, ast.AsyncFor, ast.While)) or isinstance(n, ast.Return) and n.value is not None
                   for n in ast.walk(d)):
        return None
    params = {a.arg for a in (*d.args.posonlyargs, *d.args.args, *d.args.kwonlyargs, d.args.vararg, d.args.kwarg)
              if a is not None}
    ifs = {id(n): n for n in ast.walk(d) if isinstance(n, ast.If)}
    if any(b[0] in ifs for n in ast.walk(d) for b in script.context(n).branches):
        return None  # a helper that tests the rank itself is where its rank logic is fixed
    ancestors = set()
    up = script.parents.get(id(node))
    while up is not None and up is not d:
        ancestors.add(id(up))
        up = script.parents.get(id(up))
    flags: list[tuple[str, bool]] = []  # (parameter, whether it must be true) of `if final:` around the node
    for n in ifs.values():
        if any(isinstance(v, ast.Name) and v.id in params for v in ast.walk(n.test)) and (
                id(n) in ancestors or n.lineno < node.lineno and any(
                    isinstance(t, (ast.Return, ast.Raise)) for t in ast.walk(n))):
            flag = _flag_test(n.test, params)
            if flag is None or id(n) not in ancestors:
                return None  # which callers reach it depends on what they pass (`if final:`): it stays in the helper
            inside = any(id(b) in ancestors or b is node for b in n.body)
            flags.append((flag[0], flag[1] == inside))
    calls = []
    for x in project.scripts.values():
        for n in x.nodes:
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and not (
                    isinstance(x.parents.get(id(n)), ast.Call) and x.parents[id(n)].func is n):
                return None  # passed along: it runs where the receiver calls it
        for c in x.calls:
            if terminal(c.func) != name:
                continue
            if not _resolves(project, x, c, script.path, name):
                return None  # a call of this name that may be another function, or this one through a path not seen
            if project.runs(x, c):
                if not x.context(c).functions and not _module_loops(x) \
                        or not isinstance(x.parents.get(id(c)), ast.Expr):
                    return None
                calls.append((x, c))
    if flags:
        # `if save_cur: torch.save(...)`: only the calls that pass a constant making every such test pass reach the
        # node; a call passing a value not known here leaves it in the helper
        positional = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
        reaching = []
        for x, c in calls:
            passed = [_constant_truth(d, c, positional, name) for name, _ in flags]
            if any(p is None for p in passed):
                return None
            if all(p == want for p, (_, want) in zip(passed, flags)):
                reaching.append((x, c))
        calls = reaching
    unguarded = [(x, c) for x, c in calls if x.context(c).level == ctx.level and not x.context(c).single]
    return unguarded or None


def guard_phrase(script: Script, call: ast.Call) -> str:
    """What guards a call a finding is moved to: nothing, or a local-rank check only."""
    if script.context(call).level == LOCAL:
        return "under a local-rank check only, so local rank 0 of every node runs it"
    return "with no rank check, so every rank runs it"


def _module_loops(script: Script) -> bool:
    """The module code itself loops (over epochs or data): it is the training code, and a module-level call of a
    helper is a call like any other, not the entry point's (`if __name__ == "__main__": main()`)."""
    todo = list(script.tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def _flag_test(test: ast.AST, params: set[str]) -> tuple[str, bool] | None:
    """`if save_cur:` -> ('save_cur', True), `if not final:` -> ('final', False); None for any other test."""
    if isinstance(test, ast.Name) and test.id in params:
        return test.id, True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _flag_test(test.operand, params)
        return (inner[0], not inner[1]) if inner else None
    return None


def _constant_truth(d: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, positional: list[str],
                    name: str) -> bool | None:
    """The truth of what a call passes for parameter `name` (its default where it passes nothing), when a constant."""
    value = next((k.value for k in call.keywords if k.arg == name), None)
    if value is None and any(k.arg is None for k in call.keywords) \
            or any(isinstance(a, ast.Starred) for a in call.args):
        return None
    if value is None and name in positional and positional.index(name) < len(call.args):
        value = call.args[positional.index(name)]
    if value is None:
        defaults = dict(zip(positional[len(positional) - len(d.args.defaults):], d.args.defaults))
        defaults.update({a.arg: v for a, v in zip(d.args.kwonlyargs, d.args.kw_defaults) if v is not None})
        value = defaults.get(name)
    return bool(value.value) if isinstance(value, ast.Constant) else None


def _resolves(project, x: Script, call: ast.Call, path: str, name: str) -> bool:
    if isinstance(call.func, ast.Name) and x.path == path and name not in x.aliases:
        return True
    return project.resolve(x, call.func) == (path, name)
