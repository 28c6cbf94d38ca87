"""Which modules the optimizers of a ported script train, and where `ddpkit port` wraps each one."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import ENTRY, dotted, is_device_expr, statements_of, walk

__all__ = ["plan_models", "plan_autograd_grad", "check_rebound", "check_aliases", "is_optimizer", "move_receiver", "moves_to_cpu",
           "follows", "assigned_value", "scope_holding"]

_OPTIMIZER = re.compile(r"(^|\.)optim\.(?!lr_scheduler)[A-Z]\w*$")
_OPTIMIZERS = frozenset({"SGD", "Adam", "AdamW", "Adagrad", "Adadelta", "RMSprop", "Adamax", "NAdam", "RAdam",
                         "LBFGS", "ASGD", "Rprop", "SparseAdam"})
_ELEMENT_ITERS = frozenset({"zip", "enumerate", "reversed"})
_CONTAINERS = frozenset({"ModuleList", "ModuleDict"})
"""torch containers without a forward: DDP synchronises only through its own forward, which calling their
entries bypasses."""


def is_optimizer(call: cst.Call) -> bool:
    name = dotted(call.func)
    return bool(_OPTIMIZER.search(name)) or name.rsplit(".", 1)[-1] in _OPTIMIZERS or _is_own_optimizer(call, name)


def _is_own_optimizer(call: cst.Call, name: str) -> bool:
    """A class of the project or another library built like torch's optimizers (`Lamb(model.parameters(), lr=...)`,
    `PIDOptimizer(net.parameters(), lr=lr, momentum=m)`): a capitalised name, a learning rate and parameters as its
    first argument. An EMA or a logger over the parameters takes no `lr`."""
    last = name.rsplit(".", 1)[-1]
    first = next((a.value for a in call.args if a.keyword is None or a.keyword.value == "params"), None)
    return last[:1].isupper() and first is not None and any(a.keyword is not None and a.keyword.value == "lr"
                                                            for a in call.args) and any(
        isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
        and n.func.attr.value in ("parameters", "named_parameters") for n in walk(first))


def move_receiver(call: cst.CSTNode) -> cst.BaseExpression | None:
    """For `x.to(device)`, `x.to(device, non_blocking=True)` or `x.cuda()`: x; else None."""
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
        return None
    attr = call.func.attr.value
    positional = [a for a in call.args if a.keyword is None]
    extra = [a for a in call.args if a.keyword is not None and a.keyword.value != "non_blocking"]
    if attr == "cuda" and len(positional) <= 1 and not extra:
        return call.func.value
    if attr == "to" and len(positional) == 1 and not extra and is_device_expr(positional[0].value):
        return call.func.value
    return None


def moves_to_cpu(call: cst.CSTNode) -> bool:
    """`model.to("cpu")`, `x.to(torch.device("cpu"))`: an explicit move to the CPU (to sample or export there)."""
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "cpu" and \
            not call.args:
        return True
    if move_receiver(call) is None or call.func.attr.value != "to":
        return False
    arg = next(a.value for a in call.args if a.keyword is None)
    if isinstance(arg, cst.Call) and dotted(arg.func) == "torch.device" and arg.args:
        arg = arg.args[0].value
    return isinstance(arg, cst.SimpleString) and arg.evaluated_value == "cpu"


def _owner(name: str) -> str:
    """The module a parameter source belongs to: `model.fc` -> 'model', `self.encoder.rnn` -> 'self.encoder'."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "self" else parts[0]


def _is_data_parallel(call: cst.Call) -> bool:
    return dotted(call.func).rsplit(".", 1)[-1] == "DataParallel"


def _bare(expr: cst.BaseExpression) -> cst.BaseExpression:
    """The module under its moves and DataParallel: `nn.DataParallel(Net()).to(device)` -> `Net()`."""
    while True:
        receiver = move_receiver(expr)
        if receiver is not None:
            expr = receiver
        elif isinstance(expr, cst.Call) and _is_data_parallel(expr) and expr.args and expr.args[0].keyword is None:
            expr = expr.args[0].value
        else:
            return expr


