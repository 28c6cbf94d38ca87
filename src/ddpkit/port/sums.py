"""Which per-rank sums `ddpkit port` reduces across ranks, and which shard-only values it must leave as TODOs.

A value accumulated in a loop over a ported loader holds this rank's shard only. A sum started at
zero beside the loop is reduced after it (`name = ddpkit.all_reduce_sum(ctx, name)`, keeping the
value's type); a list an evaluation loop fills is left to ddpkit.port.gathers (joined after the loop, or named);
anything else accumulated there and read after the loop (lists over a training loader, dict entries, attributes,
sums started elsewhere) gets a TODO naming it, because no single rewrite is safe for it.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import ARGS_ROOTS, accumulated, bound, dotted, root_name, walk
from ddpkit.port.ranks import agreed


__all__ = ["plan_reductions", "reduce_statement", "plan_shard_figures"]

_COUNTER = re.compile(r"(^|_)(step|steps|iter|iters|iteration|epoch|it|i|batch_idx|n_iter)$")
_THROUGHPUT = re.compile(r"per_s(ec)?$|throughput|(^|_)(tps|ips|sps)$|tok(en)?s?_?(per_?)?s(ec)?$|samples_?(per_?)?s(ec)?$",
                         re.I)
_REPORT = re.compile(r"\bprint\(|print0\(|\.(info|debug|warning|log|write|set_postfix|set_description|add_scalars?)\(|"
                     r"\blog\(")
_COUNTS = re.compile(r"\.sum\(|size\(|\blen\(|shape\[0\]|numel\(|num_graphs|\.eq\(")
_TENSOR_USE = r"\b{}\.(item|float|double|long|cpu|numpy|to|detach|tolist)\("


def _number_kind(expr: cst.BaseExpression) -> str | None:
    """What a Python number added to a sum is: "int" (`1`, `len(x)`, `x.size(0)`, `x.shape[0]`, `x.numel()`,
    `int(...)`, and their sums and products), "float" (`0.5`, `float(...)`, any quotient), "number" (`.item()`, a
    tensor's value: int or float, known at run time), None where it is not surely a Python number (a numpy value,
    a tensor). `loss.item() * x.size(0)` is a number, not an int: the product takes the loss's type."""
    if isinstance(expr, cst.Integer):
        return "int"
    if isinstance(expr, cst.Float):
        return "float"
    if isinstance(expr, cst.UnaryOperation):
        return _number_kind(expr.expression)
    if isinstance(expr, cst.BinaryOperation):
        left, right = _number_kind(expr.left), _number_kind(expr.right)
        if left is None or right is None:
            return None
        if isinstance(expr.operator, cst.Divide):
            return "float"
        if not isinstance(expr.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)):
            return None
        return "int" if left == right == "int" else "float" if "float" in (left, right) else "number"
    if isinstance(expr, cst.Call):
        name = dotted(expr.func)
        if name in ("int", "len"):
            return "int"
        if name == "float":
            return "float"
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "item" and not expr.args:
            return "number"
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("size", "numel") \
                and len(expr.args) <= 1:
            return "int"
        return None
    if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Attribute) and expr.value.attr.value == "shape":
        return "int"
    return None


def _counter(name: str, added: list[str]) -> bool:
    """`step += 1`, `global_step += args.accum`: a count of steps, the same on every rank. A name that merely ends
    like one (`loss_epoch += loss.item()`) but adds values computed from the batch is a sum of this rank's shard."""
    return bool(_COUNTER.search(name)) and not any("(" in text for text in added)


def _zero(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Integer) and node.value == "0":
        return "int"
    if isinstance(node, cst.Float) and float(node.value) == 0.0:
        return "float"
    if isinstance(node, cst.Call) and dotted(node.func) in ("torch.zeros", "torch.tensor", "torch.zeros_like"):
        return "tensor"
    return None


MEAN = "/mean"


def reduce_statement(name: str, kind: str) -> str:
    """The line that sums `name` over ranks, keeping its type: a Python number stays one, a tensor a tensor.

    A kind ending in `/mean` is a sum of per-step values (a loss's batch means) that nothing divides later by a
    count: each rank ran as many steps as the script did, on smaller batches, so the figure on the original's
    scale is the mean over ranks of the per-rank sums, not their total (a float, even from integers)."""
    if kind.startswith("="):  # recomputed from reduced parts: `meter.avg = meter.sum / meter.count`
        return f"{name} = {kind[1:]}  # from the sums over every rank\n"
    mean = kind.endswith(MEAN)
    kind = kind.removesuffix(MEAN)
    total = f"(ddpkit.all_reduce_sum(ctx, {name}) / ctx.world_size)" if mean else f"ddpkit.all_reduce_sum(ctx, {name})"
    number = "float" if mean else f"type({name})"  # how a Python number is rebuilt: the type it had, for a sum
    if kind == "int":
        expr = f"{'float' if mean else 'int'}({total}.item())"
    elif kind == "float":
        expr = f"{total}.item()"
    elif kind == "tensor":  # started as a tensor: stays one, in its own dtype
        expr = f"{total}.to({name}.dtype)"
    elif kind == "number":  # `.item()` of an int or a float tensor: a float on any rank makes the sum one
        # (a rank that saw no batch still holds the int 0 it started from; its own type would cut the total)
        expr = f"float({total}.item())" if mean else f"ddpkit.collectives.all_reduce_number(ctx, {name})"
    else:  # its type is decided at run time (a tensor from `.sum()`, or a number): keep whichever it is
        # a torch tensor keeps its dtype; a numpy scalar (which has a dtype torch cannot take) keeps its type
        # (and a Python number one whose sum is a float where any rank's is: see `number` above)
        plain = f"{number}({total}.item())" if mean else \
            f"ddpkit.collectives.all_reduce_number(ctx, {name}) if isinstance({name}, (int, float)) else {number}({total}.item())"
        expr = f"{total}.to({name}.dtype) if hasattr({name}, \"requires_grad\") else {plain}"
    comment = "mean over ranks of each rank's sum of per-step values" if mean else "sum over every rank's shard"
    return f"{name} = {expr}  # {comment}\n"


