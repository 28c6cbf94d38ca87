"""Which lists an evaluation loop fills over its shard `ddpkit port` joins across ranks, and why it leaves others.

`ddpkit.eval_loader` gives each rank a contiguous, unpadded slice of the evaluation set, so a list a loop over it
fills (`preds.extend(out.argmax(1).tolist())`, `losses.append(loss.item())`, `acc = torch.cat([acc, out])`) and
joined in rank order is the single-process list (per-sample entries), or covers the whole set once (per-batch
entries). Where the port can follow the list from where it starts empty to its uses after the loop, it joins it
right after the loop (`xs = ddpkit.gather_list(ctx, xs)`, a collective every rank reaches); anywhere it cannot,
the TODO says what stops it.
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpkit.port.facts import CONCAT, accumulated, dotted, loader_expr, walk
from ddpkit.port.ranks import agreed, tests_around

__all__ = ["plan_gathers", "gather_statement"]

_FROM_DATA = frozenset({"torch.tensor", "torch.Tensor", "torch.FloatTensor", "torch.LongTensor", "np.array",
                        "numpy.array"})
_BY_SHAPE = frozenset({"torch.empty", "torch.zeros", "np.empty", "numpy.empty", "np.zeros", "numpy.zeros"})
_NO_ORDER = "which has no order to join in"
_UNORDERED = {"dict": "a dict", "set": "a set", "defaultdict": "a dict", "collections.defaultdict": "a dict",
              "OrderedDict": "a dict", "collections.OrderedDict": "a dict", "Counter": "a dict",
              "collections.Counter": "a dict"}


def gather_statement(name: str) -> str:
    """The line after the loop that joins `name` across ranks (a collective: every rank runs it)."""
    return f"{name} = ddpkit.gather_list(ctx, {name})  # every rank's entries, joined in rank order\n"


def plan_gathers(plan: Any) -> None:
    """For each value ddpkit.port.sums found collected over an evaluation loader and used after the loop
    (`plan.collected`): join it right after the loop, or leave a TODO that says what stops the port."""
    for key, node, name, loop, both, todo in plan.collected:
        blocker = _plan_gather(plan, key, node, name, loop, both)
        if blocker is None:
            continue
        if not blocker:
            plan.todo(node, todo)
            continue
        what = accumulated(node)[1]
        join = f"`{name} = ddpkit.gather_list(ctx, {name})`" if name.isidentifier() and not blocker.endswith(
            _NO_ORDER) else "ddpkit.gather_list on a list of its entries"
        plan.todo(node, f"`{name}` {what} over this rank's shard of the data only, and is used after the loop; the "
                  f"port does not join it across ranks: {blocker}. Where that is resolved, join it after the loop, "
                  f"on every rank ({join}), or reduce sums and counts instead (ddpkit.all_reduce_sum)")


def _plan_gather(plan: Any, key: str, node: cst.CSTNode, name: str, loop: cst.For, both: bool) -> str | None:
    """Join `name`, collected at `node` in `loop` (a loop over an evaluation loader) and used after it, across
    ranks right after the loop: None when scheduled, else why not. '' where `name` holds no collection the port
    could join (a sum started elsewhere, `total += x`): the caller's TODO stays as it was. `both`: the loop is in
    a function the script runs over its training loader too."""
    start = _start(plan, key, loop, name)
    made = start[1] if isinstance(start, tuple) else None
    if isinstance(node, cst.AugAssign) and made != "list":  # `ids |= set(...)` names its set; `total += x`, as before
        return start if isinstance(start, str) and start.endswith(_NO_ORDER) else ""
    if "[" in name:
        return f"`{name}` is an entry of a dict (or a list of lists), which the port does not join"
    if "." in name:
        return f"`{name}` is an attribute, which other code may fill or read too"
    if both:
        return ("the same loop also runs over the training loader, whose padded shards would put duplicates in "
                "the joined list")
    if id(loader_expr(loop.iter)) not in plan.loaders and plan.role(key, dotted(loader_expr(loop.iter))) != "eval":
        return "the loop draws its batches itself (`next(...)`), so it may not go through the whole shard"
    dropped = _drops_last(plan)
    if dropped is not None:
        return (f"the script's evaluation DataLoader drops its last batch (line {dropped}), which "
                "ddpkit.eval_loader keeps: the joined list would not be the script's")
    if isinstance(start, str):
        return start
    why = (_loop_blocker(plan, key, loop, name, start[1]) or _reach_blocker(plan, key, loop)
           or _after_blocker(plan, key, loop, name))
    if why:
        return why
    plan.gather_after.setdefault(id(loop), []).append(name)
    touched = [n for n in plan.nodes(key) if (accumulated(n) or ("", ""))[0] == name]
    inside = [n for n in touched if any(x is n for x in walk(loop.body))]
    plan.gathered.update(id(n) for n in inside)
    plan.flagged.update(id(n) for n in inside)
    if len(inside) == len(touched):  # every value it holds is joined: as the same on every rank as a reduced sum
        plan.reduced.setdefault(key, set()).add(name)
    return None


def _empty(value: cst.BaseExpression) -> str | None:
    """'list' for `[]`, `list()`; 'tensor' for `torch.tensor([])`, `torch.Tensor()`, `torch.empty(0)`,
    `np.zeros((0, 3))`; the kind of an unordered container (`{}`, `set()`); None for anything else."""
    if isinstance(value, (cst.List, cst.Dict)) and not value.elements:
        return "list" if isinstance(value, cst.List) else "a dict"
    if not isinstance(value, cst.Call):
        return None
    func = dotted(value.func)
    if func in _UNORDERED:
        return _UNORDERED[func]
    if func == "list" and not value.args:
        return "list"
    first = value.args[0].value if value.args and value.args[0].keyword is None else None
    if func in _FROM_DATA:  # `torch.tensor([])`, `np.array([])`; `torch.Tensor()` without data
        if first is None and not value.args and func.startswith("torch.") and func != "torch.tensor":
            return "tensor"
        return "tensor" if isinstance(first, (cst.List, cst.Tuple)) and not first.elements else None
    if func in _BY_SHAPE:  # a first dimension of 0: `torch.zeros(0, 3)`, `np.empty((0, 3))`
        if isinstance(first, (cst.Tuple, cst.List)) and first.elements:
            first = first.elements[0].value
        return "tensor" if isinstance(first, cst.Integer) and first.value == "0" else None
    return None


def _binds(stmt: cst.CSTNode, name: str) -> cst.BaseExpression | None | bool:
    """The value a simple statement binds `name` to (`xs = []`, `ys, xs = [], []`); False where it does not bind
    it; None where it binds it some other way (`for xs in ...`, `a, xs = f()`)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    found: cst.BaseExpression | None | bool = False
    for small in stmt.body:
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
            [small.target] if isinstance(small, cst.AnnAssign) and small.value is not None else []
        for target in targets:
            if dotted(target) == name:
                found = small.value
            elif isinstance(target, (cst.Tuple, cst.List)) and any(dotted(e.value) == name for e in target.elements):
                value = small.value
                pairs = zip(target.elements, value.elements) if isinstance(value, (cst.Tuple, cst.List)) and len(
                    value.elements) == len(target.elements) else []
                found = next((v.value for t, v in pairs if dotted(t.value) == name), None)
    return found


