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

from ddpkit.port.weights import ast_dotted

__all__ = ["host_inputs_in_wrapped"]

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
        arg = node.args[0]
        classes = [ast_dotted(arg.func)] if isinstance(arg, ast.Call) else builders.get(ast_dotted(arg), [])
        for cls in classes:
            found = definition(cls) if cls else None
            if found is None or not isinstance(found[2], ast.ClassDef):
                continue
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