def plan_reductions(plan: Any, key: str, block: list[cst.BaseStatement]) -> None:
    """Schedule a reduction after each loop over a loader that sums into a name started at zero beside it,
    and a TODO for every other shard-only value the loop accumulates and the code reads afterwards."""
    tracked: dict[str, str] = {}
    for stmt in block:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                tracked.update(_zero_names(small))
        elif not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            loops = [n for n in walk(stmt) if isinstance(n, cst.For) and plan.loop_role(key, n)]
            if loops:
                _plan_loop(plan, key, block, stmt, loops, tracked)
        for inner in plan.blocks_of(stmt) if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else ():
            plan_reductions(plan, key, inner)


def _plan_loop(plan: Any, key: str, block: list[cst.BaseStatement], stmt: cst.CSTNode, loops: list[cst.For],
               tracked: dict[str, str]) -> None:
    end = plan.end_of(stmt)
    inside = [n for loop in loops for n in walk(loop.body)]
    # `acc = torch.cat([acc, out])` fills `acc`, which starts beside the loop: not a name the loop starts anew
    assigned_inside = {dotted(t.target) for n in inside if isinstance(n, cst.Assign) and accumulated(n) is None
                       and not _first_batch_start(plan, n) for t in n.targets}
    assigned_inside |= {dotted(n.target) for n in inside if isinstance(n, cst.For)}
    loop_vars = {dotted(n) for loop in loops for n in walk(loop.target) if isinstance(n, cst.Name)}
    summed = [n for n in inside if isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.AddAssign)]
    scope_text = "".join(plan.f.code(s) for s in block)
    handled: set[str] = set()
    for name in dict.fromkeys(dotted(n.target) for n in summed if dotted(n.target) in tracked):
        kind = tracked.pop(name)
        handled.add(name)
        plan.flagged.update(id(n) for n in summed if dotted(n.target) == name)
        place: cst.CSTNode | None = stmt
        if name not in assigned_inside and not _read_after(plan, key, name, end):
            place = _inner_place(plan, stmt, loops, name)  # `with tqdm(...) as bar: for ...` then read in the with
            if place is None or not _read_after(plan, key, name, plan.end_of(place)):
                continue
        if name in assigned_inside:
            continue  # a running value reset inside the loop, or nothing uses the sum
        texts = [plan.f.code(n.value) for n in summed if dotted(n.target) == name]
        constant = all(isinstance(n.value, (cst.Integer, cst.Float)) and not _conditional(plan, n, loops)
                       for n in summed if dotted(n.target) == name)
        if (_counter(name, texts) or constant) and not _divides(plan, key, name, end):
            continue  # `step += 1`: a step counter, the same on every rank (unless it counts batches for a mean)
        if kind != "tensor" and re.search(_TENSOR_USE.format(re.escape(name)), scope_text):
            kind = "any"
        elif kind != "tensor" and all(kinds := [_number_kind(n.value) for n in summed if dotted(n.target) == name]):
            kind = "float" if kind == "float" else "int" if set(kinds) == {"int"} else "number"
        elif kind != "tensor":
            kind = "any"
        if _step_losses(plan, key, inside, [n.value for n in summed if dotted(n.target) == name]) \
                and not _divided(plan, key, name, end):
            kind += MEAN  # `epoch_loss += loss.item()` reported as it is: its scale is the original's per rank
        plan.reduce_after.setdefault(id(place), []).append((name, kind))
        plan.reduced.setdefault(key, set()).add(name)
    for node in inside:  # tokens/s from this rank's batch: every rank processes as many
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and _THROUGHPUT.search(
                dotted(node.targets[0].target)) and any(dotted(n) in loop_vars for n in walk(node.value)):
            plan.scale_world.add(id(node))
    _reported_inside(plan, key, loops, inside)
    _last_step_reported(plan, key, block, stmt, loops)
    assigned_here = {dotted(t.target) for n in walk(stmt) if isinstance(n, cst.Assign) for t in n.targets}
    for node in inside:
        target = accumulated(node)
        if target is None or id(node) in plan.flagged:
            continue
        name, what = target
        root = name.split(".")[0].split("[")[0]
        if name in handled or root in loop_vars or name in assigned_inside or root in assigned_inside \
                or (root in assigned_here and stmt not in loops):
            continue  # started inside this statement: the pass over its inner block decides
        added = [plan.f.code(node.value)] if isinstance(node, cst.AugAssign) else ["()"]
        if _counter(name, added) or (isinstance(node, cst.AugAssign) and isinstance(node.value, (cst.Integer, cst.Float))
                                     and not _divides(plan, key, name, end)):
            continue
        if not (_read_after(plan, key, root, end) or root == "self"):
            continue
        handled.add(name)
        plan.flagged.add(id(node))
        todo = (f"`{name}` {what} over this rank's shard of the data only, and is used after the loop: reduce it "
                "across ranks before it is reported (start a sum at 0 beside the loop so the port can add "
                "ddpkit.all_reduce_sum, or ddpkit.all_gather_object for lists)")
        loop = _loader_loop(plan, key, node)
        if loop is not None and plan.loop_role(key, loop) == "eval":  # ddpkit.port.gathers joins it, or says why not
            plan.collected.append((key, node, name, loop, _serves_both(plan, key, loop), todo))
            continue
        plan.todo(node, todo)


