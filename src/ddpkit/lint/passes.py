"""Where a sampler's loader is passed over again: the loop in which a missing set_epoch shows (DDP001)."""

from __future__ import annotations

import ast
from typing import Any

from ddpkit.lint.ranks import own_returns, terminal

Script = Any
"""A lint.analysis.Script (not imported: this module sits below it, beside lint.ranks)."""

__all__ = ["rerun_site", "passed_once", "enclosing_function"]

_DEPTH = 4


def enclosing_function(s: Script, node: ast.AST) -> ast.AST | None:
    """The innermost function around a node (None at module level)."""
    while (node := s.parents.get(id(node))) is not None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def rerun_site(s: Script, sampler: ast.Call) -> tuple[Script, ast.AST] | None:
    """(script, node) where the loader built over `sampler` is passed over again, followed by data flow: the
    sampler to the DataLoader given it (in its function, or in the caller of a function that returns the sampler),
    the loader through names, `self.` attributes, the returns of loader factories (`train_loader, val_loader =
    build(...)`, `Factory(args).data`) and the parameters of the project functions it is handed to. The site is the
    `for` over the loader (or over `tqdm(loader)`, `enumerate(...)`, a name assigned from those) inside another loop
    of its function (`while True:`, `for epoch in ...`, a generator's `while True:`), or, where the loader is handed
    to a function that iterates it once, the loop around that call. None where no such loop is found for sure."""
    return s.project.memo(("rerun site", id(sampler)), lambda: _site(s, sampler))


def passed_once(s: Script, sampler: ast.Call) -> bool:
    """The loaders built over `sampler` are read only to make one iterator each (`loader_iter = enumerate(loader)`,
    `iter(loader)`), outside any loop and `except` handler, in a function no loop calls: the program takes its
    batches with next() in a step loop over a dataset sized to the run (`max_iters=...`) and passes over the data
    once, so there is no second epoch for set_epoch to reorder. An iterator made again when it runs out (`except
    StopIteration: it = iter(loader)`) is a second pass."""
    uses = [(x, use) for x, loader in _loaders(s, sampler) for holder in _holders(x, loader)
            for use in _uses(*holder)]
    return bool(uses) and all(_one_iterator(x, use) for x, use in uses) and not any(
        _called_in_a_loop(x, function) for x, use in uses if (function := enclosing_function(x, use)) is not None)


def _one_iterator(s: Script, use: ast.AST) -> bool:
    """`it = iter(loader)` / `it = enumerate(loader)` outside any loop or except handler of its function."""
    made = s.parents.get(id(use))
    stmt = s.parents.get(id(made))
    if not (isinstance(made, ast.Call) and terminal(made.func) in ("iter", "enumerate") and made.args
            and made.args[0] is use and isinstance(stmt, ast.Assign) and stmt.value is made):
        return False
    for parent in _ancestors(s, stmt):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return True
        if isinstance(parent, (ast.For, ast.While, ast.AsyncFor, ast.ExceptHandler)):
            return False
    return True


def _called_in_a_loop(s: Script, function: ast.AST) -> bool:
    """Some call of the function (by its name) sits in a loop: each call makes its iterator anew."""
    return any(y.in_loop(call) for y, call in s.project.calls_named(function.name))


def _site(s: Script, sampler: ast.Call) -> tuple[Script, ast.AST] | None:
    for x, loader in _loaders(s, sampler):
        for holder in _holders(x, loader):
            found = _consumed(*holder, handed=None, depth=0)
            if found is not None:
                return found
    return None


def _argument_of(s: Script, value: ast.AST) -> ast.Call | None:
    parent = s.parents.get(id(value))
    if isinstance(parent, ast.keyword):
        parent = s.parents.get(id(parent))
    return parent if isinstance(parent, ast.Call) and value is not parent.func else None