def _mentions(node: cst.CSTNode, name: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == name for n in walk(node))


def _start(plan: Any, key: str, loop: cst.For, name: str) -> tuple[cst.CSTNode, str] | str:
    """(the statement, 'list' or 'tensor') where `name` starts empty before `loop`, on the way out of the blocks
    around it; else why the port cannot tell that each run of the loop fills a fresh list."""
    current: cst.CSTNode = loop
    while True:
        if id(current) not in plan._block:
            return f"`{name}` is not made empty in this function before the loop"
        block, index = plan._block[id(current)]
        for prev in reversed(block[:index]):
            value = _binds(prev, name)
            if value is False:
                if _mentions(prev, name):
                    return (f"`{name}` is also used between where it starts and the loop (line "
                            f"{plan.line_of(prev)})")
                continue
            if isinstance(value, cst.Name) and value.value == "None":
                return (f"`{name}` starts as None (line {plan.line_of(prev)}) and takes the first batch's value in "
                        "the loop, so a rank whose shard gives it no batch keeps None; start it empty "
                        "(`torch.tensor([])` or `[]`) so the port can join it")
            kind = _empty(value) if value is not None else None
            if kind in ("list", "tensor"):
                return prev, kind
            if kind is not None:
                return f"`{name}` is {kind}, {_NO_ORDER}"
            return (f"`{name}` does not start empty before the loop (line {plan.line_of(prev)}), so the port "
                    "cannot tell what it holds")
        parent = plan._parent.get(id(current))
        if parent is None:
            return f"`{name}` is not made empty in this function before the loop"
        if isinstance(parent, (cst.For, cst.While)):
            return (f"`{name}` starts empty outside the loop around this one (line {plan.line_of(parent)}), so "
                    "it collects over several of its runs")
        current = parent