def _is_move(stmt: cst.BaseStatement, name: str) -> bool:
    """`model.to(device)`, `model = model.cuda()`, `model = nn.DataParallel(model)`: no change to the model."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
    if isinstance(small, cst.Assign) and (len(small.targets) != 1 or dotted(small.targets[0].target) != name):
        return False
    return value is not None and value is not _bare(value) and dotted(_bare(value)) == name


def plan_models(plan: Any) -> str | None:
    """Wrap every module an optimizer trains (a GAN's generator and discriminator, an encoder and decoder in one
    optimizer, each model of a list); drop nn.DataParallel. The first module found is returned ('?' when the
    optimizer's module cannot be followed), None when there is no optimizer."""
    _plan_data_parallel(plan)
    models: list[str] = []
    outside: set[tuple[str, str]] = set()
    f = plan.f
    for key in sorted(f.ported, key=lambda k: (k != f.entry_key and k != ENTRY, k)):
        for node in plan.nodes(key):
            if not (isinstance(node, cst.Call) and is_optimizer(node)):
                continue
            receivers = _trained_modules(plan, key, node)
            for name in _added_parameters(plan, key, node, receivers):
                if (key, name) not in outside:  # one TODO per module, at its first optimizer
                    outside.add((key, name))
                    line = plan.line_of(plan._stmt.get(id(node), node))
                    plan.todo(node, f"the optimizer at line {line} also trains `{name}`, which is not inside a "
                              "wrapped model (added to its parameters apart from the model, or a bare "
                              "nn.Parameter): nothing averages its gradients, so each rank's copy drifts apart; move "
                              f"it into the model that is wrapped, wrap it too where it runs a forward "
                              f"({_owner(name)} = ddpkit.wrap({_owner(name)}, ctx)), or all-reduce its gradients "
                              "before optimizer.step()")
            for name in _handed_groups(plan, key, node, receivers):
                plan.todo(node, f"the optimizer at line {plan.line_of(plan._stmt.get(id(node), node))} also trains "
                          f"the parameters in `{name}`, handed in by the caller of `{key}`: the port cannot follow "
                          "them to a module; where they belong to a module other than the wrapped model (a "
                          "discriminator, a loss with weights), nothing averages their gradients and each rank's "
                          "copy drifts apart: wrap that module too where it is built (ddpkit.wrap(module, ctx)), "
                          "or all-reduce its gradients before optimizer.step()")
            if not receivers:
                plan.todo(node, "cannot find the model this optimizer trains (no `X.parameters()` the codemod can "
                          "follow): build the model, then model = ddpkit.wrap(model, ctx) before this line")
                models.append("?")
                continue
            for receiver in receivers:
                known = next((m for m in models if receiver == m or receiver.startswith(m + ".")), None)
                if known is None:
                    models.append(_wrap_model(plan, key, node, receiver) or receiver)
                elif (key, known) in plan.wrapped:  # a second optimizer over it: wrapped on this path too?
                    _place(plan, key, known, plan.built[(key, known)], plan._stmt[id(node)], node)
    return models[0] if models else None


def _trained_modules(plan: Any, key: str, optimizer: cst.Call) -> list[str]:
    """The modules whose `.parameters()` an optimizer is built from, one per module: `Adam(g.parameters())`,
    `list(enc.parameters()) + list(dec.parameters())`, `itertools.chain(...)`, parameter groups, or a name
    assigned from such an expression in the same scope (`params = ...; SGD(params)`)."""
    sources: list[cst.CSTNode] = [optimizer]
    names = _argument_names(optimizer)
    for node in plan.nodes(key):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and dotted(node.targets[0].target) in names:
            sources.append(node.value)
    receivers = [dotted(n.func.value) for s in sources for n in walk(s) if isinstance(n, cst.Call)
                 and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("parameters", "named_parameters")]
    receivers += [_handed_module(n, plan.groups[dotted(n.func)]) for s in sources for n in walk(s)
                  if isinstance(n, cst.Call) and dotted(n.func) in plan.groups]
    if "" in receivers:  # `heads[0].parameters()`: a module the codemod cannot name, so cannot wrap
        return []
    out: list[str] = []
    for r in receivers:
        if not any(_owner(r) == _owner(o) for o in out):
            out.append(r)
    return out


def _handed_module(call: cst.Call, handed: list[tuple[int, str]]) -> str:
    """The module a call of a parameter-group builder hands in (`add_weight_decay(model, 1e-5)` -> 'model'); '' where
    it is not one name, or where the builder reads more than one module (the port cannot tell which is trained)."""
    if len(handed) != 1:
        return ""
    index, name = handed[0]
    positional = [a for a in call.args if a.keyword is None and not a.star]
    by_name = [a for a in call.args if a.keyword is not None and a.keyword.value == name]
    arg = by_name[0] if by_name else positional[index] if index < len(positional) else None
    return dotted(arg.value) if arg is not None else ""


def _argument_names(optimizer: cst.Call) -> list[str]:
    """The names an optimizer is handed its parameters through: `SGD(params)`, also a slice or an item of such a
    list (`SGD(params[8:])`, the first layers kept frozen), whose source is the list's own."""
    values = [a.value.value if isinstance(a.value, cst.Subscript) else a.value for a in optimizer.args]
    return [dotted(v) for v in values if isinstance(v, cst.Name)]


def _parameter_names(plan: Any, key: str, optimizer: cst.Call) -> tuple[list[str], str]:
    """The names an optimizer's parameters come through (`params`, `param_groups`) and the optimizer's own name."""
    names = _argument_names(optimizer)
    stmt = plan._stmt.get(id(optimizer))
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) else None
    target = dotted(small.targets[0].target) if isinstance(small, cst.Assign) and len(small.targets) == 1 else ""
    return names, target


