"""Findings that rest on a path the rank-guard reader could not read: left out (precision by doubt).

An every-rank finding (DDP004's "no rank check", DDP005's missing map_location, DDP006's "every rank writes",
DDP008) claims that all ranks run the line. Where something on the line's path reads a value that may differ
between ranks and the guard reader did not resolve it, the claim is a guess: an enclosing condition or an early
`return`/`continue` above the line in its function, the conditions around every call of that function (or a rank
value it is given for the parameter the condition tests), or, for a log line, a logging set-up made under such a
condition. A condition every rank reads alike (`if args.distributed:`, `if torch.cuda.is_available():`,
`if gpu is not None:`) is no doubt.
"""

from __future__ import annotations

import ast

from ddpkit.lint.ranks import (GLOBAL_ENV, LOCAL_ENV, NONE, distributed_mode, is_gpu_index, rank_side, run_sense,
                              spawn_index_names, terminal)

__all__ = ["doubted", "library_logger"]

_RULES = frozenset({"DDP004", "DDP005", "DDP006", "DDP008"})
_RANK_TOKENS = frozenset({"rank", "rank0", "ranks"})
_LEAD_TOKENS = frozenset({"master", "primary", "chief", "leader", "main"})
"""Name parts of a value that says which process this is (`node_rank`, `is_master_proc()`, `self.primary`)."""
_DEVICE_NAMES = frozenset({"gpu", "gpu_id", "gpu_idx", "local_gpu"})
_STOPS = (ast.Return, ast.Continue, ast.Break, ast.Raise)
_SETUP = frozenset({"setLevel", "addHandler", "removeHandler", "basicConfig", "disable", "dictConfig"})
_DEPTH = 3


def doubted(script, hit) -> bool:
    """Whether the every-rank claim of `hit` rests on a path through a per-rank value nothing resolved."""
    if hit.rule not in _RULES or script.context(hit.node).level != NONE:
        return False
    if hit.rule == "DDP006" and "every rank" not in hit.message:
        return False
    if hit.rule == "DDP008" and "logging" in hit.message and _logging_set_up_by_rank(script.project):
        return True
    return _path_doubt(script, hit.node, _DEPTH, set()) is not None


def _path_doubt(s, node: ast.AST, depth: int, seen: set[int]) -> tuple | None:
    """The first doubtful condition on the path to `node`: (the `if`, the branch taken, the test) or None."""
    parents = s.parents
    child = node
    while (parent := parents.get(id(child))) is not None:
        if isinstance(parent, (ast.If, ast.While, ast.IfExp)) and child is not parent.test \
                and _reads_rank(s, parent.test, parent):
            orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
            if not _every_rank_takes(s, parent, child in orelse):
                return parent, child in orelse, parent.test
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and child in block:
                for earlier in block[:block.index(child)]:
                    if isinstance(earlier, ast.If) and any(b and isinstance(b[-1], _STOPS)
                                                           for b in (earlier.body, earlier.orelse)) \
                            and _reads_rank(s, earlier.test, earlier):
                        return earlier, not (earlier.body and isinstance(earlier.body[-1], _STOPS)), earlier.test
                    if isinstance(earlier, ast.Expr) and isinstance(earlier.value, ast.Call) \
                            and isinstance(earlier.value.func, ast.Attribute) \
                            and _made_on_some_ranks(s, earlier.value.func.value, earlier):
                        # `self.writer.close()` where only some ranks hold a writer: the others raise there
                        return earlier, False, earlier.value.func.value
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return _callers_doubt(s, parent, depth - 1, seen) if depth > 0 else None
        child = parent
    return None


def _callers_doubt(s, func: ast.AST, depth: int, seen: set[int]) -> tuple | None:
    """Every call of `func` in the program sits on a doubtful path, and no two of them sit on the two sides of
    one rank test (`if rank == 0: f() else: f()`, or `if rank == 0: f()` then `if rank != 0: f()`: every rank
    calls it)."""
    if id(func) in seen:
        return None
    seen.add(id(func))
    sites = _call_sites(s.project, func.name)
    found = [_path_doubt(cs, call, depth, seen) for cs, call in sites]
    if not found or any(f is None for f in found):
        return None
    sides = {(id(f[0]), f[1]) for f in found}
    if any((i, not b) in sides for i, b in sides):
        return None
    plain = {rank_side(f[2], "orelse" if f[1] else "body") for f in found} - {None}
    if any((expr, not zero) in plain for expr, zero in plain):
        return None
    return found[0]


