"""The DDP010 check: a collective (torch.distributed's or ddpkit's) that only some ranks reach, so the job hangs."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ddpkit.lint.analysis import (Script, batchnorm_constructor, distributed_mode, is_main_flag, keyword, terminal,
                                  without_grad)
from ddpkit.lint.callsites import through_reexport
from ddpkit.lint.bindings import path_up, relation, scope_of
from ddpkit.lint.ranks import own_returns
from ddpkit.lint.rules import Hit, check

__all__ = ["collective_in_rank_branch", "one_rank_stops", "ddp_forward_on_some_ranks", "forward_around_wrapper",
           "loop_bound_from_some_ranks", "stop_on_some_ranks_count", "uneven_stride_shards"]

_DDPKIT_COLLECTIVES = frozenset({
    "init", "wrap", "save_checkpoint", "load_checkpoint", "export_state_dict", "register_comm",
    "barrier", "all_reduce_sum", "all_reduce_number", "reduce_mean", "reduce_means", "all_gather_object", "broadcast_object",
    "gather_in_order", "gather_list",
})
"""ddpkit functions every rank must call, each checked against its code: init (init_process_group),
wrap (DDP's constructor, or FSDP's, broadcasts rank 0's parameters), save_checkpoint,
load_checkpoint and export_state_dict (an all-gather and a broadcast), comm.register_comm (maps its
segment with a broadcast; a hook on some ranks only mismatches the gradient exchange), and every
function of ddpkit.collectives."""

_DDPKIT_METHODS = {"init": frozenset({"close"})}
"""Collective methods of what ddpkit returns: Context.close()."""

_TORCH_SHARDING = frozenset({"fully_shard", "FullyShardedDataParallel"})
"""torch.distributed.fsdp's: a module sharded on some ranks only all-gathers in a forward the others never run."""

_KEEP_INSIDE = "keep only rank-local work (torch.save, printing) inside the check"
_DDPKIT_SAVE = "; ddpkit.save_checkpoint is a collective too and must run on every rank (it writes from rank 0 by itself)"
_WHY = {
    "save_checkpoint": "gathers every rank's RNG state and writes the file from rank 0 by itself, so it needs no "
                       "rank check",
    "load_checkpoint": "has rank 0 pick the checkpoint and every rank load it onto its own device, so it needs no "
                       "rank check",
}


@dataclass(frozen=True)
class _Collective:
    """A call that every rank of the group must make."""

    call: ast.Call
    name: str
    """The callee as written: 'dist.all_reduce', 'ddpkit.save_checkpoint', 'ctx.close'."""
    key: str
    """The function's own name, which pairs it with the same collective in another branch."""
    why: str
    """The end of the fix: what may stay inside the rank check, or why no check is needed."""


def _handles(s: Script) -> dict[str, str]:
    """Names bound to what ddpkit.init returns: {'ctx': 'init'}."""
    def made_by(value: ast.AST | None) -> str:
        if isinstance(value, ast.Call) and s.qualname(value.func).startswith("ddpkit.") \
                and terminal(value.func) in _DDPKIT_METHODS:
            return terminal(value.func)
        return ""

    bound = s.assignments + [(item.optional_vars.id, item.context_expr) for item in s.nodes
                             if isinstance(item, ast.withitem) and isinstance(item.optional_vars, ast.Name)]
    return {name: made_by(value) for name, value in bound if not name.startswith(".") and made_by(value)}


def _collective(s: Script, call: ast.Call, handles: dict[str, str]) -> _Collective | None:
    """The collective `call` is (torch.distributed, ddpkit, or a method of a ddpkit object), else None."""
    short = terminal(call.func)
    ddpkit_call = s.qualname(call.func).startswith("ddpkit.") and short in _DDPKIT_COLLECTIVES
    method = isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) \
        and short in _DDPKIT_METHODS.get(handles.get(call.func.value.id, ""), ())
    sharding = s.qualname(call.func).startswith("torch.distributed.") and short in _TORCH_SHARDING
    metric = not (s.is_dist_collective(call) or ddpkit_call or method or sharding) and _syncing_metric(s, call)
    if not (s.is_dist_collective(call) or ddpkit_call or method or sharding or metric):
        return None
    name = ast.unparse(call.func)
    if metric:
        why = ("a torchmetrics metric's compute() all-gathers every rank's state (sync_on_compute=True by default); "
               "compute on every rank and keep only the printing inside the check")
    elif ddpkit_call and short in _WHY:
        why = f"{name}() {_WHY[short]}"
    else:
        why = _KEEP_INSIDE + (_DDPKIT_SAVE if s.uses_ddpkit else "")
    return _Collective(call, name, short, why)