def _added_parameters(plan: Any, key: str, optimizer: cst.Call, receivers: list[str]) -> list[str]:
    """Parameters that reach the optimizer outside the modules the port wraps: a module added to its parameter
    list later (`param_groups.append({"params": criterion.parameters()})`, `params += ...`, `opt.add_param_group`),
    or a bare `nn.Parameter` (learnable class centres, a loss's proxies). Nothing averages their gradients, so they
    drift apart on each rank: their names, for a TODO at the optimizer's line."""
    names, target = _parameter_names(plan, key, optimizer)
    sources: list[cst.CSTNode] = [optimizer]
    added: list[cst.CSTNode] = []
    for node in plan.nodes(key):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and dotted(node.targets[0].target) in names:
            sources.append(node.value)
        elif isinstance(node, cst.AugAssign) and dotted(node.target) in names:
            added.append(node.value)
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and (
                node.func.attr.value in ("append", "extend", "insert") and dotted(node.func.value) in names
                or node.func.attr.value == "add_param_group" and target and dotted(node.func.value) == target):
            added.extend(a.value for a in node.args)
    found = [dotted(n.func.value) for s in added for n in walk(s) if isinstance(n, cst.Call) and isinstance(
        n.func, cst.Attribute) and n.func.attr.value in ("parameters", "named_parameters")]
    outside = [r for r in dict.fromkeys(found) if r and not any(_owner(r) == _owner(o) for o in receivers)]
    bare = {dotted(t.target) for n in plan.nodes(key) if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call)
            and dotted(n.value.func).rsplit(".", 1)[-1] == "Parameter" for t in n.targets if dotted(t.target)}
    outside += [name for name in dict.fromkeys(dotted(n) for s in sources + added for n in walk(s)
                                               if isinstance(n, (cst.Name, cst.Attribute))) if name in bare]
    return outside


def _handed_groups(plan: Any, key: str, optimizer: cst.Call, receivers: list[str]) -> list[str]:
    """Parameters of the function an optimizer is built in, listed as parameter groups beside a module it can follow
    (`SGD([{"params": model.parameters()}, extra_groups])`): what the caller hands in may be another module's
    parameters, which the wrap of `model` does not cover. Their names; none where no module is followed."""
    scope = plan.f.scopes.get(key)
    if not receivers or scope is None:
        return []
    names, _ = _parameter_names(plan, key, optimizer)
    sources: list[cst.CSTNode] = [a.value for a in optimizer.args[:1]]
    sources += [n.value for n in plan.nodes(key) if isinstance(n, cst.Assign) and len(n.targets) == 1
                and dotted(n.targets[0].target) in names]
    return [dotted(e.value) for s in sources if isinstance(s, (cst.List, cst.Tuple)) for e in s.elements
            if isinstance(e.value, cst.Name) and dotted(e.value) in scope.params and dotted(e.value) not in receivers]


def _chain(plan: Any, stmt: cst.CSTNode) -> list[cst.CSTNode]:
    """A statement and the compound statements around it, innermost first."""
    out = [stmt]
    while id(out[-1]) in plan._parent:
        out.append(plan._parent[id(out[-1])])
    return out


def follows(plan: Any, first: cst.CSTNode, then: cst.CSTNode) -> bool:
    """`then` may run after `first`: a statement around `then` comes after one around `first` in one block."""
    around = _chain(plan, first)
    for stmt in _chain(plan, then):
        block, j = plan._block.get(id(stmt), ([], -1))
        if any(f is b and i < j for f in around for i, b in enumerate(block)):
            return True
    return False


def _wrap_line(model: str, optimizer: cst.Call, stmt: cst.CSTNode, code: Any) -> str:
    """`model = ddpkit.wrap(model, ctx)`, or under the optimizer's own condition when it is made only then
    (`opt = Adam(...) if fine_tune else None`): DDP refuses a module with no parameter that trains."""
    for node in walk(stmt):
        if isinstance(node, cst.IfExp) and any(n is optimizer for n in walk(node.body)):
            return f"{model} = ddpkit.wrap({model}, ctx) if {code(node.test)} else {model}"
        if isinstance(node, cst.IfExp) and any(n is optimizer for n in walk(node.orelse)):
            return f"{model} = {model} if {code(node.test)} else ddpkit.wrap({model}, ctx)"
    return f"{model} = ddpkit.wrap({model}, ctx)"


