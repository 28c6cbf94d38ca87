"""Parameters of the wrapped model a training step leaves without gradient: in its class, or in the project classes
its class builds (blocks in an `nn.Sequential`, made by a method or a helper of the project), read with ast.

DDP waits for a gradient of every parameter it registered; one that never gets one fails the second step ("Expected
to have finished reduction in the prior iteration"). A layer built in `__init__` whose call in forward is commented
out is the usual case: the wrap then needs find_unused_parameters=True.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable

from ddpkit.port.weights import Definition, ast_dotted, forward_reads, maybe_unused, wrapped_classes

__all__ = ["Resolve", "unused_in_wrapped", "unused_wraps", "used_outside_forward"]

Resolve = Callable[[str, str], "tuple[str, ast.AST] | None"]
"""(name, file) -> (its file, its definition): a name as a module of the project sees it ("" is the script)."""

_LAYERS = ("Linear", "Conv", "Norm", "Embedding", "LSTM", "GRU", "RNN", "Attention", "Bilinear", "PReLU",
           "Transformer", "Parameter")
"""Layers of torch.nn that hold parameters themselves."""

Made = tuple[str, ast.ClassDef, dict[str, tuple[str, ast.ClassDef]]]
"""A project class instance: (its file, its class, the classes its constructor's parameters are bound to)."""


def _bind(call: ast.Call, fn: ast.FunctionDef, env: dict, path: str, follow: Resolve,
          method: bool) -> dict[str, tuple[str, ast.ClassDef]]:
    """The parameters of `fn` that `call` hands a class of the project (`Encoder(BasicBlock, ...)`: block)."""
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args][1 if method else 0:]
    pairs = list(zip(params, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
    out = {}
    for name, value in pairs:
        if isinstance(value, ast.Starred):
            break  # positions after a *args are unknown
        cls = _class_named(value, env, path, follow)
        if cls is not None:
            out[name] = cls
    return out


def _class_named(node: ast.AST, env: dict, path: str, follow: Resolve) -> tuple[str, ast.ClassDef] | None:
    """The project class a name stands for: a parameter bound to one, or a class the module defines or imports."""
    if not isinstance(node, ast.Name):
        return None
    if node.id in env:
        return env[node.id]
    found = follow(node.id, path)
    return (found[0], found[1]) if found is not None and isinstance(found[1], ast.ClassDef) else None


def _made(expr: ast.AST, fn: ast.AST, env: dict, path: str, follow: Resolve, methods: dict[str, ast.FunctionDef],
          depth: int) -> list[Made]:
    """The project class instances `expr` builds, as code of `fn` (a method of the class or a helper of the project)
    runs it: directly, through a local name it filled (`layers.append(block(...))`), or through what a method of the
    class or a function of the project it calls returns."""
    out: list[Made] = []
    local: dict[str, list[ast.AST]] = {}  # local name -> expressions that fill it
    for n in ast.walk(fn):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    local.setdefault(t.id, []).append(n.value)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            local.setdefault(n.target.id, []).append(n.value)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.attr in ("append", "extend", "insert", "add_module"):
            local.setdefault(n.func.value.id, []).extend(n.args)
    seen: set[str] = set()
    stack = [expr]
    while stack:
        for n in ast.walk(stack.pop()):
            if isinstance(n, ast.Name) and n.id in local and n.id not in seen and isinstance(n.ctx, ast.Load):
                seen.add(n.id)
                stack.extend(local[n.id])
            if not isinstance(n, ast.Call):
                continue
            cls = _class_named(n.func, env, path, follow)
            if cls is not None:
                init = next((m for m in cls[1].body if isinstance(m, ast.FunctionDef) and m.name == "__init__"), None)
                out.append((*cls, _bind(n, init, env, path, follow, True) if init is not None else {}))
                continue
            if depth >= 3:
                continue
            if isinstance(n.func, ast.Attribute) and ast_dotted(n.func.value) == "self" and n.func.attr in methods:
                callee, where, method = methods[n.func.attr], path, True
            elif isinstance(n.func, ast.Name) and (found := follow(n.func.id, path)) is not None and isinstance(
                    found[1], ast.FunctionDef):
                where, callee, method = found[0], found[1], False
            else:
                continue
            bound = _bind(n, callee, env, path, follow, method)
            for ret in ast.walk(callee):
                if isinstance(ret, ast.Return) and ret.value is not None:
                    out += _made(ret.value, callee, bound, where, follow, methods if method else {}, depth + 1)
    return out


def _built(cls: ast.ClassDef, path: str, env: dict, follow: Resolve) -> dict[str, list[Made]]:
    """self.<attribute> -> the project class instances `__init__` builds into it."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    out: dict[str, list[Made]] = {}
    for n in ast.walk(methods["__init__"]):
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Attribute) and ast_dotted(t.value) == "self":
                    made = _made(n.value, methods["__init__"], env, path, follow, methods, 0)
                    if made:
                        out.setdefault(t.attr, []).extend(made)
    return out


def _inherits_work(cls: ast.ClassDef) -> bool:
    """A method of the class calls one of its base class (`super().forward(x)`), which may read its layers."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr != "__init__" and
               isinstance(n.func.value, ast.Call) and ast_dotted(n.func.value.func) == "super" for n in ast.walk(cls))


def _holds_layers(cls: ast.ClassDef) -> bool:
    """The class builds a torch.nn layer with parameters in its own code (`nn.Conv2d`, `nn.Parameter`)."""
    return any(isinstance(n, ast.Call) and ast_dotted(n.func).startswith(("nn.", "torch.nn.")) and any(
        k in ast_dotted(n.func).rsplit(".", 1)[-1] for k in _LAYERS) for n in ast.walk(cls))


def _nested(cls: ast.ClassDef, path: str, env: dict, follow: Resolve, depth: int, seen: set
            ) -> list[tuple[str, str, int]]:
    """(`Class.attribute`, file, line) of parameters in the project classes `cls` builds that a forward of `cls`
    leaves without gradient: a layer such a class's own forward never reads (or reads under a condition), or an
    instance of such a class `cls`'s forward never reads. Silent where forward reads its modules by name, or picks
    among the instances (`self.heads[task]`): which ones run is not known."""
    key = (path, cls.name, tuple(sorted((k, v[1].name) for k, v in env.items())))
    always = forward_reads(cls)
    if always is None or key in seen or depth > 4:
        return []
    seen.add(key)
    out = []
    for attr, made in _built(cls, path, env, follow).items():
        if any(isinstance(n, ast.Subscript) and ast_dotted(n.value) == f"self.{attr}" for n in ast.walk(cls)):
            continue
        through = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and
                   ast_dotted(n.value) == f"self.{attr}"}  # `self.encoder.bn1(x)`: the parent calls it itself
        line = next(n.lineno for n in ast.walk(cls) if isinstance(n, ast.Attribute) and ast_dotted(n) == f"self.{attr}")
        for where, child, bound in made:
            if attr not in always:
                if _holds_layers(child):
                    out.append((f"{cls.name}.{attr}", path, line))
                continue
            if through & {m.name for m in child.body if isinstance(m, ast.FunctionDef)} or _inherits_work(child):
                continue  # `self.vae.encode(x)`: another method than its forward runs; `super().forward(x)`
            out += [(f"{child.name}.{name}", where, at) for name, at in maybe_unused(child) if name not in through]
            out += _nested(child, where, bound, follow, depth + 1, seen)
    return list(dict.fromkeys(out))