def _every_rank_takes(s, branch: ast.AST, in_orelse: bool) -> bool:
    """`if save_cur:` testing a parameter, where a call made on every rank (no rank check around it) passes a
    constant (or leaves a constant default) that takes this branch: every rank reaches it, whatever the other
    calls pass."""
    test, negated = branch.test, False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negated = test.operand, True
    if not isinstance(test, ast.Name):
        return False
    params = _enclosing_params(s, branch)
    if test.id not in params:
        return False
    func, position = params[test.id]
    args = [*func.args.posonlyargs, *func.args.args]
    defaults = dict(zip([a.arg for a in args][len(args) - len(func.args.defaults):], func.args.defaults))
    defaults.update({a.arg: d for a, d in zip(func.args.kwonlyargs, func.args.kw_defaults) if d is not None})
    method = position > 0 and args[0].arg in ("self", "cls")
    for cs, call in _call_sites(s.project, func.name):
        if cs.context(call).level != NONE:
            continue
        given = next((k.value for k in call.keywords if k.arg == test.id), None)
        index = position - 1 if method and isinstance(call.func, ast.Attribute) else position
        if given is None and 0 <= index < len(call.args) and not isinstance(call.args[index], ast.Starred):
            given = call.args[index]
        given = given if given is not None else defaults.get(test.id)
        if isinstance(given, ast.Constant) and (bool(given.value) != negated) != in_orelse:
            return True
    return False


def _call_sites(project, name: str) -> list:
    def compute():
        found: dict[str, list] = {}
        for script in project.scripts.values():
            for call in script.calls:
                found.setdefault(terminal(call.func), []).append((script, call))
        return found
    return [(cs, c) for cs, c in project.memo("doubt call sites", compute).get(name, ())
            if project.runs(cs, c)]


def _reads_rank(s, test: ast.AST, at: ast.AST, depth: int = 1) -> bool:
    """`test` reads a value that may differ between ranks (not a test every rank answers alike)."""
    if distributed_mode(test):
        return False
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and s.before_init(test):
        return False  # `is_main_process()` that answers True without a process group, asked before it exists
    if isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.Or) and any(distributed_mode(v) or not _reads_rank(s, v, at, depth)
                                               for v in test.values):
            # `not args.multiprocessing_distributed or rank % n == 0`, `local_rank is None or local_rank == 0`:
            # an arm every rank answers alike can pass on every rank; the guard reader decides from the program
            # whether it does (where the process group starts), so that is no guess
            return False
        if isinstance(test.op, ast.And) and any(run_sense(v) for v in test.values):
            # `n_gpus == 1 and rank != 0`: only a one-process (or one-GPU) run takes it, as the reader says
            return False
        return any(_reads_rank(s, v, at, depth) for v in test.values)
    if isinstance(test, ast.UnaryOp):
        return _reads_rank(s, test.operand, at, depth)
    if isinstance(test, ast.Compare):
        if len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) \
                and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
            # `gpu is not None`: every rank was given a device or none was; only an object made on some ranks
            # alone (`writer = SummaryWriter() if rank == 0 else None`) makes a None test pick ranks, also when the
            # callers hand it over as a parameter (Script.kind reads `=train(writer)`, see callsites._flag_parameters)
            return _made_on_some_ranks(s, test.left, at) or s.kind(test) != NONE
        return any(_value_per_rank(s, e, at, depth) for e in (test.left, *test.comparators))
    if isinstance(test, ast.Attribute) and is_gpu_index(test.attr) and s.test_kind(test) == NONE:
        return False  # `if cfg.mode.gpu:` asks whether the run uses GPUs (see Script.test_kind)
    if isinstance(test, (ast.Name, ast.Attribute, ast.Subscript)):
        return _value_per_rank(s, test, at, depth) or _made_on_some_ranks(s, test, at)
    return _value_per_rank(s, test, at, depth)


def _value_per_rank(s, expr: ast.AST, at: ast.AST, depth: int = 1) -> bool:
    """Anything in `expr` that holds this process's rank, device index or spawn index; the operand itself may also
    be a flag computed from one, or a parameter the calls give per-rank values."""
    if _value_per_rank_plain(s, expr):
        return True
    if depth and _assigned_per_rank(s, expr, at, depth):
        return True  # `main_device = local_rank is None or local_rank == 0`, then `if main_device:`
    params = _enclosing_params(s, at)
    return isinstance(expr, ast.Name) and expr.id in params and _given_per_rank(s, params[expr.id], expr.id)


_PLACING = frozenset({"to", "cuda", "device", "set_device", "load"})
_PLACED = frozenset({"map_location", "device", "device_ids", "output_device"})


