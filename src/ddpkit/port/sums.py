"""Which per-rank sums `ddpkit port` reduces across ranks: `correct += ...` over a loader, read after the loop."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, walk


__all__ = ["plan_reductions"]

_COUNTER = re.compile(r"(^|_)(step|steps|iter|iters|iteration|epoch|it|i|batch_idx|n_iter)$")
_FLOATISH = re.compile(r"loss|float|double|mean|/|\d\.\d*|\.\d")


def _zero(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Integer) and node.value == "0":
        return "int"
    if isinstance(node, cst.Float) and float(node.value) == 0.0:
        return "float"
    return None


def plan_reductions(plan: Any, key: str, block: list[cst.BaseStatement]) -> None:
    """Schedule `name = all_reduce_sum(ctx, name)` after each loop over a loader that sums into `name`."""
    tracked: dict[str, str] = {}
    for stmt in block:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                tracked.update(_zero_names(small))
        elif not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) and tracked:
            loops = [n for n in walk(stmt) if isinstance(n, cst.For) and plan.loop_role(key, n)]
            if loops:
                summed = [n for n in walk(stmt) if isinstance(n, cst.AugAssign)
                          and isinstance(n.operator, cst.AddAssign) and dotted(n.target) in tracked]
                names = list(dict.fromkeys(dotted(n.target) for n in summed))
                end = plan.end_of(stmt)
                for name in names:
                    kind = tracked.pop(name)
                    if not _read_after(plan, key, name, end):
                        continue  # a running value reset inside the loop: nothing uses the sum
                    if _COUNTER.search(name) or all(isinstance(n.value, (cst.Integer, cst.Float))
                                                    for n in summed if dotted(n.target) == name):
                        continue  # `step += 1`: a step counter, the same on every rank
                    texts = [plan.f.code(n.value) for n in summed if dotted(n.target) == name]
                    scope_text = "".join(plan.f.code(s) for s in block)
                    if re.search(rf"\b{re.escape(name)}\.item\(\)", scope_text):
                        kind = "tensor"
                    elif kind == "int" and any(_FLOATISH.search(t) for t in texts):
                        kind = "float"
                    plan.reduce_after.setdefault(id(stmt), []).append((name, kind))
                    plan.reduced.setdefault(key, set()).add(name)
        for inner in plan.blocks_of(stmt) if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else ():
            plan_reductions(plan, key, inner)


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
