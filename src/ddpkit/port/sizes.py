"""The values the port changed that the script's own modules still read as before: the batch size it divided for
its loader (still the global batch there) and a GPU a module picks itself (GPU 0 on every rank, not ctx.device).

ddpkit.port.project finds the code the script hands over to; this module says where in it these values are read.
"""

from __future__ import annotations

import ast

from ddpkit.port.weights import ast_dotted

__all__ = ["fixed_device", "fixed_devices", "shapes_with", "divided_sizes", "split_sizes"]

_SHAPED = {"view", "reshape", "resize_", "expand", "repeat", "zeros", "ones", "empty", "full", "rand", "randn",
           "randint", "arange", "new_zeros", "new_ones", "new_full", "new_empty", "FloatTensor", "LongTensor", "Tensor",
           "IntTensor", "ByteTensor", "BoolTensor", "narrow", "eye"}
"""Calls whose arguments give a tensor's shape: a batch size there must be the batch's own."""


def divided_sizes(tree: ast.Module) -> list[ast.expr]:
    """Each batch size the port divided by the world size for a loader: `B` of `ddpkit.loader(..., batch_size=B //
    ctx.world_size)` (a literal, a name, a settings key); empty where the port divided no batch."""
    out: list[ast.expr] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) in ("ddpkit.loader", "ddpkit.eval_loader")):
            continue
        for kw in node.keywords:
            out += [div.left for div in (ast.walk(kw.value) if kw.arg == "batch_size" else ())
                    if isinstance(div, ast.BinOp) and isinstance(div.op, ast.FloorDiv)
                    and ast_dotted(div.right) == "ctx.world_size"]
    return out


def split_sizes(tree: ast.Module) -> dict[str, set[str]]:
    """What the port divided by the world size for a loader (`ddpkit.loader(..., batch_size=cfg.BATCH_SIZE //
    ctx.world_size)`): {root name: keys read from it} ({'cfg': {'BATCH_SIZE'}}; {'batch_size': set()} for a name).
    Elsewhere that value is still the global batch, so code that shapes a batch's tensors with it no longer fits."""
    out: dict[str, set[str]] = {}
    for size in divided_sizes(tree):
        if isinstance(size, ast.Name):
            out.setdefault(size.id, set())
        elif isinstance(size, ast.Attribute) and isinstance(size.value, ast.Name):
            out.setdefault(size.value.id, set()).add(size.attr)
        elif isinstance(size, ast.Subscript) and isinstance(size.value, ast.Name) and isinstance(
                size.slice, ast.Constant) and isinstance(size.slice.value, str):
            out.setdefault(size.value.id, set()).add(size.slice.value)
    return out


def shapes_with(defn: ast.AST, received: dict[str, str]) -> list[tuple[int, str]]:
    """Where code handed the global batch size the port divided (kind 'size') shapes a tensor with it."""
    sizes = {p for p, kind in received.items() if kind == "size"}
    out: list[tuple[int, str]] = []
    for node in ast.walk(defn) if sizes else ():
        if not isinstance(node, ast.Call):
            continue
        last = ast_dotted(node.func).rsplit(".", 1)[-1] or (node.func.attr if isinstance(node.func, ast.Attribute)
                                                            else "")
        parts = [*node.args, *(k.value for k in node.keywords if k.arg in ("size", "shape"))] if last in _SHAPED else \
            [k.value for k in node.keywords if k.arg in ("size", "shape")]
        used = sorted({ast_dotted(n) for a in parts for n in ast.walk(a) if ast_dotted(n) in sizes})
        if used:
            out.append((node.lineno, f"shapes a tensor with `{used[0]}` (the global batch size the port divided by "
                                     "the world size for the loader): each rank's batch is smaller now; use the "
                                     "batch's own size (x.size(0)) there"))
    return out


def fixed_device(expr: ast.AST, devices: set[str]) -> bool:
    """`"cuda:0"`, `torch.device("cuda:0" if ... else "cpu")`, `f"cuda:{gpu}"`, `"cuda:{}".format(...)`, or a
    module-level name bound to one: a GPU the code chooses itself, the same on every rank (not ctx.device). Plain
    "cuda" names the current device, which ddpkit.init makes the rank's."""
    return ast_dotted(expr) in devices or any(
        isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("cuda:") for c in ast.walk(expr))


def fixed_devices(module: ast.Module | None) -> set[str]:
    """Module-level names bound to a GPU of the module's own choosing (`DEVICE = torch.device("cuda:0")`)."""
    return {n.id for s in module.body if isinstance(s, ast.Assign) and fixed_device(s.value, set())
            for t in s.targets for n in ast.walk(t) if isinstance(n, ast.Name)} if module is not None else set()
