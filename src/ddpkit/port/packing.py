"""Inputs of the wrapped model that its forward needs on the host: DDP moves every forward input to ctx.device.

On CUDA, ddpkit.wrap gives DDP `device_ids=[local_rank]`, and DDP then moves every tensor handed to the model to
that GPU before forward runs. A forward that hands one of its inputs, as is, to `pack_padded_sequence` (whose
`lengths` must be a CPU tensor) worked on one GPU when the script kept the lengths on the CPU, and fails under DDP
whatever the script does at the call. The fix is inside forward (`lengths.cpu()` at the packing call), code the port
does not rewrite: it says where.
"""

from __future__ import annotations

import ast
import os
from typing import Callable

from ddpkit.port.weights import ast_dotted, wrapped_classes

__all__ = ["host_inputs_in_wrapped", "cpu_tensors_in_wrapped", "plain_tensor_members"]

Follow = Callable[[str, str], "tuple[str, ast.AST] | None"]
"""(name, file it is read in) -> (file, definition) of a class or function of the project, else None."""

_PACKS = {"pack_padded_sequence": 1}
"""Calls whose argument at this position (or keyword `lengths`) must be a CPU tensor."""
_HOST = frozenset({"cpu", "tolist", "numpy", "item"})
_DEPTH = 4


def _on_host(expr: ast.AST) -> bool:
    """`lengths.cpu()`, `lengths.tolist()`, `lengths.to("cpu")`: moved to the host at the call."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and (
        n.func.attr in _HOST or n.func.attr == "to" and any(
            isinstance(a, ast.Constant) and a.value == "cpu" for a in n.args)) for n in ast.walk(expr))


def _roots(expr: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}


def _members(cls: ast.ClassDef) -> dict[str, str]:
    """`self.enc = Encoder(...)` in __init__: {'enc': 'Encoder'}."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    return {t.attr: ast_dotted(n.value.func) for n in ast.walk(init) if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call) for t in n.targets
            if isinstance(t, ast.Attribute) and ast_dotted(t.value) == "self"} if init is not None else {}


