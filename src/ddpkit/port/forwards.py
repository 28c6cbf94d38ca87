"""Forwards of the wrapped model in a ported script: which never reach backward(), which get CPU-made inputs."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, walk
from ddpkit.port.inputs import move_cpu_input
from ddpkit.port.models import is_optimizer

__all__ = ["plan_forwards"]

_SCALES = re.compile(r"(?i)scal|backward")


def plan_forwards(plan: Any) -> None:
    """A forward whose output never reaches backward() (a look at the test set inside the training loop, a
    graph for TensorBoard) leaves DDP waiting for a backward with gradients on, and the next training step
    fails: it calls ddpkit.unwrap(model). An input the script made on the CPU is made on ctx.device where it is
    assigned, or a TODO where it is not plainly a new tensor (the model is on ctx.device)."""
    optimizers = {dotted(t.target) for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Assign)
                  and isinstance(n.value, cst.Call) and is_optimizer(n.value) for t in n.targets}
    for key in sorted(plan.f.ported):
        nodes = list(plan.nodes(key))
        backward = [n for n in nodes if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                    and n.func.attr.value == "backward"]
        feeds = {dotted(x) for b in backward for x in walk(b.func.value) if isinstance(x, cst.Name)}
        feeds |= {dotted(x) for b in backward for a in b.args for x in walk(a.value) if isinstance(x, cst.Name)}
        # a loss-scaling helper given the optimizer runs backward itself (`loss_scaler(loss, opt)`)
        scalers = [n for n in nodes if isinstance(n, cst.Call) and _SCALES.search(dotted(n.func).rsplit(".", 1)[-1])
                   and any(dotted(a.value) in optimizers for a in n.args)]
        backward += scalers
        feeds |= {dotted(x) for b in scalers for a in b.args for x in walk(a.value) if isinstance(x, cst.Name)}
        assigns = [n for n in nodes if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign))]
        # what may reach backward: every name that shares a statement with one that does (coarse on
        # purpose: lists, attributes and loops carry values too; a forward is unwrapped only when clear)
        skip = {"self", "ctx", "torch", "nn", "F", "np", "len", "range", "print", "enumerate", "zip"}
        skip |= {k for k, v in plan.f.scopes[key].roles.items() if v == "model"}
        statements = [n for n in nodes if isinstance(n, (cst.SimpleStatementLine, cst.For, cst.With))]
        tokens = [{x.value for x in walk(st) if isinstance(x, cst.Name)} - skip
                  for st in statements if isinstance(st, cst.SimpleStatementLine)]
        tokens += [{x.value for x in walk(st.target) if isinstance(x, cst.Name)} |
                   {x.value for x in walk(st.iter) if isinstance(x, cst.Name)} - skip
                   for st in statements if isinstance(st, cst.For)]
        # `with amp.scale_loss(loss, opt) as scaled: scaled.backward()`: the `as` target carries the loss
        tokens += [{x.value for x in walk(item) if isinstance(x, cst.Name)} - skip
                   for st in statements if isinstance(st, cst.With) for item in st.items]
        feeds -= skip
        for _ in range(30):
            before = len(feeds)
            for group in tokens:
                if group & feeds:
                    feeds |= group
            if len(feeds) == before:
                break
        made: dict[str, list[cst.BaseExpression]] = {}
        for a in assigns:
            for t in a.targets if isinstance(a, cst.Assign) else ():
                if isinstance(t.target, cst.Name):
                    made.setdefault(t.target.value, []).append(a.value)
        for call in (n for n in nodes if isinstance(n, cst.Call) and plan.role(key, dotted(n.func)) == "model"):
            stmt = plan._stmt.get(id(call))
            for arg in call.args:
                values = made.get(dotted(arg.value), []) if isinstance(arg.value, cst.Name) else []
                text = " ".join(plan.f.code(v) for v in values)
                if values and re.search(r"torch\.|Tensor|np\.|numpy|\.data\b", text) and not \
                        re.search(r"device|cuda|\.to\(", text) and not move_cpu_input(plan, key, dotted(arg.value)):
                    plan.todo(call, f"`{dotted(arg.value)}` is made on the CPU and given to the model, which "
                              f"ddpkit.wrap put on ctx.device: create it on ctx.device (or .to(ctx.device)) "
                              "and bring outputs back with .cpu() before .numpy()")
                    break
            if not backward or not isinstance(stmt, cst.SimpleStatementLine):
                continue
            small = stmt.body[0]
            if isinstance(small, cst.Return):
                continue
            targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
                [small.target] if isinstance(small, (cst.AugAssign, cst.AnnAssign)) else []
            names = {dotted(x) for t in targets for x in walk(t) if isinstance(x, cst.Name)}
            if isinstance(small, cst.Expr) and _state_feeds(plan, key, dotted(call.func), statements, feeds):
                continue  # `model(x)` then `loss = model.loss`: the forward's effect reaches backward
            if not names & feeds and not any(b for b in backward if plan._stmt.get(id(b)) is stmt):
                plan.unwrap_calls.add(id(call))
    _first_step_forwards(plan)


def _state_feeds(plan: Any, key: str, model: str, statements: list[cst.CSTNode], feeds: set[str]) -> bool:
    """Whether a statement that reaches backward reads an attribute of `model` (not a method it calls): a forward
    run for its effect that stores the loss on the model (`model(x)`, then `loss = model.loss`). That forward is
    the training step's own and must go through the wrapper, or DDP never averages the gradients."""
    for st in statements:
        if not isinstance(st, cst.SimpleStatementLine):
            continue
        names = {x.value for x in walk(st) if isinstance(x, cst.Name)}
        if not names & feeds and not any(isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute)
                                         and c.func.attr.value == "backward" for c in walk(st)):
            continue
        called = {id(c.func) for c in walk(st) if isinstance(c, cst.Call)}
        if any(isinstance(a, cst.Attribute) and dotted(a.value) == model and id(a) not in called for a in walk(st)):
            return True
    return False