def _loop_blocker(plan: Any, key: str, loop: cst.For, name: str, made: str) -> str:
    """Why the loop's own code keeps `name` per rank: read inside it, filled in a way that is not a join, entries
    that depend on this rank's own batch count, an early exit."""
    allowed: set[int] = set()
    values: list[cst.CSTNode] = []
    for n in walk(loop.body):
        what = accumulated(n)
        if what is None or what[0] != name:
            continue
        if isinstance(n, cst.Call):  # `xs.append(v)`, `xs.extend(v)`
            if made != "list" or len(n.args) != 1 or n.args[0].keyword is not None or n.args[0].star:
                return f"`{name}` is filled at line {plan.line_of(n)} in a way the port does not join"
            allowed.add(id(n.func.value))
            values.append(n.args[0].value)
        elif isinstance(n, cst.AugAssign):  # `xs += ys.tolist()` on a list
            if not isinstance(n.operator, cst.AddAssign):
                return f"`{name}` is changed at line {plan.line_of(n)} in a way the port does not join"
            allowed.add(id(n.target))
            values.append(n.value)
        else:  # `acc = torch.cat([acc, out])`
            joined = _joined_value(n, name)
            if joined is None or made != "tensor":
                return (f"`{name}` is joined at line {plan.line_of(n)} in a way other than appending along the first "
                        "dimension")
            allowed |= {id(n.targets[0].target), id(n.value.args[0].value.elements[0].value)}
            values.append(joined)
    reads = [n for n in walk(loop) if isinstance(n, cst.Name) and n.value == name and id(n) not in allowed]
    if reads:
        return (f"`{name}` is read inside the loop (line {plan.line_of(reads[0])}), where it holds this rank's "
                "entries only")
    position = _position_names(loop)
    position.pop(name, None)
    for value in values:
        used = sorted({n.value for n in walk(value) if isinstance(n, cst.Name)} & set(position))
        if used:
            via = f" (through `{used[0]}`)" if position[used[0]] != used[0] else ""
            return (f"its entries depend on `{position[used[0]]}`{via}, which counts or sums this rank's own "
                    "batches, not the sample's place in the dataset nor the whole set")
    for n in walk(loop.body):
        if isinstance(n, cst.Return) or isinstance(n, cst.Break) and _own_break(plan, loop, n):
            return (f"the loop may stop before the end of the shard (`{'return' if isinstance(n, cst.Return) else 'break'}`"
                    f", line {plan.line_of(n)}), at another batch on each rank")
    if loop.orelse is not None:
        return "the loop has an `else:` block, which runs before the port's join"
    return ""


def _joined_value(node: cst.Assign, name: str) -> cst.BaseExpression | None:
    """`v` of `name = torch.cat([name, v])` (or `dim=0`, `np.concatenate((name, v), axis=0)`), else None."""
    call = node.value
    if not isinstance(call, cst.Call) or dotted(call.func) not in CONCAT or not call.args:
        return None
    parts = call.args[0].value
    if call.args[0].keyword is not None or not isinstance(parts, (cst.List, cst.Tuple)) or len(parts.elements) != 2 \
            or dotted(parts.elements[0].value) != name or _mentions(parts.elements[1].value, name):
        return None
    for arg in call.args[1:]:
        if not (isinstance(arg.value, cst.Integer) and arg.value.value == "0") or (
                arg.keyword is not None and arg.keyword.value not in ("dim", "axis")):
            return None
    return parts.elements[1].value


def _own_break(plan: Any, loop: cst.For, node: cst.Break) -> bool:
    """A `break` that leaves `loop` itself, not a loop inside it."""
    parent = plan._parent.get(id(plan._stmt.get(id(node), node)))
    while parent is not None and parent is not loop:
        if isinstance(parent, (cst.For, cst.While)):
            return False
        parent = plan._parent.get(id(parent))
    return True


def _position_names(loop: cst.For) -> dict[str, str]:
    """Names whose values inside the loop are this rank's own, each with the name it comes from: the loop's
    `enumerate` index (its own count of batches), what the loop adds to (`i += 1`, `running += loss.item()`:
    running figures of its shard), and names it computes from them (`row = i * batch_size + j`)."""
    names: dict[str, str] = {}
    if isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "enumerate" and isinstance(loop.target, (
            cst.Tuple, cst.List)) and loop.target.elements:
        names.update({n.value: n.value for n in walk(loop.target.elements[0].value) if isinstance(n, cst.Name)})
    body = list(walk(loop.body))
    names.update({n.target.value: n.target.value for n in body
                  if isinstance(n, cst.AugAssign) and isinstance(n.target, cst.Name)})
    changed = True
    while changed:
        changed = False
        for n in body:
            if not isinstance(n, cst.Assign):
                continue
            origin = next((names[x.value] for x in walk(n.value) if isinstance(x, cst.Name) and x.value in names), None)
            if origin is None:
                continue
            for x in (x for t in n.targets for x in walk(t.target) if isinstance(x, cst.Name)):
                if x.value not in names:
                    names[x.value] = origin
                    changed = True
    return names