def _metric_values(s: Script, name: ast.Name, depth: int = 0) -> list[ast.AST] | None:
    """The values `name` holds where it is read: its assignments in the function, or, for a parameter, what every
    call of the function in this file passes (followed the same way); None where a value is unknown."""
    if depth > 3:
        return None
    found = [v for _, v in s.local_assignments(name.id, name)]
    if found:
        return None if any(v is None for v in found) else found
    func = next((n for n in _enclosing(s, name) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if func is None:
        return None
    params = [a.arg for a in func.args.args]
    if name.id not in params:
        return None
    at = params.index(name.id)
    calls = [c for c in s.calls if isinstance(c.func, ast.Name) and c.func.id == func.name]
    values: list[ast.AST] = []
    for c in calls:
        arg = next((k.value for k in c.keywords if k.arg == name.id), None)
        if arg is None and at < len(c.args) and not any(isinstance(a, ast.Starred) for a in c.args[:at + 1]):
            arg = c.args[at]
        if not isinstance(arg, ast.Name):
            return None
        more = _metric_values(s, arg, depth + 1)
        if more is None:
            return None
        values.extend(more)
    return values or None


def _enclosing(s: Script, node: ast.AST) -> Iterator[ast.AST]:
    while id(node) in s.parents:
        node = s.parents[id(node)]
        yield node


def _syncing_metric(s: Script, call: ast.Call) -> bool:
    """`metric.compute()` of a torchmetrics metric: it all-gathers every rank's state (sync_on_compute=True, the
    default, once the process group exists), so it is a collective. Every value the name holds is a torchmetrics
    constructor (`MulticlassAccuracy(num_classes=10).to(device)`) that does not switch the sync off."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "compute" and not call.args
            and isinstance(call.func.value, ast.Name)):
        return False
    values = _metric_values(s, call.func.value)
    if not values:
        return False
    for v in values:
        while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in ("to", "cuda"):
            v = v.func.value
        if not (isinstance(v, ast.Call) and s.qualname(v.func).startswith("torchmetrics.")):
            return False
        if any(k.arg in ("sync_on_compute", "dist_sync_fn", "process_group") or k.arg is None for k in v.keywords):
            return False
    return True


def _statement(s: Script, node: ast.AST) -> ast.AST:
    """The statement an expression is part of."""
    parents = s.parents
    while not isinstance(node, ast.stmt) and id(node) in parents:
        node = parents[id(node)]
    return node


def _on_both_sides(s: Script, node: ast.Call, ctx, ifs: dict[int, ast.If],
                   find: Callable[[ast.Call], _Collective | None]) -> bool:
    """A collective inside rank checks each of whose other side makes the same collective (`if rank == 0:
    bcast(data) else: data = bcast(None)`): every rank makes it."""
    mine = find(node)
    if mine is None:
        return False
    for if_id, side, _ in ctx.branches:
        branch = ifs.get(if_id)
        if branch is None or side not in ("body", "else"):
            return False
        other = branch.orelse if side == "body" else branch.body
        if not any(isinstance(n, ast.Call) and (c := find(n)) is not None and c.key == mine.key
                   for stmt in other for n in ast.walk(stmt)):
            return False
    return True


def _helper_collectives(s: Script, find: Callable[[ast.Call], _Collective | None]) -> dict[str, _Collective]:
    """Functions of this file that make a collective whenever they run: name -> the first one.

    Counted are collectives outside any rank check of the function itself (one inside is reported
    where it is), also through calls to other such functions, to a fixed point; the same
    function-by-name model as the guard levels that let DDP004 follow torch.save into helpers.
    """
    steps: dict[str, list[tuple[int, int, _Collective | str]]] = defaultdict(list)
    ifs = {id(n): n for n in s.nodes if isinstance(n, ast.If)}
    for d in s.defs:
        for node in ast.walk(d):
            if not isinstance(node, ast.Call):
                continue
            ctx = s.context(node)
            if ctx.scope != id(d) or ctx.branches and not _on_both_sides(s, node, ctx, ifs, find):
                continue
            found = find(node)
            if found is not None and keyword(node, "group") is None:
                steps[d.name].append((node.lineno, node.col_offset, found))
            elif found is None and s.local_callee(node):
                steps[d.name].append((node.lineno, node.col_offset, s.local_callee(node)))
    reached: dict[str, _Collective] = {}
    changed = True
    while changed:
        changed = False
        for name, body in steps.items():
            if name in reached:
                continue
            for _, _, step in sorted(body, key=lambda item: item[:2]):
                hit = step if isinstance(step, _Collective) else reached.get(step)
                if hit is not None:
                    reached[name], changed = hit, True
                    break
    return reached


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and not isinstance(node.value, bool) and node.value in (0, "0")


def _selects(s: Script, test: ast.AST, depth: int = 0) -> str:
    """Which ranks a rank check lets through: 'zero' (rank 0 only), 'others' (all but rank 0), or '' (unknown)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return {"zero": "others", "others": "zero"}.get(_selects(s, test.operand, depth), "")
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        # `step % k == 0 and master_process`: the other operands only narrow it, so it passes on no rank the rank
        # test would not let through
        picks = {_selects(s, v, depth) for v in test.values} - {""}
        return picks.pop() if len(picks) == 1 else ""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        # `not is_distributed or local_rank == 0`: the mode test is false in a distributed run, so the ranks let
        # through are those the rest lets through
        rest = [v for v in test.values if distributed_mode(v) >= 0]
        picks = {_selects(s, v, depth) for v in rest}
        return picks.pop() if rest and len(rest) < len(test.values) and len(picks) == 1 else ""
    if isinstance(test, (ast.Name, ast.Attribute)):
        if is_main_flag(terminal(test)):
            return "zero"
        return _flag_selects(s, test, depth + 1) if depth < 4 else ""
    if isinstance(test, ast.IfExp) and all(isinstance(a, ast.Constant) and isinstance(a.value, bool)
                                           for a in (test.body, test.orelse)) and test.body.value != test.orelse.value:
        picked = _selects(s, test.test, depth)
        return picked if test.body.value else {"zero": "others", "others": "zero"}.get(picked, "")
    if isinstance(test, ast.Call) and depth < 4:
        return _helper_selects(s, test.func, depth + 1)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return ""
    left, op, right = test.left, type(test.ops[0]), test.comparators[0]
    if _is_zero(left):
        left, right, op = right, left, {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE}.get(op, op)
    if not s.kind(left) or is_main_flag(terminal(left)):
        return ""
    if _is_zero(right):
        return "zero" if op in (ast.Eq, ast.LtE) else "others" if op in (ast.NotEq, ast.Gt) else ""
    if isinstance(right, ast.Constant) and right.value == 1 and not isinstance(right.value, bool):
        return "others" if op is ast.GtE else "zero" if op is ast.Lt else ""
    return ""


def _flag_selects(s: Script, flag: ast.AST, depth: int) -> str:
    """Which ranks a flag set from a rank test lets through (`opts.chatty = rank == 0`, read as `if opts.chatty:`):
    the answer of every rank test assigned to it in the program (an attribute by name, as Script.kind reads it;
    a plain name in its own file), where they agree; constants assigned elsewhere (a single-process True) do
    not count."""
    key = "." + flag.attr if isinstance(flag, ast.Attribute) else flag.id
    homes = s.project.scripts.values() if isinstance(flag, ast.Attribute) and s.project is not None else [s]
    answers = {_selects(h, value, depth) for h in homes for k, value in h.assignments
               if k == key and not isinstance(value, ast.Constant)}
    return answers.pop() if len(answers) == 1 else ""


def _helper_selects(s: Script, func: ast.AST, depth: int) -> str:
    """Which ranks a project rank helper (Script.rank_helpers) answers true for, read from its returns: the same
    answer on every non-constant return (`is_primary()` -> `get_rank() == 0` is 'zero'), '' otherwise."""
    home, name = s, terminal(func)
    local = isinstance(func, ast.Name) or isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) \
        and func.value.id in ("self", "cls")
    if not (local and name in s.rank_helpers):
        target = through_reexport(s.project, s, func) if s.project is not None else None
        if target is None or name not in s.project.scripts[target[0]].rank_helpers:
            return ""
        home = s.project.scripts[target[0]]
    answers = {_selects(home, r.value, depth) for d in home.nodes
               if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == name
               for r in own_returns(d) if r.value is not None and not isinstance(r.value, ast.Constant)}
    return answers.pop() if len(answers) == 1 else ""


def _branch_selects(s: Script, node: ast.AST | None, branch: str) -> str:
    """Which ranks run one branch of a rank check (see `_selects`; Context.branches names the branch)."""
    if isinstance(node, (ast.If, ast.IfExp)):
        test, flip = node.test, branch != "body"  # 'else', or 'after' an `if ...: return`
    elif isinstance(node, ast.BoolOp) and branch.startswith("operand"):
        test, flip = node.values[int(branch[len("operand"):])], isinstance(node.op, ast.Or)
    else:
        return ""
    selected = _selects(s, test)
    return {"zero": "others", "others": "zero"}.get(selected, "") if flip else selected


def _paired(s: Script, branches: set[tuple[int, str]], checks: dict[int, ast.AST]) -> bool:
    """Whether every rank may reach one of these calls: two branches of one check, or checks that
    may complement each other (`if rank != 0: barrier()` ... `if rank == 0: barrier()`). Calls under
    checks that all pass on the same ranks (two `if rank == 0:` blocks) are not paired."""
    if len(branches) < 2:
        return False
    if len({check for check, _ in branches}) < len(branches):
        return True
    selected = {_branch_selects(s, checks.get(check), branch) for check, branch in branches}
    return len(selected) > 1 or "" in selected


@check
def collective_in_rank_branch(s: Script) -> Iterator[Hit]:
    # A collective in a rank branch hangs unless the other ranks reach the same collective in
    # another branch (`if rank == 0: gather(t, lst) else: gather(t)`, or the "rank 0 first" barrier
    # pair), so only collectives whose rank-guarded calls are not paired (see _paired) are reported.
    # A call of a helper function that makes a collective counts as that collective, at the call.
    handles = _handles(s)

    def find(call: ast.Call) -> _Collective | None:
        return _collective(s, call, handles)

    helpers = _helper_collectives(s, find)
    groups: dict[tuple[int, str], list[tuple[ast.Call, tuple[int, str, int], _Collective, str]]] = defaultdict(list)
    for call in s.calls:
        ctx = s.context(call)
        if not ctx.branches:
            continue
        found, helper = find(call), ""
        # group= collectives run on a subgroup, whose members are naturally chosen by rank
        if found is not None and keyword(call, "group") is not None:
            continue
        if found is None:
            helper = s.local_callee(call)
            found = helpers.get(helper)
        if found is None and s.project is not None:  # a helper of another file of the program
            target = s.project.resolve(s, call.func)
            if target is not None:
                other = s.project.scripts[target[0]]
                found = s.project.memo(("helper collectives", target[0]), lambda: _helper_collectives(
                    other, lambda c: _collective(other, c, _handles(other)))).get(target[1])
                helper = terminal(call.func) if found is not None else ""
        if found is not None:
            groups[(ctx.scope, found.key)].append((call, ctx.branches[-1], found, helper))
    checks = {id(n): n for n in s.nodes if isinstance(n, (ast.If, ast.IfExp, ast.BoolOp))}
    for calls in groups.values():
        if _paired(s, {branch[:2] for _, branch, _, _ in calls}, checks):
            continue
        for call, (_, _, line), found, helper in calls:
            if helper:
                # reported at the statement: `self.model.load_state_dict(helper(...))` reads from its first line
                yield Hit(_statement(s, call), "DDP010", "error",
                          f"{helper}() runs {found.name}() (line {found.call.lineno}), a collective that every "
                          f"rank must call, but {helper}() is called only when the rank check on line {line} "
                          "passes: the other ranks never reach it and the job hangs",
                          f"call {helper}() on every rank, before or after the rank check; {found.why}")
            else:
                yield Hit(call, "DDP010", "error",
                          f"{found.name}() is a collective that every rank must call, but it runs only when the "
                          f"rank check on line {line} passes: the other ranks never reach it and the job hangs",
                          f"call {found.name}() on every rank, before or after the rank check; {found.why}")


# ---- one rank leaving, or one rank running DDP's forward -----------------------------------------
_NONFINITE = frozenset({"isfinite", "isnan", "isinf"})
_STOPS = frozenset({"exit", "_exit", "quit"})


def _local_value(s: Script, test: ast.AST) -> str:
    """The name a NaN/Inf check tests, if that value is this rank's own (not reduced across ranks), else ''.
    A value is every rank's where it, or what it is computed from (followed through its function's assignments), went
    through a collective: read from a call that reduces (by its name, or a project function that makes a collective,
    `loss, logs = metric.compute()` of a `compute` that all-reduces its state; `compute()` of a torchmetrics or
    ignite metric), or handed above the check, in the same function, to a collective or to a project function that
    all-reduces that parameter in place (`reduce_value(loss)` of `dist.all_reduce(value)`)."""
    checks = [n for n in ast.walk(test) if isinstance(n, ast.Call) and terminal(n.func) in _NONFINITE]
    for check_call in checks:
        for arg in check_call.args[:1]:
            names = [terminal(n) for n in ast.walk(arg) if isinstance(n, (ast.Name, ast.Attribute))]
            if names and not _reduced_value(s, test, names):
                return names[0]
    return ""


_METRIC_LIBRARIES = ("torchmetrics.", "ignite.metrics.")
"""Libraries whose metric objects reduce every rank's state in `compute()`."""


def _reduced_value(s: Script, test: ast.AST, names: list[str]) -> bool:
    """Whether the values `names` a check at `test` reads are every rank's (see _local_value)."""
    exchanging = s.project.exchanging_functions
    metrics = {k.lstrip(".") for k, v in s.assignments if isinstance(v, ast.Call)
               and s.qualname(v.func).startswith(_METRIC_LIBRARIES)}
    # the assignments of the check's own function (`loss, logs = c.compute()`: each name unpacked from a call
    # comes from the whole call)
    scope = _function_of(s, test)
    pairs = [(terminal(t), n.value) for n in ast.walk(scope)
             if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None
             for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
             for t in ([target] if isinstance(target, (ast.Name, ast.Attribute)) else target.elts
                       if isinstance(target, ast.Tuple) else [])]
    # a name that says it went through a collective, or whose assignments in the file say so
    sources = [v for k, v in s.assignments if k.lstrip(".") in names]
    tokens = names + [terminal(n) for v in sources for n in ast.walk(v)
                      if isinstance(n, (ast.Name, ast.Attribute, ast.Call))]
    if any(re.search("reduce|gather|sync|global", t or "") for t in tokens):
        return True
    seen, todo = set(), list(names)
    while todo:  # what the tested names are computed from, through the function's assignments
        name = todo.pop()
        if name in seen or len(seen) > 50:
            continue
        seen.add(name)
        for k, v in pairs:
            if k.lstrip(".") != name:
                continue
            for n in ast.walk(v):
                if isinstance(n, ast.Call):
                    if terminal(n.func) in exchanging or isinstance(n.func, ast.Attribute) \
                            and n.func.attr == "compute" and terminal(n.func.value) in metrics:
                        return True  # a project function that makes a collective, a library metric's compute()
                elif isinstance(n, (ast.Name, ast.Attribute)):
                    todo.append(terminal(n))
    return _handed_to_collective(s, test, seen)


def _handed_to_collective(s: Script, test: ast.AST, names: set[str]) -> bool:
    """One of `names` is handed, above `test` in its function, to a collective (`dist.all_reduce(loss)`) or to a
    project function that all-reduces that parameter in place: reduced where it stands, every rank's from then on."""
    helpers = _in_place_reducers(s.project)
    for call in ast.walk(_function_of(s, test)):
        if not isinstance(call, ast.Call) or call.lineno >= test.lineno:
            continue
        if _shares_in_place(s, call):
            given = [*call.args[:1], *(k.value for k in call.keywords if k.arg == "tensor")]
        else:
            given = [a for i, a in enumerate(call.args) if i in helpers.get(terminal(call.func), ())]
        if any(terminal(a) in names for a in given if isinstance(a, (ast.Name, ast.Attribute))):
            return True
    return False


_EVERY_RANK_GETS = frozenset({"all_reduce", "broadcast", "allreduce", "bcast"})
"""Collectives that leave their result, in place, in every rank's tensor (`dist.reduce` leaves it in `dst`'s alone)."""


def _shares_in_place(s: Script, call: ast.Call) -> bool:
    return s.is_dist_collective(call) and terminal(call.func).lower() in _EVERY_RANK_GETS


def _function_of(s: Script, node: ast.AST) -> ast.AST:
    """The function around a node (the module where there is none)."""
    while id(node) in s.parents and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node = s.parents[id(node)]
    return node


def _in_place_reducers(project) -> dict[str, set[int]]:
    """Project functions that hand a parameter itself (not a copy) to a torch.distributed collective: name ->
    positions of those parameters (`def reduce_value(value, average=True): dist.all_reduce(value)`)."""
    def compute() -> dict[str, set[int]]:
        out: dict[str, set[int]] = {}
        for x in project.scripts.values():
            for d in x.defs:
                params = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
                if params[:1] in (["self"], ["cls"]):
                    continue  # a method: its positions shift with the receiver
                for call in ast.walk(d):
                    if isinstance(call, ast.Call) and _shares_in_place(x, call):
                        for a in [*call.args[:1], *(k.value for k in call.keywords if k.arg == "tensor")]:
                            if isinstance(a, ast.Name) and a.id in params and not any(
                                    isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and any(
                                        isinstance(t, ast.Name) and t.id == a.id
                                        for t in ast.walk(n.target if not isinstance(n, ast.Assign) else n.targets[0]))
                                    and n.lineno < call.lineno for n in ast.walk(d)):
                                out.setdefault(d.name, set()).add(params.index(a.id))
        return out
    return project.memo("in-place reducers", compute)


def _loop_of(s: Script, node: ast.AST) -> ast.For | ast.While | None:
    """The innermost loop around a node in its function."""
    while id(node) in s.parents:
        node = s.parents[id(node)]
        if isinstance(node, (ast.For, ast.While)):
            return node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return None
    return None


_SIZES = frozenset({"len", "size", "numel", "nelement", "dim"})


def _data_names(value: ast.AST) -> set[str]:
    """The names a value is computed from, leaving out those it only measures (`len(x)`, `x.size(0)`, `x.shape`):
    `seen += x.numel()` counts the batch, it is not a figure of its contents."""
    out, todo = set(), [value]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Call) and terminal(node.func) in _SIZES or \
                isinstance(node, ast.Attribute) and node.attr in ("shape", "ndim"):
            continue
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            out.add(f"self.{node.attr}")  # an attribute of the object is its own value, not all of `self`
            continue
        if isinstance(node, ast.Name):
            out.add(node.id)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _step_value(s: Script, test: ast.AST, loop: ast.AST | None) -> str:
    """The name a stop condition tests, if it is computed in the loop from the same forward as the loss the loop
    backpropagates (`approx_kl` beside `loss` from one batch's `ratio`): a figure of this rank's own batch.
    Not when that value (or what it is computed from) goes through a collective, nor for a loop without a
    backward; counters and settings (`step`, `args.target_kl`, `self.it += 1` also where the loss reads it) are not
    computed from the batch."""
    if loop is None:
        return ""
    reads: dict[str, set[str]] = defaultdict(set)
    backward: set[str] = set()
    carried: set[str] = set()
    for n in ast.walk(loop):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and n.value is not None:
            names = _data_names(n.value)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                for m in _data_names(t):
                    reads[m] |= names
        elif isinstance(n, ast.Call):
            if terminal(n.func) == "backward" and isinstance(n.func, ast.Attribute):
                backward |= _data_names(n.func.value)
            elif s.is_dist_collective(n) or re.search("reduce|gather|sync", terminal(n.func).lower()):
                carried |= {m for a in n.args for m in _data_names(a)}

    def ancestry(names: set[str]) -> set[str]:
        seen, todo = set(), [n for n in names if n in reads]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(r for r in reads.get(name, ()) if r in reads)
        return seen

    from_loss = ancestry(backward)
    tested = {f"self.{m.attr}" for m in ast.walk(test) if isinstance(m, ast.Attribute)
              and isinstance(m.value, ast.Name) and m.value.id == "self"}
    for name in sorted(tested | {m.id for m in ast.walk(test) if isinstance(m, ast.Name) and m.id != "self"}):
        own = ancestry({name})
        # (a counter, `self.it += 1`, reads nothing else in the loop: the same on every rank, even where the loss
        # is computed from it, `T = self.t_fn(self.it)`)
        if name in reads and reads[name] - {name} and own & from_loss and not own & carried:
            return name
    return ""


