"""Tensors the script's own functions make on the CPU that reach the wrapped model, its loss, or an index by a batch.

The model is on ctx.device and ddpkit.loader delivers batches there. A tensor made by a helper of the script
(`char_tensor(s)` returning `torch.LongTensor(...)`, `model.init_hidden()` returning `torch.zeros(...)`), or a
module-level tensor indexed by a batch (`fill[y]`), stays on the CPU: the first step fails on a GPU rank. The
values of a forward's (or a loss's) arguments are followed back through the script's own functions, their callers'
arguments and module-level assignments; what ends in a tensor made without a device is a TODO naming it and its line.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, walk
from ddpkit.port.inputs import CREATORS

__all__ = ["plan_made_tensors", "plan_copy_inputs"]

_DEPTH = 3
_IN_PLACE = frozenset({"fill_", "zero_", "normal_", "uniform_", "scatter_", "random_", "requires_grad_", "view",
                       "float", "long", "double", "type", "unsqueeze", "squeeze", "contiguous", "reshape"})
_WRAPPERS = frozenset({"Variable", "autograd.Variable", "torch.autograd.Variable"})
_LEGACY = frozenset({"FloatTensor", "LongTensor", "IntTensor", "DoubleTensor", "ByteTensor", "BoolTensor", "Tensor"})
_ON_DEVICE = re.compile(r"device|cuda|\.to\(")
_LOSS = re.compile(r"loss|criterion", re.IGNORECASE)


def _peel(expr: cst.BaseExpression) -> cst.BaseExpression:
    """`Variable(torch.Tensor(2, 1, 8).fill_(0))` -> `torch.Tensor(2, 1, 8)`."""
    while isinstance(expr, cst.Call):
        name = dotted(expr.func)
        if name in _WRAPPERS and expr.args:
            expr = expr.args[0].value
        elif isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _IN_PLACE and \
                not name.startswith("torch."):
            expr = expr.func.value
        else:
            break
    return expr


def _created(expr: cst.BaseExpression) -> bool:
    """A new tensor made on the CPU: `torch.zeros(n)`, `torch.LongTensor(l)`, `torch.tensor([...])`."""
    name = dotted(expr.func) if isinstance(expr, cst.Call) else ""
    last = name.rsplit(".", 1)[-1]
    return name.startswith("torch.") and name.count(".") == 1 and (last in CREATORS or last in _LEGACY)


class _Origins:
    """Follows a name in a scope back to a tensor made on the CPU: (what, line) or None."""

    def __init__(self, plan: Any) -> None:
        self.p, self.f = plan, plan.f
        self.module_assigns: dict[str, list[cst.BaseExpression]] = {}
        for stmt in self.f.module.body:
            for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        if isinstance(t.target, cst.Name):
                            self.module_assigns.setdefault(t.target.value, []).append(small.value)
        self.built: dict[str, str] = {}  # name -> class of the script that builds it, anywhere in the module
        for n in walk(self.f.module, into_functions=True):
            if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and dotted(n.value.func) in self.f.classes:
                for t in n.targets:
                    if dotted(t.target):
                        self.built[dotted(t.target)] = dotted(n.value.func)

    def _assigns(self, key: str, name: str) -> list[tuple[cst.BaseExpression, int | None]]:
        """(value, tuple position or None) of every `name = ...` in the scope ("": the module's top level)."""
        if key not in self.f.scopes:
            return [(v, None) for v in self.module_assigns.get(name, [])]
        node = self.f.scopes[key].node if key in self.f.scopes and key != self.f.entry_key and \
            self.f.scopes[key].node is not None and isinstance(self.f.scopes[key].node, cst.FunctionDef) else None
        nodes = walk(node) if node is not None else (n for s in self.f.scope_statements(key) for n in walk(s))
        out = []
        for n in nodes:
            if not isinstance(n, cst.Assign):
                continue
            for t in n.targets:
                if isinstance(t.target, cst.Name) and t.target.value == name:
                    out.append((n.value, None))
                elif isinstance(t.target, (cst.Tuple, cst.List)):
                    for i, el in enumerate(t.target.elements):
                        if isinstance(el.value, cst.Name) and el.value.value == name:
                            out.append((n.value, i))
        return out

    def _function(self, call: cst.Call, key: str) -> str | None:
        """The script's own function or method a call runs (`helper(...)`, `model.init_hidden()`)."""
        found = self.f.callees(call, key)
        if found:
            return found[0] if not found[0].endswith(".__init__") else None
        if isinstance(call.func, cst.Attribute):
            value = call.func.value
            if isinstance(value, cst.Call) and dotted(value.func) == "ddpkit.unwrap" and value.args:
                value = value.args[0].value
            cls = self.built.get(dotted(value))
            method = f"{cls}.{call.func.attr.value}"
            if cls and method in self.f.scopes:
                return method
        return None

    def of_expr(self, key: str, expr: cst.BaseExpression, index: int | None, depth: int) -> tuple[str, int] | None:
        if depth > _DEPTH:
            return None
        if isinstance(expr, (cst.Tuple, cst.List)) and index is not None:
            if index < len(expr.elements) and not isinstance(expr.elements[index], cst.StarredElement):
                return self.of_expr(key, expr.elements[index].value, None, depth)
            return None
        if _ON_DEVICE.search(self.f.code(expr)):
            return None
        expr = _peel(expr)
        if _created(expr):
            return self.f.code(expr).split("(", 1)[0] + "(...)", self.p.line_of(expr)
        if isinstance(expr, cst.Subscript):
            return self.of_expr(key, expr.value, None, depth)
        if isinstance(expr, cst.Name):
            return self.of_name(key, expr.value, depth + 1)
        if isinstance(expr, cst.Call):
            func = self._function(expr, key)
            if func is not None:
                return self._returned(func, index, depth + 1)
        return None

    def _returned(self, func: str, index: int | None, depth: int) -> tuple[str, int] | None:
        node = self.f.scopes[func].node
        returns = [n.value for n in walk(node) if isinstance(n, cst.Return) and n.value is not None]
        found = [self.of_expr(func, r, index, depth) for r in returns]
        return found[0] if found and all(found) else None

    def of_name(self, key: str, name: str, depth: int) -> tuple[str, int] | None:
        if depth > _DEPTH:
            return None
        assigns = self._assigns(key, name)
        assigns = [(v, i) for v, i in assigns if not (isinstance(v, cst.Call) and key in self.f.scopes and
                                                      self.p.role(key, dotted(v.func)) == "model")]
        if assigns:  # `out, hidden = model(x, hidden)` carries the first value on: the others decide
            found = [self.of_expr(key, v, i, depth) for v, i in assigns]
            return found[0] if all(found) else None
        scope = self.f.scopes.get(key)
        if scope is not None and name in scope.params:
            return self._from_callers(key, scope.params.index(name), depth)
        values = self.module_assigns.get(name, [])
        found = [self.of_expr(self.f.entry_key if self.f.ctx_global else "", v, None, depth) for v in values]
        return found[0] if found and all(found) else None

    def _from_callers(self, key: str, position: int, depth: int) -> tuple[str, int] | None:
        """Every call of the function `key` in the script gives the parameter at `position` a CPU tensor."""
        found = []
        for caller, scope in self.f.scopes.items():
            nodes = walk(scope.node) if isinstance(scope.node, cst.FunctionDef) and caller != self.f.entry_key \
                else (n for s in self.f.scope_statements(caller) for n in walk(s))
            for n in nodes:
                if not isinstance(n, cst.Call) or key not in self.f.callees(n, caller):
                    continue
                args = [a for a in n.args if a.keyword is None]
                star = next((i for i, a in enumerate(args) if a.star), None)
                if star is not None and star <= position and args[star].star == "*" and \
                        isinstance(args[star].value, cst.Call):  # `step(model, *pair(text))`: the tuple it returns
                    found.append(self.of_expr(caller, args[star].value, position - star, depth))
                elif position < len(args) and (star is None or star > position):
                    found.append(self.of_expr(caller, args[position].value, None, depth))
                else:
                    return None
        return found[0] if found and all(found) else None


def plan_made_tensors(plan: Any) -> None:
    """A TODO at each forward or loss given a tensor a script function (or module-level code) made on the CPU, and
    at each index of such a tensor by a batch of a ported loader (on ctx.device now). Tensors made in the same
    scope are plan_forwards' (it moves them)."""
    origins = _Origins(plan)
    told: set[str] = {m for _, m in plan.todos}
    for key in sorted(plan.f.ported):
        nodes = list(plan.nodes(key))
        batch = {x.value for n in nodes if isinstance(n, cst.For) and plan.loop_role(key, n) in ("train", "eval")
                 for x in walk(n.target) if isinstance(x, cst.Name)}
        for node in nodes:
            if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name) and batch and any(
                    isinstance(x, cst.Name) and x.value in batch for s in node.slice for x in walk(s)):
                found = origins.of_name(key, node.value.value, 1)
                if found is not None:
                    _tell(plan, node, told, f"`{plan.f.code(node)}` indexes `{node.value.value}`, made on the CPU by "
                          f"`{found[0]}` (line {found[1]}), with a batch that ddpkit.loader now delivers on "
                          f"ctx.device: make `{node.value.value}` on ctx.device (or .to(ctx.device)) there")
                continue
            if not isinstance(node, cst.Call):
                continue
            func = dotted(node.func)
            if plan.role(key, func) != "model" and not _LOSS.search(func.rsplit(".", 1)[-1]):
                continue
            for arg in node.args:
                names = {x.value for x in walk(arg.value) if isinstance(x, cst.Name)}
                if isinstance(arg.value, cst.Subscript):
                    names = {dotted(arg.value.value)} if isinstance(arg.value.value, cst.Name) else set()
                elif not isinstance(arg.value, cst.Name):
                    continue
                for name in sorted(names - batch):
                    assigns = origins._assigns(key, name)
                    if assigns and all(not isinstance(v, cst.Call) or origins._function(v, key) is None
                                       for v, _ in assigns):
                        continue  # made here: plan_forwards moves it or names it
                    found = origins.of_name(key, name, 0)
                    if found is not None:
                        _tell(plan, node, told, f"`{name}` reaches `{func}(...)` from `{found[0]}` (line {found[1]}), "
                              "a tensor a function of the script makes on the CPU, while the model is on "
                              f"ctx.device: make it there (device=ctx.device, or .to(ctx.device))")