_FIRST = re.compile(r"(?i)\b\w*(init|first)\w*\b")


def _first_step_forwards(plan: Any) -> None:
    """A forward of the model without gradients on the first step only, run for its effect (its output unused,
    or the step skipped with `continue`: `if i == 0: with torch.no_grad(): model(x)`, `if not initialized:`):
    a data-dependent initialisation (ActNorm, a layer that sets its scale
    from the first batch). After ddpkit.wrap each rank sets those parameters from its own shard of the batch, and
    DDP copies parameters from rank 0 only when it wraps: the ranks train different models. A TODO."""
    for key in sorted(plan.f.ported & plan.training_scopes):
        for call in (n for n in plan.nodes(key) if isinstance(n, cst.Call)):
            func = dotted(call.func)
            model = func[: -len(".module")] if func.endswith(".module") else func
            if not model or plan.role(key, model) != "model":
                continue
            chain = []
            node = plan._stmt.get(id(call))
            while node is not None:
                chain.append(node)
                node = plan._parent.get(id(node))
            quiet = any(isinstance(n, cst.With) and any(re.search(r"no_grad|inference_mode", plan.f.code(i.item))
                                                        for i in n.items) for n in chain)
            looped = any(isinstance(n, (cst.For, cst.While)) for n in chain)
            first = next((n for n in chain if isinstance(n, cst.If) and _first_step_test(n.test)), None)
            stmt = plan._stmt.get(id(call))
            discarded = isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) and \
                stmt.body[0].value is call or (
                first is not None and any(isinstance(n, cst.Continue) for n in walk(first.body)))
            if quiet and looped and first is not None and discarded:  # its output unused: run for its effect
                plan.todo(call, f"the forward of `{model}` without gradients on the first step only "
                          f"(`if {plan.f.code(first.test)}:`) looks like a data-dependent initialisation (a layer "
                          "that sets its parameters from the first batch, ActNorm): after ddpkit.wrap each rank "
                          "sets them from its own batch and DDP never makes them agree again; run it before "
                          f"ddpkit.wrap on the same batch on every rank, or broadcast `{model}`'s parameters from "
                          "rank 0 after it")


def _first_step_test(test: cst.BaseExpression) -> bool:
    """`i == 0`, `step < 1`, `not initialized`, `first_batch`, `epoch == 0 and i == 0`."""
    for node in walk(test):
        if isinstance(node, cst.Comparison) and any(
                isinstance(c.comparator, cst.Integer) and c.comparator.value in ("0", "1") and isinstance(
                    c.operator, (cst.Equal, cst.LessThan, cst.Is)) for c in node.comparisons):
            return True
    names = [dotted(n) for n in walk(test) if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n)]
    return any(_FIRST.fullmatch(n.rsplit(".", 1)[-1]) for n in names)