def _wrap_model(plan: Any, key: str, optimizer: cst.Call, receiver: str) -> str | None:
    opt_stmt = plan._stmt[id(optimizer)]
    line = plan.line_of(opt_stmt)
    scope = plan.f.scopes[key]
    candidates = [receiver]
    while "." in candidates[-1]:
        candidates.append(candidates[-1].rsplit(".", 1)[0])
    assign, model = _build(plan, key, candidates, line)
    if assign is None and receiver == "self" and scope.cls:
        plan.todo(optimizer, f"the optimizer is built inside the model ({key}, over self.parameters()) and the "
                  "model trains itself in its own methods, which DDP cannot see: gradients are averaged only "
                  "through calls of the wrapped model; build the optimizer outside the class from the "
                  "parameters of model = ddpkit.wrap(Model(), ctx) and compute the loss through model(...)")
        return None
    if assign is None:
        listed = _listed_module(plan, optimizer, receiver)
        if listed is not None:
            return _wrap_list(plan, key, optimizer, *listed)
        if candidates[-1] in scope.params and _wrap_argument(plan, key, candidates[-1]):
            return candidates[-1]
        where = "is passed in" if any(c in scope.params for c in candidates) else "is not built here"
        # wrapped before its weights are loaded, a load into the wrapper looks for `module.` keys (a loader that
        # keeps matching keys only loads nothing), and a save of the wrapper's state_dict writes them
        plan.todo(optimizer, f"the model {receiver} {where}: wrap it with ddpkit.wrap(model, ctx) once its weights "
                  "are set (after it is built and after any loading of weights into it, which then reach the module, "
                  "not the wrapper; an optimizer made before the wrap holds the same parameters), and save "
                  "ddpkit.unwrap(model).state_dict() from then on (the wrapper's keys start with `module.`)")
        return None
    container = dotted(_bare(assign.value).func) if isinstance(_bare(assign.value), cst.Call) else ""
    if container.rsplit(".", 1)[-1] in _CONTAINERS:
        plan.todo(optimizer, f"the optimizer trains `{model}`, an nn.{container.rsplit('.', 1)[-1]} (line "
                  f"{plan.line_of(plan._stmt[id(assign)])}): a container with no forward of its own, so the script "
                  f"calls its entries, and a DDP wrap of `{model}` would see no forward and average no gradient; wrap "
                  "each module it holds that trains (`m = ddpkit.wrap(m, ctx)` before it is added) and call through "
                  "those wrappers")
        return None
    plan._set_role(key, model, "model")
    _place(plan, key, model, plan._stmt[id(assign)], plan._stmt[id(optimizer)], optimizer)
    return model


def _build(plan: Any, key: str, candidates: list[str], line: int) -> tuple[cst.Assign | None, str]:
    """The last assignment before `line` in scope `key` that builds one of `candidates` (not a move, not a
    parameter): `model = Net()`, `model, data = Net().to(device), data.to(device)`; (None, '') if none."""
    found: tuple[cst.Assign | None, str] = (None, "")
    params = plan.f.scopes[key].params
    for node in plan.nodes(key):
        if not (isinstance(node, cst.Assign) and len(node.targets) == 1 and plan.line_of(node) < line):
            continue
        target, value = node.targets[0].target, node.value
        pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]] = [(target, value)]
        if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(
                value.elements):
            pairs = [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
        for t, v in pairs:
            name = dotted(t)
            if v is not _bare(v) and dotted(_bare(v)) == name:
                continue  # `model = model.to(device)`, `model = nn.DataParallel(model)`: not where it is built
            if name in candidates and not (name == "self" or name in params):
                found = (node, name)
    return found


def _wrap_argument(plan: Any, key: str, param: str) -> bool:
    """`def train(model, ...)` with the optimizer inside, called as `train(model=model, ...)` from where the model
    is built: wrap it there, before the statement that holds the call, and `param` is a model. False (nothing
    planned) when a call passes anything but a name built in the caller."""
    params = plan.f.scopes[key].params
    sites = []
    for caller in sorted(plan.f.ported):
        for call in (n for n in plan.nodes(caller) if isinstance(n, cst.Call) and key in plan.f.callees(n, caller)):
            arg = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param), None)
            positional = [a.value for a in call.args if a.keyword is None and not a.star]
            if arg is None and params.index(param) < len(positional):
                arg = positional[params.index(param)]
            name = dotted(arg) if isinstance(arg, cst.Name) else ""
            stmt = plan._stmt.get(id(call))
            assign = _build(plan, caller, [name], plan.line_of(stmt))[0] if name and stmt is not None else None
            if assign is None:
                return False
            sites.append((caller, name, plan._stmt[id(assign)], stmt))
    if not sites:
        return False
    for caller, name, built, stmt in sites:
        plan._set_role(caller, name, "model")
        _place(plan, caller, name, built, stmt, None)
    plan._set_role(key, param, "model")
    return True


def _dominates(plan: Any, first: cst.CSTNode, then: cst.CSTNode) -> bool:
    """`first` runs before `then` whenever `then` runs: `then`, or a statement around it, comes later in the
    block that holds `first`."""
    if first is then:
        return True
    block = plan._block.get(id(first), (None, -1))
    return any(plan._block.get(id(s), (None, -1))[0] is block[0] and plan._block[id(s)][1] > block[1]
               for s in _chain(plan, then) if block[0] is not None)


def _exclusive(plan: Any, a: cst.CSTNode, b: cst.CSTNode) -> bool:
    """`a` and `b` sit in different branches of one if/elif/else chain, with no loop around it."""
    around_a, around_b = _chain(plan, a), _chain(plan, b)
    for n, common in enumerate(around_a[1:], 1):
        m = next((k for k, s in enumerate(around_b) if s is common), None)
        if m is None:
            continue
        if not isinstance(common, cst.If) or m == 0 or plan._block[id(around_a[n - 1])][0] is \
                plan._block[id(around_b[m - 1])][0]:
            return False
        return not any(isinstance(s, (cst.For, cst.While)) for s in around_a[n:])
    return False


