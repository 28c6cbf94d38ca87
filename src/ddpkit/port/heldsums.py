"""Figures a model sums on itself over this rank's batches (`self.total += self.loss` in its forward) and hands back.

A model of the script that accumulates into one of its own attributes as it runs (`self.sums["kl"] += kl` in
`forward`, `self.seen += x.shape[0]`) holds, after the port, the sums of this rank's batches only. A method of it
that reads such an attribute and returns a value (`model.get_cumulative_losses()`) then hands this rank's figure to
whatever reports, returns or logs it. The port cannot reduce it where it is read (the method also resets it, the
value may be a dict of tensors), so each such call whose value the script uses gets a TODO naming the attribute.
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, statements_of, walk

__all__ = ["plan_model_held_sums"]


def plan_model_held_sums(plan: Any) -> None:
    """A TODO at each used call, on the model, of a method that returns what the model summed on itself."""
    held = _held(plan.f.module)
    if not held:
        return
    for key in sorted(plan.f.ported):
        for stmt in plan.f.scope_statements(key):
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            for node in walk(stmt):
                if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)) \
                        or node.func.attr.value not in held or id(node) in plan.flagged:
                    continue
                owner = node.func.value
                if isinstance(owner, cst.Call) and dotted(owner.func) == "ddpkit.unwrap" and owner.args:
                    owner = owner.args[0].value
                if plan.role(key, dotted(owner)) != "model" or _unused(plan, node):
                    continue
                attr, summed = held[node.func.attr.value]
                plan.flagged.add(id(node))
                plan.todo(node, f"`{plan.f.code(node.func)}(...)` returns what the model summed on itself "
                          f"(`self.{attr}`, line {plan.line_of(summed)}) over this rank's batches only: reduce each "
                          "value across ranks (ddpkit.all_reduce_sum, every rank calling it) before it is reported, "
                          "returned or logged")


def _unused(plan: Any, call: cst.Call) -> bool:
    """The call is a statement of its own: its value is dropped (a reset, not a figure)."""
    stmt = plan._stmt.get(id(call))
    return isinstance(stmt, cst.SimpleStatementLine) and any(
        isinstance(s, cst.Expr) and s.value is call for s in stmt.body)


def _held(module: cst.Module) -> dict[str, tuple[str, cst.AugAssign]]:
    """Method name -> (attribute, where it is summed) for each method of a class of this file that returns a value
    and reads an attribute another of its methods adds non-constant values to (`self.a += v`, `self.a[k] += v`)."""
    out: dict[str, tuple[str, cst.AugAssign]] = {}
    for cls in (s for s in module.body if isinstance(s, cst.ClassDef)):
        methods = [m for m in statements_of(cls) if isinstance(m, cst.FunctionDef)]
        sums: dict[str, cst.AugAssign] = {}
        for method in methods:
            for n in walk(method.body):
                if isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.AddAssign) \
                        and not isinstance(n.value, (cst.Integer, cst.Float)):
                    attr = _self_attr(n.target)
                    if attr:
                        sums.setdefault(attr, n)
        for method in methods:
            if method.name.value.startswith("__") or not any(
                    isinstance(r, cst.Return) and r.value is not None for r in walk(method.body)):
                continue
            stores = {id(x) for n in walk(method.body) if isinstance(n, (cst.Assign, cst.AugAssign))
                      for t in (n.targets if isinstance(n, cst.Assign) else [n]) for x in walk(t.target)}
            read = next((a for n in walk(method.body) if id(n) not in stores
                         and (a := _self_attr(n, whole=True)) in sums), None)
            if read is not None:
                out.setdefault(method.name.value, (read, sums[read]))
    return out


def _self_attr(node: cst.CSTNode, whole: bool = False) -> str | None:
    """`a` of `self.a`, `self.a[k]`, `self.a.b` (with whole: only the `self.a` node itself)."""
    if not whole:
        while isinstance(node, (cst.Subscript, cst.Attribute)) and not (
                isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name)):
            node = node.value
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return node.attr.value
    return None