def _unused_of(node: ast.Call, builders: dict[str, list[str]], definition: Definition, follow: Resolve | None
               ) -> tuple[str, str, list[tuple[str, str, int]]] | None:
    """(file, class, [(`self.attribute` or `Class.attribute`, file, line)]) of the first class of the project that
    `ddpkit.wrap(model, ctx)` may wrap (any class the name is built by, in any branch) holding a parameter its
    forward, or the forward of a project class it builds, may leave unused. Classes of the script itself ("" file)
    are ddpkit.port.unused's, but for the classes they build."""
    for found in wrapped_classes(node, builders, definition):
        unused = [(f"self.{attr}", found[0], line) for attr, line in maybe_unused(found[2])] if found[0] else []
        unused = unused or (_nested(found[2], found[0], {}, follow, 0, set()) if follow is not None else [])
        if unused:
            return found[0], found[1], unused
    return None


def _names(found: tuple[str, str, list[tuple[str, str, int]]]) -> str:
    return ", ".join(f"{what} ({os.path.basename(where or found[0]) or 'this file'}:{line})"
                     for what, where, line in found[2][:3])


def unused_wraps(tree: ast.Module, builders: dict[str, list[str]], definition: Definition,
                 follow: Resolve | None = None) -> list[tuple[ast.Call, str]]:
    """(wrap call, note) for each `ddpkit.wrap(model, ctx)` without find_unused_parameters where a class of the
    project the model may be built by, or a project class it builds, holds a parameter its forward may leave unused
    (read under a condition, never read, or its output thrown away): DDP fails at the second step when one gets no
    gradient, so the wrap gets find_unused_parameters=True, as a class of the script's own file does (slower; never
    wrong). `follow` resolves the names a module of the project uses, to follow the classes a class builds."""
    out: list[tuple[ast.Call, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) == "ddpkit.wrap" and node.args) or any(
                kw.arg in ("find_unused_parameters", None) for kw in node.keywords):
            continue
        found = _unused_of(node, builders, definition, follow)
        if found is not None:
            where = f"{os.path.basename(found[0])} (read, not ported)" if found[0] else "this file"
            out.append((node, f"`{found[1]}` in {where} may leave {_names(found)} without "
                              "gradient (its forward, or the forward of a class it builds, reads it only under a "
                              "condition, never, or throws its output away), so DDP runs with "
                              "find_unused_parameters=True (slower); drop the module, or make its output reach the "
                              "loss, to train faster"))
    return out