def _stop_in(body: list[ast.stmt]) -> ast.AST | None:
    for stmt in body:
        if isinstance(stmt, (ast.Return, ast.Break, ast.Raise)):
            return stmt
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and terminal(stmt.value.func) in _STOPS:
            return stmt.value
    return None


def _exits(s: Script, node: ast.AST) -> bool:
    """A statement that ends the process: `sys.exit()`, `exit()`, `quit()`, `os._exit(n)`, `raise SystemExit`."""
    if isinstance(node, ast.Raise):
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return exc is not None and terminal(exc) == "SystemExit"
    if not (isinstance(node, ast.Call) and isinstance(s.parents.get(id(node)), ast.Expr)):
        return False
    name = s.qualname(node.func)
    return name in ("sys.exit", "os._exit") or isinstance(node.func, ast.Name) and node.func.id in ("exit", "quit") \
        and "exit" not in s.function_names and "quit" not in s.function_names


def _loop_waits(s: Script, stop: ast.Break) -> bool:
    """Whether the loop a `break` leaves makes the ranks wait for each other: a backward (DDP's all-reduce),
    a collective, or a call of a project function (which may make one) inside it."""
    node, parents = stop, s.parents
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (ast.For, ast.While)):
            calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
            return any(terminal(c.func) == "backward" or s.is_dist_collective(c) or s.local_callee(c)
                       or s.project.resolve(s, c.func) is not None or terminal(c.func) in s.project.reducing_functions
                       for c in calls)
    return True


