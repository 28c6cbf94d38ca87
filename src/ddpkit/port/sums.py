"""Which per-rank sums `ddpkit port` reduces across ranks, and which shard-only values it must leave as TODOs.

A value accumulated in a loop over a ported loader holds this rank's shard only. A sum started at
zero beside the loop is reduced after it (`name = ddpkit.all_reduce_sum(ctx, name)`, keeping the
value's type); anything else accumulated there and read after the loop (lists, dict entries,
attributes, sums started elsewhere) gets a TODO naming it, because no single rewrite is safe for it.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, root_name, walk
from ddpkit.port.ranks import agreed


__all__ = ["plan_reductions", "reduce_statement"]

_COUNTER = re.compile(r"(^|_)(step|steps|iter|iters|iteration|epoch|it|i|batch_idx|n_iter)$")
_PYTHON_NUMBER = re.compile(r"(\.item\(\)|^\s*(float|int|len)\(.*\)|\.size\(0?\)|\.shape\[0\]|\.numel\(\)|^\s*\d+(\.\d*)?)\s*$")
_INTISH = re.compile(r"(^\s*(int|len)\(.*\)|\.size\(0?\)|\.shape\[0\]|\.numel\(\)|^\s*\d+)\s*$")
_THROUGHPUT = re.compile(r"per_s(ec)?$|throughput|(^|_)(tps|ips|sps)$|tok(en)?s?_?(per_?)?s(ec)?$|samples_?(per_?)?s(ec)?$",
                         re.I)
_REPORT = re.compile(r"\bprint\(|print0\(|\.(info|debug|warning|log|write|set_postfix|set_description|add_scalars?)\(|"
                     r"\blog\(")
_COUNTS = re.compile(r"\.sum\(|size\(|\blen\(|shape\[0\]|numel\(|num_graphs|\.eq\(")
_TENSOR_USE = r"\b{}\.(item|float|double|long|cpu|numpy|to|detach|tolist)\("


def _zero(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Integer) and node.value == "0":
        return "int"
    if isinstance(node, cst.Float) and float(node.value) == 0.0:
        return "float"
    if isinstance(node, cst.Call) and dotted(node.func) in ("torch.zeros", "torch.tensor", "torch.zeros_like"):
        return "tensor"
    return None


def reduce_statement(name: str, kind: str) -> str:
    """The line that sums `name` over ranks, keeping its type: a Python number stays one, a tensor a tensor."""
    total = f"ddpkit.all_reduce_sum(ctx, {name})"
    if kind == "int":
        expr = f"int({total}.item())"
    elif kind == "float":
        expr = f"{total}.item()"
    elif kind == "tensor":  # started as a tensor: stays one, in its own dtype
        expr = f"{total}.to({name}.dtype)"
    elif kind == "number":  # `.item()` of an int or a float tensor: the type it had
        expr = f"type({name})({total}.item())"
    else:  # its type is decided at run time (a tensor from `.sum()`, or a number): keep whichever it is
        expr = (f"{total}.to({name}.dtype) if hasattr({name}, \"dtype\") else type({name})({total}.item())")
    return f"{name} = {expr}  # sum over every rank's shard\n"


def plan_reductions(plan: Any, key: str, block: list[cst.BaseStatement]) -> None:
    """Schedule a reduction after each loop over a loader that sums into a name started at zero beside it,
    and a TODO for every other shard-only value the loop accumulates and the code reads afterwards."""
    tracked: dict[str, str] = {}
    for stmt in block:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                tracked.update(_zero_names(small))
        elif not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            loops = [n for n in walk(stmt) if isinstance(n, cst.For) and plan.loop_role(key, n)]
            if loops:
                _plan_loop(plan, key, block, stmt, loops, tracked)
        for inner in plan.blocks_of(stmt) if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else ():
            plan_reductions(plan, key, inner)


def _plan_loop(plan: Any, key: str, block: list[cst.BaseStatement], stmt: cst.CSTNode, loops: list[cst.For],
               tracked: dict[str, str]) -> None:
    end = plan.end_of(stmt)
    inside = [n for loop in loops for n in walk(loop.body)]
    assigned_inside = {dotted(t.target) for n in inside if isinstance(n, cst.Assign) for t in n.targets}
    assigned_inside |= {dotted(n.target) for n in inside if isinstance(n, cst.For)}
    loop_vars = {dotted(n) for loop in loops for n in walk(loop.target) if isinstance(n, cst.Name)}
    summed = [n for n in inside if isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.AddAssign)]
    scope_text = "".join(plan.f.code(s) for s in block)
    handled: set[str] = set()
    for name in dict.fromkeys(dotted(n.target) for n in summed if dotted(n.target) in tracked):
        kind = tracked.pop(name)
        handled.add(name)
        plan.flagged.update(id(n) for n in summed if dotted(n.target) == name)
        if name in assigned_inside or not _read_after(plan, key, name, end):
            continue  # a running value reset inside the loop, or nothing uses the sum
        texts = [plan.f.code(n.value) for n in summed if dotted(n.target) == name]
        constant = all(isinstance(n.value, (cst.Integer, cst.Float)) for n in summed if dotted(n.target) == name)
        if (_COUNTER.search(name) or constant) and not _divides(plan, key, name, end):
            continue  # `step += 1`: a step counter, the same on every rank (unless it counts batches for a mean)
        if kind != "tensor" and re.search(_TENSOR_USE.format(re.escape(name)), scope_text):
            kind = "any"
        elif kind != "tensor" and all(_PYTHON_NUMBER.search(t) for t in texts):
            kind = "float" if kind == "float" else "int" if all(_INTISH.search(t) for t in texts) else "number"
        elif kind != "tensor":
            kind = "any"
        plan.reduce_after.setdefault(id(stmt), []).append((name, kind))
        plan.reduced.setdefault(key, set()).add(name)
    for node in inside:  # tokens/s from this rank's batch: every rank processes as many
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and _THROUGHPUT.search(
                dotted(node.targets[0].target)) and any(dotted(n) in loop_vars for n in walk(node.value)):
            plan.scale_world.add(id(node))
    _reported_inside(plan, key, loops, inside)
    assigned_here = {dotted(t.target) for n in walk(stmt) if isinstance(n, cst.Assign) for t in n.targets}
    for node in inside:
        target = _accumulated(node)
        if target is None or id(node) in plan.flagged:
            continue
        name, what = target
        root = name.split(".")[0].split("[")[0]
        if name in handled or root in loop_vars or name in assigned_inside or root in assigned_inside \
                or (root in assigned_here and stmt not in loops):
            continue  # started inside this statement: the pass over its inner block decides
        if _COUNTER.search(name) or (isinstance(node, cst.AugAssign) and isinstance(node.value, (cst.Integer, cst.Float))
                                     and not _divides(plan, key, name, end)):
            continue
        if not (_read_after(plan, key, root, end) or root == "self"):
            continue
        handled.add(name)
        plan.flagged.add(id(node))
        plan.todo(node, f"`{name}` {what} over this rank's shard of the data only, and is used after the loop: "
                  f"reduce it across ranks before it is reported (start a sum at 0 beside the loop so the port "
                  f"can add ddpkit.all_reduce_sum, or ddpkit.all_gather_object for lists)")


def _reported_inside(plan: Any, key: str, loops: list[cst.For], inside: list[cst.CSTNode]) -> None:
    """`running += loss.item()` ... `if i % 100 == 99: print(running / 100)`: the printed value is reduced
    where it is read (a mean of per-step values over ranks, or a sum of counts), or a TODO when ranks may not
    all reach that line."""
    sums = [n for n in inside if isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.AddAssign)
            and not isinstance(n.value, (cst.Integer, cst.Float))]
    texts: dict[str, list[str]] = {}
    for n in sums:
        texts.setdefault(plan.f.code(n.target), []).append(plan.f.code(n.value))
    if not texts:
        return
    stores = {id(t.target) for n in inside if isinstance(n, cst.Assign) for t in n.targets}
    stores |= {id(n.target) for n in inside if isinstance(n, cst.AugAssign)}
    stores |= {id(n.attr) for n in inside if isinstance(n, cst.Attribute)}  # names that are not values
    stores |= {id(n.keyword) for n in inside if isinstance(n, cst.Arg) and n.keyword is not None}
    for node in inside:
        if not isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)) or id(node) in stores \
                or id(node) in plan.reduce_read:
            continue
        text = plan.f.code(node)
        if text not in texts or id(node) in plan.flagged:
            continue
        stmt = plan._stmt.get(id(node))
        block = plan._parent.get(id(stmt))
        where = plan.f.code(block if isinstance(block, cst.If) else stmt)
        if not _REPORT.search(where):
            continue
        tests = []
        parent = plan._parent.get(id(stmt))
        while parent is not None and not any(parent is loop for loop in loops):
            if isinstance(parent, (cst.If, cst.While)):
                tests.append(parent.test)
            parent = plan._parent.get(id(parent))
        if parent is None or plan.loop_role(key, parent) != "train":
            continue  # evaluation shards differ by a batch: no collective inside their loop (progress stays local)
        if not all(agreed(plan, key, t) for t in tests):
            plan.flagged.add(id(node))
            plan.todo(node, f"`{text}` sums this rank's shard and is reported here, on a branch some ranks may "
                      "not take: reduce it (ddpkit.all_reduce_sum) where every rank passes, then report it")
            continue
        counts = all(_COUNTS.search(t) for t in texts[text])
        plan.reduce_read[id(node)] = "count" if counts else "mean"


def _accumulated(node: cst.CSTNode) -> tuple[str, str] | None:
    """`x += v`, `d[k] += v`, `xs.append(v)`, `x = torch.cat([x, v])`: (what accumulates, how)."""
    if isinstance(node, cst.AugAssign):
        name = dotted(node.target) or (f"{root_name(node.target)}[...]" if root_name(node.target) else "")
        return (name, "accumulates") if name else None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in (
            "append", "extend") and dotted(node.func.value):
        return dotted(node.func.value), "collects values"
    if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call) \
            and dotted(node.value.func) in ("torch.cat", "np.concatenate", "torch.stack", "np.vstack"):
        name = dotted(node.targets[0].target)
        if name and any(dotted(n) == name for n in walk(node.value)):
            return name, "concatenates values"
    return None


def _divides(plan: Any, key: str, name: str, line: int) -> bool:
    """`total / n` after the loop: `n` counts this rank's batches or samples for a mean."""
    return any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Divide, cst.FloorDivide))
               and dotted(n.right) == name and plan.line_of(n) > line for n in plan.nodes(key))


def _read_after(plan: Any, key: str, name: str, line: int) -> bool:
    stores = {id(t.target) for n in plan.nodes(key) if isinstance(n, (cst.Assign,))
              for t in n.targets}
    return any(dotted(n) == name and id(n) not in stores and plan.line_of(n) > line
               for n in plan.nodes(key) if isinstance(n, (cst.Name, cst.Attribute)))


def _zero_names(small: cst.BaseSmallStatement) -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(small, cst.Assign):
        for target in small.targets:
            t, v = target.target, small.value
            if isinstance(t, cst.Tuple) and isinstance(v, cst.Tuple) and len(t.elements) == len(v.elements):
                for te, ve in zip(t.elements, v.elements):
                    if dotted(te.value) and _zero(ve.value):
                        out[dotted(te.value)] = _zero(ve.value)
            elif dotted(t) and _zero(v):
                out[dotted(t)] = _zero(v)
    elif isinstance(small, cst.AnnAssign) and small.value is not None and _zero(small.value):
        out[dotted(small.target)] = _zero(small.value)
    return out