def unused_in_wrapped(tree: ast.Module, builders: dict[str, list[str]], definition: Definition,
                      follow: Resolve | None = None) -> list[tuple[int, str]]:
    """`ddpkit.wrap(model, ctx)` without find_unused_parameters where a class of the project the model may be built
    by holds a parameter its forward may leave unused: a TODO where the gate could not add the keyword itself."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) == "ddpkit.wrap" and node.args) or any(
                kw.arg == "find_unused_parameters" for kw in node.keywords):
            continue
        found = _unused_of(node, builders, definition, follow)
        if found is not None:
            where = f"{os.path.basename(found[0])} (read, not ported)" if found[0] else "this file"
            out.append((node.lineno, f"not checked: `{found[1]}` in {where}: its forward, or the "
                                     f"forward of a class it builds, reads {_names(found)} only under a condition, "
                                     "never, or throws its output away, so a step may give it no gradient and DDP "
                                     "fails at the next one: wrap with ddpkit.wrap(..., ctx, "
                                     "find_unused_parameters=True) unless it is always used"))
    return out


def used_outside_forward(tree: ast.Module, builders: dict[str, list[str]], definition: Definition,
                         follow: Resolve | None = None) -> list[tuple[int, str]]:
    """A TODO where the script uses, outside the model's forward, a module that forward may leave unused
    (`criterion(ddpkit.unwrap(model).decoder.weight, ...)`, weight tying in the loss) of a model wrapped with
    find_unused_parameters=True: DDP marks that module's parameters unused after each forward, and the gradient
    this use gives them at backward marks them ready a second time (RuntimeError)."""
    out: list[tuple[int, str]] = []
    bound = {id(n.value): ast_dotted(n.targets[0]) for n in ast.walk(tree) if isinstance(n, ast.Assign)
             and len(n.targets) == 1}  # `model = ddpkit.wrap(LM(), ctx, ...)`: the name the wrapper is read by
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) == "ddpkit.wrap" and node.args and any(
                kw.arg == "find_unused_parameters" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                for kw in node.keywords)):
            continue
        found = _unused_of(node, builders, definition, follow)
        attrs = {what[5:]: (where, line) for what, where, line in (found[2] if found else []) if what.startswith("self.")}
        model = bound.get(id(node)) or ast_dotted(node.args[0])
        read = next((n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in attrs and isinstance(
            n.value, ast.Call) and ast_dotted(n.value.func) == "ddpkit.unwrap" and n.value.args and ast_dotted(
            n.value.args[0]) == model), None) if attrs and model else None
        if read is None:
            continue
        where, line = attrs[read.attr]
        out.append((read.lineno, f"`{model}.{read.attr}` gets its gradient here, outside the model's forward, while "
                    f"`{found[1]}.forward` may leave self.{read.attr} unused ({os.path.basename(where or found[0])}:"
                    f"{line}), so the port wrapped {model} with find_unused_parameters=True: DDP then marks its "
                    "parameters unused after each forward, and this use at backward marks them ready a second "
                    "time (RuntimeError at the first backward). Compute this use inside forward (return what the "
                    f"loss needs from it), or, if every step uses self.{read.attr} here and nothing else is unused, "
                    "wrap without find_unused_parameters"))
    return out