@check
def one_rank_stops(s: Script) -> Iterator[Hit]:
    if not (s.distributed or s.project.distributed):
        return
    for node in s.nodes:
        if isinstance(node, ast.If):
            stop, value = _stop_in(node.body), _local_value(s, node.test)
        elif isinstance(node, ast.Assert):
            stop, value = node, _local_value(s, node.test)
        else:
            continue
        step_value = ""
        if stop is not None and not value and isinstance(stop, (ast.Break, ast.Return)):
            # `if approx_kl > args.target_kl: break`: a stop on a figure of this rank's own batch
            step_value = _step_value(s, node.test, _loop_of(s, node))
        if stop is None or not (value or step_value) or not s.in_loop(node) or s.context(node).single:
            continue
        if step_value:
            if isinstance(stop, ast.Break) and not _loop_waits(s, stop):
                continue
            yield Hit(stop, "DDP010", "error",
                      f"this rank stops ({ast.unparse(stop).split('(')[0]}) on its own '{step_value}', computed "
                      "from its own batch and never reduced: the other ranks' values differ, so they go on to the "
                      "next collective (DDP's gradient all-reduce) and wait there for this rank until the job "
                      "times out",
                      "decide on every rank together: all-reduce the value (or a stop flag) first, then every rank "
                      "stops or goes on alike")
            continue
        if isinstance(stop, ast.Break) and not _loop_waits(s, stop):
            continue  # `for p in model.parameters(): ... break` leaves a scan, not the loop the ranks share
        how = "an assert" if isinstance(stop, ast.Assert) else ast.unparse(stop).split("(")[0]
        yield Hit(stop, "DDP010", "error",
                  f"this rank stops ({how}) when its own '{value}' is not finite, but the other ranks' values "
                  "can be finite: they go on to the next collective (DDP's gradient all-reduce) and wait there "
                  "for this rank until the job times out",
                  "decide on every rank together: flag = torch.tensor(float(not ok)); dist.all_reduce(flag); "
                  "then every rank skips the step or stops when flag > 0")