def _first_batch_start(plan: Any, node: cst.Assign) -> bool:
    """`xs = out` under `if xs is None:` in a loop that concatenates `xs` otherwise (also `ys = y` beside it, `ys`
    concatenated in the `else:`): the first batch starts the collection, which the loop then fills; not a value
    made afresh each pass."""
    stmt = plan._stmt.get(id(node))
    parent = plan._parent.get(id(stmt)) if stmt is not None else None
    if not (isinstance(parent, cst.If) and len(node.targets) == 1 and any(s is stmt for s in parent.body.body)):
        return False
    test, name = parent.test, dotted(node.targets[0].target)
    joined = isinstance(parent.orelse, cst.Else) and any(
        (accumulated(n) or ("", ""))[0] == name for n in walk(parent.orelse.body))  # `t_outputs_all` beside it
    return name != "" and isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and isinstance(
        test.comparisons[0].operator, cst.Is) and dotted(test.comparisons[0].comparator) == "None" and (
        dotted(test.left) == name or joined)


def _loader_loop(plan: Any, key: str, node: cst.CSTNode) -> cst.For | None:
    """The innermost loop over a ported loader around `node`."""
    parent = plan._parent.get(id(plan._stmt.get(id(node), node)))
    while parent is not None:
        if isinstance(parent, cst.For) and plan.loop_role(key, parent):
            return parent
        parent = plan._parent.get(id(parent))
    return None


def _backed(nodes: list[cst.CSTNode]) -> set[str]:
    """Names `nodes` call `.backward()` on (also `scaler.scale(loss).backward()`)."""
    out = set()
    for n in nodes:
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward":
            target = n.func.value
            if isinstance(target, cst.Call) and target.args:  # scaler.scale(loss).backward()
                target = target.args[0].value
            if isinstance(target, cst.Name):
                out.add(target.value)
    return out


def _step_losses(plan: Any, key: str, inside: list[cst.CSTNode], added: list[cst.BaseExpression]) -> bool:
    """Every value added is a training loss of the step (`loss.item()`, `float(loss)`, `loss.detach()`): a name on
    which the loop calls `.backward()`, or one a function of the script returns after calling `.backward()` on
    it (`loss, out = train_step(model, x, y)`), and the port does not scale it as a sum over the batch: each a
    mean over its batch. Anything else (a count from a helper, a product with the batch size) may be a sum over
    samples: not this."""
    if any(isinstance(n, cst.Call) and id(n) in plan.scale_backward for n in inside):
        return False  # a loss summed over the batch: its per-step values add up over ranks
    backed = _backed(inside)
    for n in inside:  # `loss, out = step(...)` where step() runs loss.backward() and returns it there
        if not (isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.value, cst.Call)):
            continue
        for callee in plan.f.callees(n.value, key):
            body = list(walk(plan.f.scopes[callee].node))
            inner = _backed(body)
            returned = [r.value for r in body if isinstance(r, cst.Return) and r.value is not None]
            if len(returned) != 1:
                continue
            target, value = n.targets[0].target, returned[0]
            pairs = (zip(target.elements, value.elements) if isinstance(target, cst.Tuple) and isinstance(
                value, cst.Tuple) and len(target.elements) == len(value.elements) else [])
            pairs = [(t.value, v.value) for t, v in pairs] or [(target, value)]
            backed.update(t.value for t, v in pairs if isinstance(t, cst.Name) and isinstance(v, cst.Name)
                          and v.value in inner)

    def loss_of(value: cst.BaseExpression) -> bool:
        while True:
            if isinstance(value, cst.Name):
                return value.value in backed
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and not value.args \
                    and value.func.attr.value in ("item", "detach", "cpu", "float"):
                value = value.func.value
            elif isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "float" \
                    and len(value.args) == 1:
                value = value.args[0].value
            else:
                return False
    return bool(added) and all(loss_of(v) for v in added)


def _conditional(plan: Any, node: cst.CSTNode, loops: list[cst.For]) -> bool:
    """`node` runs under an `if` inside the loop: `correct += 1` when a prediction is right counts events, unlike
    `step += 1`, which every rank runs as often."""
    parent = plan._parent.get(id(plan._stmt.get(id(node))))
    while parent is not None and not any(parent is loop for loop in loops):
        if isinstance(parent, cst.If):
            return True
        parent = plan._parent.get(id(parent))
    return False


def _inner_place(plan: Any, stmt: cst.CSTNode, loops: list[cst.For], name: str) -> cst.CSTNode | None:
    """The one loop inside `stmt` that sums `name`, when only `with` blocks lie between them: every rank that
    runs `stmt` finishes that loop, so its sum can be reduced right after it (where the code reads it)."""
    owners = [loop for loop in loops if any(isinstance(n, cst.AugAssign) and dotted(n.target) == name
                                            for n in walk(loop.body))]
    if len(owners) != 1 or owners[0] is stmt:
        return None
    node = plan._parent.get(id(owners[0]))
    while node is not None and node is not stmt:
        if not isinstance(node, cst.With):
            return None
        node = plan._parent.get(id(node))
    return owners[0] if node is stmt and isinstance(stmt, cst.With) else None