def _packed(path: str, cls: ast.ClassDef, method: str, moved: set[int], follow: Follow, depth: int,
            seen: set[tuple[str, str, str]]) -> list[tuple[str, int, str]]:
    """(file, line, name) where `method` of `cls` hands an input DDP moved (parameters at positions `moved`,
    counted without self) to a call that needs it on the host, through its own methods and its submodules."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if method not in methods or depth > _DEPTH or (path, cls.name, method) in seen:
        return []
    seen.add((path, cls.name, method))
    fn = methods[method]
    params = [a.arg for a in fn.args.args[1:]]
    moved_names = {p for i, p in enumerate(params) if i in moved}
    for node in fn.body:  # `lens = src_lens.long()`: still the moved tensor
        for n in ast.walk(node):
            if isinstance(n, ast.Assign) and _roots(n.value) & moved_names and not _on_host(n.value):
                moved_names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
    members = _members(cls)
    out: list[tuple[str, int, str]] = []
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        func = ast_dotted(call.func)
        last = func.rsplit(".", 1)[-1]
        if last in _PACKS:
            lengths = next((k.value for k in call.keywords if k.arg == "lengths"), None) or (
                call.args[_PACKS[last]] if len(call.args) > _PACKS[last] else None)
            if lengths is not None and _roots(lengths) & moved_names and not _on_host(lengths):
                out.append((path, call.lineno, ast.unparse(lengths)))
            continue
        passed = {i for i, a in enumerate(call.args) if _roots(a) & moved_names and not _on_host(a)}
        if not passed or not func.startswith("self.") or func.count(".") != 1:
            continue
        attr = func[5:]
        if attr in methods:
            out += _packed(path, cls, attr, passed, follow, depth + 1, seen)
        elif attr in members:
            found = follow(members[attr], path)
            if found is not None and isinstance(found[1], ast.ClassDef):
                out += _packed(found[0], found[1], "forward", passed, follow, depth + 1, seen)
    return out


def host_inputs_in_wrapped(tree: ast.Module, builders: dict[str, list[str]],
                           definition: Callable[[str], "tuple[str, str, ast.AST] | None"], follow: Follow
                           ) -> list[tuple[int, str]]:
    """(line of the wrap, TODO) for each `ddpkit.wrap(model, ctx)` of a class (of the script or its project) whose
    forward hands one of its inputs as is to `pack_padded_sequence` as the lengths: DDP moves it to the GPU."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) == "ddpkit.wrap" and node.args):
            continue
        for found in wrapped_classes(node, builders, definition):
            forward = next((n for n in found[2].body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
            count = len(forward.args.args) - 1 if forward is not None else 0
            hits = _packed(found[0], found[2], "forward", set(range(count)), follow, 0, set())
            if hits:
                path, line, lengths = hits[0]
                out.append((node.lineno, f"`{lengths}` reaches `pack_padded_sequence` in {os.path.basename(path)}:"
                                         f"{line} as the lengths, from the model's inputs, which DDP moves to the "
                                         "GPU (lengths must be a CPU tensor there): write "
                                         f"`{lengths}.cpu()` at that call"))
                break
    return out


_MAKES = frozenset({"from_numpy", "tensor", "as_tensor", "Tensor", "FloatTensor", "DoubleTensor", "LongTensor"})
"""torch calls that make a tensor on the CPU unless told a device."""


def _cpu_fed(cls: ast.ClassDef) -> tuple[str, int, str, str] | None:
    """(method, line, made, submodule) where a method of the class makes a tensor on the CPU (`obs =
    torch.from_numpy(obs)`, no device=) and hands that name to one of its own submodules (`self.actor(obs)`),
    in a module that names no device: the submodule is on ctx.device once the model is wrapped."""
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        made: dict[str, tuple[int, str]] = {}
        for node in sorted((n for n in ast.walk(method) if isinstance(n, (ast.Assign, ast.Call))),
                           key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(node, ast.Assign):
                call = node.value
                while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(
                        call.func.value, ast.Call) and call.func.attr in ("double", "float", "long", "unsqueeze"):
                    call = call.func.value  # `torch.from_numpy(obs).double()`
                func = ast_dotted(call.func) if isinstance(call, ast.Call) else ""
                for target in (t for t in node.targets if isinstance(t, ast.Name)):
                    if func.startswith("torch.") and func.rsplit(".", 1)[-1] in _MAKES and not any(
                            k.arg == "device" for k in call.keywords):
                        made[target.id] = (node.lineno, ast.unparse(call))
                    elif target.id in made and node.lineno > made[target.id][0]:
                        del made[target.id]  # bound again to something else
            elif isinstance(node.func, ast.Attribute) and ast_dotted(node.func.value) == "self" and any(
                    isinstance(a, ast.Name) and a.id in made for a in node.args):
                name = next(a.id for a in node.args if isinstance(a, ast.Name) and a.id in made)
                return method.name, made[name][0], made[name][1], f"self.{node.func.attr}"
    return None


def cpu_tensors_in_wrapped(tree: ast.Module, builders: dict[str, list[str]],
                           definition: Callable[[str], "tuple[str, str, ast.AST] | None"]) -> list[tuple[int, str]]:
    """(line of the wrap, TODO) for each `ddpkit.wrap(model, ctx)` of a class of the project, in a module that
    names no device, whose own methods make a tensor on the CPU and give it to a submodule (observations of an
    environment): ddpkit.wrap put that submodule on ctx.device, which is a GPU on a GPU rank."""
    if any(isinstance(n, ast.keyword) and n.arg == "device" for n in ast.walk(tree)):
        return []  # `ddpkit.init(device="cpu")` or a device the script hands on: not this case
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) == "ddpkit.wrap" and node.args):
            continue
        arg = node.args[0]
        for cls in [ast_dotted(arg.func)] if isinstance(arg, ast.Call) else builders.get(ast_dotted(arg), []):
            found = definition(cls) if cls else None
            if found is None or not found[0] or not isinstance(found[2], ast.ClassDef):
                continue
            with open(found[0], encoding="utf-8") as f:
                text = f.read()
            words = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(ast.parse(text))
                     if isinstance(n, (ast.Name, ast.Attribute))}
            if any("device" in w.lower() or "cuda" in w.lower() for w in words):
                continue  # the module places its tensors itself
            hit = _cpu_fed(found[2])
            if hit is not None:
                where = os.path.basename(found[0])
                out.append((node.lineno, f"`{found[1]}.{hit[0]}` in {where} (read, not ported) makes `{hit[2][:50]}` "
                                         f"on the CPU ({where}:{hit[1]}) and gives it to `{hit[3]}`, which "
                                         "ddpkit.wrap put on ctx.device: on a GPU rank that fails with a device "
                                         "mismatch; make it on the model's device there, or keep every rank on the "
                                         "CPU with ddpkit.init(device=\"cpu\")"))
                break
    return out


_CREATES = _MAKES | {"zeros", "ones", "arange", "randn", "rand", "randint", "empty", "full", "eye", "linspace",
                     "IntTensor", "BoolTensor", "ByteTensor"}