@check
def ddp_forward_on_some_ranks(s: Script) -> Iterator[Hit]:
    wrapped = {k for k, v in s.assignments
               if isinstance(v, ast.Call) and s.qualname(v.func).endswith("DistributedDataParallel")}
    if not wrapped:
        return
    parents = s.parents
    # DDP broadcasts rank 0's buffers (BatchNorm statistics) in every forward, gradients or not
    broadcasts = {k for k, v in s.assignments if isinstance(v, ast.Call) and k in wrapped and not any(
        kw.arg in ("broadcast_buffers", "forward_sync_buffers") and isinstance(kw.value, ast.Constant)
        and not kw.value.value
        for kw in v.keywords)} if s.project.memo("buffers", lambda: _has_buffers(s.project)) else set()
    for call in s.calls:
        func = call.func.value if isinstance(call.func, ast.Attribute) and call.func.attr == "forward" else call.func
        key = func.id if isinstance(func, ast.Name) else "." + func.attr if isinstance(func, ast.Attribute) else ""
        ctx = s.context(call)
        if key not in wrapped or not ctx.branches or ctx.single or _before_the_wrap(s, call, key):
            continue
        if _wrapped_in_the_same_arm(s, call, key, ctx.branches[-1][0]):
            continue  # (only the ranks the check picks build the DDP model: every rank that holds it runs this)
        if key not in broadcasts and _frozen_before(s, call, key.lstrip(".")):
            continue  # no parameter needs a gradient and no buffer is broadcast: this forward starts no collective
        if without_grad(s, call, parents):
            if key in broadcasts and _selects(s, _branch_test(s, ctx)) in ("zero", "others"):
                yield Hit(call, "DDP010", "error",
                          f"the DistributedDataParallel model runs forward only when the rank check on line "
                          f"{ctx.branches[-1][2]} passes; even under no_grad DDP broadcasts the model's buffers "
                          "(BatchNorm statistics) from rank 0 in forward, a collective the other ranks never join, "
                          "so the job hangs",
                          "evaluate the unwrapped model (model.module) inside the rank check, or run the forward "
                          "on every rank (or wrap with broadcast_buffers=False)")
            continue
        yield Hit(call, "DDP010", "error",
                  f"the DistributedDataParallel model runs forward with gradients only when the rank check on "
                  f"line {ctx.branches[-1][2]} passes: DDP synchronises buffers and prepares the gradient "
                  "all-reduce in forward, so the ranks fall out of step and the job hangs",
                  "run the forward on every rank, or evaluate under torch.no_grad() on the unwrapped model "
                  "(model.module) inside the rank check")
    yield from _forward_in_helper(s, broadcasts)


