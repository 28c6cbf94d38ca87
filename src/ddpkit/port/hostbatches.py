"""Batches of a torch DataLoader the port keeps, in a script that names no device: moved to ctx.device at the top
of their loop.

ddpkit.wrap puts the model on ctx.device (a GPU on a GPU node) while a DataLoader the port leaves as it is (one the
script's own project module returns, `loader(dataset, 16)`) delivers CPU batches. Where a forward of the model is
given a batch of a `for` over such a loader (the loop's own names, or names unpacked from them in the body), the
loop's names are moved first thing in its body: `x, y = x.to(ctx.device), y.to(ctx.device)` for names the body uses
as tensors, `ddpkit.device.to_device(batch, ctx.device)` (tensors inside dicts, lists and tuples; other values pass
through) for the others. The move is planned only where nothing in the loop hands those values, or values computed
from them, to code that reads host memory (numpy, a list it fills, a function of the script or of another
library); `.numpy()` is read through `.cpu()` by the rewrite already. Anything else stays the TODO of feeds.py.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, loader_expr, names_a_device, root_name, walk

__all__ = ["plan_batch_moves", "plan_kept_batches", "model_forwards"]

_TENSOR_USES = frozenset({
    "squeeze", "unsqueeze", "view", "view_as", "size", "shape", "float", "long", "double", "half", "int", "bool",
    "numpy", "type", "reshape", "permute", "dim", "ndim", "dtype", "argmax", "eq", "ne", "sum", "mean", "detach",
    "contiguous", "numel", "clone", "transpose", "flatten", "max", "min", "masked_fill", "unsqueeze_", "squeeze_"})
"""Attributes only a tensor has (a collated batch element that is a list, a dict or a string has none of them)."""
_HOST_READS = frozenset({"numpy", "tolist", "item", "cpu"})
"""Reads that bring a value back to the host: what is computed from them is no device value."""
_BUILTINS = frozenset({"len", "int", "float", "print", "range", "zip", "enumerate", "isinstance", "str", "round",
                       "min", "max", "abs", "sum"})
_LOSS = re.compile(r"loss|criterion|crit$", re.IGNORECASE)


def _names(target: cst.BaseExpression) -> list[str]:
    return [x.value for x in walk(target) if isinstance(x, cst.Name)]


def _loop_names(loop: cst.For) -> list[str]:
    """The names a `for` binds to a batch (the counter `enumerate` adds is none)."""
    target = loop.target
    if isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "enumerate" and isinstance(
            target, cst.Tuple) and len(target.elements) == 2:
        target = target.elements[1].value
    return _names(target)


def _host_loop(plan: Any, key: str, node: cst.CSTNode, name: str) -> cst.For | None:
    """The innermost `for` around `node` over a torch DataLoader the port keeps whose batch `name` is (a loop name,
    or bound in the body from one: `inputs, labels = data`)."""
    stmt = plan._stmt.get(id(node), node)
    loop = plan._parent.get(id(stmt))
    while loop is not None and not isinstance(loop, cst.For):
        loop = plan._parent.get(id(loop))
    if loop is None or dotted(loader_expr(loop.iter)) not in plan.host_loaders.get(key, set()):
        return None
    return loop if name in _batch_names(loop) else None


def _batch_names(loop: cst.For) -> set[str]:
    """The loop's names and those bound in its body from them without a call (`x, y = batch`, `x = batch["x"]`)."""
    names = set(_loop_names(loop))
    for n in walk(loop.body):
        if isinstance(n, cst.Assign) and root_name(n.value) in names and not any(
                isinstance(c, cst.Call) for c in walk(n.value)):
            names |= {x for t in n.targets for x in _names(t.target)}
    return names


def _computed(loop: cst.For, start: set[str], forwards: set[int]) -> set[str]:
    """`start` and the names the loop body computes from them (a forward's output is on ctx.device already)."""
    found = set(start)
    for _ in range(3):
        for n in walk(loop.body):
            if not isinstance(n, cst.Assign) or any(id(c) in forwards for c in walk(n.value)):
                continue
            reads = {x.value for x in _device_reads(n.value)}
            if reads & found:
                found |= {x for t in n.targets for x in _names(t.target)}
    return found


def _device_reads(expr: cst.CSTNode) -> list[cst.Name]:
    """The names `expr` reads as they are, not through a read back to the host (`y.item()`, `y.cpu().numpy()`)."""
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _HOST_READS:
        return []
    if isinstance(expr, cst.Name):
        return [expr]
    return [x for c in expr.children for x in _device_reads(c)]