def _walk_values(expr: ast.AST, s=None):
    """ast.walk, less what only says where a value lives (`x.to(gpu)`, `map_location=f"cuda:{rank}"`): a tensor
    placed on this rank's device holds the same value on every rank. With `s`, also less the arguments a function
    of the file only places tensors with (`train_one_epoch(model, loader, gpu)` whose `gpu` goes only into
    `.cuda(gpu)`): the device a value was computed on does not change the value."""
    todo = [expr]
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, ast.Call):
            todo.append(n.func)
            placing = _placing_arguments(s, n) if s is not None else ((), ())
            if terminal(n.func) not in _PLACING:
                todo.extend(a for i, a in enumerate(n.args) if i not in placing[0])
            todo.extend(k.value for k in n.keywords if k.arg not in _PLACED and k.arg not in placing[1])
        else:
            todo.extend(ast.iter_child_nodes(n))


def _placing_arguments(s, call: ast.Call) -> tuple[set[int], set[str]]:
    """(positions, keywords) of the arguments of `call` that the function it calls (a module-level function of the
    same file, called by its bare name) uses only to place tensors: every read of the parameter is an argument of
    `.to()`/`.cuda()`/`torch.device()`/`set_device()` or a device keyword, and nothing assigns it."""
    if not isinstance(call.func, ast.Name):
        return set(), set()
    func = s.project.memo(("doubt module function", s.path, call.func.id), lambda: next(
        (d for d in s.tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
         and d.name == call.func.id), None))
    if func is None or func.args.vararg or func.args.kwarg:
        return set(), set()

    def compute() -> tuple[set[int], set[str]]:
        params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
        names = {*params, *(a.arg for a in func.args.kwonlyargs)}
        placing = {name for name in names if _only_places(s, func, name)}
        return {i for i, p in enumerate(params) if p in placing}, placing
    return s.project.memo(("doubt placing parameters", id(func)), compute)


def _only_places(s, func: ast.AST, name: str) -> bool:
    uses = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name]
    if not uses or any(not isinstance(n.ctx, ast.Load) for n in uses):
        return False
    for use in uses:
        parent = s.parents.get(id(use))
        if isinstance(parent, ast.keyword):
            if parent.arg not in _PLACED:
                return False
        elif not (isinstance(parent, ast.Call) and use in parent.args and terminal(parent.func) in _PLACING):
            return False
    return True


def _enclosing_params(s, node: ast.AST) -> dict[str, tuple[ast.AST, int]]:
    """Parameter name -> (its function, position) for the innermost function around `node`."""
    child = node
    while (parent := s.parents.get(id(child))) is not None:
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [*parent.args.posonlyargs, *parent.args.args]
            found = {a.arg: (parent, i) for i, a in enumerate(args)}
            found.update({a.arg: (parent, -1) for a in parent.args.kwonlyargs})
            return found
        child = parent
    return {}


def _given_per_rank(s, where: tuple[ast.AST, int], param: str) -> bool:
    """The value `param` gets may differ between ranks: some call passes a per-rank value for it
    (`save(..., is_best=rank == 0)`), or the calls pass different values and one of them runs under a rank check
    (`if rank == 0: save(args)` beside `save(args, last=True)` on every rank)."""
    func, position = where
    method = position > 0 and [*func.args.posonlyargs, *func.args.args][0].arg in ("self", "cls")
    given_values, ranked = set(), False
    for cs, call in _call_sites(s.project, func.name):
        given = next((k.value for k in call.keywords if k.arg == param), None)
        index = position - 1 if method and isinstance(call.func, ast.Attribute) else position
        if given is None and 0 <= index < len(call.args) and not isinstance(call.args[index], ast.Starred):
            given = call.args[index]
        if given is not None and _value_per_rank_plain(cs, given):
            return True
        given_values.add(ast.unparse(given) if given is not None else "")
        guarded = cs.context(call).level != NONE
        if not guarded and given is not None and not isinstance(given, ast.Constant):
            return False  # an every-rank call may pass anything (`final=epoch > 2`): either branch, on every rank
        ranked = ranked or guarded
    return ranked and len(given_values) > 1


def _value_per_rank_plain(s, expr: ast.AST) -> bool:
    """`expr` itself holds a rank, device index or spawn index (no flags or parameters followed)."""
    spawn = s.project.memo(("doubt spawn", s.path), lambda: spawn_index_names(s))
    for n in _walk_values(expr, s):
        if isinstance(n, (ast.Name, ast.Attribute, ast.Call)) and s.kind(n) != NONE:
            return True
        if isinstance(n, ast.Constant) and n.value in GLOBAL_ENV | LOCAL_ENV:
            return True  # os.environ["LOCAL_RANK"]
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name is not None and (name.lower() in _DEVICE_NAMES or name in spawn or _names_a_process(name.lower())
                                 or name.lower() in ("current_device", "get_rank", "get_local_rank")):
            return True
    return False