def _tell(plan: Any, node: cst.CSTNode, told: set[str], message: str) -> None:
    if message not in told:
        told.add(message)
        plan.todo(node, " ".join(message.split()))  # quoted code stays on one comment line


def plan_copy_inputs(plan: Any) -> None:
    """The inputs of a copy's forward (`target(next_state)`) go to ctx.device with it, as DDP moves the wrapped
    model's: `x.to(ctx.device)` for a tensor the script made on the CPU, `ddpkit.device.to_device(x, ctx.device)` for
    another name (its tensors moved, other values kept); an input that is not a plain name is a TODO naming it."""
    f = plan.f
    traced = _Origins(plan)
    for _, name in sorted(plan.model_copies):
        for k in sorted(f.ported):
            for call in (n for n in plan.nodes(k) if isinstance(n, cst.Call) and dotted(n.func) == name
                         and plan.is_model_copy(k, name)):
                unsure = []
                for arg in call.args:
                    if not isinstance(arg.value, cst.Name) or arg.star:
                        unsure.append(f"`{f.code(arg.value)}`")
                    elif traced.of_expr(k, arg.value, None, 0):
                        plan.move_at.add(id(arg.value))
                    else:  # what DDP does to the wrapped model's inputs: tensors moved, other values as they are
                        plan.replace[id(arg.value)] = f"ddpkit.device.to_device({arg.value.value}, ctx.device)"
                if unsure:
                    plan.todo(call, f"{', '.join(unsure)} {'are' if len(unsure) > 1 else 'is'} given to `{name}`, "
                              "a copy of the model that the port puts on ctx.device with it: make "
                              f"{'them' if len(unsure) > 1 else 'it'} there (ddpkit.device.to_device(x, ctx.device))")