def _wrapped_in_the_same_arm(s: Script, call: ast.Call, key: str, branch: int) -> bool:
    """`if local_rank < num_gpus: model = DDP(...)` ... `model(x)` in the same arm of that rank check: the ranks
    the check leaves out never hold the model (nor join its group), so it is no forward on some ranks only."""
    test = next((n for n in s.nodes if id(n) == branch and isinstance(n, ast.If)), None)
    if test is None:
        return False
    wraps = [v for k, v in s.assignments if k == key and isinstance(v, ast.Call)
             and s.qualname(v.func).endswith("DistributedDataParallel")]

    def arm(node: ast.AST) -> str:
        inside = {id(n): name for name in ("body", "orelse") for stmt in getattr(test, name) for n in ast.walk(stmt)}
        return inside.get(id(node), "")

    where = arm(call)
    return bool(where) and bool(wraps) and all(arm(w) == where for w in wraps)


def _before_the_wrap(s: Script, call: ast.Call, key: str) -> bool:
    """`model(x)` in straight-line code of a function that wraps `model = DDP(model)` only further down: the
    forward runs the plain module, which starts no collective (not inside a loop, which may come back to it
    after the wrap)."""
    if key.startswith("."):
        return False
    wraps = [v for v in s.local_values(key, call)
             if isinstance(v, ast.Call) and s.qualname(v.func).endswith("DistributedDataParallel")]
    if not wraps or any(v.lineno <= call.lineno for v in wraps):
        return False
    node = call
    while id(node) in s.parents:
        node = s.parents[id(node)]
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            return False
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            break
    return True


def _forward_in_helper(s: Script, broadcasts: set[str]) -> Iterator[Hit]:
    """`if rank == 0: test(model, loader)` where test() runs the DDP model it is handed under no_grad: the
    buffer broadcast of that forward happens on the ranks the check picks alone (reported at the call)."""
    defs = {d.name: d for d in s.defs}
    for call in s.calls:
        ctx = s.context(call)
        d = defs.get(call.func.id) if isinstance(call.func, ast.Name) else None
        if d is None or not ctx.branches or ctx.single or _selects(s, _branch_test(s, ctx)) not in ("zero", "others"):
            continue
        params = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
        given = {params[i]: a for i, a in enumerate(call.args) if i < len(params)}
        given.update((k.arg, k.value) for k in call.keywords if k.arg)
        handed = {p for p, a in given.items() if isinstance(a, ast.Name) and a.id in broadcasts}
        # the module-level DDP model the helper reads itself (`def estimate_loss(): ... model(X, Y)`)
        handed |= _globals_read(d, broadcasts, params) if d in s.tree.body else set()
        inner = next((c for c in ast.walk(d) if isinstance(c, ast.Call) and (
            isinstance(c.func, ast.Name) and c.func.id in handed or isinstance(c.func, ast.Attribute)
            and c.func.attr == "forward" and isinstance(c.func.value, ast.Name) and c.func.value.id in handed)
            and without_grad(s, c, s.parents) and not s.context(c).branches), None)
        if inner is None:
            continue
        yield Hit(call, "DDP010", "error",
                  f"{d.name}() runs the DistributedDataParallel model forward (line {inner.lineno}) under no_grad, "
                  f"and it is called only when the rank check on line {ctx.branches[-1][2]} passes; DDP broadcasts "
                  "the model's buffers (BatchNorm statistics) from rank 0 in every forward, a collective the other "
                  "ranks never join, so the job hangs",
                  f"hand {d.name}() the unwrapped model (model.module), or call it on every rank (or wrap with "
                  "broadcast_buffers=False)")


def _globals_read(d: ast.AST, broadcasts: set[str], params: list[str]) -> set[str]:
    """The module-level names of `broadcasts` that a module-level function reads without binding them itself."""
    bound = set(params) | {a.arg for a in (*d.args.kwonlyargs, d.args.vararg, d.args.kwarg) if a is not None} | {
        n.id for n in ast.walk(d) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    return {n.id for n in ast.walk(d) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            and n.id in broadcasts and n.id not in bound}


def _freezers(project) -> set[str]:
    """Project functions that set `.requires_grad` of a model's parameters to one of their own parameters
    (`def requires_grad(model, flag): for p in model.parameters(): p.requires_grad = flag`)."""
    found = set()
    for x in project.scripts.values():
        for d in x.defs:
            params = {a.arg for a in d.args.args}
            if any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "requires_grad"
                                                     for t in n.targets)
                   and isinstance(n.value, ast.Name) and n.value.id in params for n in ast.walk(d)):
                found.add(d.name)
    return found


