"""Tensors a wrapped model makes on the CPU in its own forward, where the port puts the model on the rank's GPU.

ddpkit.wrap puts the model on ctx.device (a GPU on a GPU host) and ddpkit.loader delivers its batches there. A
forward that makes a tensor by a shaped factory without a device (`h0 = torch.zeros(layers, x.size(0), hidden)`, an
LSTM's initial state; `torch.randn(...)` noise; a legacy `torch.FloatTensor(...)`) makes it on the CPU, and the first
layer that meets it and the GPU input raises a device-mismatch RuntimeError on every rank. The policy: each class the
ported script wraps (its own, or one of its project's modules, `from model import LSTMModel`) is read, with the
methods its forward calls on `self` and the classes of the same file it builds; a factory call there with no
`device=` (nor `**kwargs` that may hold one), whose value is not moved on (`.to(...)`, `.cuda()`, `.type_as(...)`,
also through the name it is bound to) and is not an index (`x[torch.randint(...)]` reads a GPU tensor with a CPU
index), is named in a TODO at the wrap, unless the port keeps every rank on the CPU (`ddpkit.init(device="cpu")`).
`torch.tensor(2.0)` and `torch.arange(n)` are left out: a 0-d CPU tensor meets a GPU one without error, and an
arange is mostly an index. Read with ast from the ported output.
"""

from __future__ import annotations

import ast

from ddpkit.port.localcode import class_named, definition, local_imports, parsed_module, resolve
from ddpkit.port.weights import ast_dotted
from ddpkit.port.wrapped import wrapped_classes

__all__ = ["host_tensors"]

_FACTORIES = frozenset({"zeros", "ones", "empty", "full", "rand", "randn", "randint", "eye", "FloatTensor",
                        "LongTensor", "IntTensor", "DoubleTensor", "ByteTensor", "BoolTensor", "HalfTensor", "Tensor"})
"""`torch.<name>(shape...)`: a new tensor on the default device (the CPU) unless given `device=`."""
_MOVES = frozenset({"to", "cuda", "type_as"})
_DEPTH = 3


def _receivers(fn: ast.AST) -> tuple[set[int], set[str]]:
    """Ids of the nodes a move (`.to(...)`, `.cuda()`, `.type_as(x)`) acts on, through its receiver chain
    (`torch.zeros(2).requires_grad_().to(x.device)`), and the names moved so (`h0 = h0.to(x.device)`)."""
    ids: set[int] = set()
    names: set[str] = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _MOVES:
            inner = node.func.value
            while isinstance(inner, (ast.Call, ast.Attribute, ast.Subscript)):
                ids.add(id(inner))
                inner = inner.func if isinstance(inner, ast.Call) else inner.value
            if isinstance(inner, ast.Name):
                names.add(inner.id)
    return ids, names


