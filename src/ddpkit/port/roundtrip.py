"""A model the script moves to the CPU and back (to save, sample or export on the host): the move back stays.

`ddpkit.wrap` puts the model on ctx.device, so the rewrite drops the script's own placement of it (`model.cuda()`,
`Net().to(device)`). A script that moves the model off the GPU during training (`model.cpu(); torch.save(...);
model.cuda()`, `model.eval().cpu()` ... `model.cuda().train()`, a helper that does it) moves it back with the same
call: dropped, the model would train on the CPU from there on a GPU rank. Here the moves of a model that may run
after one of its moves to the CPU are found, so the rewrite keeps them as `.to(ctx.device)`; only the placement
before any such move, in the scope that wraps the model, is dropped. The move to the CPU of a round trip moves the
wrapped module in place (`ddpkit.unwrap(model).cpu()`), without binding the name to the bare module (that binding,
right for sampling on the CPU after training, would leave training on the bare module after the move back).
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted
from ddpkit.port.models import move_receiver, moves_to_cpu

__all__ = ["plan_round_trips"]


def _cpu_model(plan: Any, key: str, call: cst.CSTNode) -> str:
    """`model.cpu()`, `model.eval().cpu()`, `model.to("cpu")` of a model of the scope: the model's name, else ''."""
    if not moves_to_cpu(call):
        return ""
    receiver = call.func.value
    while isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) and not receiver.args \
            and receiver.func.attr.value in ("eval", "train", "float", "half", "double"):
        receiver = receiver.func.value  # `model.eval().cpu()`: these return the module itself
    name = dotted(receiver)
    return name if name and plan.role(key, name) == "model" else ""


def _device_move(plan: Any, key: str, call: cst.CSTNode) -> str:
    """`model.cuda()`, `model.to(device)` of a model of the scope (not to the CPU): the model's name, else ''."""
    receiver = move_receiver(call)
    if receiver is None or moves_to_cpu(call):
        return ""
    name = dotted(receiver)
    return name if name and plan.role(key, name) == "model" else ""


def _loops(plan: Any, stmt: cst.CSTNode) -> list[int]:
    """ids of the loops around a statement (innermost first)."""
    out, node = [], plan._parent.get(id(stmt))
    while node is not None:
        if isinstance(node, (cst.For, cst.While)):
            out.append(id(node))
        node = plan._parent.get(id(node))
    return out