def _place(plan: Any, key: str, model: str, built: cst.CSTNode, opt_stmt: cst.CSTNode,
           optimizer: cst.Call | None) -> None:
    """Wrap where the model is built when only moves of it come before its optimizer, else just before the
    optimizer (before the outermost loop around it that does not build the model: once, not every epoch). A
    second optimizer over the model in another branch of the same if/elif (`args.opt == "adam"` / `"sgd"`) wraps
    there too, a fine-tuning branch only there: DDP refuses a module with no parameter that trains. A second
    optimizer that may run after the first wrap on one path is a TODO (a module wrapped twice breaks DDP)."""
    placed = plan.wrapped.setdefault((key, model), [])
    plan.built.setdefault((key, model), built)
    around_built = _chain(plan, built)
    anchor = opt_stmt
    for stmt in _chain(plan, opt_stmt)[1:]:
        if any(stmt is b for b in around_built):
            break
        if isinstance(stmt, (cst.For, cst.While)) or optimizer is None:  # a call: wrap in the build's block
            anchor = stmt
    if any(where is anchor or _dominates(plan, where, opt_stmt) for where in placed):
        return
    anchor = _hoisted(plan, built, anchor)
    if _wraps_again(plan, key, model, built, anchor, optimizer or opt_stmt):
        if not placed:
            del plan.wrapped[(key, model)]  # left to the TODO: no `bound again` findings on top of it
        return
    line = _wrap_line(model, optimizer, opt_stmt, plan.f.code) if optimizer is not None else \
        f"{model} = ddpkit.wrap({model}, ctx)"
    plain = f"{model} = ddpkit.wrap({model}, ctx)"
    if placed and not all(_exclusive(plan, where, anchor) for where in placed) or anchor is not opt_stmt \
            and line != plain:
        plan.todo(optimizer or opt_stmt, f"this also trains `{model}`, which may be wrapped already on this path (a "
                  f"module wrapped twice breaks DDP) or only under a condition the codemod cannot place: wrap "
                  f"{model} once, with {plain}, before the optimizers that train it")
        return
    block, j = plan._block.get(id(anchor), ([], -1))
    i = next((n for n, b in enumerate(block) if b is built), -1)
    pattern = re.compile(rf"(?<![\w.]){re.escape(model)}\b")
    whole = isinstance(built, cst.SimpleStatementLine) and isinstance(built.body[0], cst.Assign) and dotted(
        built.body[0].targets[0].target) == model  # not `model, data = Net(), data.to(device)`
    if 0 <= i < j and whole and line == plain and all(
            not pattern.search(plan.f.code(s)) or _is_move(s, model) for s in block[i + 1:j]):
        plan.wrap_inline[id(built)] = model
        placed.append(built)
    else:
        plan.wrap_before.setdefault(id(anchor), []).append(line)
        placed.append(anchor)


def scope_holding(plan: Any, stmt: cst.CSTNode) -> str | None:
    """The function of the script whose body holds `stmt` (the entry point's nodes include the bodies of the
    functions a top-level script defines); None for the entry point's own code."""
    top = _chain(plan, stmt)[-1]
    for key, scope in plan.f.scopes.items():
        if key not in (ENTRY, plan.f.entry_key) and isinstance(scope.node, cst.FunctionDef) and any(
                top is s for s in statements_of(scope.node)):
            return key
    return None


def runs_again(plan: Any, key: str, seen: frozenset[str] = frozenset()) -> int | None:
    """A line of a call that may run function `key` a second time: one of several call sites, a call inside a
    loop, or the only call inside a function that itself runs again; None when it runs at most once."""
    sites = []
    for caller in sorted(plan.f.ported):
        for node in plan.nodes(caller):
            if isinstance(node, cst.Call) and key in plan.f.callees(node, caller) and id(node) in plan._stmt:
                stmt = plan._stmt[id(node)]
                if scope_holding(plan, stmt) in (None, caller) or caller == ENTRY:
                    sites.append(stmt)
    unique = list({id(s): s for s in sites}.values())
    if len(unique) > 1:
        return plan.line_of(unique[1])
    for stmt in unique:
        if any(isinstance(s, (cst.For, cst.While)) for s in _chain(plan, stmt)[1:]):
            return plan.line_of(stmt)
        outer = scope_holding(plan, stmt)
        if outer is not None and outer != key and outer not in seen:
            return runs_again(plan, outer, seen | {key})
    return None


def _fresh(plan: Any, built: cst.CSTNode, model: str) -> bool:
    """The statement builds a new module (`model = Net(cfg)`, `model = build(args)`), not one from the model it
    had (a pruned copy `narrower(model, k)`, `self.model = model`, `model.prune()`)."""
    value = assigned_value(built, model)
    last = model.split(".")[-1]
    return isinstance(value, cst.Call) and not any(isinstance(n, cst.Name) and n.value == last for n in walk(value))