def _reported_inside(plan: Any, key: str, loops: list[cst.For], inside: list[cst.CSTNode]) -> None:
    """`running += loss.item()` ... `if i % 100 == 99: print(running / 100)`: the printed value is reduced
    where it is read (a mean of per-step values over ranks, or a sum of counts), or a TODO when ranks may not
    all reach that line."""
    sums = [n for n in inside if isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.AddAssign)
            and not isinstance(n.value, (cst.Integer, cst.Float))]
    texts: dict[str, list[str]] = {}
    for n in sums:
        texts.setdefault(plan.f.code(n.target), []).append(plan.f.code(n.value))
    for text in [t for t in texts if _not_a_number(plan, key, t, sums)]:
        del texts[text]  # `y_true += labels.tolist()`, `line += f"..."`: a list or text, no sum to reduce
    if not texts:
        return
    # every name an assignment binds, inside a tuple target too (`total, count = 0, 0` resets, it reads nothing)
    stores = {id(x) for n in inside if isinstance(n, cst.Assign) for t in n.targets for x in bound(t.target)}
    stores |= {id(x) for n in inside if isinstance(n, (cst.AugAssign, cst.AnnAssign, cst.For)) for x in bound(n.target)}
    stores |= {id(n.attr) for n in inside if isinstance(n, cst.Attribute)}  # names that are not values
    stores |= {id(n.keyword) for n in inside if isinstance(n, cst.Arg) and n.keyword is not None}
    for node in inside:
        if not isinstance(node, (cst.Name, cst.Attribute, cst.Subscript)) or id(node) in stores \
                or id(node) in plan.reduce_read:
            continue
        text = plan.f.code(node)
        if text not in texts or id(node) in plan.flagged:
            continue
        stmt = plan._stmt.get(id(node))
        block = plan._parent.get(id(stmt))
        where = plan.f.code(block if isinstance(block, cst.If) else stmt)
        if not _REPORT.search(where) and not _feeds_report(plan, stmt, loops):
            continue
        tests = []
        parent = plan._parent.get(id(stmt))
        while parent is not None and not any(parent is loop for loop in loops):
            if isinstance(parent, (cst.If, cst.While)):
                tests.append(parent.test)
            parent = plan._parent.get(id(parent))
        if parent is None or plan.loop_role(key, parent) != "train":
            if parent is not None and id(node) not in plan.flagged and _serves_both(plan, key, parent):
                plan.flagged.add(id(node))
                plan.todo(node, f"not checked: `{text}` sums this rank's shard and is reported here, in a loop the "
                          "script runs over its training loader and over an evaluation loader: a collective here "
                          "would wait forever on an evaluation shard one batch shorter, so the figure stays this "
                          "rank's; reduce the sums after the loop (ddpkit.all_reduce_sum) and report them there")
            continue  # evaluation shards differ by a batch: no collective inside their loop (progress stays local)
        if not all(agreed(plan, key, t) for t in tests):
            plan.flagged.add(id(node))
            plan.todo(node, f"`{text}` sums this rank's shard and is reported here, on a branch some ranks may "
                      "not take: reduce it (ddpkit.all_reduce_sum) where every rank passes, then report it")
            continue
        counts = all(_COUNTS.search(t) for t in texts[text])
        plan.reduce_read[id(node)] = "count" if counts else "mean"


def _last_step_reported(plan: Any, key: str, block: list[cst.BaseStatement], stmt: cst.CSTNode,
                        loops: list[cst.For]) -> None:
    """`for x, y in loader: loss = ...; loss.backward()` then `print(f"loss: {loss.item()}")` after the loop: the
    figure is this rank's last batch, a quarter of the original's last batch on 4 ranks. Read where every rank
    passes, it becomes the mean over ranks (equal shards: the original's last-batch loss); on a branch ranks may
    take differently, or for a loss the port scales as a sum over the batch, a TODO names it."""
    train = [loop for loop in loops if plan.loop_role(key, loop) == "train"]
    backed = _backed([n for loop in train for n in walk(loop.body)])
    if not backed:
        return
    summed = any(isinstance(n, cst.Call) and id(n) in plan.scale_backward for loop in train for n in walk(loop.body))
    at = next((i for i, s in enumerate(block) if s is stmt), None)
    for later in block[at + 1:] if at is not None else []:
        if isinstance(later, (cst.FunctionDef, cst.ClassDef)):
            continue
        stores = {id(x) for n in walk(later) if isinstance(n, (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.For))
                  for t in (n.targets if isinstance(n, cst.Assign) else [n]) for x in walk(t.target)}
        stores |= {id(n.attr) for n in walk(later) if isinstance(n, cst.Attribute)}
        stores |= {id(n.keyword) for n in walk(later) if isinstance(n, cst.Arg) and n.keyword is not None}
        for node in walk(later):
            if not (isinstance(node, cst.Name) and node.value in backed) or id(node) in stores \
                    or id(node) in plan.reduce_read or id(node) in plan.flagged:
                continue
            line = plan._stmt.get(id(node))
            if line is None or not _REPORT.search(plan.f.code(line)):
                continue
            tests, parent = [], plan._parent.get(id(line))
            while parent is not None and parent is not stmt and any(parent is s for s in [later, *walk(later)]):
                if isinstance(parent, (cst.If, cst.While)):
                    tests.append(parent.test)
                parent = plan._parent.get(id(parent))
            plan.flagged.add(id(node))
            if summed and any(f"`{node.value}` sums over" in m for m in plan.notes.get(id(line), [])):
                continue  # ddpkit.port.losses named this report of the summed loss already
            if summed or not all(agreed(plan, key, t) for t in tests):
                why = ("the port scales it as a sum over the batch" if summed else
                       "on a branch some ranks may not take")
                plan.todo(node, f"`{node.value}` is reported here from this rank's last training batch only ({why}): "
                          "reduce it over the ranks where every rank passes (ddpkit.all_reduce_sum), then report it")
                continue
            plan.reduce_read[id(node)] = "mean"
        if any(id(x) in stores for x in walk(later) if isinstance(x, cst.Name) and x.value in backed):
            backed = backed - {x.value for x in walk(later) if isinstance(x, cst.Name) and id(x) in stores}
            if not backed:
                return