def _loaders(s: Script, sampler: ast.Call) -> list[tuple[Script, ast.Call]]:
    """The DataLoader calls given the sampler: directly, through a name it is assigned to in its function (or
    through torch's BatchSampler), or as the return value of its function (or an item of the tuple it returns,
    unpacked by name) at the callers' DataLoader."""
    out: list[tuple[Script, ast.Call]] = []
    values: list[tuple[Script, ast.AST]] = [(s, sampler)]
    while values:
        x, value = values.pop()
        call = _argument_of(x, value)
        if call is not None and terminal(call.func) == "DataLoader":
            out.append((x, call))
            continue
        if call is not None and terminal(call.func) == "BatchSampler":
            values.append((x, call))
            continue
        parent = x.parents.get(id(value))
        if isinstance(parent, ast.IfExp) and value is not parent.test:  # `RandomSampler(d) if ... else <sampler>`
            values.append((x, parent))
            continue
        function = enclosing_function(x, value)
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and len(values) < 8 \
                and isinstance(target := parent.targets[0], (ast.Name, ast.Attribute)):
            held = _held(x, target, function)
            if held is not None:
                values.extend((x, n) for n in _uses(x, *held))
        elif isinstance(parent, ast.Return) and function is not None and len(out) + len(values) < 8:
            values.extend((y, c) for y, c in x.project.calls_named(function.name) if _calls(y, c, x, function))
        elif isinstance(parent, ast.Tuple) and isinstance(x.parents.get(id(parent)), ast.Return) \
                and function is not None and len(out) + len(values) < 8:
            values.extend(_unpacked(x, function, next(i for i, e in enumerate(parent.elts) if e is value)))
    return out


def _unpacked(s: Script, function: ast.AST, index: int) -> list[tuple[Script, ast.AST]]:
    """Where the callers of `function` read item `index` of the tuple it returns, unpacked by name
    (`train_set, val_set, train_sampler, val_sampler = load_data(args)`)."""
    out = []
    for y, call in s.project.calls_named(function.name):
        stmt = y.parents.get(id(call))
        if _calls(y, call, s, function) and isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Tuple) and len(stmt.targets[0].elts) > index \
                and isinstance(item := stmt.targets[0].elts[index], ast.Name):
            out += [(y, n) for n in _uses(y, enclosing_function(y, call) or y.tree, item.id)]
    return out


def _calls(y: Script, call: ast.Call, x: Script, function: ast.AST) -> bool:
    """The call names that function of script x (a plain name of the same file, or an import of it)."""
    if y is x and isinstance(call.func, ast.Name):
        return True
    found = x.project.resolve(y, call.func)
    return found is not None and found[0] == x.path and found[1] == function.name


def _holders(s: Script, value: ast.AST, depth: int = 0) -> list[tuple[Script, ast.AST | None, str]]:
    """(script, function or None for a `self.` attribute, name) that hold the value: the names it is assigned to,
    and where its function returns it, the names its callers assign the result (or that item of it) to."""
    parent = s.parents.get(id(value))
    function = enclosing_function(s, value)
    if not isinstance(parent, ast.Assign) or len(parent.targets) != 1 or depth > _DEPTH:
        return []
    target = parent.targets[0]
    held = _held(s, target, function) if isinstance(target, (ast.Name, ast.Attribute)) else None
    if held is not None and held[0] is None:
        out = [(s, None, "." + target.attr)]
        classdef = next((p for p in _ancestors(s, value) if isinstance(p, ast.ClassDef)), None)
        if classdef is not None:  # `Factory(args).data` in a caller: what the attribute holds
            for y, call in s.project.calls_named(classdef.name):
                outer = y.parents.get(id(call))
                if isinstance(outer, ast.Attribute) and outer.attr == target.attr and outer.value is call:
                    out.extend(_holders(y, outer, depth + 1))
        return out
    if held is None:
        return []
    out = [(s, *held)]
    for ret in own_returns(function) if function is not None else ():
        index = None if isinstance(ret.value, ast.Name) and ret.value.id == target.id else next(
            (i for i, e in enumerate(ret.value.elts) if isinstance(e, ast.Name) and e.id == target.id), -1) \
            if isinstance(ret.value, ast.Tuple) else -1
        if index == -1:
            continue
        for y, call in s.project.calls_named(function.name):
            if not _calls(y, call, s, function):
                continue
            stmt = y.parents.get(id(call))
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            if index is None:
                out.extend(_holders(y, call, depth + 1))
            elif isinstance(stmt.targets[0], ast.Tuple) and len(stmt.targets[0].elts) > index:
                item = stmt.targets[0].elts[index]
                if isinstance(item, ast.Name):
                    out.append((y, enclosing_function(y, call) or y.tree, item.id))
    return out


