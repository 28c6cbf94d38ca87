"""What the project's own training code does that works on CPU tensors only: where it runs, a port that wraps no model
is CPU-only, and says so in a TODO naming those lines.

A script that names no device and trains in its project's code (`train_model(model, train_loader)`) gets batches on
`ctx.device` from ddpkit's loaders. On a GPU rank, `t.numpy()` of a batch or a model output raises (numpy reads host
memory only), and a tensor made by a legacy typed constructor (`torch.FloatTensor(...)`) is a CPU tensor that fails
where it meets one on the GPU. The places are found by the walk of ddpkit.port.diskwrites (the project's functions,
classes and methods a call of the script reaches).
"""

from __future__ import annotations

import ast

from ddpkit.port.diskwrites import Site, reached
from ddpkit.port.weights import Follow, ast_dotted

__all__ = ["cpu_only_of", "cpu_only_reached"]

_TYPED = frozenset({"FloatTensor", "LongTensor", "IntTensor", "DoubleTensor", "ByteTensor", "BoolTensor", "HalfTensor"})
"""Legacy typed constructors: `torch.FloatTensor(x)` is always a CPU tensor."""


def _brought_to_cpu(node: ast.AST) -> bool:
    """The receiver chain of a method call passes through `.cpu()` or `.to("cpu")` (`x.detach().cpu()`)."""
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (node.func.attr == "cpu" or (
                node.func.attr == "to" and any(isinstance(a, ast.Constant) and a.value == "cpu" for a in node.args))):
            return True
        node = node.func if isinstance(node, ast.Call) else node.value
    return False


def cpu_only_of(node: ast.AST) -> str:
    """What a call does that needs a CPU tensor (`.numpy()` of a tensor not brought to the CPU first, a legacy typed
    constructor), else ""."""
    if not isinstance(node, ast.Call):
        return ""
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr == "numpy" and not node.args and not _brought_to_cpu(func.value):
        return f"`{ast.unparse(node)[:40]}`"
    name = ast_dotted(func)
    if name.startswith("torch.") and name.removeprefix("torch.") in _TYPED:
        return f"`{name}(...)`"
    return ""


def cpu_only_reached(path: str, defn: ast.AST, follow: Follow, owner: tuple | None = None,
                     call: ast.Call | None = None, handed: list[tuple[str, ast.ClassDef]] = ()) -> list[Site]:
    """Every CPU-only operation `defn` runs on every rank, followed as diskwrites.writes_reached follows."""
    return reached(path, defn, follow, owner, call, handed, lambda _, n, __, ___: cpu_only_of(n))