def _feeds_report(plan: Any, stmt: cst.CSTNode, loops: list[cst.For]) -> bool:
    """`metrics["loss"] = running / (i + 1)` ... `bar.set_postfix(metrics)` later in the loop: the value the
    statement stores is reported there."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Assign):
        return False
    roots = {root_name(t.target) for t in stmt.body[0].targets} - {""}
    line = plan.line_of(stmt)
    for loop in loops:
        for later in walk(loop.body):
            if isinstance(later, cst.SimpleStatementLine) and plan.line_of(later) > line \
                    and _REPORT.search(plan.f.code(later)) \
                    and any(isinstance(n, cst.Name) and n.value in roots for n in walk(later)):
                return True
    return False


def _serves_both(plan: Any, key: str, loop: cst.For) -> bool:
    """`def run(loader, ...): for x, y in loader:` called with the training loader and with an evaluation one."""
    name = dotted(_strip_iter(loop.iter))
    scope = plan.f.scopes.get(key)
    if scope is None or name not in scope.params:
        return False
    index = scope.params.index(name)
    roles = set()
    for caller in sorted(plan.f.ported):
        for call in (n for n in plan.nodes(caller) if isinstance(n, cst.Call) and key in plan.f.callees(n, caller)):
            positional = [a for a in call.args if a.keyword is None and not a.star]
            given = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name),
                         positional[index].value if index < len(positional) else None)
            if given is not None:
                roles.add(plan.role(caller, dotted(given)))
    return {"train", "eval"} <= roles


_SEQUENCES = (cst.List, cst.ListComp, cst.Tuple, cst.Dict, cst.DictComp, cst.Set, cst.SetComp,
              cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)


def _not_a_number(plan: Any, key: str, text: str, sums: list[cst.AugAssign]) -> bool:
    """`text` holds a list, a dict or a string: made so in its scope (`y = []`, `s = "F1: "`) or grown by one
    (`y += x.tolist()`, `s += f"..."`). all_reduce_sum takes numbers and tensors only."""
    grown = [n.value for n in sums if plan.f.code(n.target) == text]
    made = [n.value for n in plan.nodes(key) if isinstance(n, cst.Assign)
            and any(plan.f.code(t.target) == text for t in n.targets)]
    for value in grown + made:
        if isinstance(value, _SEQUENCES):
            return True
        func = plan.f.code(value.func) if isinstance(value, cst.Call) else ""
        if func in ("list", "str", "tuple", "dict", "sorted") or func.endswith((".tolist", ".split", ".format")):
            return True
    return False


def _divides(plan: Any, key: str, name: str, line: int) -> bool:
    """`total / n` or `total /= n` after the loop: `n` counts this rank's batches or samples for a mean."""
    return any(plan.line_of(n) > line and (
        isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Divide, cst.FloorDivide))
        and dotted(n.right) == name
        or isinstance(n, cst.AugAssign) and isinstance(n.operator, (cst.DivideAssign, cst.FloorDivideAssign))
        and dotted(n.value) == name) for n in plan.nodes(key))


def _divided(plan: Any, key: str, name: str, line: int) -> bool:
    """`name / n` or `name /= n` after the loop: a sum made into a mean by a count (which the port reduces too).
    A size every rank shares (`len(loader.dataset)`, a number) is no such count: it divides the sum as it is."""
    return any(plan.line_of(n) > line and (
        isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Divide, cst.FloorDivide))
        and dotted(n.left) == name and not _shared_size(n.right)
        or isinstance(n, cst.AugAssign) and isinstance(n.operator, (cst.DivideAssign, cst.FloorDivideAssign))
        and dotted(n.target) == name and not _shared_size(n.value)) for n in plan.nodes(key))


def _shared_size(divisor: cst.BaseExpression) -> bool:
    """`len(loader.dataset)`, `len(train_set)`, `100`: the same on every rank, whatever the shard (a sum of per-step
    means divided by it is still reduced as their mean over ranks)."""
    if isinstance(divisor, (cst.Integer, cst.Float)):
        return True
    if not (isinstance(divisor, cst.Call) and dotted(divisor.func) == "len" and len(divisor.args) == 1):
        return False
    return bool(re.search(r"(^|[._])(data_?set|train_?set|test_?set|val_?set|valid_?set)s?$",
                          dotted(divisor.args[0].value).lower()))


def _read_after(plan: Any, key: str, name: str, line: int) -> bool:
    stores = {id(t.target) for n in plan.nodes(key) if isinstance(n, (cst.Assign,))
              for t in n.targets}
    return any(dotted(n) == name and id(n) not in stores and plan.line_of(n) > line
               for n in plan.nodes(key) if isinstance(n, (cst.Name, cst.Attribute)))


def _zero_names(small: cst.BaseSmallStatement) -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(small, cst.Assign):
        for target in small.targets:
            t, v = target.target, small.value
            if isinstance(t, cst.Tuple) and isinstance(v, cst.Tuple) and len(t.elements) == len(v.elements):
                for te, ve in zip(t.elements, v.elements):
                    if dotted(te.value) and _zero(ve.value):
                        out[dotted(te.value)] = _zero(ve.value)
            elif dotted(t) and _zero(v):
                out[dotted(t)] = _zero(v)
    elif isinstance(small, cst.AnnAssign) and small.value is not None and _zero(small.value):
        out[dotted(small.target)] = _zero(small.value)
    return out


_METER_CALLS = frozenset({"update", "add", "add_batch", "accumulate", "record", "push"})
_NOT_METERS = frozenset({"ctx", "ddpkit", "self", "os", "sys", "torch", "np", "math"})