def _hoisted(plan: Any, built: cst.CSTNode, anchor: cst.CSTNode) -> cst.CSTNode:
    """A model built in the entry point's code and trained by a function that runs again (`for epoch in ...:
    train(epoch)`, the optimizer made in train()): the statement of the build's block that first runs the function,
    so it is wrapped once there; else `anchor`."""
    holder = scope_holding(plan, anchor)
    if holder is None or scope_holding(plan, built) is not None or runs_again(plan, holder) is None:
        return anchor
    entry = ENTRY if plan.f.ctx_global else plan.f.entry_key
    sites = [plan._stmt[id(n)] for n in plan.nodes(entry)
             if isinstance(n, cst.Call) and holder in plan.f.callees(n, entry) and id(n) in plan._stmt
             and scope_holding(plan, plan._stmt[id(n)]) is None]
    if not sites or any(scope_holding(plan, plan._stmt[id(n)]) is not None
                        for k in plan.f.ported for n in plan.nodes(k)
                        if isinstance(n, cst.Call) and holder in plan.f.callees(n, k) and id(n) in plan._stmt):
        return anchor
    first = min(sites, key=plan.line_of)
    around = _chain(plan, built)
    for stmt in _chain(plan, first):
        block, j = plan._block.get(id(stmt), ([], -1))
        if any(a is b and i < j for a in around for i, b in enumerate(block)) and \
                all(plan.line_of(s) >= plan.line_of(stmt) for s in sites):
            return stmt
    return anchor


def _wraps_again(plan: Any, key: str, model: str, built: cst.CSTNode, anchor: cst.CSTNode,
                 node: cst.CSTNode) -> bool:
    """The wrap must run once per module, after its last change and before its first training forward. Where the
    codemod would place it in a function that runs again (every epoch, with the model built outside it) or in a
    loop that builds the model from another one each pass (pruning), it writes a TODO instead: True."""
    plain = f"{model} = ddpkit.wrap({model}, ctx)"
    holder = scope_holding(plan, anchor)
    if holder is not None and holder != scope_holding(plan, built):
        again = runs_again(plan, holder)
        if again is not None:
            plan.todo(node, f"`{model}` is built outside {holder}(), which runs again (the call at line {again}): "
                      f"a wrap here would wrap the DDP wrapper again at the second call (ddpkit.wrap refuses it); "
                      f"wrap it once with {plain} after it is built (line {plan.line_of(built)}) and before "
                      f"{holder}() first runs")
            return True
    loop = next((s for s in _chain(plan, anchor)[1:] if isinstance(s, (cst.For, cst.While))), None)
    if loop is not None and not _fresh(plan, built, model):
        plan.todo(node, f"`{model}` is built again from another module in the loop at line {plan.line_of(loop)} "
                  f"(line {plan.line_of(built)}), so a wrap here would run every pass on a model whose shape may "
                  f"differ between ranks (DDP checks the shapes are equal): make every rank build the same model, "
                  f"then wrap it once with {plain} before it trains")
        return True
    return False


def _one_line_owner(nodes: list[cst.CSTNode], node: cst.CSTNode) -> cst.CSTNode | None:
    """The compound statement whose one-line body holds `node` (`if use_gpu: model = model.cuda()`)."""
    for stmt in nodes:
        suites = [getattr(stmt, "body", None), getattr(getattr(stmt, "orelse", None), "body", None)]
        if isinstance(stmt, (cst.If, cst.For, cst.While, cst.With)) and any(
                isinstance(suite, cst.SimpleStatementSuite) and any(n is node for n in walk(suite))
                for suite in suites):
            return stmt
    return None


def check_rebound(plan: Any) -> None:
    """A wrapped model bound again where no wrap follows (`model = checkpoint["model"]` on the resume path),
    before a training loop or a call of a training function, would train unwrapped there: a TODO."""
    for (key, model), placed in plan.wrapped.items():
        nodes = list(plan.nodes(key))
        trains = [plan.line_of(n) for n in nodes if isinstance(n, cst.For) and plan.loop_role(key, n) == "train"
                  or isinstance(n, cst.Call) and set(plan.f.callees(n, key)) & plan.training_scopes]
        for node in nodes:
            if not (isinstance(node, cst.Assign) and any(dotted(t.target) == model for t in node.targets)):
                continue
            stmt = plan._stmt.get(id(node)) or _one_line_owner(nodes, node)
            if stmt is None:
                continue
            if node.value is not _bare(node.value) and dotted(_bare(node.value)) == model or any(
                    stmt is where and id(where) in plan.wrap_inline for where in placed):
                continue
            holder = scope_holding(plan, stmt)
            if holder is not None and all(scope_holding(plan, where) is None for where in placed) and not any(
                    isinstance(n, cst.Global) and any(g.name.value == model for g in n.names)
                    for n in walk(plan.f.scopes[holder].node)):
                continue  # a local of another function (`net = Net()` in a build helper that returns it)
            if not any(follows(plan, stmt, where) for where in placed) and any(
                    line > plan.line_of(stmt) for line in trains):
                plan.todo(node, f"`{model}` is bound again here and no ddpkit.wrap follows on this path, so it "
                          f"would train unwrapped (its gradients never averaged): add {model} = "
                          f"ddpkit.wrap({model}, ctx) after it, before it trains")


