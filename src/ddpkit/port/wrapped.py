"""What `ddpkit.wrap` is handed: an object of a class of the script or its project that is no nn.Module.

The port wraps the module an optimizer trains, named by the root of `X.model.parameters()`. Where X is a plain
class holding the network in an attribute and running the step in a method of its own (`DiffusionModel(unet)` whose
`train(x, optimizer)` calls `self.model(...)`), `ddpkit.wrap(X, ctx)` raises TypeError before training starts, and
so does `ddpkit.unwrap(X)`. Such wraps are undone and named: the module to wrap is the attribute, and the method
that runs the step must call it through the wrapper.
"""

from __future__ import annotations

import ast
import os

from ddpkit.port.weights import Definition, Follow, ast_dotted

__all__ = ["plain_wraps", "without_wraps", "wrapped_classes"]

_TORCH_BASES = ("nn.", "torch.nn.")


def plain_wraps(tree: ast.Module, definition: Definition, follow: Follow) -> list[tuple[ast.Call, str, str]]:
    """(wrap call, the name it is bound to or "", message) for each `ddpkit.wrap(X, ctx)` of the ported script whose
    X is built, right there or by the name's last assignment before it, by a class of the script ("" file) or of its
    project none of whose bases, followed through the project, is an nn.Module."""
    out: list[tuple[ast.Call, str, str]] = []
    seen: set[int] = set()
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for scope in [*reversed(scopes), tree]:  # the innermost scope of each wrap first
        for stmt in (n for n in ast.walk(scope) if isinstance(n, ast.Assign) and len(n.targets) == 1):
            call = stmt.value
            if not (isinstance(call, ast.Call) and ast_dotted(call.func) == "ddpkit.wrap" and call.args) or \
                    id(call) in seen:
                continue
            seen.add(id(call))
            built = _built_by(scope, call)
            found = definition(built) if built else None
            if found is None or not isinstance(found[2], ast.ClassDef) or _is_module(found[2], found[0], follow) \
                    is not False:
                continue
            name = ast_dotted(stmt.targets[0])
            out.append((call, name, _message(tree, name, found[0], found[1], found[2])))
    return out


def _built_by(scope: ast.AST, wrap: ast.Call) -> str:
    """The class or function that builds what `wrap` gets: called in place, or the last assignment of the name
    before the wrap in the same scope."""
    arg = wrap.args[0]
    if isinstance(arg, ast.Call):
        return ast_dotted(arg.func)
    name = ast_dotted(arg)
    made = [n for n in ast.walk(scope) if isinstance(n, ast.Assign) and n.lineno < wrap.lineno and isinstance(
        n.value, ast.Call) and any(ast_dotted(t) == name for t in n.targets)]
    return ast_dotted(max(made, key=lambda n: n.lineno).value.func) if made and name else ""


def _is_module(cls: ast.ClassDef, path: str, follow: Follow, depth: int = 0) -> bool | None:
    """True where a base is torch's (`nn.Module`, `nn.Sequential`, any `...Module`), False where the bases end in the
    project with none (or `object`), None where a base cannot be followed (a library's class)."""
    verdicts: list[bool | None] = []
    for base in cls.bases:
        name = ast_dotted(base)
        if name.startswith(_TORCH_BASES) or name.endswith("Module"):
            return True
        if name in ("object", "ABC", "abc.ABC"):
            continue
        found = follow(name, path) if name and "." not in name and depth < 4 else None
        verdicts.append(_is_module(found[1], found[0], follow, depth + 1)
                        if found is not None and isinstance(found[1], ast.ClassDef) else None)
    return True if True in verdicts else None if None in verdicts else False


def _message(tree: ast.Module, name: str, path: str, cls_name: str, cls: ast.ClassDef) -> str:
    where = f"{os.path.basename(path)}:{cls.lineno}" if path else f"line {cls.lineno}"
    attr = _trained_attribute(tree, name) or "<the attribute that holds the network>"
    step = next((f"; its `{m.name}` ({os.path.basename(path) + ':' if path else 'line '}{m.lineno}) runs the step"
                 for m in cls.body if isinstance(m, ast.FunctionDef) and _steps(m)), "")
    return (f"`{cls_name}` ({where}) is not an nn.Module (none of its bases is), so ddpkit.wrap would raise TypeError "
            f"here before training: the port left `{name or cls_name}` unwrapped, and nothing averages the gradients "
            f"of the network it holds in `{attr}`{step}. Wrap that module (`{name or 'obj'}.{attr} = "
            f"ddpkit.wrap({name or 'obj'}.{attr}, ctx)` before the optimizer is made) so that the step calls it "
            "through the wrapper")


def _trained_attribute(tree: ast.Module, name: str) -> str:
    """`model` for an optimizer of the script built over `name.model.parameters()`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "parameters", "named_parameters"):
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and ast_dotted(owner.value) == name:
                return owner.attr
            if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Call) and \
                    ast_dotted(owner.value.func) == "ddpkit.unwrap" and owner.value.args and \
                    ast_dotted(owner.value.args[0]) == name:
                return owner.attr
    return ""


def _steps(method: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("backward", "step")
               for n in ast.walk(method))


def without_wraps(code: str, tree: ast.Module, wraps: list[tuple[ast.Call, str, str]]) -> str:
    """`code` with each of `wraps` replaced by what it wrapped, and `ddpkit.unwrap(name)` of the names they were bound
    to by the name itself (both raise TypeError for an object that is no nn.Module)."""
    names = {name for _, name, _ in wraps if name}
    calls = [c for c, _, _ in wraps] + [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast_dotted(
        n.func) == "ddpkit.unwrap" and len(n.args) == 1 and ast_dotted(n.args[0]) in names]
    lines = code.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line.encode("utf-8")))
    data = code.encode("utf-8")

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + col
    for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset), reverse=True):
        arg = call.args[0]
        inner = data[offset(arg.lineno, arg.col_offset):offset(arg.end_lineno, arg.end_col_offset)]
        data = data[:offset(call.lineno, call.col_offset)] + inner + data[offset(call.end_lineno,
                                                                                  call.end_col_offset):]
    return data.decode("utf-8")


def wrapped_classes(tree: ast.Module) -> list[tuple[ast.Call, str]]:
    """(wrap call, the dotted name of what builds the model it wraps) for `ddpkit.wrap(Net(...), ctx)` and `model =
    Net(...)` ... `ddpkit.wrap(model, ctx)` (the last assignment of the name before the wrap)."""
    return [(call, name) for call in ast.walk(tree) if isinstance(call, ast.Call) and ast_dotted(call.func) ==
            "ddpkit.wrap" and call.args for name in [_built_by(tree, call)] if name]