def plan_shard_figures(plan: Any) -> None:
    """The claim audit, run after every other rule: a figure a loop over a ported loader builds from this rank's
    batches and the code uses after that loop (printed, logged, returned, compared) is reduced across ranks, or
    named in a TODO, so that "ported fully" never stands on one rank's shard.

    Followed soundly and reduced: an averaging meter (`m.update(v, n)` of a class in this file keeping
    `self.sum`, `self.count` and `self.avg = self.sum / self.count`) made beside the loop. Named: other meters,
    values computed inside the loop from its running sums (`acc = correct / total`), sums the port did not
    reduce, and reduced sums divided by this rank's own batch index or step count."""
    meter_classes = _meter_classes(plan.f.module)
    for key in sorted(plan.f.ported):
        loops = [n for n in _own_nodes(plan, key) if isinstance(n, cst.For) and _shard_loop(plan, key, n)]
        for loop in loops:
            _audit_loop(plan, key, loop, meter_classes)
        _foreign_helpers(plan, key)


def _own_nodes(plan: Any, key: str) -> list[cst.CSTNode]:
    """The nodes of a scope's own code, not of the functions and classes it defines."""
    return [n for stmt in plan.f.scope_statements(key) if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef))
            for n in walk(stmt)]


def _shard_loop(plan: Any, key: str, loop: cst.For) -> bool:
    """A loop over a loader the port shards: a known role, or a container the port's loaders were put in
    (`loaders = {"train": ddpkit.loader(...), ...}; for x, y in loaders[phase]:`)."""
    return bool(plan.loop_role(key, loop)) or _holds_loader(plan, key, _strip_iter(loop.iter))


def _holds_loader(plan: Any, key: str, expr: cst.BaseExpression) -> bool:
    """`loader`, `loaders["train"]`: a loader the port shards, or a container built from such loaders."""
    if plan.role(key, dotted(expr)) in ("train", "eval"):
        return True
    root = root_name(expr)
    if not root or not isinstance(expr, cst.Subscript):
        return False  # `loader.batch_size` is not the loader
    for node in plan.nodes(key):
        if isinstance(node, cst.Assign) and any(root_name(t.target) == root and not isinstance(t.target, cst.Tuple)
                                                for t in node.targets):
            if any(isinstance(c, cst.Call) and id(c) in plan.loaders for c in walk(node.value)):
                return True
    return False


def _evaluated_elsewhere(plan: Any, key: str, call: cst.Call) -> None:
    """`trainer.fit(train_loader, val_loader)` as a statement: code this file does not define gets an evaluation
    loader the port shards, and whatever it reports or decides from it there (a validation loss, mAP, early
    stopping, the best checkpoint) is this rank's shard's alone."""
    name = dotted(call.func)
    if not name or name in _NOT_HELPERS or name.startswith(("ddpkit.", "torch.", "ctx.")) \
            or plan.f.callees(call, key) or id(call) in plan.flagged:
        return
    shards = [plan.f.code(a.value) for a in call.args if plan.role(key, dotted(a.value)) == "eval"
              and _bound_here(plan, key, a.value, plan.line_of(call)) is None]
    if shards:
        plan.flagged.add(id(call))
        plan.todo(call, f"not checked: `{name}(...)`, defined outside this file, runs over this rank's shard of "
                  f"`{shards[0]}` (ddpkit.eval_loader): whatever it reports or decides from it there (a validation "
                  "loss, a metric, early stopping, the best checkpoint) is this rank's alone; reduce those figures "
                  "across ranks in that code (ddpkit.all_reduce_sum), or hand it the whole set on every rank")


def _bound_here(plan: Any, key: str, expr: cst.BaseExpression, line: int) -> cst.Assign | None:
    """The binding of `expr`'s name that reaches `line` (the last one before it) where that is a call the port did not
    make a sharded loader: a name bound to a shard in one branch and to the project's own loader in another
    (`train_loader, _ = data.loaders()`) is that other loader where the other binding reaches. None where the
    reaching binding is the port's loader, or is no call."""
    name = dotted(expr) if isinstance(expr, cst.Name) else ""
    if not name:
        return None
    last: tuple[int, cst.Assign] | None = None
    for node in plan.nodes(key):
        if isinstance(node, cst.Assign) and plan.line_of(node) < line and any(
                isinstance(x, cst.Name) and x.value == name for t in node.targets for x in walk(t.target)):
            if last is None or plan.line_of(node) > last[0]:
                last = (plan.line_of(node), node)
    if last is None or not isinstance(last[1].value, cst.Call) or any(
            isinstance(c, cst.Call) and id(c) in plan.loaders for c in walk(last[1].value)):
        return None
    return last[1]