def check_aliases(plan: Any) -> None:
    """Another name for the model bound before its wrap (`para_model = model`, `runner = SomeDataParallel(model,
    ...)`, `self.net = model`) still holds the bare module after `model = ddpkit.wrap(model, ctx)`: a training
    forward through it bypasses DDP (no gradient is averaged, each rank trains its own copy). So does the name a
    moved model came from (`m = model.to(device)`, `m` wrapped: `model` is the same bare module). A TODO at the
    alias, where a training function calls it."""
    for (key, model), placed in plan.wrapped.items():
        first_wrap = min((plan.line_of(w) for w in placed), default=0)
        readers = [key] + [k for k in sorted(plan.f.ported) if k != key and key == ENTRY and plan.f.ctx_global]
        for node in plan.nodes(key):
            if not isinstance(node, cst.Assign):
                continue
            stmt = plan._stmt.get(id(node))
            if stmt is None:
                continue
            if _aliases(plan, key, node.value, model):
                if any(stmt is w for w in placed) or plan.line_of(stmt) >= first_wrap:
                    continue
                names = {dotted(t.target) for t in node.targets} - {model, ""}
            elif any(dotted(t.target) == model for t in node.targets) and isinstance(_bare(node.value), cst.Name) \
                    and dotted(_bare(node.value)) != model and move_receiver(node.value) is not None \
                    and plan.line_of(stmt) <= first_wrap:
                # `m = model.to(device)` (also where the wrap replaces it): a module's move returns the module itself,
                # so `model` still holds the bare module once `m` is wrapped; a training forward through it bypasses
                # DDP as through any other alias
                names = {dotted(_bare(node.value))}
            else:
                continue
            for alias in sorted(names):
                calls = [n for k in readers for n in plan.nodes(k) if isinstance(n, cst.Call) and dotted(n.func) == alias
                         and k in plan.training_scopes and (k == key or alias not in plan.f.scopes[k].params)]
                if not calls:
                    continue
                if dotted(_bare(node.value)) == alias:
                    held = (f"`{model} = {alias}.to(...)` returns `{alias}` itself, so `{alias}` still holds the bare "
                            f"module once `{model}` is wrapped (line {first_wrap})")
                else:
                    held = f"`{alias}` is bound to `{model}` before `{model} = ddpkit.wrap({model}, ctx)` (line {first_wrap})"
                plan.todo(node, f"{held} and the training step calls `{alias}(...)` (line {plan.line_of(calls[0])}): "
                          f"that forward bypasses DDP, so no gradient is averaged; bind `{alias} = {model}` after the "
                          "wrap")


def _aliases(plan: Any, key: str, value: cst.BaseExpression, model: str) -> bool:
    """`model`, `model.to(device)`, `nn.DataParallel(model)`, a parallel wrapper of another module given it
    (`BalancedDataParallel(size, model, dim=1)`)."""
    bare = _bare(value)
    if dotted(bare) == model:
        return True
    return isinstance(bare, cst.Call) and dotted(bare.func).endswith("Parallel") and any(
        dotted(a.value) == model for a in bare.args)


def _listed_module(plan: Any, optimizer: cst.Call, receiver: str) -> tuple[str, cst.CompFor] | None:
    """`[optim.Adam(net.parameters()) for net in nets]`: ('nets', the comprehension's `for`), else None."""
    stmt = plan._stmt.get(id(optimizer))
    for node in walk(stmt) if stmt is not None else ():
        if isinstance(node, cst.CompFor) and receiver in {n.value for n in walk(node.target)
                                                          if isinstance(n, cst.Name)}:
            return plan.f.code(node.iter), node
    return None


def _element_names(target: cst.BaseExpression, iterable: cst.BaseExpression, name: str) -> list[str] | None:
    """The names a loop over `name` binds to its elements: `for m in nets` -> ['m'], `for m, o in zip(nets, opts)`
    -> ['m'], `for i, m in enumerate(nets)` -> ['m']; None when it is another use of the list."""
    if isinstance(iterable, cst.Name) and iterable.value == name:
        return [target.value] if isinstance(target, cst.Name) else None
    if not (isinstance(iterable, cst.Call) and dotted(iterable.func) in _ELEMENT_ITERS):
        return None
    args = [a.value for a in iterable.args]
    if dotted(iterable.func) == "reversed" and len(args) == 1:
        return _element_names(target, args[0], name)
    positions = [i for i, a in enumerate(args) if isinstance(a, cst.Name) and a.value == name]
    if dotted(iterable.func) == "enumerate":
        positions = [1] if positions == [0] else []
    elements = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else []
    element = elements[positions[0]] if len(positions) == 1 and positions[0] < len(elements) else None
    return [element.value] if isinstance(element, cst.Name) else None


