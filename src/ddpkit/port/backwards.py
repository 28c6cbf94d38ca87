"""Two backward() calls through one forward of a wrapped model: DDP reduces its gradients in the first only.

DDP arms its gradient hooks at each forward and all-reduces the model's gradients in the first backward() that runs
back through that forward. A second backward() through the same forward output (`fake = gen(z)`, then
`critic_loss.backward(retain_graph=True)` and `gen_loss.backward()`, both through `fake`) finds the hooks spent:
DDP ignores them, and the gradients it leaves are this rank's own, so the replicas drift apart (or DDP raises).

Where the model's gradients from the first backward are thrown away before the second (its `zero_grad()` between
them, no step of its optimizer before that), the first loss does not need them: the port detaches the forward's
output where only the first loss reads it (`critic(fake.detach())`), which changes no step the original takes and
leaves the second backward() as the one that reduces. Otherwise a TODO names both backward() calls.
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, walk


__all__ = ["plan_reused_graphs"]

_CUTS = frozenset({"detach", "detach_", "item", "tolist", "numpy"})
"""Methods whose result carries no graph back to their receiver."""
_NEW_LEAVES = frozenset({"Variable", "tensor", "as_tensor", "from_numpy"})
"""Calls that make a new leaf from their argument's values (`Variable(x, requires_grad=True)`): no graph back."""


def _reads(expr: cst.CSTNode, cut: set[int] = frozenset()) -> list[cst.Name]:
    """The names `expr` reads with their graph: not an attribute's name, a called function's own name, a receiver
    of `.detach()`, nor a name in `cut` (ids of Name nodes the port detaches)."""
    skip: set[int] = set()
    for node in walk(expr):
        if isinstance(node, cst.Attribute):
            skip.add(id(node.attr))
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _CUTS:
            skip.update(id(n) for n in walk(node.func.value))
        if isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] in _NEW_LEAVES:
            skip.update(id(n) for a in node.args for n in walk(a.value))  # `Variable(x, requires_grad=True)`
        if isinstance(node, cst.Attribute) and node.attr.value == "data":
            skip.update(id(n) for n in walk(node.value))
        if isinstance(node, cst.Arg) and node.keyword is not None:
            skip.add(id(node.keyword))
    return [n for n in walk(expr) if isinstance(n, cst.Name) and id(n) not in skip and id(n) not in cut]


def _targets(assign: cst.Assign) -> set[str]:
    return {n.value for t in assign.targets for n in walk(t.target) if isinstance(n, cst.Name)}


class _Flow:
    """What a name read at a line comes from, through the scope's assignments before that line (any branch)."""

    def __init__(self, plan: Any, key: str) -> None:
        self.plan = plan
        self.assigns = [n for n in plan.nodes(key) if isinstance(n, cst.Assign)]

    def sources(self, name: str, line: int, cut: set[int] = frozenset()) -> tuple[set[str], list[cst.Assign]]:
        """(every name `name` depends on at `line`, the assignments that carry that dependence)."""
        names, used, todo = {name}, [], [(name, line)]
        while todo:
            current, before = todo.pop()
            for assign in self.assigns:
                at = self.plan.line_of(assign)
                if at < before and current in _targets(assign) and assign not in used:
                    used.append(assign)
                    for read in _reads(assign.value, cut):
                        if read.value not in names:
                            names.add(read.value)
                            todo.append((read.value, at))
        return names, used


def _is_true(arg: cst.Arg) -> bool:
    return isinstance(arg.value, cst.Name) and arg.value.value == "True"


def plan_reused_graphs(plan: Any) -> None:
    """Each pair of backward() calls in a scope, the second run back through an output of a wrapped model's forward
    that the first already ran back through: detached for the first where that is the original's step, else a TODO
    at the second."""
    wrapped = {model for _, model in plan.wrapped}
    for key in sorted(plan.f.ported):
        nodes = list(plan.nodes(key))
        backwards = sorted((n for n in nodes if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                            and n.func.attr.value == "backward" and dotted(n.func.value)), key=plan.line_of)
        if len(backwards) < 2:
            continue
        flow = _Flow(plan, key)
        forwards = {id(a): dotted(a.value.func) for a in flow.assigns if isinstance(a.value, cst.Call)
                    and dotted(a.value.func) in wrapped and plan.role(key, dotted(a.value.func)) == "model"}
        if not forwards:
            continue
        for first, second in zip(backwards, backwards[1:]):
            _check_pair(plan, key, nodes, flow, forwards, first, second)


