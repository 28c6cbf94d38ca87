"""Where the training batches come from: data without a training DataLoader, the iterable of a loop that is no
ported loader, and reads of torch DataLoader attributes on a loader the port made ddpkit's.

Without a loader there is nothing to shard, yet DDP stays correct when every rank runs the same number of
optimizer steps: with the same data the ranks repeat one run's work (correct, no speed-up: a TODO says the data is
not sharded); with per-step random draws each rank draws its own samples from its own stream (ddpkit.init seeds
ranks differently): data parallelism, where batches.py divides each draw's batch to keep the script's. What must
stay alike (the data, a split) is drawn before training, so it must be seeded before it is drawn. The step count
is fixed when every loop and branch around backward() reads only counters, arguments and constants; a `while`,
an environment or a replay buffer decides per rank, and those stay TODOs.

Where the count or the batches are not the same on every rank, the TODO names the loop and what it iterates,
back to where that is made.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.batches import plan_drawn_batches
from ddpkit.port.facts import (ARGS_ROOTS, ENTRY, dotted, hands_to_unported, loader_expr, names_a_device,
                               root_name, walk)
from ddpkit.port.hostbatches import model_forwards as _forwards, plan_batch_moves
from ddpkit.port.inputs import RANDOM_DRAW
from ddpkit.port.models import runs_again

__all__ = ["plan_no_loader", "plan_loader_reads"]

_COUNTER_CALLS = frozenset({"len", "int", "min", "max", "size", "abs"})
_GROWS = frozenset({"append", "extend", "put", "push", "add", "insert", "appendleft"})


# ---- no DataLoader ---------------------------------------------------------------------------------------
def _counter_only(expr: cst.BaseExpression, counters: set[str], grown: frozenset[str] = frozenset()) -> bool:
    """Every rank computes the same value: literals, loop counters, arguments, constants, len()/size() of
    something no rank grows as it runs (`len(memory)` of a replay buffer that `memory.append`s is per rank)."""
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(expr, (cst.Name, cst.Attribute)):
        root = dotted(expr).split(".")[0]
        return bool(root) and (root in counters or root in ARGS_ROOTS or root.isupper() or root in (
            "True", "False", "None"))
    if isinstance(expr, cst.Call):
        last = dotted(expr.func).rsplit(".", 1)[-1]
        measured = [expr.func.value] if isinstance(expr.func, cst.Attribute) else [a.value for a in expr.args]
        return last in _COUNTER_CALLS and not any(root_name(m) in grown for m in measured)
    if isinstance(expr, cst.Subscript):  # `x.shape[0]`
        return dotted(expr.value).endswith(".shape")
    if isinstance(expr, cst.BinaryOperation):
        return _counter_only(expr.left, counters, grown) and _counter_only(expr.right, counters, grown)
    if isinstance(expr, cst.UnaryOperation):
        return _counter_only(expr.expression, counters, grown)
    if isinstance(expr, cst.BooleanOperation):
        return _counter_only(expr.left, counters, grown) and _counter_only(expr.right, counters, grown)
    if isinstance(expr, cst.Comparison):
        return _counter_only(expr.left, counters, grown) and all(_counter_only(c.comparator, counters, grown)
                                                                 for c in expr.comparisons)
    return False


def _constants(module: cst.Module) -> set[str]:
    """Module-level names only ever bound to literals (`max_iters = 5000`, `lr = 3e-4`): alike on every rank."""
    values: dict[str, list[cst.BaseExpression]] = {}
    for node in walk(module, into_functions=True):
        if isinstance(node, cst.Assign):
            for t in node.targets:
                for name in (x for x in walk(t.target) if isinstance(x, cst.Name)):
                    values.setdefault(name.value, []).append(node.value if isinstance(t.target, cst.Name) else None)
        elif isinstance(node, (cst.AugAssign, cst.For)):
            for name in (x for x in walk(node.target) if isinstance(x, cst.Name)):
                values.setdefault(name.value, []).append(None)
    return {k for k, v in values.items() if all(_literal(e) for e in v)}


def _literal(expr: cst.BaseExpression | None) -> bool:
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString)):
        return True
    if isinstance(expr, cst.BinaryOperation):
        return _literal(expr.left) and _literal(expr.right)
    return isinstance(expr, cst.UnaryOperation) and _literal(expr.expression)


def _fixed_path(plan: Any, key: str, node: cst.CSTNode, depth: int = 0) -> cst.BaseStatement | None:
    """The entry point's statement that runs `node` the same number of times on every rank (loops over
    range() of counters and arguments, branches on them, through the calls that reach `node`'s scope);
    None when a `while`, a per-rank branch or an unknown caller decides."""
    stmt = plan._stmt.get(id(node), node)
    chain = [stmt]
    parent = plan._parent.get(id(stmt))
    while parent is not None:
        chain.append(parent)
        parent = plan._parent.get(id(parent))
    if not any(chain[-1] is s for s in plan.f.scope_statements(key)):
        return None  # inside a function defined in the scope (a closure): who calls it, and how often, is not read
    counters = _constants(plan.f.module)
    grown = frozenset(root_name(c.func.value) for c in walk(plan.f.module, into_functions=True) if isinstance(
        c, cst.Call) and isinstance(c.func, cst.Attribute) and c.func.attr.value in _GROWS)
    for p in reversed(chain[1:]):  # outermost first: its counters are known inside
        if isinstance(p, cst.For):
            it = loader_expr(p.iter)
            if not (isinstance(it, cst.Call) and dotted(it.func) == "range" and all(
                    _counter_only(a.value, counters, grown) for a in it.args)):
                return None
            counters |= {x.value for x in walk(p.target) if isinstance(x, cst.Name)}
        elif isinstance(p, cst.If):  # no calls: `if buffer.size() > 2000:` is a per-rank decision
            if any(isinstance(c, cst.Call) for c in walk(p.test)) or not _counter_only(p.test, counters, grown):
                return None
        elif not isinstance(p, (cst.With, cst.Try)):
            return None
    if key in (ENTRY, plan.f.entry_key):
        return chain[-1]
    sites = [(k, c) for k in sorted(plan.f.ported) if k != key for c in plan.nodes(k)
             if isinstance(c, cst.Call) and key in plan.f.callees(c, k)]
    if not sites or depth > 4:
        return None
    tops = [_fixed_path(plan, k, c, depth + 1) for k, c in sites]
    return None if any(t is None for t in tops) else tops[0]


def _cpu_input_todo(plan: Any, blocks: list[tuple[str, list[cst.BaseStatement]]]) -> bool:
    """In a script that names no device, the first input of a training forward (`model(x)`, `model.forward(x)`)
    not made on ctx.device by the port gets a TODO: ddpkit.wrap put the model there. True when one did.

    Every other forward of the model in a ported scope (an evaluation loop, a `test()`) that is given a batch of a
    loop over something that is not a ddpkit loader gets one too: those batches stay on the CPU as well."""
    f = plan.f
    if names_a_device(f.module):
        return False
    moved = {x.value for k in f.ported for n in plan.nodes(k) if id(n) in plan.to_device
             for t in n.targets for x in walk(t.target) if isinstance(x, cst.Name)}
    # batches of a kept torch DataLoader given to the model: moved at the top of their loop where that is sure
    carried = {k: set().union(*(plan_batch_moves(plan, k, c) for c in _forwards(plan, k, f.scope_statements(k))))
               for k in sorted(f.ported)}
    named = False
    seen: set[int] = set()
    for k, stmts in blocks:
        for call in _forwards(plan, k, stmts):
            inputs = [a.value for a in call.args if root_name(a.value) not in moved | carried.get(k, set())]
            if inputs and not named:
                seen.add(id(call))
                partners = _loss_partners(plan, stmts, call, moved | carried.get(k, set()))
                also = f"; so is `{partners[0]}`, which meets the model's output (the loss's target)" if partners else ""
                kin = [] if partners else _unpacked_with(plan, stmts, inputs[0], call, _forwards(plan, k, stmts),
                                                    moved | carried.get(k, set()))
                if kin:
                    also = (f"; so {'are' if len(kin) > 1 else 'is'} {', '.join(f'`{n}`' for n in kin)}, unpacked "
                            "from the same call and used after the model's call, where they are tensors")
                plan.todo(call, f"`{f.code(inputs[0])}` is made on the CPU (the script names no device) and given to "
                          f"the model, which ddpkit.wrap put on ctx.device{also}: make {'them' if also else 'it'} on ctx.device "
                          "(.to(ctx.device))")
                named = True
    for k in sorted(f.ported):
        stmts = f.scope_statements(k)
        batches = _host_batches(plan, k, stmts)
        for call in _forwards(plan, k, stmts):
            inputs = [a.value for a in call.args if id(call) not in seen
                      and root_name(a.value) in batches.keys() - moved - carried.get(k, set())]
            if inputs:
                seen.add(id(call))
                names = ", ".join(f"`{f.code(x)}`" for x in inputs)
                plan.todo(call, f"{names} {'come' if len(inputs) > 1 else 'comes'} from a batch of `{batches[root_name(inputs[0])]}` (not a ddpkit "
                          "loader: on the CPU, as the script names no device) and is given to the model, which "
                          "ddpkit.wrap put on ctx.device: move the batch there (ddpkit.device.to_device(batch, ctx.device))")
    return named


def _host_batches(plan: Any, key: str, stmts: list[cst.BaseStatement]) -> dict[str, str]:
    """Names a `for` loop binds to the items of an iterable that is no ddpkit loader of the port -> that iterable
    (`for i, (x, y) in enumerate(test_loader)`: x, y -> `test_loader`); counted loops (range) bind none."""
    out: dict[str, str] = {}
    for loop in (n for s in stmts for n in walk(s) if isinstance(n, cst.For)):
        it = loader_expr(loop.iter)
        name = root_name(it)
        if isinstance(it, cst.Call) and dotted(it.func) in ("range", "zip") or plan.role(key, name) in (
                "train", "eval") and name not in plan.host_loaders.get(key, set()):
            continue  # a ddpkit loader delivers its batches on ctx.device
        target = loop.target
        if isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "enumerate" and isinstance(
                target, cst.Tuple) and len(target.elements) == 2:
            target = target.elements[1].value  # the counter enumerate adds is no batch
        for x in walk(target):
            if isinstance(x, cst.Name):
                out.setdefault(x.value, plan.f.code(it))
    return out


def _unpacked_with(plan: Any, stmts: list[cst.BaseStatement], given: cst.BaseExpression, forward: cst.Call,
                   forwards: list[cst.Call], moved: set[str]) -> list[str]:
    """The other names of the tuple unpacking that binds `given` (`state, action, reward = buffer.sample(n)`):
    made by the same call, so on the CPU with it, where the statements after the forward read them and no call of
    the model is given them."""
    if not isinstance(given, cst.Name):
        return []
    fed = {root_name(a.value) for n in forwards for a in n.args}
    for s in stmts:
        for node in walk(s, into_functions=True):
            if not (isinstance(node, cst.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0].target, cst.Tuple) and isinstance(node.value, cst.Call)):
                continue
            names = [e.value.value for e in node.targets[0].target.elements if isinstance(e.value, cst.Name)]
            if given.value not in names:
                continue
            after = plan.line_of(plan._statement_of(forward))
            read = {x.value for t in stmts for x in walk(t, into_functions=True) if isinstance(x, cst.Name)
                    and plan.line_of(plan._statement_of(x)) > after}
            return [n for n in names if n != given.value and n not in fed | moved and n in read]
    return []


def _loss_partners(plan: Any, stmts: list[cst.BaseStatement], forward: cst.Call, moved: set[str]) -> list[str]:
    """Plain names given with the forward's output to one call after it (`loss.forward(fx, y)`, `crit(out, y)`):
    on the CPU where the output is on ctx.device."""
    stmt = plan._statement_of(forward)
    outputs = {x.value for t in (stmt.body[0].targets if isinstance(stmt, cst.SimpleStatementLine) and isinstance(
        stmt.body[0], cst.Assign) else []) for x in walk(t.target) if isinstance(x, cst.Name)}
    for call in (n for s in stmts for n in walk(s) if isinstance(n, cst.Call) and n is not forward):
        names = [a.value.value for a in call.args if isinstance(a.value, cst.Name)]
        if outputs & set(names):
            return [n for n in names if n not in outputs and n not in moved]
    return []


def _batch_source(plan: Any, key: str, backward: cst.CSTNode) -> tuple[cst.CSTNode, str] | None:
    """The loop around `backward` that draws the batches, and where what it iterates is made: (the loop, the
    words naming it); None when every loop around it counts with range()."""
    scope = plan.f.scopes[key].node
    parents: dict[int, cst.CSTNode] = {}
    for n in walk(scope, into_functions=True):
        for c in n.children:
            parents[id(c)] = n
    node = backward
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, cst.While):
            return node, f"the training loop at line {plan.line_of(node)} is a `while` loop that draws its own batches"
        if not isinstance(node, cst.For):
            continue
        it = loader_expr(node.iter)
        if isinstance(it, cst.Call) and dotted(it.func) == "range":
            continue
        words = f"the training loop at line {plan.line_of(node)} iterates `{plan.f.code(it)}`"
        name, owner = root_name(it), parents.get(id(node), scope)
        while owner is not scope and not isinstance(owner, cst.FunctionDef):
            owner = parents.get(id(owner), scope)
        params = {p.name.value for p in owner.params.params} if isinstance(owner, cst.FunctionDef) else set()
        made = [a for a in walk(owner, into_functions=owner is not scope) if isinstance(a, cst.Assign) and any(
            name in {x.value for x in walk(t.target) if isinstance(x, cst.Name)} for t in a.targets)] if name else []
        if made and isinstance(made[0].value, cst.Call) and any(isinstance(c, cst.Call) and dotted(c.func) == "range"
                                                                for a in made[0].value.args for c in [a.value]):
            continue  # `pbar = tqdm(range(n))`: a counted loop
        if name in params:
            given = _argument_made(plan, owner, name)
            words += f" (`{name}` is a parameter of `{owner.name.value}`" + (
                f", given `{given[0]}` made at line {given[1]} by `{given[2]}`)" if given else ")")
        elif made:
            words += f" (made at line {plan.line_of(made[0])} by `{_short(plan.f.code(made[0].value))}`)"
        return node, words
    return None


def _argument_made(plan: Any, function: cst.FunctionDef, param: str) -> tuple[str, int, str] | None:
    """Where the first call of `function` that passes `param` a plain name made that name: (name, line, value)."""
    names = [p.name.value for p in function.params.params]
    for call in (n for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Call)
                 and dotted(n.func).rsplit(".", 1)[-1] == function.name.value):
        positional = [a for a in call.args if a.keyword is None and not a.star]
        given = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param), None)
        if given is None and names.index(param) < len(positional):
            given = positional[names.index(param)].value
        arg = root_name(given) if given is not None else ""
        made = [a for a in walk(plan.f.module, into_functions=True) if arg and isinstance(a, cst.Assign) and any(
            arg in {x.value for x in walk(t.target) if isinstance(x, cst.Name)} for t in a.targets)]
        if made:
            return arg, plan.line_of(made[0]), _short(plan.f.code(made[0].value))
    return None


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _uncounted(plan: Any, key: str, node: cst.CSTNode, depth: int = 0) -> tuple[cst.CSTNode, str] | None:
    """The outermost `for ... in range(...)` around `node`, in its scope or around a call that reaches it, whose
    count reads something other than counters, arguments and constants: (it, its header); None when there is none."""
    stmt = plan._stmt.get(id(node), node)
    chain = []
    parent = plan._parent.get(id(stmt))
    while parent is not None:
        chain.append(parent)
        parent = plan._parent.get(id(parent))
    counters = _constants(plan.f.module)
    for p in reversed(chain):
        if isinstance(p, cst.For):
            it = loader_expr(p.iter)
            if isinstance(it, cst.Call) and dotted(it.func) == "range" and not all(
                    _counter_only(a.value, counters) for a in it.args):
                return p, f"for {plan.f.code(p.target)} in {_short(plan.f.code(p.iter))}"
            counters |= {x.value for x in walk(p.target) if isinstance(x, cst.Name)}
    if depth > 4 or key in (ENTRY, plan.f.entry_key):
        return None
    sites = [(k, c) for k in sorted(plan.f.ported) if k != key for c in plan.nodes(k)
             if isinstance(c, cst.Call) and key in plan.f.callees(c, k)]
    return next((u for u in (_uncounted(plan, k, c, depth + 1) for k, c in sites) if u), None)


def _branched(plan: Any, stmt_id: int) -> bool:
    """The statement runs under an if/while/try: the model may not be wrapped on the path that trains."""
    node = plan._parent.get(stmt_id)
    while node is not None:
        if isinstance(node, (cst.If, cst.While, cst.Try)):
            return True
        node = plan._parent.get(id(node))
    return False


def _scopes_under(plan: Any, stmts: list[cst.CSTNode], key: str) -> set[str]:
    """The ported scopes the statements call, transitively."""
    seen: set[str] = set()
    todo = [k for s in stmts for n in walk(s) if isinstance(n, cst.Call) for k in plan.f.callees(n, key)]
    while todo:
        k = todo.pop()
        if k in seen or k not in plan.f.ported:
            continue
        seen.add(k)
        todo.extend(plan.f.scopes[k].calls)
    return seen


def _local_defs_called(plan: Any, nodes: list[cst.CSTNode], blocks: list[list[cst.BaseStatement]]
                       ) -> list[cst.FunctionDef]:
    """Functions defined inside a ported scope (`def get_batch(split):` in the `__main__` block) that the nodes
    call by name, transitively: they are no scopes of their own, yet what they draw is drawn in the step."""
    defs = {s.name.value: s for block in blocks for s in block if isinstance(s, cst.FunctionDef)}
    found: dict[str, cst.FunctionDef] = {}
    todo = list(nodes)
    while todo:
        node = todo.pop()
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in defs \
                and node.func.value not in found:
            found[node.func.value] = defs[node.func.value]
            todo.extend(walk(defs[node.func.value].body))
    return list(found.values())


NOT_SHARDED = "the data is not sharded"
"""How the TODO over training with no DataLoader where every rank runs the same steps begins."""


def plan_no_loader(plan: Any, start: cst.CSTNode) -> None:
    """No DataLoader trains: the TODO that says the data is not sharded. Where every rank runs the same steps on
    the same data the port is still correct (no speed-up), and the TODO says so; a port that leaves N GPUs
    repeating one run's work is no finished data-parallel port."""
    todo = ("no training DataLoader found: the data is not sharded, so every rank trains on all of it (no "
            "speed-up); feed it through ddpkit.loader(dataset, ctx, batch_size=...) or slice it by ctx.rank and "
            "ctx.world_size")
    f = plan.f
    backward = [(k, n) for k in sorted(f.ported) for n in plan.nodes(k) if isinstance(n, cst.Call)
                and isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward"]
    found = any(isinstance(n, cst.Call) and dotted(n.func).rsplit(".", 1)[-1] == "DataLoader"
                for k in f.ported for n in plan.nodes(k))
    wraps = [*plan.wrap_inline, *plan.wrap_before]  # `if args.use_optimizer: model = ddpkit.wrap(model, ctx)`
    entry = ENTRY if f.ctx_global else f.entry_key
    region = f.scope_statements(entry)
    defined = {id(x) for s in region if isinstance(s, (cst.FunctionDef, cst.ClassDef)) for x in walk(s)}
    backward = [(k, n) for k, n in backward if not (k == entry and id(n) in defined)]  # seen from its own scope
    loops = [_fixed_path(plan, k, n) for k, n in backward]  # the entry's statements that train
    if any(_branched(plan, w) for w in wraps):
        loops.append(None)
    if found or not backward or not all(any(loop is s for s in region) for loop in loops) or "model" not in {
            r for s in f.scopes.values() for r in s.roles.values()}:
        source = next((s for s in (_batch_source(plan, k, n) for k, n in backward) if s), None)
        counted = None if found or source else next((c for c in (_uncounted(plan, k, n) for k, n in backward) if c),
                                                    None)
        if counted is not None:
            plan.todo(counted[0], f"no training DataLoader found: the training loop at line {plan.line_of(counted[0])} "
                      f"(`{counted[1]}`) counts with a value the port cannot follow to one every rank shares, and "
                      "every rank trains on all of the data (not sharded); feed it through ddpkit.loader(dataset, "
                      "ctx, batch_size=...) or slice it by ctx.rank and ctx.world_size")
        elif source is None:
            plan.todo(start, todo)
        else:
            plan.todo(source[0], f"no training DataLoader found: {source[1]}, not a loader the port made "
                      "ddpkit.loader, so every rank trains on all of the data; shard it by ctx.rank and "
                      "ctx.world_size, or build it with ddpkit.loader(dataset, ctx, batch_size=...)")
        _cpu_input_todo(plan, [(k, f.scope_statements(k)) for k in sorted({k for k, _ in backward})])
        return
    top = [s for s in region if any(loop is s for loop in loops)]
    step_scopes = _scopes_under(plan, top, entry)
    # every rank draws alike from ddpkit.init on (the script's streams restored, or one seed for all): data drawn
    # before the training loop is the same on every rank, and the reseed below makes the loop's draws per rank

    def draws(nodes):
        return [n for n in nodes if isinstance(n, cst.Call) and RANDOM_DRAW.search(dotted(n.func))
                and not any(a.keyword and a.keyword.value == "generator" for a in n.args)]

    if _cpu_input_todo(plan, [(k, top if k == entry else f.scope_statements(k)) for k in [entry, *sorted(step_scopes)]]):
        return
    step_nodes = [n for s in top for n in walk(s)] + [n for k in step_scopes for n in plan.nodes(k)]
    step_nodes += [n for d in _local_defs_called(plan, step_nodes, [region, *(
        f.scope_statements(k) for k in step_scopes)]) for n in walk(d.body)]
    step_draws = draws(step_nodes)
    if not step_draws:
        plan.todo(top[0], f"{NOT_SHARDED}: every rank trains on all of the data, so the ranks "
                  "repeat one run's work (the result stays the original's, with no speed-up); to train data-parallel, slice the data by ctx.rank and ctx.world_size or feed it "
                  "through ddpkit.loader(dataset, ctx, batch_size=...)")
        return
    plan.reseed.add(id(top[0]))  # from here on each rank draws its own batches
    plan_drawn_batches(plan, step_draws)


# ---- reads of torch DataLoader internals on a ported loader ----------------------------------------------
_LOADER_INTERNALS = frozenset({"sampler", "batch_sampler", "generator", "worker_init_fn", "prefetch_factor",
                               "persistent_workers", "timeout", "multiprocessing_context"})
"""Attributes of torch's DataLoader that ddpkit's loaders lack or hold with another meaning. Both answer `dataset`,
`batch_size` (the batch each rank's loader yields, as a DataLoader's is the batch it yields), `num_workers`,
`drop_last`, `collate_fn` and `pin_memory` as a DataLoader does (ddpkit.data's `_DATALOADER_ATTRIBUTES`; port/ reads
code and does not import the runtime, so the list is kept here too)."""


def plan_loader_reads(plan: Any) -> None:
    """`len(loader.sampler)` on a loader the port made ddpkit's meant the dataset's size (DataLoader's default
    samplers hold every sample): it reads `len(loader.dataset)`, the global count, on every rank. ddpkit.loader's
    `sampler` is its per-rank batch sampler and ddpkit.eval_loader's its shard's indices, so any other read of a
    DataLoader attribute they lack or answer otherwise (`loader.batch_sampler`, `loader.sampler.indices`) is a TODO
    naming it; `loader.batch_size` and the others both answer as a DataLoader does are left alone."""
    for key in sorted(plan.f.ported):
        nodes = list(plan.nodes(key))
        measured = {id(n.args[0].value) for n in nodes if isinstance(n, cst.Call) and dotted(n.func) == "len"
                    and len(n.args) == 1}
        for node in nodes:
            if not (isinstance(node, cst.Attribute) and node.attr.value in _LOADER_INTERNALS and dotted(node.value)):
                continue
            loader = dotted(node.value)
            kind = plan.role(key, loader)
            if kind not in ("train", "eval"):
                continue
            if node.attr.value == "sampler" and id(node) in measured:
                plan.replace[id(node)] = f"{loader}.dataset"
                continue
            made = "ddpkit.loader" if kind == "train" else "ddpkit.eval_loader"
            has = "has no such attribute" if node.attr.value != "sampler" else \
                "holds its per-rank batch sampler there" if kind == "train" else "holds its shard's indices there"
            plan.todo(node, f"`{loader}.{node.attr.value}` reads an attribute of torch's DataLoader, but `{loader}` "
                      f"is now {made}, which {has}: "
                      f"read `len({loader}.dataset)` for the number of samples, `len({loader})` for this rank's "
                      "batches")


def plan_rank_streams(plan: Any) -> None:
    """A script that does not seed itself gets one seed on every rank from ddpkit.init (so data prepared before
    training agrees); from its training loop on, each rank draws its own stream again: augmentation a dataset
    draws in `__getitem__` with no loader workers, dropout, noise drawn in the step. The reseed goes before the
    outermost loop around the training step (in a loop over the training loader's scope first), else before the
    entry's statement that starts training."""
    f = plan.f
    if f.seeded_before_init() or plan.reseed:
        return
    entry = ENTRY if f.ctx_global else f.entry_key
    region = {id(s) for s in f.scope_statements(entry)}

    def outermost(key: str, node: cst.CSTNode, loader_loop: bool) -> cst.CSTNode | None:
        found, stmt = None, plan._stmt.get(id(node), node)
        while stmt is not None:
            if isinstance(stmt, (cst.For, cst.While)) and (not loader_loop or found is not None or isinstance(
                    stmt, cst.For) and plan.loop_role(key, stmt) == "train"):
                found = stmt
            stmt = plan._parent.get(id(stmt))
        if found is not None and key in (ENTRY, f.entry_key):
            return found if id(_top(plan, found)) in region else None  # before ddpkit.init: no ctx there
        # a function that runs again (once per epoch) would restart the same streams each time: its caller's
        # statement gets the reseed instead
        return found if found is not None and runs_again(plan, key) is None else None

    for key in sorted(plan.loop_scopes):
        loops = [n for n in plan.nodes(key) if isinstance(n, cst.For) and plan.loop_role(key, n) == "train"]
        found = next((o for o in (outermost(key, n, True) for n in loops) if o is not None), None)
        if found is not None:
            plan.reseed.add(id(found))
            return
    for key in sorted(f.ported):
        for n in plan.nodes(key):
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward":
                found = outermost(key, n, False)
                if found is not None:
                    plan.reseed.add(id(found))
                    return
    for stmt in f.scope_statements(entry):
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            continue
        if any(isinstance(n, cst.Call) and (isinstance(n.func, cst.Attribute) and n.func.attr.value == "backward"
                                            or set(f.callees(n, entry)) & plan.training_scopes)
               for n in walk(stmt)):
            plan.reseed.add(id(stmt))
            return
    handed = hands_to_unported(f)
    if handed is not None:
        plan.reseed.add(id(handed[0]))


def _top(plan: Any, stmt: cst.CSTNode) -> cst.CSTNode:
    """The outermost statement of its scope around `stmt`."""
    while plan._parent.get(id(stmt)) is not None:
        stmt = plan._parent[id(stmt)]
    return stmt