def _strip_iter(expr: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(expr, cst.Call) and dotted(expr.func) in ("enumerate", "tqdm", "tqdm.tqdm", "iter", "trange",
                                                                  "tqdm.auto.tqdm", "zip") and expr.args:
        expr = expr.args[0].value
    return expr


def _meter_classes(module: cst.Module) -> dict[str, str]:
    """Classes of this file whose `update` adds to `self.sum` and `self.count` and sets `self.avg` from them:
    class name -> the avg expression, written for `self`."""
    out = {}
    for cls in (n for n in walk(module, into_functions=True) if isinstance(n, cst.ClassDef)):
        update = next((n for n in walk(cls.body) if isinstance(n, cst.FunctionDef) and n.name.value == "update"),
                      None)
        if update is None:
            continue
        added = {dotted(n.target) for n in walk(update.body) if isinstance(n, cst.AugAssign)
                 and isinstance(n.operator, cst.AddAssign)}
        avg = [n.value for n in walk(update.body) if isinstance(n, cst.Assign) and len(n.targets) == 1
               and dotted(n.targets[0].target) == "self.avg"]
        if {"self.sum", "self.count"} <= added and len(avg) == 1 and {
                dotted(n) for n in walk(avg[0]) if isinstance(n, cst.Attribute)} <= {"self.sum", "self.count"}:
            out[cls.name.value] = cst.Module([]).code_for_node(avg[0])
    return out


def _audit_loop(plan: Any, key: str, loop: cst.For, meter_classes: dict[str, str]) -> None:
    end = plan.end_of(loop)
    own = _own_nodes(plan, key)
    inside = list(walk(loop.body))
    loop_vars = {dotted(n) for n in walk(loop.target) if isinstance(n, cst.Name)}
    assigned = set(loop_vars)
    for n in inside:
        if isinstance(n, cst.Assign):
            assigned |= {dotted(x) for t in n.targets for x in walk(t.target) if isinstance(x, (cst.Name,
                                                                                               cst.Attribute))}
        elif isinstance(n, cst.For):
            assigned |= {dotted(x) for x in walk(n.target) if isinstance(x, cst.Name)}
    reduced = plan.reduced.get(key, set())
    todo_lines = {line for line, _ in plan.todos}
    sums: dict[str, cst.CSTNode] = {}
    counts: dict[str, cst.CSTNode] = {}
    for n in inside:
        if isinstance(n, cst.AugAssign) and dotted(n.target) and not isinstance(n.operator, cst.DivideAssign):
            name = dotted(n.target)
            if isinstance(n.value, (cst.Integer, cst.Float)) and not _conditional(plan, n, [loop]) \
                    or _counter(name, [plan.f.code(n.value)]):
                counts.setdefault(name, n)
            else:
                sums.setdefault(name, n)
    meters: dict[str, cst.CSTNode] = {}
    for n in inside:
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in _METER_CALLS \
                and n.args:
            owner = dotted(n.func.value)
            if not owner or owner in assigned or owner.split(".")[0] in _NOT_METERS | ARGS_ROOTS \
                    or plan.role(key, owner) is not None:
                continue
            if any(dotted(x) in assigned for a in n.args for x in walk(a.value) if isinstance(x, (cst.Name,
                                                                                                cst.Attribute))):
                meters.setdefault(owner, n)
    derived: dict[str, cst.CSTNode] = {}
    for n in inside:
        if isinstance(n, cst.Assign) and len(n.targets) == 1 and dotted(n.targets[0].target):
            used = {dotted(x) for x in walk(n.value) if isinstance(x, (cst.Name, cst.Attribute))}
            if any(u in sums or u in meters or u.rsplit(".", 1)[0] in meters for u in used):
                derived.setdefault(dotted(n.targets[0].target), n)
    after = sorted((n for n in own if isinstance(n, (cst.Name, cst.Attribute))
                    and plan.line_of(n) > end), key=plan.line_of)
    stores = {id(t.target) for n in own if isinstance(n, cst.Assign) for t in n.targets}
    stores |= {id(x) for n in own if isinstance(n, cst.Assign) for t in n.targets
               if isinstance(t.target, (cst.Tuple, cst.List)) for x in walk(t.target)}
    calls_as_statements = {id(s.value.func) for n in own if isinstance(n, cst.SimpleStatementLine)
                           for s in n.body if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call)}

    def first_use(name: str) -> cst.CSTNode | None:
        """The first read of `name` (or of an attribute of it) after the loop, unless it is first assigned anew."""
        for node in after:
            text = dotted(node)
            if text != name and not (text.startswith(name + ".") and isinstance(node, cst.Attribute)):
                continue
            if id(node) in stores and text == name:
                return None
            if id(node) in stores or id(node) in calls_as_statements:
                continue  # `meter.reset()`, `pbar.close()`: not a figure
            if isinstance(plan._parent.get(id(node)), cst.Attribute):
                continue
            return node
        return None

    for name, node in meters.items():
        use = first_use(name)
        if use is None or id(node) in plan.flagged:
            continue
        plan.flagged.add(id(node))
        if _reduce_meter(plan, key, loop, name, meter_classes):
            continue
        plan.todo(use, f"not checked: `{plan.f.code(use)}` (line {plan.line_of(use)}) comes from `{name}`, "
                  f"updated with this rank's batches only (line {plan.line_of(node)}): reduce its sum and count "
                  "across ranks (ddpkit.all_reduce_sum) before it is reported, returned or compared")
    for name, node in derived.items():
        use = first_use(name)
        if use is None or id(node) in plan.flagged or name in reduced:
            continue
        plan.flagged.add(id(node))
        plan.todo(use, f"not checked: `{name}` used here is computed inside the loop (line {plan.line_of(node)}) "
                  "from this rank's running sums: compute it after the loop from sums reduced across ranks "
                  "(ddpkit.all_reduce_sum)")
    for name, node in sums.items():
        if name in reduced or plan.line_of(node) in todo_lines or id(node) in plan.gathered:
            continue
        use = first_use(name)
        if use is None:
            continue
        plan.flagged.add(id(node))
        plan.todo(use, f"not checked: `{name}` used here sums this rank's shard only (line {plan.line_of(node)}) "
                  "and is not reduced: start it at 0 beside the loop so the port reduces it, or reduce it "
                  "(ddpkit.all_reduce_sum) before it is reported")
    keyed: dict[str, cst.AugAssign] = {}
    for n in inside:  # `correct_pred[classname] += 1`: per-class counts of this rank's shard
        if isinstance(n, cst.AugAssign) and isinstance(n.target, cst.Subscript) and root_name(n.target) \
                and root_name(n.target) not in assigned | _NOT_METERS:
            keyed.setdefault(root_name(n.target), n)
    for name, node in keyed.items():
        if name in reduced or plan.line_of(node) in todo_lines or id(node) in plan.flagged and any(
                f"`{name}[...]`" in m for _, m in plan.todos):
            continue
        use = first_use(name)
        if use is None:
            continue
        plan.flagged.add(id(node))
        plan.todo(use, f"not checked: `{name}` used here counts this rank's shard only (its entries are added to "
                  f"at line {plan.line_of(node)}): reduce every entry across ranks (ddpkit.all_reduce_sum) "
                  "before it is reported")
    own_counts = (loop_vars | set(counts)) - reduced
    for n in own:
        if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Divide, cst.FloorDivide)) \
                and plan.line_of(n) > end and id(n) not in plan.flagged:
            left = {dotted(x) for x in walk(n.left) if isinstance(x, (cst.Name, cst.Attribute))}
            right = {dotted(x) for x in walk(n.right) if isinstance(x, (cst.Name, cst.Attribute))}
            if left & reduced & (set(sums) | set(counts)) and right & own_counts:
                count = sorted(right & own_counts)[0]
                plan.flagged.add(id(n))
                plan.todo(n, f"not checked: `{plan.f.code(n)}` divides a sum over every rank by `{count}`, this "
                          "rank's own count of batches or steps: divide by the count over every rank "
                          f"(ddpkit.all_reduce_sum(ctx, {count}))")