def _host_handed(plan: Any, key: str, loop: cst.For, names: set[str]) -> str:
    """The first call in the loop that hands one of `names` as it is (or an item of it) to code that may read host
    memory: its text; '' when none does."""
    for call in (n for n in walk(loop.body) if isinstance(n, cst.Call)):
        func = dotted(call.func)
        handed = [a.value for a in call.args if root_name(a.value) in names and isinstance(
            a.value, (cst.Name, cst.Subscript))]
        if not handed:
            continue
        last = func.rsplit(".", 1)[-1] if func else ""
        if plan.role(key, func) == "model" or func.startswith(("torch.", "F.", "nn.")) or func in _BUILTINS:
            continue
        if _LOSS.search(last) or isinstance(call.func, cst.Attribute) and last in _TENSOR_USES and root_name(
                call.func.value) not in ("np", "numpy"):
            continue
        return plan.f.code(call)
    return ""


def plan_batch_moves(plan: Any, key: str, forward: cst.Call) -> set[str]:
    """Move the batch a forward of the model in scope `key` is given to ctx.device at the top of its loop, when the
    loop iterates a torch DataLoader the port keeps and nothing there takes the batch back to the host: the names
    moved (empty where none is)."""
    inputs = [root_name(a.value) for a in forward.args if root_name(a.value)]
    loops = {id(lp): lp for lp in (_host_loop(plan, key, forward, n) for n in inputs) if lp is not None}
    moved: set[str] = set()
    for loop in loops.values():
        names = _loop_names(loop)
        first = loop.body.body[0] if isinstance(loop.body, cst.IndentedBlock) and loop.body.body else None
        if not names or first is None:
            continue
        if id(first) in plan.batch_moves:
            moved |= _batch_names(loop)
            continue
        forwards = {id(c) for c in walk(loop.body) if isinstance(c, cst.Call) and plan.role(key, dotted(
            c.func.value if isinstance(c.func, cst.Attribute) and c.func.attr.value == "forward"
            else c.func)) == "model"}
        if _host_handed(plan, key, loop, _computed(loop, set(names), forwards)):
            continue
        used = {root_name(n.value) for n in walk(loop.body) if isinstance(n, cst.Attribute) and isinstance(
            n.value, (cst.Name, cst.Subscript)) and n.attr.value in _TENSOR_USES}  # `y.squeeze(1)`, `y[i].numpy()`
        if all(n in used for n in names):
            lines = [f"{', '.join(names)} = {', '.join(f'{n}.to(ctx.device)' for n in names)}"]
        else:  # a batch whose structure the body does not show: its tensors, inside dicts, lists and tuples
            lines = [f"{n} = {f'{n}.to(ctx.device)' if n in used else f'ddpkit.device.to_device({n}, ctx.device)'}"
                     for n in names]
        lines[0] += "  # the model is on ctx.device; this loader gives CPU batches"
        plan.batch_moves[id(first)] = lines
        moved |= _batch_names(loop)
    return moved


def plan_kept_batches(plan: Any) -> None:
    """A script that names no device and trains from a ddpkit loader: a forward of the model given a batch of a torch
    DataLoader the port keeps (the script's project module returns it) is moved to ctx.device at the top of its
    loop where that is sure, else a TODO names it: those batches stay on the CPU, the model does not."""
    f = plan.f
    if names_a_device(f.module):
        return
    for k in sorted(f.ported):
        kept = plan.host_loaders.get(k, set())
        for call in model_forwards(plan, k, f.scope_statements(k)):
            moved = plan_batch_moves(plan, k, call)
            loops = [n for n in _around(plan, call) if isinstance(n, cst.For) and dotted(loader_expr(n.iter)) in kept]
            inputs = [a.value for a in call.args if root_name(a.value) not in moved and any(  # `x = noise(batch)` too
                root_name(a.value) in _computed(lp, set(_loop_names(lp)), {id(call)}) for lp in loops)]
            if inputs:
                names = ", ".join(f"`{f.code(x)}`" for x in inputs)
                plan.todo(call, f"{names} {'come' if len(inputs) > 1 else 'comes'} from a batch of "
                          f"`{f.code(loader_expr(loops[0].iter))}` (a torch DataLoader the port keeps: on the CPU, as "
                          "the script names no device) and is given to the model, which ddpkit.wrap put on "
                          "ctx.device, and the port cannot tell that moving it keeps the rest of the loop right: move "
                          "the batch there (ddpkit.device.to_device(batch, ctx.device))")


def _around(plan: Any, node: cst.CSTNode) -> list[cst.CSTNode]:
    """The statements around `node`'s statement, innermost first."""
    out, stmt = [], plan._parent.get(id(plan._stmt.get(id(node), node)))
    while stmt is not None:
        out.append(stmt)
        stmt = plan._parent.get(id(stmt))
    return out


def model_forwards(plan: Any, key: str, stmts: list[cst.BaseStatement]) -> list[cst.Call]:
    """The calls of the wrapped model (`model(x)`, `model.forward(x)`) in these statements."""
    out = []
    for call in (n for s in stmts for n in walk(s) if isinstance(n, cst.Call)):
        func = call.func.value if isinstance(call.func, cst.Attribute) and call.func.attr.value == "forward" \
            else call.func
        if plan.role(key, dotted(func)) == "model":
            out.append(call)
    return out