def _check_pair(plan: Any, key: str, nodes: list[cst.CSTNode], flow: _Flow, forwards: dict[int, str],
                first: cst.Call, second: cst.Call) -> None:
    one, two = plan.line_of(first), plan.line_of(second)
    if one >= two or not any(a.keyword is not None and a.keyword.value in ("retain_graph", "create_graph")
                             and _is_true(a) for a in first.args):
        return  # without retain_graph the original's second backward() through that graph would raise already
    loss1, loss2 = dotted(first.func.value), dotted(second.func.value)
    names1, used1 = flow.sources(loss1, one)
    names2, used2 = flow.sources(loss2, two)
    for made in (a for a in used2 if id(a) in forwards and a in used1):
        outputs = _targets(made) & names1 & names2
        if not outputs:
            continue
        # the forward reached by both: no forward of the model between the two backward() calls made it anew
        if any(id(a) in forwards and _targets(a) & outputs and one < plan.line_of(a) < two for a in used2):
            continue
        model = forwards[id(made)]
        cut = _detachable(plan, nodes, flow, model, outputs, used1, used2, loss1, first, second)
        if cut is not None:
            # a model's input is detached; a function's argument stays a tensor that requires grad (a gradient
            # penalty takes autograd.grad through what it mixes from it), only cut from `model`'s graph
            fed = {id(a.value) for a in used1 for c in walk(a.value) if isinstance(c, cst.Call) and plan.role(
                key, dotted(c.func)) == "model" for a in c.args}
            for name in cut:
                plan.replace[id(name)] = f"{name.value}.detach()" if id(name) in fed else \
                    f"{name.value}.detach().requires_grad_()"
            plan.note(first, f"`{', '.join(sorted(outputs))}` from `{model}` (wrapped) is detached where only "
                      f"`{loss1}` reads it: DDP reduces `{model}`'s gradients in the first backward() through its "
                      f"forward, and `{loss2}.backward()` runs back through that forward again; the original throws "
                      f"`{model}`'s gradients from `{loss1}` away (zero_grad) before that, so no step changes")
            return
        plan.todo(second, f"`{loss2}.backward()` runs back through `{', '.join(sorted(outputs))}` (line "
                  f"{plan.line_of(made)}), an output of the wrapped `{model}`'s forward that `{loss1}.backward()` "
                  f"(line {one}) already ran back through: DDP reduced `{model}`'s gradients there and ignores them "
                  "here, so its step uses this rank's own gradients (the replicas drift apart) or DDP raises; run a "
                  f"new forward of `{model}` for `{loss2}`, or detach its output where `{loss1}` reads it if "
                  f"`{model}` needs no gradient from `{loss1}`")
        return


def _detachable(plan: Any, nodes: list[cst.CSTNode], flow: _Flow, model: str, outputs: set[str],
                used1: list[cst.Assign], used2: list[cst.Assign], loss1: str, first: cst.Call,
                second: cst.Call) -> list[cst.Name] | None:
    """The reads of `outputs` to detach so that `loss1` no longer runs back into `model`, where the original
    discards `model`'s gradients from `loss1` before its second backward() (and steps nothing on them); else None."""
    one, two = plan.line_of(first), plan.line_of(second)
    optimizers = {dotted(a.targets[0].target) for a in flow.assigns if len(a.targets) == 1 and isinstance(
        a.value, cst.Call) and any(dotted(n) in (f"{model}.parameters", f"{model}.named_parameters")
                                   for n in walk(a.value))}
    optimizers.discard("")
    calls = [n for n in nodes if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)]
    zeroed = sorted(plan.line_of(c) for c in calls if c.func.attr.value == "zero_grad" and (
        dotted(c.func.value) == model or dotted(c.func.value) in optimizers) and one < plan.line_of(c) < two)
    if not zeroed:
        return None
    # a step of the model's optimizer anywhere in the loop around the first backward(), or before the zero_grad,
    # would use the gradients the first loss left
    start, end = _span(plan, first, second)
    if any(c.func.attr.value == "step" and dotted(c.func.value) in optimizers and (
            start <= plan.line_of(c) <= end or one < plan.line_of(c) < zeroed[0]) for c in calls):
        return None
    only1 = [a for a in used1 if a not in used2]
    cut = [n for a in only1 for n in _reads(a.value) if n.value in outputs]
    if not cut:
        return None
    names, _ = flow.sources(loss1, one, {id(n) for n in cut})
    return None if names & outputs else cut


def _span(plan: Any, first: cst.Call, second: cst.Call) -> tuple[int, int]:
    """The lines of the outermost loop around `first` that does not also hold `second` (the first's own line where
    no loop holds it alone)."""
    span = (plan.line_of(first), plan.line_of(first))
    node = plan._parent.get(id(plan._stmt.get(id(first), first)))
    while node is not None:
        if isinstance(node, (cst.For, cst.While)):
            inside = {id(n) for n in walk(node)}
            if id(second) in inside:
                break
            span = (plan.line_of(node), plan.end_of(node))
        node = plan._parent.get(id(node))
    return span