def _ancestors(s: Script, node: ast.AST):
    while (node := s.parents.get(id(node))) is not None:
        yield node


def _held(s: Script, target: ast.AST, function: ast.AST | None) -> tuple[ast.AST | None, str] | None:
    """(function, or the module for module-level code, or None for a `self.` attribute; name) an assignment target
    stands for; None for other targets."""
    if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
        return None, "." + target.attr
    if isinstance(target, ast.Name):
        return function or s.tree, target.id
    return None


def _uses(s: Script, function: ast.AST | None, name: str) -> list[ast.AST]:
    """Where the holder is read: `self.name` anywhere in the file, or the name in its own function's code."""
    if function is None:
        return [n for n in s.nodes if isinstance(n, ast.Attribute) and n.attr == name[1:] and isinstance(
            n.value, ast.Name) and n.value.id == "self" and isinstance(n.ctx, ast.Load)]
    own = None if isinstance(function, ast.Module) else function
    return [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
            and enclosing_function(s, n) is own]


def _consumed(s: Script, function: ast.AST | None, name: str, handed: tuple[Script, ast.Call, str] | None,
              depth: int, root: str = "") -> tuple[Script, ast.AST] | None:
    """The site (see rerun_site) for a loader held by `name`; `handed`: the call that handed it to this function;
    `root`: the name that holds the loader itself where `name` holds a wrapper of it (`tqdm(loader)`)."""
    if depth > _DEPTH:
        return None
    for use in _uses(s, function, name):
        node = use
        while True:  # up through `enumerate(...)`, `tqdm(...)`, `iter(...)` to what consumes it
            parent = s.parents.get(id(node))
            if isinstance(parent, ast.Call) and node is not parent.func and terminal(parent.func) in _WRAPPERS:
                node = parent
                continue
            if isinstance(parent, ast.keyword) and terminal(s.parents[id(parent)].func) in _WRAPPERS:
                node = s.parents[id(parent)]
                continue
            if isinstance(parent, ast.IfExp) and node is not parent.test:  # `tqdm(loader) if main else loader`
                node = parent
                continue
            break
        child = node
        parent = s.parents.get(id(node))
        if isinstance(parent, ast.For) and parent.iter is child:
            if _loop_around(s, parent, root or name) is not None:
                return s, parent
            if handed is not None:
                caller_script, call, held = handed
                loop = _loop_around(caller_script, call, held)
                if loop is not None:
                    return caller_script, loop
            continue
        if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name) \
                and child is not use and function is not None:  # `epoch_iterator = tqdm(train_loader, ...)`
            found = _consumed(s, function, parent.targets[0].id, handed, depth + 1, root or name)
            if found is not None:
                return found
            continue
        call = _argument_of(s, use)
        if call is None or child is not use:
            continue
        target = _parameter(s, call, use)
        if target is not None:
            found = _consumed(*target, handed=(s, call, name), depth=depth + 1)
            if found is not None:
                return found
    return None


_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip"})


def _parameter(s: Script, call: ast.Call, value: ast.AST) -> tuple[Script, ast.AST, str] | None:
    """(script, function, parameter name) of the project function that receives `value` in `call`."""
    found = s.project.callee(s, call)
    if found is None:
        return None
    x, name = found
    defs = [d for d in x.defs if d.name == name and enclosing_function(x, d) is None]
    if len(defs) != 1:
        return None
    d = defs[0]
    params = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
    if value in call.args:
        index = call.args.index(value)
        if any(isinstance(a, ast.Starred) for a in call.args[:index + 1]) or index >= len(params):
            return None
        return x, d, params[index]
    keyword = next((k for k in call.keywords if k.value is value), None)
    if keyword is not None and keyword.arg in (*params, *(a.arg for a in d.args.kwonlyargs)):
        return x, d, keyword.arg
    return None


def _loop_around(s: Script, node: ast.AST, name: str) -> ast.AST | None:
    """The innermost loop of node's function around it that does not also (re)bind `name` (a loader built anew on
    every pass is not passed over again)."""
    for parent in _ancestors(s, node):
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return None
        if isinstance(parent, (ast.For, ast.While, ast.AsyncFor)):
            rebinds = any(isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Store)
                          and (n.id if isinstance(n, ast.Name) else "." + n.attr) == name for n in ast.walk(parent))
            if not rebinds:
                return parent
    return None
