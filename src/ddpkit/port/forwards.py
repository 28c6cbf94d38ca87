"""Forwards of the wrapped model in a ported script: which never reach backward(), which get CPU-made inputs."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, walk
from ddpkit.port.inputs import made_on_cpu, move_cpu_input
from ddpkit.port.models import is_optimizer

__all__ = ["plan_forwards", "returns_no_graph"]

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
    _method_inputs(plan)


def _method_inputs(plan: Any) -> None:
    """`model.act(state)`, a method of the model's class other than forward (the port calls it on
    ddpkit.unwrap(model)), that builds a tensor itself on the CPU (`torch.FloatTensor(state)`) and runs the model on
    it (`self(x)`, `self.forward(x)`, `self.layers(x)`): the model is on ctx.device after the port, so on a GPU
    rank the first such call fails with a device mismatch. A TODO at the call: the method is the script's own
    code, shared by every caller, and the port does not rewrite it for one of them."""
    named: set[str] = set()
    for key in sorted(plan.f.ported):
        for call in (n for n in plan.nodes(key) if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)):
            method = next((plan.f.scopes[k] for k in plan.f.callees(call, key) if plan.f.scopes[k].cls), None)
            if method is None or call.func.attr.value == "forward" or method.key in named \
                    or plan.role(key, dotted(call.func.value)) != "model":
                continue
            made = _made_and_run(plan, method)
            if made is None:
                continue
            named.add(method.key)
            receiver = dotted(call.func.value)
            plan.todo(call, f"`{receiver}.{call.func.attr.value}(...)` builds its input `{made[0]}` on the CPU "
                      f"(`{' '.join(plan.f.code(made[1].value).split())}`, line {plan.line_of(made[1])}) and runs the "
                      "model on it, but the model is on ctx.device after the port: on a GPU rank this fails with a "
                      f"device mismatch; make it on the model's device in `{call.func.attr.value}` "
                      "(`.to(next(self.parameters()).device)`)")


def _made_and_run(plan: Any, scope: Any) -> tuple[str, cst.Assign] | None:
    """The first tensor `method` makes on the CPU and gives to its own model (`self(x)`, `self.forward(x)`, a
    submodule `self.layers(x)`), with its assignment; None when the method names a device (it places its inputs
    itself) or runs the model on nothing it made."""
    method = scope.node
    if re.search(r"device|cuda|\.to\(", plan.f.code(method.body)):
        return None

    def runs_model(call: cst.Call) -> bool:  # `self(x)`, `self.forward(x)`, a submodule (not a method of the class)
        name = dotted(call.func)
        return name in ("self", "self.forward") or name.count(".") == 1 and name.startswith("self.") and \
            f"{scope.cls}.{name[5:]}" not in plan.f.scopes

    made: dict[str, cst.Assign] = {}
    for n in walk(method.body):
        if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Name):
            name = n.targets[0].target.value
            if made_on_cpu(n.value):
                made.setdefault(name, n)
            else:
                made.pop(name, None)
        elif isinstance(n, cst.Call) and runs_model(n):
            for arg in n.args:
                if isinstance(arg.value, cst.Name) and arg.value.value in made:
                    return arg.value.value, made[arg.value.value]
    return None


def returns_no_graph(method: cst.FunctionDef) -> bool:
    """Every value `method` returns is free of autograd's graph (a Python number from `.item()`, `int(...)`, a
    draw of `random`, a literal, an argument passed back): its output cannot reach backward(), whatever the caller
    does with it (`action = model.act(state)` pushed into a replay buffer)."""
    params = {p.name.value for p in method.params.params}
    assigned: dict[str, list[cst.BaseExpression]] = {}
    for n in walk(method.body):
        if isinstance(n, cst.Assign):
            for t in n.targets:
                for x in walk(t.target):
                    if isinstance(x, cst.Name):
                        assigned.setdefault(x.value, []).append(n.value if t.target is x else None)
        elif isinstance(n, (cst.AugAssign, cst.For)):
            for x in walk(n.target):
                if isinstance(x, cst.Name):
                    assigned.setdefault(x.value, []).append(None)

    def free(expr: cst.BaseExpression | None, seen: frozenset[str]) -> bool:
        if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)):
            return True
        if isinstance(expr, cst.Name):
            if expr.value in ("True", "False", "None") or expr.value in params and expr.value not in assigned:
                return True
            return expr.value not in seen and bool(assigned.get(expr.value)) and all(
                free(v, seen | {expr.value}) for v in assigned[expr.value])
        if isinstance(expr, cst.Tuple):
            return all(free(e.value, seen) for e in expr.elements)
        if isinstance(expr, cst.Call):
            name = dotted(expr.func)
            return name in _PLAIN or name.startswith(("random.", "np.random.", "numpy.random.")) or isinstance(
                expr.func, cst.Attribute) and expr.func.attr.value in _DETACHES
        return False

    returns = [n for n in walk(method.body) if isinstance(n, cst.Return)]
    return bool(returns) and all(free(r.value, frozenset()) for r in returns)


_PLAIN = frozenset({"int", "float", "bool", "len", "str", "round"})
_DETACHES = frozenset({"item", "tolist", "detach", "numpy"})
"""Methods whose value carries no autograd graph."""


def _state_feeds(plan: Any, key: str, model: str, statements: list[cst.CSTNode], feeds: set[str]) -> bool:
    """Whether a statement that reaches backward reads an attribute of `model` (not a method it calls) or hands
    `model` itself to a call: a forward run for its effect that stores the loss on the model (`model(x)`, then
    `loss = model.loss` or `loss = collect_loss(model)`). That forward is the training step's own and must go
    through the wrapper, or DDP never averages the gradients."""
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
        if _hands_over(st, model):
            return True
    return False


def _hands_over(statement: cst.SimpleStatementLine, model: str) -> bool:
    """Whether `statement` gives `model` itself to a call (`collect_loss(model)`), which may read what its forward
    stored on it."""
    return any(isinstance(c, cst.Call) and any(dotted(a.value) == model for a in c.args) for c in walk(statement))


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