def _wrap_list(plan: Any, key: str, optimizer: cst.Call, listed: str, comp: cst.CompFor) -> str | None:
    """`nets = [Net(a), Net(b)]` (or a comprehension of calls) trained by `[Adam(n.parameters()) for n in nets]`:
    every element is wrapped before the optimizers, and the names that loops over the list bind to its elements
    are models. Any other use of the list (an index, an argument, a second binding) keeps a TODO."""
    def todo(why: str) -> None:
        plan.todo(optimizer, f"this optimizer trains each module of `{listed}` (models kept in a list), and {why}: "
                  f"wrap each one before the optimizers are made ({listed} = [ddpkit.wrap(m, ctx) for m in "
                  f"{listed}]) and read their attributes through ddpkit.unwrap(m)")

    nodes = list(plan.nodes(key))
    built = [n for n in nodes if isinstance(n, cst.Assign) and any(dotted(t.target) == listed for t in n.targets)]
    if not isinstance(comp.iter, cst.Name) or len(built) != 1 or len(built[0].targets) != 1 or not (
            isinstance(built[0].value, cst.List) and all(isinstance(e.value, cst.Call) for e in built[0].value.elements)
            or isinstance(built[0].value, cst.ListComp) and isinstance(built[0].value.elt, cst.Call)):
        todo("the codemod cannot see one place that builds them all")
        return None
    others = [k for k in plan.f.scopes if k != key and any(
        isinstance(n, cst.Name) and n.value == listed for n in walk(plan.f.scopes[k].node))]
    if others:
        todo(f"`{listed}` is also read in {others[0]}")
        return None
    allowed = {id(built[0].targets[0].target)}
    elements: set[str] = set()
    for n in nodes:
        if isinstance(n, (cst.For, cst.CompFor)):
            names = _element_names(n.target, n.iter, listed)
            if names is not None:
                elements.update(names)
                allowed |= {id(x) for x in walk(n.iter) if isinstance(x, cst.Name) and x.value == listed}
        elif isinstance(n, cst.Call) and dotted(n.func) == "len" and len(n.args) == 1:
            allowed.add(id(n.args[0].value))
    stray = next((n for n in nodes if isinstance(n, cst.Name) and n.value == listed and id(n) not in allowed), None)
    if stray is not None:
        todo(f"`{listed}` is used at line {plan.line_of(stray)} in a way the codemod does not follow (an index, "
             "an argument)")
        return None
    bound = [dotted(t.target) for n in nodes if isinstance(n, cst.Assign) for t in n.targets] + [
        x.value for n in nodes if isinstance(n, (cst.For, cst.CompFor)) and _element_names(n.target, n.iter, listed)
        is None for x in walk(n.target) if isinstance(x, cst.Name)]
    if elements & set(bound) or not elements:
        todo(f"a name that holds one of them also holds something else ({', '.join(sorted(elements & set(bound)))})"
             if elements else "no loop over the list uses its elements")
        return None
    for name in elements:
        plan._set_role(key, name, "model")
    opt_stmt = plan._stmt[id(optimizer)]
    plan.wrap_before.setdefault(id(opt_stmt), []).append(f"{listed} = [ddpkit.wrap(m, ctx) for m in {listed}]")
    return listed


def plan_autograd_grad(plan: Any) -> None:
    """`torch.autograd.grad(loss, model.parameters())`: DDP averages only the gradients backward() accumulates
    into .grad, so these stay this rank's. A gradient with respect to inputs (a gradient penalty, whose double
    backward then runs in backward()) is averaged like any other loss term."""
    for key in sorted(plan.f.ported):
        for node in plan.nodes(key):
            if not (isinstance(node, cst.Call) and dotted(node.func).endswith("autograd.grad")):
                continue
            inputs = next((a.value for a in node.args if a.keyword and a.keyword.value == "inputs"), None)
            positional = [a.value for a in node.args if a.keyword is None]
            inputs = inputs if inputs is not None else positional[1] if len(positional) > 1 else None
            if inputs is None or any(isinstance(n, cst.Name) and (n.value in ("parameters", "named_parameters")
                                                                 or plan.role(key, n.value) == "model")
                                     for n in walk(inputs)):
                plan.todo(node, "torch.autograd.grad with respect to the model's parameters: DDP averages only the "
                          "gradients backward() accumulates into .grad, so these stay this rank's; all-reduce "
                          "them (ddpkit.all_reduce_sum(ctx, g) / ctx.world_size) or use backward()")


def _plan_data_parallel(plan: Any) -> None:
    """`model = nn.DataParallel(model, device_ids=...)`: one process per device now, so the call goes and
    `model.module` becomes the model itself. A DataParallel without a positional module is a TODO."""
    for key in sorted(plan.f.ported):
        for node in plan.nodes(key):
            if not (isinstance(node, cst.Call) and _is_data_parallel(node)):
                continue
            if not node.args or node.args[0].keyword is not None or node.args[0].star:
                plan.todo(node, "nn.DataParallel without the module as its first argument: remove it by hand; "
                          "ddpkit.wrap(model, ctx) replaces it (one process per device)")
                continue
            plan.drop_parallel.add(id(node))
            stmt = plan._stmt.get(id(node))
            if isinstance(stmt, cst.SimpleStatementLine):
                plan.parallel_names.update(dotted(t.target) for s in stmt.body if isinstance(s, cst.Assign)
                                           for t in s.targets if dotted(t.target))


def assigned_value(stmt: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign) and dotted(
            stmt.body[0].targets[0].target) == name:
        return _bare(stmt.body[0].value)
    return None