def _made_on_host(fn: ast.AST) -> list[ast.Call]:
    """The factory calls of `fn` that make a CPU tensor the function keeps (see the module's policy)."""
    moved, moved_names = _receivers(fn)
    index = {id(n) for s in ast.walk(fn) if isinstance(s, ast.Subscript) for n in ast.walk(s.slice)}
    bound = {id(n): t.id for a in ast.walk(fn) if isinstance(a, ast.Assign) for t in a.targets
             if isinstance(t, ast.Name) for n in ast.walk(a.value)}
    out = []
    for node in ast.walk(fn):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func).startswith("torch.")
                and ast_dotted(node.func).removeprefix("torch.") in _FACTORIES):
            continue
        if any(k.arg in ("device", None) for k in node.keywords) or id(node) in moved or id(node) in index:
            continue
        if bound.get(id(node)) in moved_names:
            continue
        out.append(node)
    return out


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _class_sites(module: ast.Module, cls: ast.ClassDef, depth: int = 0) -> list[ast.Call]:
    """Host factories of `cls`'s forward, the methods it calls on `self`, and the classes of `module` it builds."""
    methods = _methods(cls)
    todo, seen, out = ["forward"], set(), []
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        out += _made_on_host(methods[name])
        todo += [n.func.attr for n in ast.walk(methods[name]) if isinstance(n, ast.Call) and isinstance(
            n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]
    for built in {ast_dotted(n.func) for n in ast.walk(cls) if isinstance(n, ast.Call)} if depth < _DEPTH else ():
        inner = definition(module, built) if built and "." not in built else None
        if isinstance(inner, ast.ClassDef) and inner is not cls:
            out += _class_sites(module, inner, depth + 1)
    return out


def _on_cpu(tree: ast.Module) -> bool:
    """The port keeps every rank on the CPU: `ddpkit.init(device="cpu")`."""
    return any(isinstance(n, ast.Call) and ast_dotted(n.func) == "ddpkit.init" and any(
        k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "cpu" for k in n.keywords)
        for n in ast.walk(tree))


def _sites_text(where: str, sites: list[ast.Call]) -> str:
    at = ", ".join(str(s.lineno) for s in sites)
    calls = ", ".join(dict.fromkeys(f"`{ast_dotted(s.func)}(...)`" for s in sites))
    return f"{where.rsplit('/', 1)[-1]}:{at}: {calls}" if where else f"line {at}: {calls}"


def _built_by_project(tree: ast.Module, folder: str, modules: dict[str, str], parsed: dict[str, ast.Module | None],
                      imported: dict[str, tuple[str, str | None]]) -> list[tuple[int, str]]:
    """A script that wraps no model and hands its training to a function of its project that builds the model
    (`model = train_lstm(x, y)`, `LSTMModel(...)` built in train.py): the TODO that asks for the wrap stands, and the
    model's forward makes CPU tensors that meet ctx.device once it is wrapped: (line of the call, message)."""
    out = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
        source = imported.get(call.func.id)
        hit = resolve(modules, folder, source[0], source[1], parsed) if source and source[1] else None
        if hit is None or not isinstance(hit[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for built in (n for n in ast.walk(hit[1]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            cls = resolve(modules, folder, hit[0], built.func.id, parsed)
            module = parsed_module(modules, cls[0], parsed) if cls is not None else None
            sites = _class_sites(module, cls[1]) if module is not None and isinstance(cls[1], ast.ClassDef) and \
                "forward" in _methods(cls[1]) else []
            if sites:
                out.append((call.lineno, f"`{call.func.id}(...)` builds `{cls[1].name}` "
                                         f"({hit[0].rsplit('/', 1)[-1]}:{built.lineno}), whose forward makes tensors "
                                         f"on the CPU ({_sites_text(cls[0], sites)} without a device): once the model "
                                         "is wrapped on ctx.device (a GPU on a GPU host) with its batches, they meet "
                                         "in a device-mismatch RuntimeError on every rank; make them on the input's "
                                         "device (`device=x.device`, `x.new_zeros(...)`)"))
                break
    return out


def host_tensors(tree: ast.Module, folder: str | None, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the wrap, message) for each wrapped class whose forward makes CPU tensors (see the module's policy);
    where the script wraps no model, at each call of a project function that builds one."""
    if _on_cpu(tree):
        return []
    parsed: dict[str, ast.Module | None] = {}
    imported = local_imports(tree, modules, folder, parsed) if folder is not None else {}
    if folder is not None and not any(isinstance(n, ast.Call) and ast_dotted(n.func) == "ddpkit.wrap" for n in ast.walk(tree)):
        return _built_by_project(tree, folder, modules, parsed, imported)
    out = []
    for call, name in wrapped_classes(tree):
        found = class_named(tree, name, folder, modules, parsed, imported)
        if found is None:
            continue
        where, module, cls = found
        sites = _class_sites(module, cls)
        if not sites:
            continue
        out.append((call.lineno, f"`{cls.name}` makes tensors on the CPU in its forward ({_sites_text(where, sites)} "
                                 "without a "
                                 "device), while ddpkit.wrap puts the model and ddpkit.loader its batches on "
                                 "ctx.device (a GPU on a GPU host): they meet in a device-mismatch RuntimeError on "
                                 "every rank; make them on the input's device (`device=x.device`, `x.new_zeros(...)`)"))
    return out
