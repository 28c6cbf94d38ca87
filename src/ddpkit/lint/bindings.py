"""Which assignment of a name reaches a use, and which calls of a function give its optional parameters."""

from __future__ import annotations

import ast

__all__ = ["local_names", "optional_parameters", "passes", "switch_parameters", "switched_on", "presence_test", "scope_of", "path_up", "relation"]


def optional_parameters(defs: list[ast.AST]) -> set[str]:
    """Parameters that default to None in any of these function definitions."""
    found: set[str] = set()
    for d in defs:
        positional = [*d.args.posonlyargs, *d.args.args]
        pairs = list(zip(positional[len(positional) - len(d.args.defaults):], d.args.defaults))
        pairs += [(a, v) for a, v in zip(d.args.kwonlyargs, d.args.kw_defaults) if v is not None]
        found |= {a.arg for a, v in pairs if isinstance(v, ast.Constant) and v.value is None}
    return found


def switch_parameters(defs: list[ast.AST]) -> set[str]:
    """Parameters that default to False or None in every one of these function definitions (a switch a call turns
    on by passing a true constant: `save_cur=True`)."""
    found: set[str] | None = None
    for d in defs:
        positional = [*d.args.posonlyargs, *d.args.args]
        pairs = list(zip(positional[len(positional) - len(d.args.defaults):], d.args.defaults))
        pairs += [(a, v) for a, v in zip(d.args.kwonlyargs, d.args.kw_defaults) if v is not None]
        mine = {a.arg for a, v in pairs if isinstance(v, ast.Constant) and (v.value is False or v.value is None)}
        found = mine if found is None else found & mine
    return found or set()


def switched_on(call: ast.Call, defs: list[ast.AST], name: str, param: str) -> bool:
    """Whether `call` surely turns the switch `param` of the function `name` on: it passes a true constant
    (`save_cur=True`). A call that spreads `*args`/`**kwargs`, or passes anything else, may leave it off."""
    if _spreads(call):
        return False
    given = _argument(call, defs, name, param)
    return isinstance(given, ast.Constant) and given.value is not None and bool(given.value) \
        and not isinstance(given.value, str)


def passes(call: ast.Call, defs: list[ast.AST], name: str, param: str) -> bool:
    """Whether `call` gives the parameter `param` of the function `name` a value (other than None)."""
    if _spreads(call):
        return True
    given = _argument(call, defs, name, param)
    return given is not None and not (isinstance(given, ast.Constant) and given.value is None)


def _spreads(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords)


def _argument(call: ast.Call, defs: list[ast.AST], name: str, param: str) -> ast.AST | None:
    """What `call` passes to the parameter `param` of the function `name`, by keyword or by position (None where
    it passes nothing)."""
    given = next((k.value for k in call.keywords if k.arg == param), None)
    if given is not None:
        return given
    for d in defs:
        if d.name != name:
            continue
        positional = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
        if positional[:1] in (["self"], ["cls"]) and isinstance(call.func, ast.Attribute):
            positional = positional[1:]
        if param in positional and positional.index(param) < len(call.args):
            return call.args[positional.index(param)]
    return None


def presence_test(test: ast.AST) -> tuple[str, str]:
    """(name, branch that runs when it is given) for `if p:`, `if p is not None:` (body) and `if p is None:` (else)."""
    if isinstance(test, ast.Name):
        return test.id, "body"
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name) \
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
        return test.left.id, {ast.IsNot: "body", ast.Is: "else"}.get(type(test.ops[0]), "")
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return next(((name, "body") for v in test.values for name, branch in [presence_test(v)]
                     if name and branch == "body"), ("", ""))
    return "", ""


def scope_of(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST | None:
    """The function (or lambda, or class body) a node runs in; None at module level."""
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return node
    return None


def _field_of(parent: ast.AST, child: ast.AST) -> str:
    for name, value in ast.iter_fields(parent):
        if value is child or (isinstance(value, list) and any(v is child for v in value)):
            return name
    return ""


def path_up(node: ast.AST, parents: dict[int, ast.AST]) -> dict[int, str]:
    """id of each ancestor of `node` -> the field of that ancestor the path to `node` goes through."""
    path: dict[int, str] = {}
    while id(node) in parents:
        parent = parents[id(node)]
        path[id(parent)] = _field_of(parent, node)
        node = parent
    return path


def relation(stmt: ast.AST, use_path: dict[int, str], parents: dict[int, ast.AST]) -> str:
    """How an earlier statement stands to a later use: 'before' (it always runs first: it sits in a block
    the use is in), 'exclusive' (the other branch of an `if` the use is in) or 'maybe'."""
    child, node = stmt, stmt
    while id(node) in parents:
        parent = parents[id(node)]
        if id(parent) in use_path:
            field = _field_of(parent, node)
            if field == use_path[id(parent)]:
                return "before" if child is node else "maybe"
            if isinstance(parent, (ast.If, ast.IfExp)) and {field, use_path[id(parent)]} == {"body", "orelse"}:
                return "exclusive"
            return "maybe"
        node = parent
    return "maybe"


def local_names(scope: ast.AST) -> set[str]:
    """The parameters of a function and the names its own body assigns (not nested functions' names, not names
    declared global): a read of one of these reads the local variable, never a module-level function."""
    args = scope.args
    found = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg) if a}
    declared: set[str] = set()
    todo = list(scope.body) if isinstance(scope.body, list) else [scope.body]
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            declared.update(n.names)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            found.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(n.name)
            continue
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(n))
    return found - declared