def _reduce_meter(plan: Any, key: str, loop: cst.For, name: str, meter_classes: dict[str, str]) -> bool:
    """`m = AverageMeter()` beside the loop, of a class in this file: its sum and count are reduced after the
    loop and its average recomputed from them, the way the class computes it."""
    made: cst.Assign | None = None
    for node in _own_nodes(plan, key):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and dotted(node.targets[0].target) == name \
                and isinstance(node.value, cst.Call) and dotted(node.value.func) in meter_classes:
            if made is not None:
                return False  # made in two places: the pass cannot tell which one the loop updates
            made = node
    stmt = plan._stmt.get(id(made)) if made is not None else None
    if stmt is None or id(stmt) not in plan._block:
        return False
    block, index = plan._block[id(stmt)]
    outer: cst.CSTNode | None = loop
    while outer is not None and not (id(outer) in plan._block and plan._block[id(outer)][0] is block):
        outer = plan._parent.get(id(outer))
    if outer is None or made is None or not isinstance(made.value, cst.Call) \
            or plan._block[id(outer)][1] <= index:
        return False
    avg = meter_classes[dotted(made.value.func)].replace("self.", f"{name}.")
    plan.reduce_after.setdefault(id(outer), []).extend(
        [(f"{name}.sum", "any"), (f"{name}.count", "any"), (f"{name}.avg", f"={avg}")])
    plan.reduced.setdefault(key, set()).update({name, f"{name}.sum", f"{name}.count", f"{name}.avg"})
    return True


_NOT_HELPERS = frozenset({"enumerate", "len", "iter", "next", "zip", "list", "tuple", "tqdm", "tqdm.tqdm", "trange",
                          "print", "sorted", "range", "isinstance", "getattr", "setattr", "hasattr", "id", "type",
                          "dict", "set", "str", "int", "float", "bool", "repr", "format", "map", "filter"})
_BATCH_SOURCES = re.compile(r"(?i:.*prefetch.*)|[A-Z]\w*(Loader|Iterator|Iter|Generator|Stream|Feeder)|cycle")
"""Names of what wraps a loader and hands back its batches (`CUDAPrefetcher(loader, device)`, `data_prefetcher`,
a class `InfiniteLoader`, `ForeverDataIterator`, `BackgroundGenerator`, itertools' `cycle`): no figure of the shard
to reduce (a function `score_loader(model, loader)` is no such class)."""


def _foreign_helpers(plan: Any, key: str) -> None:
    """`hr, ndcg = evaluate.metrics(model, test_loader)`: a function this file does not define runs over a
    loader the port shards, and what it returns is used: a figure of this rank's shard the port cannot follow."""
    for node in _own_nodes(plan, key):
        if isinstance(node, cst.Expr) and isinstance(node.value, cst.Call):
            _evaluated_elsewhere(plan, key, node.value)
        if not isinstance(node, cst.Assign) or not isinstance(node.value, cst.Call):
            continue
        call = node.value
        name = dotted(call.func)
        if not name or name in _NOT_HELPERS or name.startswith(("ddpkit.", "torch.", "ctx.")) \
                or plan.f.callees(call, key) or plan.role(key, name.split(".")[0]) == "model" \
                or plan.role(key, name) == "model":
            continue
        held = [a.value for a in call.args if _holds_loader(plan, key, a.value)]
        loaders = [plan.f.code(a) for a in held if _bound_here(plan, key, a, plan.line_of(node)) is None]
        for a in held:
            bound = _bound_here(plan, key, a, plan.line_of(node))
            if bound is not None and id(bound) not in plan.flagged:
                plan.flagged.add(id(bound))
                plan.todo(node, f"`{plan.f.code(a)}` handed to `{name}(...)` here is the one line "
                          f"{plan.line_of(bound)} binds (`{plan.f.code(bound.value)}`), not a loader the port made "
                          "ddpkit.loader: it is not sharded, so every rank runs over all of it (no speed-up, the same "
                          "batches on every rank); build it with ddpkit.loader(dataset, ctx, batch_size=...) or shard it "
                          "by ctx.rank and ctx.world_size")
        if not loaders or _BATCH_SOURCES.fullmatch(name.rsplit(".", 1)[-1]):
            continue  # a prefetcher over the loader hands back its batches, not a figure of them
        targets = ", ".join(plan.f.code(t.target) for t in node.targets)
        plan.todo(node, f"not checked: `{targets}` comes from `{name}(...)`, defined outside this file, which runs "
                  f"over this rank's shard of `{loaders[0]}`: reduce what it returns across ranks (sums and counts, "
                  "ddpkit.all_reduce_sum) before it is reported, or port that function too")