def _ends(stmt: cst.CSTNode) -> bool:
    """`return`, `raise`, `sys.exit(...)`: a statement after which the rest of the block never runs."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return any(isinstance(s, (cst.Return, cst.Raise)) or isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)
               and dotted(s.value.func) in ("sys.exit", "exit", "quit", "os._exit") for s in stmt.body)


def _shares_path(plan: Any, stmt: cst.CSTNode, wraps: list[cst.CSTNode]) -> bool:
    """Whether a wrap of the model runs on the path that runs `stmt`: walking out of the blocks around it, a block
    that holds a wrap is reached before one that ends (`return`) after `stmt` without one."""
    if not _same_function(plan, stmt, wraps):
        return True  # the wrap is in another function: which calls run first is not this rule's to follow
    inside = {id(n) for w in wraps for n in _chain(plan, w)}
    node: cst.CSTNode | None = stmt
    while node is not None:
        block, i = plan._block.get(id(node), ([], 0))
        if any(id(s) in inside for s in block if s is not node):
            return True
        if any(_ends(s) for s in block[i + 1:]):
            return False
        node = plan._parent.get(id(node))
    return False


_DEVICE_FREE = frozenset({"load_state_dict", "train", "eval", "parameters", "named_parameters", "state_dict", "modules",
                          "children", "named_modules", "named_children", "apply", "requires_grad_", "zero_grad"})
"""Methods of a module that work wherever its parameters are (no input meets them)."""


def _used_before_wrap(plan: Any, key: str, name: str, stmt: cst.CSTNode, wraps: list[cst.CSTNode]) -> bool:
    """Whether the model runs, or is handed to a call, between its move and its wrap (`print(evaluate(model,
    test_loader))` before the optimizer): there it must already be on ctx.device."""
    start, end = plan.line_of(stmt), min(plan.line_of(w) for w in wraps)
    for node in plan.nodes(key):
        if not isinstance(node, cst.Call) or id(node) not in plan._stmt:
            continue
        if not start < plan.line_of(plan._stmt[id(node)]) < end:
            continue
        func = dotted(node.func)
        if func == name or any(dotted(a.value) == name for a in node.args) and func not in ("print", "len", "str"):
            return True
        if func.startswith(name + ".") and func.count(".") == name.count(".") + 1 and \
                func.rsplit(".", 1)[-1] not in _DEVICE_FREE:
            return True
    return False


def _called_unwrapped(plan: Any, helper: str) -> bool:
    """A function of the script called where its caller's wrap has not run (before it, or on a path that leaves
    before it: `if args.test: test(model); return`): the model it gets there was placed by its own moves only."""
    for key in plan.f.ported:
        wraps = [w for (k, _), placed in plan.wrapped.items() if k == key for w in placed]
        if not wraps:
            continue
        first = min(plan.line_of(w) for w in wraps)
        for node in plan.nodes(key):
            if isinstance(node, cst.Call) and helper in plan.f.callees(node, key) and id(node) in plan._stmt:
                stmt = plan._stmt[id(node)]
                if not _shares_path(plan, stmt, wraps) or (
                        plan.line_of(stmt) < first and _same_function(plan, stmt, wraps)):
                    return True
    return False


def _same_function(plan: Any, stmt: cst.CSTNode, wraps: list[cst.CSTNode]) -> bool:
    """A wrap sits in one of the blocks around `stmt` (the same function's code)."""
    inside = {id(n) for w in wraps for n in _chain(plan, w)}
    return any(id(s) in inside for n in _chain(plan, stmt) for s in plan._block.get(id(n), ([], 0))[0])


def _chain(plan: Any, stmt: cst.CSTNode) -> list[cst.CSTNode]:
    out, node = [], stmt
    while node is not None:
        out.append(node)
        node = plan._parent.get(id(node))
    return out


def plan_round_trips(plan: Any) -> None:
    """Fill plan.move_back (ids of a model's device moves the rewrite keeps, as `.to(ctx.device)`) and
    plan.round_trip (ids of `model.cpu()` statements whose model comes back: no rebinding to the bare module)."""
    f = plan.f
    cpu: dict[str, list[tuple[cst.CSTNode, str]]] = {}  # scope -> (statement, model) moved to the CPU there
    moves: dict[str, list[tuple[cst.Call, cst.CSTNode, str]]] = {}  # scope -> (call, statement, model)
    for key in sorted(f.ported):
        for node in plan.nodes(key):
            if not isinstance(node, cst.Call):
                continue
            stmt = plan._stmt.get(id(node))
            if stmt is None:
                continue
            if name := _cpu_model(plan, key, node):
                cpu.setdefault(key, []).append((stmt, name))
            elif name := _device_move(plan, key, node):
                moves.setdefault(key, []).append((node, stmt, name))
    for key, found in moves.items():
        for call, stmt, name in found:
            wraps = [w for w in plan.wrapped.get((key, name), [])]
            if wraps and not _shares_path(plan, stmt, wraps):
                plan.move_back.add(id(call))  # a path that leaves before the wrap (`if args.test: ...; return`)
            elif wraps and _used_before_wrap(plan, key, name, stmt, wraps):
                plan.move_back.add(id(call))  # `evaluate(model, loader)` before the wrap: on ctx.device there too
            elif not wraps and _called_unwrapped(plan, key):
                plan.move_back.add(id(call))  # `def test(model): model.cuda()` also run where no wrap placed it
    if not cpu:
        return  # the model never leaves the device: every move of it is the placement ddpkit.wrap does
    movers = set(cpu)
    while True:  # scopes that move a model to the CPU themselves or through a function they call
        more = {k for k in f.ported - movers if f.scopes[k].calls & movers}
        if not more:
            break
        movers |= more
    for key, found in moves.items():
        events = [(s, n) for s, n in cpu.get(key, [])]
        events += [(plan._stmt[id(c)], "") for c in plan.nodes(key) if isinstance(c, cst.Call) and id(c) in plan._stmt
                   and set(f.callees(c, key)) & movers]
        for call, stmt, name in found:
            line, loops = plan.line_of(stmt), set(_loops(plan, stmt))
            after = [s for s, n in events if n in (name, "") and (
                plan.line_of(s) < line or loops & set(_loops(plan, s)))]
            if after:
                plan.move_back.add(id(call))  # it may run after the model went to the CPU: it brings it back
    for key, found in cpu.items():
        for stmt, name in found:
            line, loops = plan.line_of(stmt), set(_loops(plan, stmt))
            back = [s for c, s, n in moves.get(key, []) if n == name and id(c) in plan.move_back and (
                plan.line_of(s) > line or loops & set(_loops(plan, s)))]
            if back:
                plan.round_trip.add(id(stmt))
                _window_forwards(plan, key, stmt, back, name)


def _window_forwards(plan: Any, key: str, cpu_stmt: cst.CSTNode, back: list[cst.CSTNode], name: str) -> None:
    """A forward of the wrapped model while it sits on the CPU (between the move away and the first move back,
    in the same block): DDP's forward moves its inputs to its GPU, where the parameters no longer are."""
    end = min((plan.line_of(s) for s in back if plan.line_of(s) > plan.line_of(cpu_stmt)), default=None)
    if end is None:
        return
    for node in plan.nodes(key):
        if isinstance(node, cst.Call) and dotted(node.func) == name and id(node) not in plan.unwrap_calls:
            stmt = plan._stmt.get(id(node))
            if stmt is not None and plan.line_of(cpu_stmt) <= plan.line_of(stmt) <= end and stmt is not cpu_stmt:
                plan.todo(stmt, f"`{name}` is on the CPU here (moved at line {plan.line_of(cpu_stmt)}, back at line "
                          f"{end}), and a forward of its DDP wrapper moves the inputs to the rank's GPU: call "
                          f"`ddpkit.unwrap({name})(...)` on CPU inputs here")
                return