def _reach_blocker(plan: Any, key: str, loop: cst.For) -> str:
    """Why some ranks may not reach the join after `loop`, or reach it another number of times: a line the port
    runs on rank 0 alone around it, a branch on a value that may differ between ranks, or another loop over an
    evaluation shard, there or around a call of this function."""
    seen: set[str] = set()
    todo: list[tuple[str, cst.CSTNode]] = [(key, loop)]
    while todo:
        scope, node = todo.pop()
        stmt = plan._stmt.get(id(node), node)
        if id(stmt) in plan.guard or plan.guarded_above(stmt):
            return f"line {plan.line_of(stmt)} runs on rank 0 alone, and a collective must run on every rank"
        outer = plan._parent.get(id(stmt))
        while outer is not None:  # evaluation shards differ by a batch: a collective inside their loops waits forever
            if isinstance(outer, cst.For) and plan.loop_role(scope, outer) == "eval":
                return (f"it sits inside another loop over an evaluation loader (line {plan.line_of(outer)}), which "
                        "runs one batch fewer on some ranks")
            outer = plan._parent.get(id(outer))
        for test in tests_around(plan, stmt):
            if not agreed(plan, scope, test):
                return (f"`{plan.f.code(test)}` (line {plan.line_of(test)}) may differ between ranks, and a "
                        "collective must run on every rank")
        if scope in seen or scope == plan.f.entry_key or len(seen) > 20:
            continue
        seen.add(scope)
        for caller in sorted(plan.f.ported):
            todo.extend((caller, c) for c in plan.nodes(caller)
                        if isinstance(c, cst.Call) and scope in plan.f.callees(c, caller))
    return ""


def _after_blocker(plan: Any, key: str, loop: cst.For, name: str) -> str:
    """Why the joined list would be wrong where it is used: filled again after the loop (before it starts anew),
    or combined with this rank's own count of batches (`sum(losses) / (i + 1)`) that the port does not reduce."""
    end = plan.end_of(loop)
    starts = [plan.line_of(n) for n in plan.nodes(key) if isinstance(n, cst.SimpleStatementLine)
              and plan.line_of(n) > end and _binds(n, name) is not False]
    until = min(starts, default=float("inf"))
    position = set(_position_names(loop)) - plan.reduced.get(key, set()) - {name}
    for n in plan.nodes(key):
        what = accumulated(n)
        if what is not None and what[0] == name and end < plan.line_of(n) < until:
            return f"`{name}` is filled again after the loop (line {plan.line_of(n)})"
        if not (isinstance(n, cst.Name) and n.value == name and end < plan.line_of(n) < until):
            continue
        stmt = plan._stmt.get(id(n), n)
        used = sorted(p for op in walk(_header(stmt)) if isinstance(op, cst.BinaryOperation)  # `sum(xs) / (i + 1)`
                      for one, other in ((op.left, op.right), (op.right, op.left)) if _mentions(one, name)
                      for p in {x.value for x in walk(other) if isinstance(x, cst.Name)} & position)
        if used:
            return (f"line {plan.line_of(n)} reads it with `{used[0]}`, this rank's own count or sum (once "
                    f"joined, len({name}) counts every rank's entries)")
    return ""


def _header(stmt: cst.CSTNode) -> cst.CSTNode:
    """What a statement evaluates itself: a simple line whole, a compound statement's test, iterable or items."""
    if isinstance(stmt, (cst.If, cst.While)):
        return stmt.test
    if isinstance(stmt, cst.For):
        return stmt.iter
    if isinstance(stmt, cst.With):
        return cst.Tuple([cst.Element(item.item) for item in stmt.items])
    return stmt


def _drops_last(plan: Any) -> int | None:
    """The line of an evaluation DataLoader given a `drop_last` other than False (ddpkit.eval_loader keeps every
    sample), else None."""
    for key in sorted(plan.f.ported):
        for node in plan.nodes(key):
            if isinstance(node, cst.Call) and plan.loaders.get(id(node)) == "eval":
                options = {**plan.spread.get(id(node), {}),
                           **{a.keyword.value: a.value for a in node.args if a.keyword is not None}}
                value = options.get("drop_last")
                if value is not None and not (isinstance(value, cst.Name) and value.value == "False"):
                    return plan.line_of(node)
    return None