_KEEPS_PLACE = frozenset({"long", "float", "double", "int", "bool", "unsqueeze", "squeeze", "view", "reshape",
                          "unflatten", "t", "contiguous", "clone", "detach", "refine_names", "rename", "expand"})
"""Tensor methods whose result is a new tensor where the receiver is (`.to(device)` is no such method)."""


def _cpu_made(expr: ast.AST, attr: str) -> bool:
    """`torch.Tensor(...).long()`, `self.offsets.unflatten(...)` (of a CPU tensor): a tensor on the CPU."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in _KEEPS_PLACE:
        if ast_dotted(expr.func.value) == f"self.{attr}":
            return True
        expr = expr.func.value
    if not isinstance(expr, ast.Call) or any(k.arg == "device" for k in expr.keywords):
        return False
    func = ast_dotted(expr.func)
    last = func.rsplit(".", 1)[-1]
    if last in ("tensor", "as_tensor"):  # `torch.tensor(0.5)` is zero-dimensional: it mixes with any device
        return bool(expr.args) and isinstance(expr.args[0], (ast.List, ast.Tuple, ast.ListComp))
    return func.startswith("torch.") and func.count(".") == 1 and last in _CREATES


def _plain_tensor(cls: ast.ClassDef) -> tuple[str, int, str, int] | None:
    """(attribute, line made, method, line read) of a tensor `__init__` keeps on the CPU as a plain attribute (not a
    parameter or a registered buffer: Module.to() does not move it) that another method reads as it is."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    init = methods.get("__init__")
    if init is None or methods.keys() & {"to", "cuda", "_apply"}:
        return None
    registered = {a.value for n in ast.walk(cls) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr == "register_buffer" for a in n.args[:1] if isinstance(a, ast.Constant)}
    made: dict[str, int] = {}
    for node in (n for n in ast.walk(init) if isinstance(n, ast.Assign)):
        for t in node.targets:
            if isinstance(t, ast.Attribute) and ast_dotted(t.value) == "self":
                if _cpu_made(node.value, t.attr) and (t.attr in made or not ast_dotted(node.value).startswith("self.")):
                    made.setdefault(t.attr, node.lineno)
                else:
                    made.pop(t.attr, None)  # bound again to something else (a Parameter, a moved tensor)
    for attr in sorted(made.keys() - registered):
        for name, method in methods.items():
            if name == "__init__":
                continue
            for node in ast.walk(method):
                if isinstance(node, ast.BinOp) and f"self.{attr}" in (ast_dotted(node.left), ast_dotted(node.right)):
                    return attr, made[attr], name, node.lineno
    return None


def plain_tensor_members(tree: ast.Module, builders: dict[str, list[str]],
                         definition: Callable[[str], "tuple[str, str, ast.AST] | None"], follow: Follow
                         ) -> list[tuple[int, str]]:
    """(line of the wrap, TODO) for each `ddpkit.wrap(model, ctx)` of a class of the project whose own modules (its
    class or a submodule's, `self.emb = EmbeddingLayer(...)` followed into their files) keep a CPU tensor as a plain
    attribute that a method adds to its inputs: the wrap moves parameters and buffers to ctx.device, not it."""
    if any(isinstance(n, ast.keyword) and n.arg == "device" for n in ast.walk(tree)):
        return []  # `ddpkit.init(device="cpu")`: every rank stays on the CPU
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) == "ddpkit.wrap" and node.args):
            continue
        arg = node.args[0]
        found = [definition(c) for c in ([ast_dotted(arg.func)] if isinstance(arg, ast.Call) else builders.get(
            ast_dotted(arg), [])) if c]
        todo = [(f[0], f[2]) for f in found if f is not None and f[0] and isinstance(f[2], ast.ClassDef)]
        seen: set[tuple[str, str]] = set()
        while todo and len(seen) < 20:
            path, cls = todo.pop(0)
            if (path, cls.name) in seen:
                continue
            seen.add((path, cls.name))
            hit = _plain_tensor(cls)
            if hit is not None:
                where = os.path.basename(path)
                out.append((node.lineno, f"`{cls.name}` in {where} (read, not ported) keeps `self.{hit[0]}`, a tensor "
                                         f"made on the CPU ({where}:{hit[1]}), as a plain attribute, not a parameter "
                                         "or a registered buffer: ddpkit.wrap moves the model to ctx.device without "
                                         f"it, and `{hit[2]}` meets it there ({where}:{hit[3]}); on a GPU rank that "
                                         "fails with a device mismatch: register it (self.register_buffer) or move "
                                         "it where it is read"))
                break
            for member in _members(cls).values():
                sub = follow(member, path) if member else None
                if sub is not None and isinstance(sub[1], ast.ClassDef):
                    todo.append(sub)
    return out
