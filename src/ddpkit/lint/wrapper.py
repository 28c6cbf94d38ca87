"""The DDP015 check: a training step whose forward goes around the DDP wrapper (or a trained module never
wrapped), so DDP never all-reduces those gradients and each rank trains its own copy."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ddpkit.lint.analysis import Script, assigned_key, terminal, without_grad
from ddpkit.lint.ranks import own_returns
from ddpkit.lint.rules import Hit, check

__all__ = ["forward_around_wrapper"]


_UNWRAPS = frozenset({"unwrap", "unwrap_model", "de_parallel", "get_unwrapped_model", "unwrap_ddp", "module_of"})
_BACKWARDS = frozenset({"backward"})


def _wraps(s: Script, value: ast.AST) -> bool:
    return isinstance(value, ast.Call) and (s.qualname(value.func).endswith("DistributedDataParallel")
                                            or s.qualname(value.func) == "ddpkit.wrap")


def _own_wrapped(s: Script) -> dict[str, str]:
    """{name holding a DDP-wrapped model: name of the module it wraps ('' if the same name)} of this file."""
    out: dict[str, str] = {}
    for key, value in s.assignments:
        if isinstance(value, ast.IfExp):  # `ddpkit.wrap(m, ctx) if fine_tune else m`: wrapped where it trains
            value = next((arm for arm in (value.body, value.orelse) if isinstance(arm, ast.Call)), value)
        if _wraps(s, value):
            raw = assigned_key(value.args[0]) if value.args else ""
            out[key] = "" if raw == key else raw
    for key, value in s.assignments:
        # `model_without_ddp = model.module` (or `= unwrap(model)`): the name holds the wrapper's bare module
        held = value.value if isinstance(value, ast.Attribute) and value.attr == "module" else \
            value.args[0] if isinstance(value, ast.Call) and terminal(value.func) in _UNWRAPS and value.args else None
        if held is not None and assigned_key(held) in out and not out[assigned_key(held)] and key not in out and \
                not key.startswith("."):
            out[f"<module of {assigned_key(held)}>"] = key
    for n in s.nodes:
        # `DDP(model, device_ids=[rank])` as a statement: the wrapper is built and thrown away, `model` stays raw
        if isinstance(n, ast.Expr) and _wraps(s, n.value) and n.value.args and assigned_key(n.value.args[0]):
            out[f"<discarded line {n.lineno}>"] = assigned_key(n.value.args[0])
    return out


def _wrapped_models(s: Script) -> dict[str, str]:
    """{name holding a DDP-wrapped model: name of the module it wraps ('' if the same name)}, with the attributes
    a project class keeps from a constructor argument: the wrapper passed in (`Trainer(ddp_model)` and
    `self.model = model`) is wrapped; a bare module passed in before DDP rebinds its name (`trainer = Trainer(net);
    net = DDP(net)`) is raw (held under a `<captured ...>` key)."""
    out = _own_wrapped(s)
    if s.project is not None:
        passed = s.project.memo("ddp015 passed models", lambda: _passed_models(s.project))
        for key, raw in passed.get(s.path, {}).items():
            if raw == "" and key not in out:
                out[key] = ""
            elif raw and raw not in out:
                out[f"<captured {raw}>"] = raw
    return out


def _captures_before_wrap(s: Script) -> list[tuple[ast.Call, str, ast.AST]]:
    """(call, name, argument) where a bare module is handed to a call that keeps it (a constructor, `partial`)
    before `name = DDP(name)` rebinds the name in the same body: the call kept the unwrapped module."""
    found = []
    for scope in s.nodes:
        body = getattr(scope, "body", None)
        if not isinstance(body, list) or not isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for i, stmt in enumerate(body):
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and _wraps(s, stmt.value)
                    and stmt.value.args and assigned_key(stmt.value.args[0]) and assigned_key(stmt.targets[0]) ==
                    assigned_key(stmt.value.args[0])):
                continue
            name = assigned_key(stmt.targets[0])
            for before in body[:i]:
                if not (isinstance(before, ast.Assign) and isinstance(before.value, ast.Call)):
                    continue
                call = before.value
                for arg in (*call.args, *(k.value for k in call.keywords)):
                    if assigned_key(arg) == name and not isinstance(arg, ast.Starred):
                        found.append((call, name, arg))
    return found


def _passed_models(project) -> dict[str, dict[str, str]]:
    """{path: {'.attribute': '' (holds the wrapper) or '.attribute' (holds the bare module)}} of project classes
    whose `__init__` keeps a parameter (`self.model = model`), from every construction of the class in the project;
    and {path: {'<partial ...>': name}} of `partial(f, net)` made before `net = DDP(net)`."""
    classes: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for path, script in project.scripts.items():
        for n in script.nodes:
            if isinstance(n, ast.ClassDef):
                classes.setdefault(n.name, []).append((path, n))
    out: dict[str, dict[str, str]] = {}
    verdicts: dict[tuple[str, str], set[str]] = {}
    for path, script in project.scripts.items():
        own = _own_wrapped(script)
        captured = {id(arg): name for _, name, arg in _captures_before_wrap(script)}
        for call in script.calls:
            if terminal(call.func) == "partial" and call.args:
                held = [a for a in call.args[1:] if id(a) in captured]
                if held and isinstance(script.parents.get(id(call)), ast.Assign):
                    for t in script.parents[id(call)].targets:
                        if assigned_key(t):
                            out.setdefault(path, {})[assigned_key(t)] = assigned_key(t)
                continue
            found = classes.get(terminal(call.func), [])
            if len(found) != 1:
                continue
            cls_path, cls = found[0]
            init = next((d for d in cls.body if isinstance(d, ast.FunctionDef) and d.name == "__init__"), None)
            if init is None:
                continue
            params = [a.arg for a in init.args.args[1:]]
            given = {params[i]: a for i, a in enumerate(call.args[:len(params)]) if not isinstance(a, ast.Starred)}
            given.update({k.arg: k.value for k in call.keywords if k.arg})
            for param, arg in given.items():
                if id(arg) in captured:
                    verdict = "raw"
                elif assigned_key(arg) in own and not assigned_key(arg).startswith("<"):
                    verdict = "wrapped"
                else:
                    verdict = "other"
                for stmt in ast.walk(init):
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id == param:
                        for t in stmt.targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                                verdicts.setdefault((cls_path, "." + t.attr), set()).add(verdict)
    kept = {id(stmt) for cls in classes.values() for _, c in cls for d in c.body
            if isinstance(d, ast.FunctionDef) and d.name == "__init__" for stmt in ast.walk(d)}
    # an attribute also set elsewhere (`trainer.model = net` after the wrap, `self.model = DDP(self.model)` in a
    # setup method) may hold something else by the time the step runs
    set_elsewhere = {"." + t.attr for sc in project.scripts.values() for n in sc.nodes
                     if isinstance(n, (ast.Assign, ast.AnnAssign)) and id(n) not in kept
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Attribute)}
    for (path, key), seen in verdicts.items():
        elsewhere = key in set_elsewhere
        if seen == {"wrapped"}:
            out.setdefault(path, {})[key] = ""
        elif seen == {"raw"} and not elsewhere:
            out.setdefault(path, {})[key] = key
    return out


def _bypass(s: Script, call: ast.Call, wrapped: dict[str, str]) -> str:
    """How `call` runs the model around its wrapper: 'model.module.encode', 'unwrap(model)...', the raw module."""
    func = call.func
    if isinstance(func, ast.Call) and terminal(func.func) == "getattr" and len(func.args) >= 2:
        # `getattr(model.module, "forward_" + mode)(x)`: a method named at run time, of the unwrapped module
        name = func.args[1]
        if isinstance(name, ast.Constant) and isinstance(name.value, str) and _NOT_FORWARD.match(name.value):
            return ""
        owner = func.args[0]
        if isinstance(owner, ast.Attribute) and owner.attr == "module" and assigned_key(owner.value) in wrapped \
                or assigned_key(owner) in _raw_here(s, call, wrapped):
            return ast.unparse(func)
        return ""
    chain = []
    node = func
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call) and terminal(node.func) in _UNWRAPS and node.args \
            and assigned_key(node.args[0]) in wrapped:
        return ast.unparse(func)
    # model.module.x(...) / model.module(...): `.module` right after a wrapped name
    node = func
    while isinstance(node, ast.Attribute):
        if node.attr == "module" and assigned_key(node.value) in wrapped:
            return ast.unparse(func)
        node = node.value
    if isinstance(node, ast.IfExp) and _module_when_wrapped(node, wrapped):
        return ast.unparse(func)
    raw = _raw_here(s, call, wrapped)
    if assigned_key(func) in raw or (isinstance(func, ast.Attribute) and assigned_key(func.value) in raw):
        return ast.unparse(func)
    return ""


def _module_when_wrapped(choice: ast.IfExp, wrapped: dict[str, str]) -> bool:
    """`(model if n_gpus == 1 else model.module)` of a wrapped `model`: the wrapper has none of the module's methods,
    so where it is wrapped the `.module` arm runs."""
    arms = (choice.body, choice.orelse)
    return any(isinstance(arm, ast.Attribute) and arm.attr == "module" and assigned_key(arm.value) in wrapped
               and assigned_key(other) == assigned_key(arm.value) for arm, other in (arms, arms[::-1]))


def _why(key: str) -> str:
    """Why a `<...>` key of _wrapped_models holds the bare module, for the message."""
    if key.startswith("<module of "):
        return f"{key[11:-1]}.module, not the wrapper {key[11:-1]}"
    if key.startswith("<discarded line "):
        return f"given to a DistributedDataParallel built and discarded on line {key[16:-1]}"
    return "a constructor or partial() kept before DDP rebound the module's name to the wrapper"


def _local_function(call: ast.Call, functions: dict[str, str]) -> str:
    """The name in `functions` that `call` calls: `f(...)` or `self.f(...)`, else ''."""
    func = call.func
    if isinstance(func, ast.Name) and func.id in functions:
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls") \
            and func.attr in functions:
        return func.attr
    return ""


def _tainted(nodes: list[ast.AST], sources: set[int]) -> set[str]:
    """Names assigned (through other assignments, 4 steps deep) from the calls whose ids are `sources`."""
    tainted: set[str] = set()
    for _ in range(4):
        for n in nodes:
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                inside = list(ast.walk(n.value))
                if any(id(m) in sources for m in inside) or any(
                        isinstance(m, ast.Name) and m.id in tainted for m in inside):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    tainted.update(m.id for t in targets for m in ast.walk(t) if isinstance(m, ast.Name))
    return tainted


def _bypassing_functions(s: Script, wrapped: dict[str, str]) -> dict[str, str]:
    """{function or method of this file: the call around the wrapper whose result it returns} for functions that
    never forward through the wrapper themselves (`def compute_loss(self, x): return self.model.module.f(x)`)."""
    found: dict[str, str] = {}
    defs = [d for d in s.nodes if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for _ in range(2):  # a helper of a helper
        for d in defs:
            if d.name in found or d.name.startswith("__"):
                continue
            nodes = list(ast.walk(d))
            calls = [c for c in nodes if isinstance(c, ast.Call)]
            if any(assigned_key(c.func) in wrapped or any(assigned_key(a) in wrapped for a in (*c.args, *(k.value for k in c.keywords)))
                   for c in calls):
                continue
            bypasses = {id(c): b for c in calls for b in [_bypass(s, c, wrapped)]
                        if b and not _not_forward(c, b)}
            bypasses.update({id(c): found[_local_function(c, found)] for c in calls if _local_function(c, found)})
            if not bypasses:
                continue
            tainted = _tainted(nodes, set(bypasses))
            for r in own_returns(d):
                inside = list(ast.walk(r.value)) if r.value is not None else []
                hit = next((bypasses[id(m)] for m in inside if id(m) in bypasses), None)
                if hit is None and any(isinstance(m, ast.Name) and m.id in tainted for m in inside):
                    hit = next(iter(bypasses.values()))
                if hit is not None:
                    found[d.name] = hit
                    break
    return found


def _raw_here(s: Script, node: ast.AST, wrapped: dict[str, str]) -> set[str]:
    """Names that hold a wrapped module's bare module where `node` runs: the raw names of `wrapped` that are not
    parameters of an enclosing function, and the parameters every call of this file fills with a raw name
    (`train(model, ...)` beside an unused `ddp_model = DDP(model)`)."""
    raw = {r for r in wrapped.values() if r}
    found = raw - _parameters_around(s, node)
    parents = s.parents
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found |= s.project.memo(("ddp015 raw parameters", id(node)), lambda d=node: _raw_parameters(s, d, wrapped))
    return found


def _raw_parameters(s: Script, d: ast.FunctionDef | ast.AsyncFunctionDef, wrapped: dict[str, str]) -> set[str]:
    """Parameters of `d` that every call of it in this file fills with the bare module of a wrapper."""
    raw = {r for r in wrapped.values() if r}
    calls = [c for c in s.calls if _local_function(c, {d.name: ""})]
    params = [a.arg for a in d.args.args]
    if params and params[0] in ("self", "cls"):
        params = params[1:]
    found = set()
    for i, param in enumerate(params):
        given = [next((k.value for k in c.keywords if k.arg == param),
                      c.args[i] if i < len(c.args) and not any(isinstance(a, ast.Starred) for a in c.args[:i + 1])
                      else None) for c in calls]
        if given and all(g is not None and assigned_key(g) in raw and assigned_key(g) not in wrapped for g in given):
            found.add(param)
    return found


def _parameters_around(s: Script, node: ast.AST) -> set[str]:
    """Parameter names of the functions enclosing `node`: a parameter `model` is whatever the caller passes
    (often the wrapped model, `train(ddp_model, ...)`), not the raw module of the same name elsewhere."""
    names: set[str] = set()
    parents = s.parents
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            names.update(x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs))
            names.update(x.arg for x in (a.vararg, a.kwarg) if x is not None)
    return names


_NOT_FORWARD = re.compile(r"^(parameters|named_parameters|state_dict|load_state_dict|train|eval|zero_grad|to|cuda|cpu|"
                          r"half|float|double|bfloat16|apply|modules|named_modules|children|named_children|buffers|"
                          r"named_buffers|requires_grad_|register_.*|get_.*|set_.*|update.*|ema.*|reset.*|init.*|"
                          r"save.*|load.*|no_sync|step|extra_repr)$")


def _not_forward(call: ast.Call, name: str) -> bool:
    """Whether a call of the module's method `name` (dotted) is no forward: bookkeeping (`state_dict`, `train`,
    `get_input_embeddings()`); a getter fed data (`get_losses(batch)`) computes from it, so it is a forward."""
    method = name.rsplit(".", 1)[-1]
    if not _NOT_FORWARD.match(method):
        return False
    fed = any(not isinstance(a, ast.Constant) for a in (*call.args, *(k.value for k in call.keywords)))
    return not (method.startswith("get_") and fed)


_OPTIMIZERS = re.compile(r"^(SGD|Adam|AdamW|Adagrad|Adadelta|RMSprop|LAMB|Lamb|LARS|Adafactor|Lion|NAdam|RAdam|"
                         r"Adamax|ASGD|Rprop|SparseAdam|LBFGS|FusedAdam|FusedLAMB|ZeroRedundancyOptimizer)$")


def _unwrapped_trainables(s: Script, wrapped: dict[str, str]) -> set[str]:
    """Names whose `.parameters()` an optimizer gets but that no DDP call wraps (`head` beside `DDP(backbone)`)."""
    raw = set(wrapped.values())
    found: set[str] = set()
    for call in s.calls:
        if not _OPTIMIZERS.match(terminal(call.func)):
            continue
        for n in ast.walk(call):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and n.func.attr in ("parameters", "named_parameters"):
                owner = n.func.value
                if isinstance(owner, ast.Attribute) and owner.attr == "module":
                    continue  # `model.module.parameters()`: the wrapped model's own parameters
                key = assigned_key(owner)
                if key and key not in wrapped and key not in raw:
                    found.add(key)
    return found


def _rewrap(s: Script, near: ast.AST) -> ast.Call | None:
    """`d1 = DDP(d1)` a second time in the function of `near`, its module already wrapped: the copy-pasted wrap
    that was meant for another module."""
    scope, wrapped = s.context(near).scope, set()
    for call in sorted((c for c in s.calls if _wraps(s, c) and c.args and s.context(c).scope == scope),
                       key=lambda c: (c.lineno, c.col_offset)):
        if assigned_key(call.args[0]) and assigned_key(call.args[0]) in wrapped:
            return call
        wrapped.add(assigned_key(call.args[0]))
    return None


def _never_wrapped(s: Script, seen: ast.Call, back: ast.Call) -> Hit:
    """DDP015 for a trained module run in the step beside the wrapper but never wrapped: at the wrap that wraps
    another module a second time where there is one (the line to change), else at its run."""
    name = ast.unparse(seen.func)
    rewrap = _rewrap(s, seen)
    slip = "" if rewrap is None else (f" (line {rewrap.lineno} wraps {ast.unparse(rewrap.args[0])} a second time "
                                      f"instead; first run in the step at line {seen.lineno})")
    return Hit(rewrap or seen, "DDP015", "error",
               f"{name} is trained (its parameters are in an optimizer) and runs in the training step into "
               f"backward() (line {back.lineno}), but it was never wrapped in DistributedDataParallel{slip}: its "
               "gradients are not all-reduced, so its copies drift apart",
               f"wrap it too (DistributedDataParallel({name}, ...)) or make it part of the wrapped model")


def _feeds(call: ast.Call, back: ast.Call, nodes: list[ast.AST]) -> bool:
    """Whether what `call` returns reaches the value whose backward() runs (through assignments)."""
    tainted: set[str] = set()
    for _ in range(4):
        for n in nodes:
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                inside = list(ast.walk(n.value))
                if any(m is call for m in inside) or any(isinstance(m, ast.Name) and m.id in tainted for m in inside):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    tainted.update(m.id for t in targets for m in ast.walk(t) if isinstance(m, ast.Name))
    used = [m for a in (back.func, *back.args) for m in ast.walk(a)]
    return any(m is call for m in used) or any(isinstance(m, ast.Name) and m.id in tainted for m in used)


@check
def forward_around_wrapper(s: Script) -> Iterator[Hit]:
    wrapped = _wrapped_models(s)
    if not wrapped:
        return
    parents = s.parents
    helpers = _bypassing_functions(s, wrapped)
    reported: set[str] = set()  # one finding per module never wrapped, not one per backward() it reaches
    for back in s.calls:
        notes: dict[int, str] = {}
        if terminal(back.func) not in _BACKWARDS or without_grad(s, back, parents):
            continue
        region = back
        while id(region) in parents and not isinstance(region, (ast.For, ast.While, ast.FunctionDef,
                                                                   ast.AsyncFunctionDef, ast.Module)):
            region = parents[id(region)]
        nodes = list(ast.walk(region))
        calls = [c for c in nodes if isinstance(c, ast.Call)]
        # a forward through the wrapper, or the wrapper handed to a function that may run it: DDP is in the step
        through = any(assigned_key(c.func) in wrapped or (isinstance(c.func, ast.Attribute) and c.func.attr == "forward"
                                                  and assigned_key(c.func.value) in wrapped)
                      or (terminal(c.func) not in _UNWRAPS
                          and any(assigned_key(a) in wrapped for a in (*c.args, *(k.value for k in c.keywords))))
                      for c in calls)
        unwrapped = _unwrapped_trainables(s, wrapped)
        if through and unwrapped:
            # a module the optimizer trains, run in the step beside the wrapper but never wrapped itself
            seen = next((c for c in calls if assigned_key(c.func) in unwrapped and _feeds(c, back, nodes)), None)
            if seen is not None and assigned_key(seen.func) not in reported:
                reported.add(assigned_key(seen.func))
                yield _never_wrapped(s, seen, back)
            continue
        if through:
            continue
        bypasses = {id(c): _bypass(s, c, wrapped) for c in calls}
        bypasses = {id(c): b for c in calls if (b := bypasses[id(c)]) and not _not_forward(c, b)}
        for c in calls:  # `loss = self.compute_loss(x)`, whose return runs `self.model.module.encode(x)`
            helper = _local_function(c, helpers)
            if helper and id(c) not in bypasses:
                bypasses[id(c)] = ast.unparse(c.func)
                notes[id(c)] = f" (which returns what {helpers[helper]}(...) computes)"
        if not bypasses:
            continue
        # follow what the bypassing calls return into the value whose backward() runs
        tainted: set[str] = set()
        by_call = {id(c): c for c in calls}
        for _ in range(4):
            for n in nodes:
                if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
                    inside = [m for m in ast.walk(n.value)]
                    if any(id(m) in bypasses for m in inside) or any(
                            isinstance(m, ast.Name) and m.id in tainted for m in inside):
                        targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                        tainted.update(m.id for t in targets for m in ast.walk(t) if isinstance(m, ast.Name))
        used = [m for a in (back.func, *back.args) for m in ast.walk(a)]
        source = next((by_call[id(m)] for m in used if id(m) in bypasses), None)
        if source is None and any(isinstance(m, ast.Name) and m.id in tainted for m in used):
            # the bypassing call last before this backward(), not one of another branch further on
            ordered = sorted((by_call[i] for i in bypasses), key=lambda c: (c.lineno, c.col_offset))
            source = next((c for c in reversed(ordered) if c.lineno <= back.lineno), ordered[0])
        if source is None:
            continue
        raw = bypasses[id(source)]
        note = notes.get(id(source)) or next(
            (f" ({r if k.startswith('<module of ') else raw} holds the module {_why(k)})" for k, r in wrapped.items() if r and k.startswith("<")
             and (raw == r or raw.startswith(r + ".") or r.startswith(".") and (raw.endswith(r) or r + "." in raw))),
            "")
        yield Hit(source, "DDP015", "error",
                  f"the training step runs {raw}(...){note}, around the DistributedDataParallel wrapper, "
                  f"and its result reaches backward() (line {back.lineno}) with no forward through the wrapper: DDP "
                  "never all-reduces these gradients, so each rank trains its own copy of the model",
                  "call the wrapped model (its forward) in the training step; to reach another method, make "
                  "forward() dispatch to it (e.g. forward(self, x, mode='encode'))")