def _made_on_some_ranks(s, expr: ast.AST, at: ast.AST) -> bool:
    """`expr` names something every assignment of which (None aside) is made under a rank-reading condition, or as
    `X if <rank test> else None`: it exists on some ranks only. A plain name is looked up in its own file, and not
    at all where it is a parameter of the function (its callers say what it holds)."""
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return False
    if isinstance(expr, ast.Name) and expr.id in _enclosing_params(s, at):
        return False
    key = expr.id if isinstance(expr, ast.Name) else "." + expr.attr
    made = []
    for script in ([s] if isinstance(expr, ast.Name) else s.project.scripts.values()):
        for k, value in script.assignments:
            if k == key and not (isinstance(value, ast.Constant) and value.value is None):
                made.append(_made_under_rank_test(script, value))
    return bool(made) and all(made)


def _made_under_rank_test(script, value: ast.AST) -> bool:
    if isinstance(value, ast.IfExp) and _value_per_rank_plain(script, value.test):
        return True
    child = value
    while (parent := script.parents.get(id(child))) is not None and not isinstance(
            parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if isinstance(parent, ast.If) and child is not parent.test and not distributed_mode(parent.test) \
                and _value_per_rank_plain(script, parent.test) and not _some_arm_every_rank(script, parent.test):
            # (made in both branches of the rank test, `if local_rank == 0: m = A() else: m = B()`, every rank has one)
            return child in parent.body
        child = parent
    return False


def _some_arm_every_rank(script, test: ast.AST) -> bool:
    """`rank == 0 and step % 20 == 0 or step == last`: an `or` arm that reads no rank passes on every rank alike,
    so what the branch makes is made on every rank (at that step), not on some ranks only. An arm that tests the
    run's mode (`not args.distributed or rank == 0`) passes only where there is one process: no such arm."""
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) \
        and any(not _value_per_rank_plain(script, v) and not distributed_mode(v) and not run_sense(v)
                and not script.group_sense(v) for v in test.values)


def _logging_set_up_by_rank(project) -> bool:
    """The program sets a level, a handler or basicConfig under a condition on the rank (or with the rank in its
    arguments): which ranks' log lines show is decided per rank."""
    def compute() -> bool:
        through_root = project.memo("logging set-ups whose logger prints through the root on every rank", set)
        for script in project.scripts.values():
            for call in script.calls:
                if terminal(call.func) not in _SETUP or id(call) in through_root \
                        or library_logger(project, script, call):
                    continue  # (a named logger set up on rank 0 whose lines reach the root's console on every rank;
                    # a library's logger quietened on some ranks)
                if any(_value_per_rank_plain(script, a) for a in (*call.args, *(k.value for k in call.keywords))):
                    return True
                child = call
                while (parent := script.parents.get(id(child))) is not None:
                    if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test \
                            and _reads_rank(script, parent.test, parent):
                        return True
                    child = parent
        return False
    return project.memo("doubt logging set-up", compute)


def library_logger(project, x, call: ast.Call) -> bool:
    """The set-up call configures a library's named logger (`logging.getLogger("transformers.modeling_utils")
    .setLevel(...)`): a constant name whose package is no module of the program and that no other getLogger of the
    program names. It decides that library's lines only, not the program's own."""
    if not (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Call)):
        return False
    inner = call.func.value
    if x.qualname(inner.func) != "logging.getLogger" or len(inner.args) != 1 or not (
            isinstance(inner.args[0], ast.Constant) and isinstance(inner.args[0].value, str) and inner.args[0].value):
        return False
    name = inner.args[0].value
    others = [c for y in project.scripts.values() for c in y.calls if c is not inner
              and y.qualname(c.func) == "logging.getLogger" and c.args and isinstance(c.args[0], ast.Constant)
              and c.args[0].value == name and not isinstance(y.parents.get(id(c)), ast.Attribute)]
    return not others and project.modules.locate(x.path, name.split(".")[0]) is None


def _names_a_process(lowered: str) -> bool:
    """`rank`, `node_rank`, `rank0`: a name ending in a rank; `is_master_proc`, `am_primary`: a flag naming the
    process that leads (not `val_rank_max`, `get_master_ip`)."""
    tokens = [t for t in lowered.strip("_").split("_") if t]
    if not tokens:
        return False
    if tokens[-1] in _RANK_TOKENS or tokens[0] in _RANK_TOKENS:
        return True
    return len(tokens) > 1 and tokens[0] in ("is", "am") and tokens[1] in _LEAD_TOKENS


def _assigned_per_rank(s, expr: ast.AST, at: ast.AST, depth: int) -> bool:
    """A name or attribute in `expr` whose assigned values read the rank (a flag or index computed once from it)."""
    for n in _walk_values(expr):
        if not isinstance(n, (ast.Name, ast.Attribute)):
            continue
        key = n.id if isinstance(n, ast.Name) else "." + n.attr
        if any(_reads_rank(s, v, at, depth - 1) for k, v in s.assignments if k == key):
            return True
    return False
