"""Buffers the wrapped model fills from its batches: a queue of negatives, a memory bank.

A module's registered buffer is state that DDP keeps alike on every rank by copying rank 0's over the others' at
each forward (`broadcast_buffers=True`, DDP's default). That is right for BatchNorm's running statistics. A buffer the
model's own code stores samples into, item by item or slice by slice (MoCo's queue of keys, `self.queue[:, p:p + b]
= keys.t()`; a memory bank indexed by sample), holds under DDP only what each rank's own batch put there, and the
next forward replaces it with rank 0's: what the other ranks stored is lost without a word. Whether to gather the
stored values from every rank or keep one buffer per rank is a decision the port cannot take; it says where.
"""

from __future__ import annotations

import ast
import os

from ddpkit.port.weights import Definition, Follow, ast_dotted, wrapped_classes

__all__ = ["filled_buffers_in_wrapped"]

_STORES = frozenset({"copy_", "index_copy_", "index_put_", "scatter_", "masked_scatter_"})
"""In-place calls that store values into positions of the tensor they are called on (`buf[i].copy_(v)`)."""


def _buffers(cls: ast.ClassDef) -> set[str]:
    """`self.register_buffer("queue", ...)` anywhere in the class: {'queue'}."""
    return {n.args[0].value for n in ast.walk(cls) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "register_buffer" and n.args and isinstance(n.args[0], ast.Constant)
            and isinstance(n.args[0].value, str)}


def _buffer_of(node: ast.AST, names: set[str]) -> str | None:
    """`self.queue[...]` (or `self.queue[...][...]`): 'queue' when it is one of `names`."""
    if not isinstance(node, ast.Subscript):
        return None
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.attr if isinstance(node, ast.Attribute) and ast_dotted(node.value) == "self" and \
        node.attr in names else None


def _values_read(expr: ast.AST) -> set[str]:
    """The names whose values `expr` reads: not those it only measures (`keys.shape[0]`, `len(keys)`, `x.size(0)`),
    which make a position or a count, not a value to store."""
    measured = {id(n.value) for n in ast.walk(expr) if isinstance(n, ast.Attribute) and n.attr in _MEASURES} | {
        id(n.func.value) for n in ast.walk(expr) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
        and n.func.attr in ("size", "dim")} | {id(a) for n in ast.walk(expr) if isinstance(n, ast.Call)
                                                and ast_dotted(n.func) == "len" for a in n.args}
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name) and id(n) not in measured}


_MEASURES = frozenset({"shape", "ndim", "dtype", "device"})


def _fed(method: ast.FunctionDef) -> set[str]:
    """The method's parameters (not self) and the names assigned from their values, in the order the body runs."""
    fed = {a.arg for a in method.args.args[1:] + method.args.kwonlyargs}
    for node in ast.walk(method):
        if isinstance(node, ast.Assign) and _values_read(node.value) & fed:
            fed |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return fed


def _filled(cls: ast.ClassDef) -> tuple[str, str, int, str] | None:
    """(buffer, method, line, code) of the first store into positions of a registered buffer, outside `__init__`,
    of a value computed from the method's arguments (the batch's keys, features); None where the class gathers
    across ranks itself (an `all_gather` in it) or stores nothing so."""
    names = _buffers(cls)
    if not names or any(isinstance(n, ast.Call) and "gather" in ast_dotted(n.func).rsplit(".", 1)[-1]
                        for n in ast.walk(cls)):
        return None
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"):
        fed = _fed(method)
        for node in ast.walk(method):
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets, value = (node.targets if isinstance(node, ast.Assign) else [node.target]), node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _STORES:
                target = node.func.value
                targets = [target if node.func.attr == "copy_" else ast.Subscript(target, ast.Constant(0))]
                value = ast.Tuple([*node.args, *(k.value for k in node.keywords)])
            else:
                continue
            buffer = next((b for t in targets if (b := _buffer_of(t, names))), None)
            if buffer and _values_read(value) & fed:
                return buffer, method.name, node.lineno, " ".join(ast.unparse(node).split())[:80]
    return None


def filled_buffers_in_wrapped(tree: ast.Module, builders: dict[str, list[str]], definition: Definition,
                              follow: Follow) -> list[tuple[int, str]]:
    """(line of the wrap, TODO) for each `ddpkit.wrap(model, ctx)` (without `broadcast_buffers=`) of a class of the
    script or its project that, or one of whose submodules (`self.enc = Encoder(...)`), stores values computed from
    its inputs into positions of one of its registered buffers (see the module's docstring)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) == "ddpkit.wrap" and node.args) or any(
                k.arg == "broadcast_buffers" for k in node.keywords):
            continue
        found = next(((path, cls, hit) for path, cls in _with_submodules(
            [(f[0], f[2]) for f in wrapped_classes(node, builders, definition)], follow)
            if (hit := _filled(cls)) is not None), None)
        if found is None:
            continue
        path, cls, (buffer, method, line, code) = found
        where = f"{os.path.basename(path)}:{line}" if path else f"line {line}"
        out.append((node.lineno, f"`{cls.name}` stores values computed from its inputs into its registered buffer "
                                 f"`{buffer}` in `{method}` ({where} `{code}`: a queue, a memory bank): each rank "
                                 "stores only its own batch's, and DDP copies rank 0's buffers over every rank's at "
                                 "each forward (broadcast_buffers=True), so what the other ranks stored is lost; "
                                 "gather the stored values from every rank first (torch.distributed.all_gather, "
                                 "MoCo's concat_all_gather: each store then holds world_size batches), or keep one "
                                 "buffer per rank on purpose: `ddpkit.wrap(model, ctx, broadcast_buffers=False)`"))
    return out


def _with_submodules(classes: list[tuple[str, ast.ClassDef]], follow: Follow, limit: int = 20):  # noqa: ANN202
    """(file, class) of each of `classes` and of the classes of the script or project its `__init__` builds members
    from (`self.enc = Encoder(...)`), breadth first, each once, `limit` at most."""
    seen: set[tuple[str, str]] = set()
    while classes and len(seen) < limit:
        path, cls = classes.pop(0)
        if (path, cls.name) in seen:
            continue
        seen.add((path, cls.name))
        yield path, cls
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        for member in sorted({ast_dotted(n.value.func) for n in ast.walk(init) if isinstance(n, ast.Assign)
                              and isinstance(n.value, ast.Call)} - {""}) if init is not None else ():
            sub = follow(member, path)
            if sub is not None and isinstance(sub[1], ast.ClassDef):
                classes.append(sub)
