"""The DDP015 check: a training step whose forward goes around the DDP wrapper (or a trained module never
wrapped), so DDP never all-reduces those gradients and each rank trains its own copy."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ddpkit.lint.analysis import Script, terminal, without_grad
from ddpkit.lint.rules import Hit, check

__all__ = ["forward_around_wrapper"]


_UNWRAPS = frozenset({"unwrap", "unwrap_model", "de_parallel", "get_unwrapped_model", "unwrap_ddp", "module_of"})
_BACKWARDS = frozenset({"backward"})


def _wrapped_models(s: Script) -> dict[str, str]:
    """{name holding a DDP-wrapped model: name of the module it wraps ('' if the same name)}."""
    out: dict[str, str] = {}
    for key, value in s.assignments:
        if isinstance(value, ast.IfExp):  # `ddpkit.wrap(m, ctx) if fine_tune else m`: wrapped where it trains
            value = next((arm for arm in (value.body, value.orelse) if isinstance(arm, ast.Call)), value)
        if isinstance(value, ast.Call) and s.qualname(value.func).endswith("DistributedDataParallel") \
                or isinstance(value, ast.Call) and s.qualname(value.func) == "ddpkit.wrap":
            inner = value.args[0] if value.args else None
            raw = (inner.id if isinstance(inner, ast.Name) else "." + inner.attr
                   if isinstance(inner, ast.Attribute) else "")
            out[key] = "" if raw == key else raw
    return out


def _key(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else "." + node.attr if isinstance(node, ast.Attribute) else ""


def _bypass(s: Script, call: ast.Call, wrapped: dict[str, str]) -> str:
    """How `call` runs the model around its wrapper: 'model.module.encode', 'unwrap(model)...', the raw module."""
    func = call.func
    chain = []
    node = func
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call) and terminal(node.func) in _UNWRAPS and node.args \
            and _key(node.args[0]) in wrapped:
        return ast.unparse(func)
    # model.module.x(...) / model.module(...): `.module` right after a wrapped name
    node = func
    while isinstance(node, ast.Attribute):
        if node.attr == "module" and _key(node.value) in wrapped:
            return ast.unparse(func)
        node = node.value
    raw = {r for r in wrapped.values() if r} - _parameters_around(s, call)
    if _key(func) in raw or (isinstance(func, ast.Attribute) and _key(func.value) in raw):
        return ast.unparse(func)
    return ""


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
                key = _key(owner)
                if key and key not in wrapped and key not in raw:
                    found.add(key)
    return found


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
    for back in s.calls:
        if terminal(back.func) not in _BACKWARDS or without_grad(s, back, parents):
            continue
        region = back
        while id(region) in parents and not isinstance(region, (ast.For, ast.While, ast.FunctionDef,
                                                                   ast.AsyncFunctionDef, ast.Module)):
            region = parents[id(region)]
        nodes = list(ast.walk(region))
        calls = [c for c in nodes if isinstance(c, ast.Call)]
        # a forward through the wrapper, or the wrapper handed to a function that may run it: DDP is in the step
        through = any(_key(c.func) in wrapped or (isinstance(c.func, ast.Attribute) and c.func.attr == "forward"
                                                  and _key(c.func.value) in wrapped)
                      or (terminal(c.func) not in _UNWRAPS
                          and any(_key(a) in wrapped for a in (*c.args, *(k.value for k in c.keywords))))
                      for c in calls)
        unwrapped = _unwrapped_trainables(s, wrapped)
        if through and unwrapped:
            # a module the optimizer trains, run in the step beside the wrapper but never wrapped itself
            seen = next((c for c in calls if _key(c.func) in unwrapped and _feeds(c, back, nodes)), None)
            if seen is not None:
                yield Hit(seen, "DDP015", "error",
                          f"{ast.unparse(seen.func)} is trained (its parameters are in an optimizer) and runs in the "
                          f"training step into backward() (line {back.lineno}), but it was never wrapped in "
                          "DistributedDataParallel: its gradients are not all-reduced, so its copies drift apart",
                          f"wrap it too (DistributedDataParallel({ast.unparse(seen.func)}, ...)) or make it part of "
                          "the wrapped model")
            continue
        if through:
            continue
        bypasses = {id(c): _bypass(s, c, wrapped) for c in calls}
        bypasses = {i: b for i, b in bypasses.items() if b and not _NOT_FORWARD.match(b.rsplit(".", 1)[-1])}
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
            source = next(by_call[i] for i in bypasses)
        if source is None:
            continue
        yield Hit(source, "DDP015", "error",
                  f"the training step runs {bypasses[id(source)]}(...), around the DistributedDataParallel wrapper, "
                  f"and its result reaches backward() (line {back.lineno}) with no forward through the wrapper: DDP "
                  "never all-reduces these gradients, so each rank trains its own copy of the model",
                  "call the wrapped model (its forward) in the training step; to reach another method, make "
                  "forward() dispatch to it (e.g. forward(self, x, mode='encode'))")