def _grad_switch(s: Script, stmt: ast.AST, name: str, depth: int = 0) -> bool | None:
    """The last `requires_grad` setting a statement makes for the model named `name`: `name.requires_grad_(f)`,
    `requires_grad(name, f)` through a project freezer, or inside a function of this file it calls."""
    freezers = s.project.memo("freezers", lambda: _freezers(s.project))
    last = None
    calls = sorted((n for n in ast.walk(stmt) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for c in calls:
        flag: ast.AST | None = None
        if isinstance(c.func, ast.Attribute) and c.func.attr == "requires_grad_" and terminal(c.func.value) == name:
            flag = c.args[0] if c.args else ast.Constant(True)
        elif terminal(c.func) in freezers and c.args and terminal(c.args[0]) == name:
            flag = c.args[1] if len(c.args) > 1 else ast.Constant(None)
        elif depth == 0 and s.local_callee(c):
            for d in (d for d in s.defs if d.name == s.local_callee(c)):
                inner = _grad_switch(s, ast.Module(body=d.body, type_ignores=[]), name, 1)
                last = inner if inner is not None else last
            continue
        if flag is not None:
            last = flag.value if isinstance(flag, ast.Constant) and isinstance(flag.value, bool) else True
    return last


def _frozen_before(s: Script, call: ast.Call, name: str) -> bool:
    """The statements that run before `call` in its function last turned the model's gradients off."""
    node, parents = call, s.parents
    while id(node) in parents:
        parent = parents[id(node)]
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and node in block:
                for stmt in reversed(block[:block.index(node)]):
                    switch = _grad_switch(s, stmt, name)
                    if switch is not None:
                        return switch is False
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        node = parent
    return False


def _has_buffers(project) -> bool:
    """Some module of the program holds buffers DDP broadcasts: BatchNorm layers or register_buffer, or a library
    network of a BatchNorm architecture (`torchvision.models.resnet18()`)."""
    return any(isinstance(n, (ast.Name, ast.Attribute)) and re.fullmatch(
        r"(Sync)?BatchNorm([123]d)?|register_buffer|InstanceNorm[123]d", terminal(n))
        or isinstance(n, ast.Call) and batchnorm_constructor(x, n) is not None
        for x in project.scripts.values() for n in x.nodes)


def _branch_test(s: Script, ctx) -> ast.AST | None:
    """The test of the innermost rank check around a node (negated for its else branch), else None."""
    check_id, branch, _ = ctx.branches[-1]
    node = next((n for n in s.nodes if id(n) == check_id), None)
    if not isinstance(node, (ast.If, ast.IfExp)):
        return None
    return node.test if branch == "body" else ast.UnaryOp(ast.Not(), node.test)


# ---- loops whose length only some ranks know ------------------------------------------------------
def _rank_only_names(s: Script) -> dict[str, int]:
    """Plain names (re)assigned inside the body of a rank check (`if rank == 0: start_epoch = ...`): {name: line}."""
    found: dict[str, int] = {}
    for node in s.nodes:
        if isinstance(node, ast.If) and s.kind(node.test) and distributed_mode(node.test) == 0:
            for stmt in node.body:
                for sub in ast.walk(stmt):
                    if isinstance(sub, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        for t in targets:
                            if isinstance(t, ast.Name) and not _stores_held_value(s, sub, t.id):
                                found.setdefault(t.id, node.lineno)
    # a value every rank receives afterwards (broadcast, all_reduce, or rebuilt from one) is shared again
    shared = {n.id for c in s.calls if s.is_dist_collective(c) or re.search(r"broadcast|reduce|gather|sync",
                                                                            terminal(c.func).lower())
              for a in (*c.args, *(k.value for k in c.keywords)) for n in ast.walk(a) if isinstance(n, ast.Name)}
    for key, value in s.assignments:
        if not key.startswith(".") and any(isinstance(n, ast.Name) and n.id in shared for n in ast.walk(value)):
            shared.add(key)
    return {name: line for name, line in found.items() if name not in shared and not s.kind(ast.Name(name))}


def _stores_held_value(s: Script, stmt: ast.AST, name: str) -> bool:
    """`start_epoch = 0` under a rank check where every rank already holds that value: the same constant (or the
    same expression of no call) stored in the same function by a statement outside any rank check that always
    runs before it, with no other store between (stores in the other arm of an `if` around it do not count). The
    rank check changes nothing, so the name does not become rank-dependent."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1 or any(
            isinstance(n, ast.Call) for n in ast.walk(stmt.value)):
        return False
    parents = s.parents
    written, scope, where = ast.dump(stmt.value), scope_of(stmt, parents), (stmt.lineno, stmt.col_offset)
    use_path = path_up(stmt, parents)
    earlier = [(b, v) for b, v in s._bindings.get(name, ()) if (b.lineno, b.col_offset) < where
               and scope_of(b, parents) is scope]
    for before, value in reversed(earlier):
        how = relation(before, use_path, parents)
        if how == "exclusive":
            continue
        if value is None or ast.dump(value) != written or s.context(before).level:
            return False
        if how == "before":
            return True
    return False


@check
def loop_bound_from_some_ranks(s: Script) -> Iterator[Hit]:
    if not (s.distributed or s.project.distributed):
        return
    names = _rank_only_names(s)
    if not names:
        return
    wrapped = {k for k, v in s.assignments if isinstance(v, ast.Call) and
               s.qualname(v.func).endswith("DistributedDataParallel")}
    for loop in s.nodes:
        if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and terminal(loop.iter.func) == "range":
            bound = loop.iter
        elif isinstance(loop, ast.While):
            bound = loop.test
        else:
            continue
        used = next((n.id for n in ast.walk(bound) if isinstance(n, ast.Name) and n.id in names), None)
        if used is None or s.context(loop).level or s.context(loop).single:
            continue
        body = [c for c in ast.walk(loop) if isinstance(c, ast.Call)]
        syncs = next((c for c in body if s.is_dist_collective(c) or terminal(c.func) == "backward" and wrapped
                      or (isinstance(c.func, ast.Name) and c.func.id in wrapped) or _syncs_in_callee(s, c, wrapped)),
                     None)
        if syncs is None:
            continue
        yield Hit(loop, "DDP010", "error",
                  f"the loop's length depends on '{used}', which only the ranks passing the rank check on line "
                  f"{names[used]} set: the ranks run different numbers of iterations, and those that go on wait in "
                  f"the next collective (line {syncs.lineno}) for ranks that have stopped",
                  f"broadcast '{used}' from rank 0 before the loop (dist.broadcast_object_list([{used}], src=0)), "
                  "or compute it on every rank")


@check
def stop_on_some_ranks_count(s: Script) -> Iterator[Hit]:
    """`if bad_epochs >= patience: break` in the training loop, where `bad_epochs` is only updated under a rank
    check (`if rank == 0: ... bad_epochs += 1`) and never shared: those ranks leave the loop, the others go on."""
    if not (s.distributed or s.project.distributed):
        return
    names = _rank_only_names(s)
    for node in s.nodes:
        stop = _stop_in(node.body) if isinstance(node, ast.If) else None
        if not isinstance(stop, (ast.Break, ast.Return)) or s.context(node).level or s.context(node).single \
                or _loop_of(s, node) is None or not _loop_waits(s, stop):
            continue
        used = next((n.id for n in ast.walk(node.test) if isinstance(n, ast.Name) and n.id in names
                     and _set_in_scope(s, n.id, names[n.id], node)), None)
        if used is None:
            continue
        yield Hit(node, "DDP010", "error",
                  f"this stop tests '{used}', which only the ranks passing the rank check on line {names[used]} "
                  f"update: they leave the loop ({ast.unparse(stop)}) on their own, and the other ranks go on to "
                  "the next collective (DDP's gradient all-reduce) and wait there until the job times out",
                  f"update '{used}' on every rank (from a figure all ranks share), or broadcast it from rank 0 "
                  f"before the test (dist.broadcast_object_list([{used}], src=0))")


def _set_in_scope(s: Script, name: str, line: int, node: ast.AST) -> bool:
    """The rank check on `line` that sets `name` sits in the same function as `node`."""
    scope = scope_of(node, s.parents)
    return any(isinstance(n, ast.If) and n.lineno == line and scope_of(n, s.parents) is scope for n in s.nodes)


def _syncs_in_callee(s: Script, call: ast.Call, wrapped: set[str]) -> bool:
    """A call of a project function (this file's or another's) that makes a collective, or that is handed the
    DDP model and runs a backward (`train(cfg, loader, model, ...)` doing `loss.backward()`)."""
    found = s.project.callee(s, call)
    if found is None:
        return False
    home, name = found
    handed = any(isinstance(a, ast.Name) and a.id in wrapped for a in (*call.args, *(k.value for k in call.keywords)))
    inner = [c for d in home.defs if d.name == name for c in ast.walk(d) if isinstance(c, ast.Call)]
    return any(home.is_dist_collective(c) or handed and terminal(c.func) == "backward" for c in inner)


@check
def break_on_some_ranks(s: Script) -> Iterator[Hit]:
    """`if rank == 0: ... break` inside a loop that backpropagates or makes collectives: only the ranks the check
    picks leave it; the others go on to the loop's next collective and wait there alone."""
    if not (s.distributed or s.project.distributed):
        return
    parents = s.parents
    checks = {id(n): n for n in s.nodes if isinstance(n, ast.If)}
    for stop in s.nodes:
        if not (isinstance(stop, ast.Break) or _exits(s, stop)) or s.context(stop).single:
            continue
        loop = _loop_of(s, stop)
        if loop is None or not _loop_waits(s, stop):
            continue
        inside = s.context(stop).branches[len(s.context(loop).branches):]
        picked = [(checks[check], branch) for check, branch, _ in inside if check in checks]
        if s.context(stop).level <= s.context(loop).level or not picked or any(
                _branch_selects(s, check, branch) not in ("zero", "others") or _stop_in(
                    check.orelse if branch == "body" else check.body) is not None for check, branch in picked):
            continue
        check = picked[0][0]
        if not isinstance(stop, ast.Break):
            yield Hit(stop, "DDP010", "error",
                      f"{ast.unparse(stop.func if isinstance(stop, ast.Call) else stop)} ends the process inside a "
                      f"loop only on the ranks the check at line {check.lineno} (`{ast.unparse(check.test)}`) lets "
                      "through; the other ranks go on to the loop's next collective (DDP's gradient all-reduce) and "
                      "wait there for them until the job times out",
                      "decide on every rank together: let rank 0 set a stop flag, broadcast it "
                      "(dist.broadcast(flag, src=0)), then every rank leaves the loop when the flag is set and exits "
                      "after destroy_process_group()")
            continue
        yield Hit(stop, "DDP010", "error",
                  f"this break leaves the loop only on the ranks the check at line {check.lineno} "
                  f"(`{ast.unparse(check.test)}`) lets through; the other ranks go on to the loop's next "
                  "collective (DDP's gradient all-reduce) and wait there for them until the job times out",
                  "decide on every rank together: let rank 0 set a stop flag, broadcast it "
                  "(dist.broadcast(flag, src=0)), then every rank breaks when the flag is set")


def _evened(s: Script, sliced: ast.AST, before: ast.AST) -> bool:
    """The function of `before` grows or cuts the sliced sequence first (`indices += indices[:pad]`,
    `indices = indices[:total]`, `indices.extend(...)`): its length may be made a multiple of the world size."""
    key, scope = ast.unparse(sliced), s.context(before).scope
    for n in s.nodes:
        if getattr(n, "lineno", before.lineno) >= before.lineno or s.context(n).scope != scope:
            continue
        if isinstance(n, ast.AugAssign) and ast.unparse(n.target) == key or isinstance(n, ast.Assign) and any(
                ast.unparse(t) == key for t in n.targets) and any(ast.unparse(m) == key for m in ast.walk(n.value)):
            return True  # (built from itself: a first `batches = [...]` evens nothing)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("extend", "append") \
                and ast.unparse(n.func.value) == key:
            return True
    return False


def _deals_batches(s: Script, c: ast.ClassDef, part: ast.Subscript) -> bool:
    """Each item the stride slice keeps is one step: the class is a batch sampler (handed to a DataLoader as
    `batch_sampler=` in the program) whose `__iter__` hands out the kept items as they are (`iter(self.batches)`,
    `yield from ...`, `for b in ...: yield b`), not samples it groups into batches afterwards."""
    handed = {terminal(v) for x in s.project.scripts.values() for call in x.calls
              if (v := keyword(call, "batch_sampler")) is not None}
    built = {k.lstrip(".") for x in s.project.scripts.values() for k, v in x.assignments
             if isinstance(v, ast.Call) and terminal(v.func) == c.name}
    if not handed & (built | {c.name}):
        return False
    stored = s.parents.get(id(part))
    kept = {ast.unparse(t) for t in stored.targets} if isinstance(stored, ast.Assign) else {ast.unparse(part)}
    method = next(d for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "__iter__")
    for n in ast.walk(method):
        given = n.args[0] if isinstance(n, ast.Call) and terminal(n.func) == "iter" and n.args else \
            n.value if isinstance(n, ast.YieldFrom) else n.iter if isinstance(n, ast.For) and any(
                isinstance(y, ast.Yield) and y.value is not None and ast.unparse(y.value) == ast.unparse(n.target)
                for y in ast.walk(n)) else None
        if given is not None and ast.unparse(given) in kept:
            return True
    return False


@check
def uneven_stride_shards(s: Script) -> Iterator[Hit]:
    """`self.batches[self.rank::self.world_size]` in a sampler (a class that defines `__iter__`): rank r gets
    ceil((n - r) / world_size) batches, so when n is not a multiple of the world size the ranks' epochs differ in
    length and the ranks with one more batch wait in its DDP all-reduce."""
    if not any(x.uses_ddp for x in s.project.scripts.values()):
        return
    for c in (n for n in s.nodes if isinstance(n, ast.ClassDef)):
        if not any(isinstance(d, ast.FunctionDef) and d.name == "__iter__" for d in c.body):
            continue
        for n in ast.walk(c):
            if not (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and n.slice.upper is None
                    and n.slice.lower is not None and n.slice.step is not None
                    and not isinstance(n.slice.step, ast.Constant) and s.kind(n.slice.lower)
                    and not s.kind(n.slice.step) and s.project.runs(s, n)):
                continue
            if _evened(s, n.value, n) or not _deals_batches(s, c, n):
                continue
            yield Hit(n, "DDP010", "error",
                      f"{ast.unparse(n)} gives rank r ceil((n - r) / {ast.unparse(n.slice.step)}) of the n batches: "
                      "unless n is a multiple of the world size, some ranks run one more DDP step than the others "
                      "and wait in its gradient all-reduce until the job times out",
                      "even the shards first: drop the last n % world_size batches (or repeat some) before taking "
                      "every world_size-th, as DistributedSampler does")
