"""The lint checks for output repeated on every rank (DDP008): prints, records, the logging set-up they go through."""

from __future__ import annotations

import ast
import builtins
import os
from collections.abc import Iterator

from ddpkit.lint.analysis import NONE, Script, argument, keyword, next_statements, rerun_by_workers, terminal
from ddpkit.lint.flow import class_of
from ddpkit.lint.logsetup import (debug_shown, disabled_level, logger_classes, logger_helpers, logging_configured,
                                  logging_per_rank, loguru_default, maker_method, outside_log_setup)
from ddpkit.lint.ranks import WORLD
from ddpkit.lint.reporting import every_rank_writer, handed_writer_record, in_step_loop, names_a_rank, reports_only, scope_of
from ddpkit.lint.rules import Hit, check, off_by_default

__all__ = ["every_rank_prints", "every_rank_records", "print_swap_opened_by_size"]

_PROCESS_TAGS = frozenset({"getpid", "gethostname", "hostname", "pid", "current_device"})
"""Calls and names whose value differs by process: a message that shows one (`[GPU{torch.cuda.current_device()}]`,
the device this process set) is tagged per process on purpose."""
_EXITS = frozenset({"exit", "_exit", "quit"})
_BARS = frozenset({"tqdm", "trange", "tqdm_rich", "trrange", "tqdm_notebook", "tnrange", "tqdm_gui", "tgrange",
                   "tqdm_asyncio"})
"""tqdm's bar classes and their range shortcuts, in its front-end modules too (`from tqdm.rich import tqdm_rich`)."""
_STDOUT_BARS = frozenset({"tqdm_rich", "trrange"})
"""Bars drawn by rich, whose console writes sys.stdout: silenced where stdout is (taken as silenced by a print swap
too, where that is all the program does: a bar left out rather than reported on a guess)."""


def _writer_made(s: Script, call: ast.Call) -> ast.Call | None:
    """The one `SummaryWriter(...)` that makes the writer `writer.add_scalar(...)` records through: where every rank
    makes its own, the line to fix. None where the file makes it in more than one place."""
    key = terminal(call.func.value) if isinstance(call.func.value, ast.Name) else "." + call.func.value.attr
    made = [v for k, v in s.assignments if k == key]
    return made[0] if len(made) == 1 and isinstance(made[0], ast.Call) else None


def _writer_key(s: Script, call: ast.Call) -> object:
    """One every-rank writer finding per writer made in one place, else per function that records."""
    made = _writer_made(s, call)
    return id(made) if made is not None else s.context(call).scope


def _in_handler(s: Script, node: ast.AST) -> bool:
    parents = s.parents
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.ExceptHandler):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
    return False


def _shows_failed_item(s: Script, call: ast.Call) -> bool:
    """The message sits in an `except` block (of its function) and shows what failed: the caught exception
    (`except Exception as e: print(e)`) or a value the `try` body worked on (`print(annotations)` after
    `augment(**annotations)` failed). A rank gets there only when its own item (its sample, its file) raised,
    so the line is that rank's diagnostic, not one line written world_size times. A constant message
    (`except ImportError: print("apex not found")`), or a `try` of imports alone, is the same on every rank
    and stays reported."""
    node: ast.AST = call
    while id(node) in s.parents:
        parent = s.parents[id(node)]
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            return False
        if isinstance(parent, ast.ExceptHandler):
            break
        node = parent
    else:
        return False
    handler, attempt = parent, s.parents.get(id(parent))
    if not isinstance(attempt, ast.Try) or all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in attempt.body):
        return False
    worked = {n.id for stmt in attempt.body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    if handler.name:
        worked.add(handler.name)
    shown = (n for a in (*call.args, *(k.value for k in call.keywords)) for n in ast.walk(a))
    return any(isinstance(n, ast.Name) and n.id in worked for n in shown)


def _stops(stmt: ast.stmt | None) -> bool:
    """`sys.exit(...)` or `raise ...`: a message printed right before it explains why a process stops."""
    if isinstance(stmt, ast.Raise):
        return True
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and terminal(stmt.value.func) in _EXITS


def _normal_end(stmt: ast.stmt | None) -> bool:
    """`exit(0)`: the program ends well, and the message before it is one every rank prints like any other."""
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and len(stmt.value.args) == 1 \
        and isinstance(stmt.value.args[0], ast.Constant) and stmt.value.args[0].value == 0 \
        and not isinstance(stmt.value.args[0].value, bool)


_MESSAGES = frozenset({"print", "info", "warning", "warn", "error", "critical", "debug", "exception", "write"})


def _before_exit(s: Script, after: dict[int, ast.stmt], stmt: ast.stmt | None) -> bool:
    """The message opens (or is) a run of messages that ends in `sys.exit`/`raise`, in an assert that fails
    there, or at the end of an arm of an `if` after which the program reads a name only the other arms bind:
    it says why a process stops; also any message of an `except` block that ends by stopping (`except RuntimeError
    as e: print(e); save(...); exit(0)`: the failing rank's own diagnostics, whatever the exit code). A `for`/`if`
    of messages alone counts as one (`for k, v in losses.items(): print(k, v)` then `exit()`); an `import` or
    `pass` between them writes nothing (`print(...); import sys; sys.exit(1)`)."""
    handler = _enclosing_handler(s, stmt)
    if handler is not None and _stops(handler.body[-1]):
        return True
    arm = _if_arm(s, stmt)
    if arm and _stops(arm[-1]) and not _normal_end(arm[-1]):
        return True  # `if torch.isnan(loss): print(...); reload(...); raise NanException`: why this rank stops
    for _ in range(20):
        last = stmt
        stmt = after.get(id(stmt))
        while stmt is None and last is not None and isinstance(s.parents.get(id(last)), (ast.For, ast.If)) \
                and reports_only(s, s.parents[id(last)]):
            last = s.parents[id(last)]  # the end of a loop (or `if`) of messages: the run goes on after it
            stmt = after.get(id(last))
        if _stops(stmt):
            return not _normal_end(stmt)
        if _fails(s, stmt):
            return True
        if stmt is None:
            return last is not None and _falls_into_unbound(s, after, last)
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
            continue  # `print(...); import sys; sys.exit(1)`: writes nothing, the run of messages goes on
        if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and terminal(stmt.value.func) in _MESSAGES):
            return False
    return False


_ANOMALY = frozenset({"isnan", "isinf", "isneginf", "isposinf"})


def _assert_message(s: Script, call: ast.Call) -> bool:
    """The call is (in) the message of an `assert` (`assert a == b, print(a, b)`): Python evaluates it only when the
    assertion fails, so it is the failing rank's own diagnostic."""
    child, parent = call, s.parents.get(id(call))
    while parent is not None and not isinstance(parent, (ast.stmt, ast.Lambda)):
        child, parent = parent, s.parents.get(id(parent))
    return isinstance(parent, ast.Assert) and parent.msg is child


def _under_anomaly_test(s: Script, call: ast.Call) -> bool:
    """The message sits in the body of an `if` (of its function) that asks whether this rank's own values went
    bad: `torch.isnan(...)`/`isinf`, `x.isnan().any()`, `math.isnan(v)`, `np.isinf(...)`, or `not
    torch.isfinite(...).all()`; only a rank whose data gave NaN or inf gets there, so the line is its own
    diagnostic, not one line written world_size times."""
    node: ast.AST = call
    while id(node) in s.parents:
        parent = s.parents[id(node)]
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(parent, ast.If) and node in parent.body and _asks_anomaly(parent.test):
            return True
        node = parent
    return False


def _asks_anomaly(test: ast.AST) -> bool:
    for n in ast.walk(test):
        if isinstance(n, ast.Call) and terminal(n.func) in _ANOMALY:
            return True
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not) and any(
                isinstance(c, ast.Call) and terminal(c.func) == "isfinite" for c in ast.walk(n.operand)):
            return True
    return False


def _if_arm(s: Script, stmt: ast.stmt | None) -> list[ast.stmt]:
    """The statements of the `if` arm (body or `else:`) a statement is one of; [] elsewhere."""
    branch = s.parents.get(id(stmt)) if stmt is not None else None
    if not isinstance(branch, ast.If):
        return []
    return branch.body if stmt in branch.body else branch.orelse if stmt in branch.orelse else []


def _enclosing_handler(s: Script, stmt: ast.stmt | None) -> ast.ExceptHandler | None:
    """The `except` block a statement sits in, within its function."""
    node = stmt
    while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(node, ast.ExceptHandler):
            return node
        node = s.parents.get(id(node))
    return None


def _fails(s: Script, stmt: ast.stmt | None) -> bool:
    """An assert that cannot hold where it stands: `assert False`, or the negation of the test of the `if` it
    sits in (`if k not in keys: ... assert k in keys`)."""
    if not isinstance(stmt, ast.Assert):
        return False
    if isinstance(stmt.test, ast.Constant) and not stmt.test.value:
        return True
    branch = s.parents.get(id(stmt))
    return isinstance(branch, ast.If) and stmt in branch.body and _negates(stmt.test, branch.test)


def _negates(one: ast.AST, other: ast.AST) -> bool:
    """`one` is `not other` (either way round), or the same comparison with `in`/`not in`, `==`/`!=`,
    `is`/`is not` swapped."""
    for a, b in ((one, other), (other, one)):
        if isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.Not) and ast.dump(a.operand) == ast.dump(b):
            return True
    opposite = {ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot,
                ast.IsNot: ast.Is}
    return isinstance(one, ast.Compare) and isinstance(other, ast.Compare) and len(one.ops) == len(other.ops) == 1 \
        and opposite.get(type(one.ops[0])) is type(other.ops[0]) and ast.dump(one.left) == ast.dump(other.left) \
        and ast.dump(one.comparators[0]) == ast.dump(other.comparators[0])


def _falls_into_unbound(s: Script, after: dict[int, ast.stmt], last: ast.stmt) -> bool:
    """`last` ends an arm of an `if`/`elif` chain, and the statement after the chain reads a name that only the
    chain's other arms bind (nothing else in the scope binds it, no loop runs the chain again): from this arm
    the program stops there with a NameError (`else: print("unknown dataset")` then `max(train_set.targets)`)."""
    top = s.parents.get(id(last))
    if not isinstance(top, ast.If):
        return False
    arm = top.body if last in top.body else top.orelse
    while True:  # climb an `elif` chain: the inner `if` is the whole `else:` of the outer one
        up = s.parents.get(id(top))
        if isinstance(up, ast.If) and up.orelse == [top]:
            top = up
        else:
            break
    following = after.get(id(top))
    scope = top
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(scope, (ast.For, ast.AsyncFor, ast.While, ast.Lambda, ast.ClassDef)):
            return False  # (a loop may have bound the name on an earlier pass)
        scope = s.parents.get(id(scope))
    scope = scope if scope is not None else s.tree
    if following is None or isinstance(following, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return False
    inside = {id(n) for stmt in arm for n in ast.walk(stmt)}
    chain = {id(n) for n in ast.walk(top)}  # (ids of the chain's nodes)
    bindings = _scope_bindings(scope)
    declared = {name for n in ast.walk(s.tree) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names}
    star = any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in s.tree.body)
    for n in ast.walk(following):
        if not (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)) or n.id in declared or star \
                or n.id in _BUILTINS and isinstance(scope, ast.Module):
            continue
        # (bindings below `following` run after it: the chain is in no loop)
        bound = [b for b in bindings.get(n.id, []) if (b.lineno, b.col_offset) < (following.lineno, following.col_offset)]
        if bound and all(id(b) in chain and id(b) not in inside for b in bound):
            return True
    return False


_BUILTINS = frozenset(dir(builtins))


def _scope_bindings(scope: ast.AST) -> dict[str, list[ast.AST]]:
    """name -> the nodes that bind it in `scope` itself (not in the functions, classes, lambdas and
    comprehensions it holds, which have scopes of their own); a function's parameters count."""
    found: dict[str, list[ast.AST]] = {}
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for a in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs, scope.args.vararg,
                  scope.args.kwarg):
            if a is not None:
                found.setdefault(a.arg, []).append(a)
    todo = list(scope.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.setdefault(node.name, []).append(node)
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            found.setdefault(node.id, []).append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                found.setdefault((a.asname or a.name).split(".")[0], []).append(node)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            found.setdefault(node.name, []).append(node)
        elif isinstance(node, ast.MatchAs) and node.name or isinstance(node, ast.MatchStar) and node.name:
            found.setdefault(node.name, []).append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def _derives_from_rank(s: Script, value: ast.AST) -> bool:
    """`value` shows the rank when written out: the rank itself, text or arithmetic made of it (`f"cuda:{rank}"`,
    `rank % 8`), a device named by it (`torch.device("cuda", local_rank)`) or an item picked by it
    (`device_ids[rank]`). Not a value merely built with it (a model moved to the rank's device prints the same)."""
    if isinstance(value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) and s.kind(value):
        return True
    if isinstance(value, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) and _derives_from_rank(s, v.value) for v in value.values)
    if isinstance(value, ast.BinOp):
        return _derives_from_rank(s, value.left) or _derives_from_rank(s, value.right)
    if isinstance(value, ast.Subscript):
        return _derives_from_rank(s, value.slice)
    if isinstance(value, ast.Call) and terminal(value.func) in ("device", "str", "int", "format"):
        parts = [*value.args, *(k.value for k in value.keywords)]
        if terminal(value.func) == "format" and isinstance(value.func, ast.Attribute):
            parts.append(value.func.value)
        return any(_derives_from_rank(s, p) for p in parts)
    return False


def _rank_valued(s: Script, node: ast.AST, call: ast.Call) -> bool:
    """A name or attribute a message shows holds a value that differs per rank, so each rank's line is its own:
    a name every assignment of which in the function derives from the rank (`device = f"cuda:{local_rank}"`; those of
    a single-process arm aside), or
    an attribute every store of which in the program does (`self.device = torch.device("cuda", local_rank)` in
    `__init__`, `opts.gpu = device_ids[rank]` in the worker)."""
    if isinstance(node, ast.Name):
        # (a value assigned in the single-process arm of a mode check, `else: device = torch.device("cuda")`,
        # is not what the ranks of a distributed run show)
        values = [v for v in s.local_values(node.id, call) if not s.context(v).single]
        return bool(values) and all(_derives_from_rank(s, v) for v in values)
    if not isinstance(node, ast.Attribute) or not isinstance(node.ctx, ast.Load):
        return False
    project = s.project

    def stores() -> dict[str, bool]:  # attribute name -> every store of it derives from the rank
        found: dict[str, bool] = {}
        for x in project.scripts.values():
            for n in x.nodes:
                if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                    for target in n.targets if isinstance(n, ast.Assign) else [n.target]:
                        if isinstance(target, ast.Attribute):
                            found[target.attr] = found.get(target.attr, True) and _derives_from_rank(x, n.value)
                elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Attribute):
                    found[n.target.attr] = False
        return found
    return project.memo("rank-valued attributes", stores).get(node.attr, False)


def _placed_tensor_device(s: Script, node: ast.AST, call: ast.Call) -> bool:
    """`x.device` of a tensor this function moved to a device (`x = x.to(...)`, `.cuda(...)`): it names the
    rank's GPU (`cuda:3`), so a line that shows it is the process's own."""
    if not (isinstance(node, ast.Attribute) and node.attr == "device" and isinstance(node.value, ast.Name)):
        return False
    values = s.local_values(node.value.id, call)
    return bool(values) and all(isinstance(v, ast.Call) and terminal(v.func) in ("to", "cuda") for v in values)


def _steps_on_some_ranks(s: Script, call: ast.Call) -> bool:
    """`scheduler = ReduceLROnPlateau(..., verbose=True)` (which prints only in step(), not when built) whose every
    `scheduler.step(...)` in the file runs under a rank check: only those ranks print."""
    stmt = s.parents.get(id(call))
    if terminal(call.func) != "ReduceLROnPlateau" or not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                                                          and isinstance(stmt.targets[0], (ast.Name, ast.Attribute))):
        return False
    key = terminal(stmt.targets[0])
    steps = [c for c in s.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "step"
             and isinstance(c.func.value, (ast.Name, ast.Attribute)) and terminal(c.func.value) == key]
    return bool(steps) and all(s.context(c).level != NONE for c in steps)


_FILLS = frozenset({"append", "extend", "update", "setdefault", "insert", "add"})


def _over_rank_filled(s: Script, node: ast.AST) -> bool:
    """The node runs inside `for key in results:` (also `.items()`, `.keys()`, `.values()`) where its function binds
    `results` once, to an empty `dict()`/`{}`/`[]`, and fills it only under a rank check (`results[k] = ...`,
    `results.append(...)`, `results[k].append(...)`): on the other ranks the loop has nothing to run."""
    while id(node) in s.parents:
        node = s.parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if not isinstance(node, ast.For):
            continue
        over = node.iter
        if isinstance(over, ast.Call) and isinstance(over.func, ast.Attribute) and not over.args \
                and over.func.attr in ("items", "keys", "values"):
            over = over.func.value
        if not isinstance(over, ast.Name):
            continue
        bound = [(stmt, v) for stmt, v in s.local_assignments(over.id, node) if not (
            isinstance(stmt, (ast.Assign, ast.AugAssign)) and not any(
                isinstance(t, ast.Name) for t in getattr(stmt, "targets", [getattr(stmt, "target", None)])))]
        if len(bound) != 1 or not _empty_container(bound[0][1]):
            continue
        scope = scope_of(s, node)
        fills = [n for n in ast.walk(scope) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                 and n.value.id == over.id and (isinstance(n.ctx, ast.Store) or isinstance(s.parents.get(id(n)), ast.Attribute))
                 or isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _FILLS
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == over.id]
        if fills and all(s.context(n).level != NONE for n in fills):
            return True
    return False


def _empty_container(value: ast.AST | None) -> bool:
    return isinstance(value, ast.Dict) and not value.keys or isinstance(value, ast.List) and not value.elts \
        or isinstance(value, ast.Call) and terminal(value.func) in ("dict", "list", "OrderedDict", "defaultdict") \
        and not value.args[1:] and not value.keywords and not (value.args and terminal(value.func) != "defaultdict")


def _after_a_stop(s: Script, node: ast.AST) -> bool:
    """The node follows, in a block of its function, a statement that always stops the process: `sys.exit()`,
    `raise`, or a `try:` whose `finally:` block ends in one."""
    child = node
    while (parent := s.parents.get(id(child))) is not None:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and child in block and any(
                    _stops(stmt) or isinstance(stmt, ast.Try) and stmt.finalbody and _stops(stmt.finalbody[-1])
                    for stmt in block[:block.index(child)]):
                return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        child = parent
    return False


def _text(value: ast.AST) -> bool:
    """A string built for a message: an f-string, `"...".format(...)`, `"..." % x` or `"..." + x`."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "format":
        value = value.func.value
    elif isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Mod, ast.Add)):
        value = value.left
    return isinstance(value, ast.JoinedStr) or isinstance(value, ast.Constant) and isinstance(value.value, str)


def _logger_warning(call: ast.Call, loggers: set[str]) -> bool:
    """`logging.warning(...)`, or `.warning(...)` of a logger of the program (`logger = logging.getLogger(...)`)."""
    return terminal(call.func) == "warning" and isinstance(call.func, ast.Attribute) \
        and isinstance(call.func.value, (ast.Name, ast.Attribute)) \
        and terminal(call.func.value) in {k.lstrip(".") for k in loggers}


def _not_the_logging_module(s: Script, call: ast.Call) -> bool:
    """`logging.info(...)` where `logging` is a name the program rebinds: a parameter of an enclosing function
    (whatever its callers pass: unknown, so not reported) or an object of a project class whose `info` names the
    rank in what it writes (`logging = Logger(save, rank)`, its lines say which rank wrote them)."""
    receiver = call.func.value
    if not isinstance(receiver, ast.Name):
        return False
    node: ast.AST | None = call
    while (node := s.parents.get(id(node))) is not None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and receiver.id in {
                a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}:
            return True
    built = {terminal(v.func) for k, v in s.assignments if k == receiver.id and isinstance(v, ast.Call)}
    return any(_method_names_the_rank(s.project, cls, terminal(call.func)) for cls in built)


def _writer_method(s: Script, call: ast.Call) -> str:
    """`ProgressBar.__call__` for `pbar(...)`, `ProgressBar.epoch_start` for `pbar.epoch_start(...)`, else ''."""
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else call.func
    if not isinstance(receiver, ast.Name):
        return ""
    built = {terminal(v.func) for k, v in s.assignments if k == receiver.id and isinstance(v, ast.Call)}
    if len(built) != 1:
        return ""
    method = call.func.attr if isinstance(call.func, ast.Attribute) else "__call__"
    return f"{next(iter(built))}.{method}"


def _console_writer(s: Script, call: ast.Call) -> str:
    """'stdout' or 'stderr' where the call runs a method of an object of a project class (the name bound only to
    the class's constructor in this file) whose own code writes that stream (`sys.stdout.write(...)`): a progress
    bar or console reporter of the project's own; '' otherwise."""
    spot = _writer_method(s, call)
    if not spot:
        return ""
    cls, method = spot.split(".")
    receiver = call.func.value if isinstance(call.func, ast.Attribute) else call.func
    if not all(isinstance(v, ast.Call) and terminal(v.func) == cls for k, v in s.assignments if k == receiver.id):
        return ""
    for x in s.project.scripts.values():
        for c in x.nodes:
            if not (isinstance(c, ast.ClassDef) and c.name == cls):
                continue
            for d in c.body:
                if isinstance(d, ast.FunctionDef) and d.name == method:
                    for n in ast.walk(d):
                        if isinstance(n, ast.Call) and x.qualname(n.func) in ("sys.stdout.write", "sys.stderr.write"):
                            return x.qualname(n.func).split(".")[1]
    return ""



_STREAM_WRITES = frozenset({"sys.stdout.write", "sys.stderr.write"})


def _stream_writer_functions(project) -> dict[tuple[str, str], str]:
    """{(path, name): 'stdout'/'stderr'} of the program's module-level functions that write a parameter of theirs to
    that stream (`def progress_bar(msg): sys.stdout.write(msg + "\\n")`): their callers choose what is written, so
    the line is reported at the calls."""
    found = {}
    for x in project.scripts.values():
        for d in x.tree.body:
            if not isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = {a.arg for a in (*d.args.posonlyargs, *d.args.args, *d.args.kwonlyargs)}
            for n in ast.walk(d):
                if isinstance(n, ast.Call) and x.qualname(n.func) in _STREAM_WRITES and any(
                        isinstance(m, ast.Name) and m.id in params for a in n.args for m in ast.walk(a)):
                    found.setdefault((x.path, d.name), x.qualname(n.func).split(".")[1])
    return found


def _stream_write(s: Script, call: ast.Call, writers: dict[tuple[str, str], str]) -> tuple[str, str]:
    """('stdout'/'stderr', how) where the call writes that stream: `sys.stdout.write(...)` itself (how: ''), or a call
    of a program function that writes its argument there (how: 'progress at utils.py:17'); ('', '') otherwise, and for
    the write inside such a function or a method of a class (reported at their calls)."""
    name = s.qualname(call.func)
    if name in _STREAM_WRITES:
        ctx = s.context(call)
        inside = ctx.functions and (s.path, ctx.functions[-1]) in writers and any(
            (s.path, d.name) in writers for d in s.tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
            and d.name == ctx.functions[-1] and ctx.scope == id(d))
        # a method's write is its class's (a progress bar of the project: reported at its calls, see _console_writer)
        method = any(isinstance(c, ast.ClassDef) and any(id(d) == ctx.scope for d in c.body) for c in s.nodes)
        return ("", "") if inside or method else (name.split(".")[1], "")
    local = s.local_callee(call)
    target = (s.path, local) if local else s.project.resolve(s, call.func)
    if target is None or target not in writers:
        return "", ""
    d = next((d for d in s.project.scripts[target[0]].tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
              and d.name == target[1]), None)
    return writers[target], f"{target[1]} at {os.path.basename(target[0])}:{d.lineno if d else 1}"


def _logging_module_names(s: Script) -> set[str]:
    """Names the file binds to the `logging` module itself (`logger = logging`), every other binding of which is a
    `logging.getLogger(...)` logger (`global logger; logger = logging.getLogger(name)`): either way the root logger's
    handlers write the line."""
    found = {k for k, v in s.assignments if isinstance(v, ast.Name) and s.qualname(v) == "logging"}
    return {k for k in found if all(isinstance(v, ast.Name) and s.qualname(v) == "logging" or isinstance(v, ast.Call)
                                    and s.qualname(v.func) in ("logging.getLogger", "getLogger")
                                    for key, v in s.assignments if key == k)}


def _handed_loggers(s: Script, makers: set[str]) -> set[str]:
    """`.logger` where a class of this file keeps a constructor parameter (`self.logger = logger`) and every
    construction of the class in the program hands it a logger its caller made (`Scheduler(args, optimizer,
    logging.getLogger())` through `logger = logging.getLogger()`), or a parameter of the caller every call fills so
    (`def main(logger, args): model = Model(logger)` with `main(logging.getLogger(__name__), args)`)."""
    def is_logger(x: Script, value: ast.AST, within: ast.AST) -> bool:
        return _a_made_logger(x, value, within, makers, 0)

    found = set()
    for c in (n for n in s.tree.body if isinstance(n, ast.ClassDef)):
        init = next((d for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "__init__"), None)
        if init is None or sum(isinstance(n, ast.ClassDef) and n.name == c.name
                               for x in s.project.scripts.values() for n in x.nodes) != 1:
            continue
        params = [a.arg for a in init.args.args[1:]]
        kept = {t.attr: n.value.id for n in init.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)
                and n.value.id in params for t in n.targets if isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name) and t.value.id == "self"}
        built = [(x, call) for x in s.project.scripts.values() for call in x.calls
                 if isinstance(call.func, (ast.Name, ast.Attribute)) and terminal(call.func) == c.name]
        for attr, param in kept.items():
            given = [(x, call, argument(call, param, params.index(param))) for x, call in built]
            if given and all(v is not None and is_logger(x, v, call) for x, call, v in given):
                found.add("." + attr)
    return found



def _logger_parameters_filled(s: Script, makers: set[str]) -> set[str]:
    """Parameters of this file's module-level functions that every call in the program fills with a logger its
    caller made (`logger = setup_logger("reid", ...)` then `do_train(cfg, model, ..., logger)`, in another file):
    `logging.getLogger(...)` or a logger helper of the program, through the caller's own assignments, or a
    parameter of the caller filled so in turn (`do_train_config(..., logger)` handing it on)."""
    return {p for d in s.tree.body if isinstance(d, ast.FunctionDef)
            for i, p in enumerate(a.arg for a in d.args.args) if _filled_with_a_logger(s, d, p, i, makers, 0)}


def _filled_with_a_logger(s: Script, d: ast.FunctionDef, param: str, at: int, makers: set[str], depth: int) -> bool:
    calls = [(x, c) for x, c in s.project.calls_named(d.name) if (s.project.callee(x, c) or ("", ""))[0] is s]
    return bool(calls) and depth < 3 and all(_a_made_logger(x, argument(c, param, at), c, makers, depth)
                                             for x, c in calls)


def _a_made_logger(x: Script, value: ast.AST | None, within: ast.AST, makers: set[str], depth: int) -> bool:
    values = x.local_values(value.id, within) if isinstance(value, ast.Name) else [value]
    if not values and isinstance(value, ast.Name):  # the caller's own parameter, handed on
        scope = x.context(within).scope
        outer = next((f for f in x.tree.body if isinstance(f, ast.FunctionDef) and id(f) == scope), None)
        params = [a.arg for a in outer.args.args] if outer is not None else []
        return value.id in params and _filled_with_a_logger(x, outer, value.id, params.index(value.id), makers,
                                                            depth + 1)
    return bool(values) and all(isinstance(v, ast.Call) and (
        x.qualname(v.func) in ("logging.getLogger", "getLogger") or terminal(v.func) in makers) for v in values)


def _imported_loggers(s: Script) -> set[str]:
    """Names this file imports from a module of the program that binds them, at module level, to
    `logging.getLogger(...)` (`from tools.common import logger`, where tools/common.py has `logger =
    logging.getLogger()`)."""
    out = set()
    for name, dotted in s.aliases.items():
        if "." not in dotted:
            continue
        module, attr = dotted.rsplit(".", 1)
        path = s.project.modules.locate(s.path, module)
        x = s.project.scripts.get(path) if path else None
        if x is None or x is s:
            continue
        values = [stmt.value for stmt in x.tree.body if isinstance(stmt, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets)]
        if values and all(isinstance(v, ast.Call) and x.qualname(v.func) in ("logging.getLogger", "getLogger")
                          for v in values):
            out.add(name)
    return out


def _method_names_the_rank(project, cls: str, method: str) -> bool:
    """A project class `cls` whose `method` puts the rank into the message it writes."""
    for script in project.scripts.values():
        for c in script.nodes:
            if isinstance(c, ast.ClassDef) and c.name == cls:
                for d in c.body:
                    if isinstance(d, ast.FunctionDef) and d.name == method and any(
                            isinstance(n, ast.JoinedStr) and any(script.kind(m) for m in ast.walk(n)
                                                                 if isinstance(m, (ast.Name, ast.Attribute)))
                            for n in ast.walk(d)):
                        return True
    return False



def _prints_a_table(s: Script, call: ast.Call) -> bool:
    """A model summary that prints its table: torchsummary's `summary(model, size)`, or torchinfo's `summary(model)`
    unless made quiet (`verbose=0`; its default prints outside a notebook)."""
    name = s.qualname(call.func)
    if name == "torchsummary.summary":
        return True
    quiet = keyword(call, "verbose")
    return name == "torchinfo.summary" and not (isinstance(quiet, ast.Constant) and quiet.value in (0, False))


@check
def every_rank_prints(s: Script) -> Iterator[Hit]:
    project = s.project
    per_rank_file = s.distributed or s.path in project.imported or project.joins(s)
    if not per_rank_file or not project.distributed:
        return
    after = next_statements(s)
    statement_of = {id(n.value): n for n in s.nodes if isinstance(n, ast.Expr)}
    makers = project.memo("logger helpers", lambda: logger_helpers(project))
    classes = project.memo("logger classes", lambda: logger_classes(project))
    forwarding = set().union(*classes.values())
    streams = project.memo("stream writers", lambda: _stream_writer_functions(project))
    loggers = {k for k, v in s.assignments if isinstance(v, ast.Call) and (
        s.qualname(v.func) in ("logging.getLogger", "getLogger") or s.local_callee(v) in makers
        or (project.resolve(s, v.func) or ("", ""))[1] in makers or maker_method(s, v.func, makers)
        or terminal(v.func) in classes and not s.qualname(v.func).startswith("logging."))} | _imported_loggers(s)
    loggers |= _logging_module_names(s) | _handed_loggers(s, makers) | _logger_parameters_filled(s, makers)
    # (`logging.disable(logging.WARNING)` at the top of the program: no INFO, nor WARNING, line is written anywhere)
    silenced = project.memo("logging disabled", lambda: disabled_level(project))
    logging_open = project.memo("logging shown", lambda: logging_configured(project)) \
        and not project.memo("logging per rank", lambda: logging_per_rank(project)) and silenced < 20
    warnings_open = not project.memo("logging per rank", lambda: logging_per_rank(project)) and silenced < 30
    outside = project.memo("logging set up outside", lambda: outside_log_setup(project))
    loguru_open = project.memo("loguru shown", lambda: loguru_default(project))
    for call in s.calls:
        name = s.qualname(call.func)
        # a torch LR scheduler built with verbose=True prints a line at its construction and at every step()
        flag = keyword(call, "verbose")
        verbose = name.startswith(("torch.optim.lr_scheduler.", "optim.lr_scheduler.")) \
            and isinstance(flag, ast.Constant) and flag.value is True and not _steps_on_some_ranks(s, call)
        # (torchsummary's and torchinfo's summary() print their table with print())
        is_print = (name in ("print", "rich.print") or _prints_a_table(s, call) or verbose) \
            and not project.print_silenced(s, call)
        # (a builtins.print swap does not silence a bar: tqdm writes to sys.stderr itself)
        is_bar = name.split(".")[0] == "tqdm" and terminal(call.func) in _BARS \
            and not project.print_silenced(s, call, stdout=False) \
            and not (terminal(call.func) in _STDOUT_BARS and project.print_silenced(s, call))
        # `pbar(step, info)` of a project class whose __call__ (or the method called) writes sys.stdout itself
        writer = "" if is_print or is_bar or project.print_silenced(s, call) else _console_writer(s, call)
        # `sys.stdout.write(text)`, or a function of the program that writes its argument there (`bar(suffix)`)
        stream, via = ("", "") if is_print or is_bar or writer else _stream_write(s, call, streams)
        if not (is_print or is_bar or writer) and name == "pprint.pprint" and keyword(call, "stream") is None:
            stream = "stdout"  # pprint writes sys.stdout itself (a builtins.print swap does not silence it)
        if stream and not project.print_silenced(s, call, stdout=stream == "stdout"):
            writer = stream
        is_print = is_print or bool(writer)
        # logging.info / a logging.getLogger() logger: every rank's handler writes the line, unless the
        # program sets logging up per rank (a level, a handler or basicConfig chosen by the rank)
        is_log = logging_open and (terminal(call.func) == "info" or name == "logging.debug" and project.memo(
            "debug shown", lambda: debug_shown(project))) and isinstance(call.func, ast.Attribute) and (
            name in ("logging.info", "logging.debug") or (isinstance(call.func.value, (ast.Name, ast.Attribute))
                                       and terminal(call.func.value) in {k.lstrip(".") for k in loggers}))
        # a WARNING line is shown with no set-up at all (Python's last-resort handler), so only a set-up per rank hides
        # it; in the loop that runs the step it is the training log written at WARNING, a line every step on every rank
        # (a one-off notice elsewhere, `logging.warning("apex not available")`, is left alone)
        warned = not is_log and warnings_open and (name == "logging.warning" or _logger_warning(call, loggers)) \
            and in_step_loop(s, s.tree, call)
        is_log = is_log or warned
        if is_log and name in ("logging.info", "logging.warning", "logging.debug") \
                and _not_the_logging_module(s, call) \
                or id(call) in forwarding:
            continue
        # loguru's logger writes to sys.stderr in every process until the program configures it; its default handler
        # shows every level from DEBUG up, so `logger.debug` lines are as much the program's log as `logger.info`
        is_loguru = loguru_open and name in ("loguru.logger.info", "loguru.logger.debug", "loguru.logger.success")
        is_log = is_log or is_loguru
        ctx = s.context(call)
        # module code of a script that mp.spawns its workers runs again in each of them (see rerun_by_workers)
        rerun = not s.per_rank(call) and (is_print or is_bar or is_log) and rerun_by_workers(s, call)
        if not (is_print or is_bar or is_log) or ctx.level != NONE or ctx.single or not (s.per_rank(call) or rerun):
            continue
        # a rank, a pid or a device in the message means the per-process output is deliberate
        mentioned = [n for a in (*call.args, *call.keywords) for n in ast.walk(a)]
        # (a rank read only by the test of `x if local_rank != -1 else y` picks a value, it is not written out)
        tested = {id(n) for p in mentioned if isinstance(p, ast.IfExp) for n in ast.walk(p.test)}
        mentioned = [n for n in mentioned if id(n) not in tested]
        mentioned += [m for n in mentioned if isinstance(n, ast.Name) for v in s.local_values(n.id, call)
                      if _text(v) for m in ast.walk(v)]  # `prefix = f"rank {rank} | "; print(prefix, ...)`
        if any(s.kind(n) for n in mentioned) or any(terminal(n) in _PROCESS_TAGS for n in mentioned
                                                   if isinstance(n, (ast.Name, ast.Attribute, ast.Call))) \
                or any(_placed_tensor_device(s, n, call) or _rank_valued(s, n, call) for n in mentioned):
            continue
        if (is_print and keyword(call, "file") is not None) or _before_exit(s, after, statement_of.get(id(call))):
            continue
        if _under_anomaly_test(s, call):
            continue  # `if torch.isnan(loss): print(...)`: only the rank whose own values went bad shows it
        if _assert_message(s, call):
            continue  # `assert ok, print(...)`: runs only where the assertion fails, right before AssertionError
        if _shows_failed_item(s, call):
            continue  # `except Exception as e: print(e)`: only the rank whose own item failed shows it
        if _after_a_stop(s, call):
            continue  # no process gets here: an exit (or a `finally:` that exits) comes first
        if _over_rank_filled(s, call):
            continue  # a loop over a container only the ranks of a rank check fill: the others have nothing to show
        if is_bar and keyword(call, "disable") is not None and not off_by_default(s, keyword(call, "disable")):
            continue  # (`disable=False`, or a store_true flag the run does not pass, leaves the bar on every rank)
        if is_log and _in_handler(s, call):
            continue  # a log line in an `except:` block reports this rank's own failure or fallback
        if is_loguru:
            yield Hit(call, "DDP008", "warning",
                      f"{ast.unparse(call.func)}() (loguru) runs on every rank, and loguru's default handler writes "
                      "to sys.stderr in every process: each line appears world_size times",
                      "configure loguru per rank: `if rank != 0: logger.remove()` (or logger.add(..., "
                      "level='WARNING') there), or guard the call with `if rank == 0:`")
            continue
        if warned:
            yield Hit(call, "DDP008", "warning",
                      f"{ast.unparse(call.func)}() runs on every rank and nothing sets logging up per rank; WARNING "
                      "lines are shown even with no logging set-up, so each appears world_size times",
                      "guard the call with `if rank == 0:` (or log it at INFO with logging shown on rank 0 only)")
            continue
        if is_log:
            shown = "" if outside is None else (
                f" (INFO lines are taken as shown by {ast.unparse(outside[1].func)}() at "
                f"{os.path.basename(outside[0].path)}:{outside[1].lineno}, a library's logging set-up" + (
                    ")" if outside[0].qualname(outside[1].func) == "coloredlogs.install" else ", read by its name)"))
            yield Hit(call, "DDP008", "warning",
                      f"{ast.unparse(call.func)}() runs on every rank and nothing sets logging up per rank, so "
                      f"each line appears world_size times{shown}",
                      "log on rank 0 only: logging.basicConfig(level=logging.INFO if rank == 0 else "
                      "logging.WARNING), or guard the call with `if rank == 0:`")
            continue
        what = f"{ast.unparse(call.func)}(verbose=True), which prints at every step()," if verbose else \
            f"{ast.unparse(call.func)}(), which prints its table with print()," if _prints_a_table(s, call) else \
            f"{ast.unparse(call.func)}()" if writer and stream and not via else \
            f"{ast.unparse(call.func)}(), which writes to sys.{writer} ({via})," if writer and via else \
            f"{ast.unparse(call.func)}(), which writes to sys.{writer} ({_writer_method(s, call)})," if writer else \
            "print()" if is_print else "the tqdm progress bar"
        yield Hit(call, "DDP008", "warning",
                  f"{what} runs on every rank (no rank check), so the output appears world_size times" + (
                      " (module code outside the `__main__` block: mp.spawn's start method runs it again in every "
                      "worker)" if rerun else ""),
                  "move it into the `if __name__ == \"__main__\":` block" if rerun else
                  "pass verbose=(rank == 0)" if verbose else
                  "guard it with `if rank == 0:` (ddpkit: `ddpkit.print0(ctx, ...)`)" if is_print else
                  "create the bar on rank 0 only: tqdm(..., disable=(rank != 0))")


def _under_wandb_test(s: Script, call: ast.Call) -> bool:
    """The call sits under an `if` (or a conditional expression) whose test reads wandb's state (`if wandb.run:`)."""
    node = call
    while id(node) in s.parents:
        parent = s.parents[id(node)]
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and node is not parent.test and any(
                isinstance(n, ast.Name) and s.qualname(n).split(".")[0] == "wandb" for n in ast.walk(parent.test)):
            return True
        node = parent
    return False


def _run_holders(inits: list[tuple[Script, ast.Call]]) -> set[str]:
    """Names that hold the run wandb.init returns: the variable it is assigned to (`wandb_run = wandb.init(...)`
    under the rank check, None elsewhere), then the parameters of the project's functions and classes that variable
    is handed to (`DDPMTrainer(..., wandb_run)`) and the attributes those are stored in (`self.wandb_run =
    wandb_run`), followed through every file of the program."""
    holders: set[str] = set()
    for x, init in inits:
        parent = x.parents.get(id(init))
        if isinstance(parent, ast.Assign) and parent.value is init:
            holders.update(terminal(t) for t in parent.targets if isinstance(t, (ast.Name, ast.Attribute)))
    holders.discard("")
    if not holders:
        return holders
    project = inits[0][0].project
    defs = {d.name: d for x in project.scripts.values() for d in x.defs}
    classes = {c.name: c for x in project.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)}
    changed = True
    while changed:
        changed = False
        for x in project.scripts.values():
            for node in x.nodes:
                found: set[str] = set()
                if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)) \
                        and terminal(node.value) in holders:
                    found = {terminal(t) for t in node.targets if isinstance(t, (ast.Name, ast.Attribute))}
                elif isinstance(node, ast.Call):
                    name = terminal(node.func)
                    target = defs.get(name) if name not in classes else next(
                        (d for d in classes[name].body if isinstance(d, ast.FunctionDef) and d.name == "__init__"),
                        None)
                    if target is None:
                        continue
                    params = [a.arg for a in (*target.args.posonlyargs, *target.args.args)]
                    params = params[1:] if params[:1] in (["self"], ["cls"]) else params
                    found = {k.arg for k in node.keywords if k.arg and isinstance(k.value, (ast.Name, ast.Attribute))
                             and terminal(k.value) in holders}
                    found |= {params[i] for i, a in enumerate(node.args) if i < len(params)
                              and isinstance(a, (ast.Name, ast.Attribute)) and terminal(a) in holders}
                found -= {""}
                if found - holders:
                    holders |= found
                    changed = True
    return holders


def _under_run_test(s: Script, call: ast.Call, holders: set[str]) -> bool:
    """The call sits in the body of an `if` that tests a holder of the run for None or for truth (`if
    self.wandb_run is not None:`, `if run:`): the ranks that hold no run skip it."""
    node = call
    while id(node) in s.parents:
        parent = s.parents[id(node)]
        if isinstance(parent, ast.If) and node in parent.body:
            test = parent.test
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.IsNot) \
                    and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None:
                test = test.left
            if isinstance(test, (ast.Name, ast.Attribute)) and terminal(test) in holders:
                return True
        node = parent
    return False


@check
def every_rank_records(s: Script) -> Iterator[Hit]:
    """A run record every rank writes: `wandb.log` on every rank where the program calls `wandb.init` under a rank
    check only, and the first record of each function into a tensorboard SummaryWriter every rank makes on the same
    folder (see every_rank_writer)."""
    project = s.project
    if not s.distributed or not project.distributed:
        return
    inits = project.calls_named("init")
    inits = [(x, c) for x, c in inits if x.qualname(c.func) == "wandb.init" and project.runs(x, c)]
    ranked_init = next(((x, c) for x, c in inits), None) if inits and all(
        x.context(c).level != NONE for x, c in inits) else None
    recorded: set[tuple[str, int]] = set()
    for call in sorted(s.calls, key=lambda c: (c.lineno, c.col_offset)):
        ctx = s.context(call)
        if ctx.level != NONE or ctx.single or not s.per_rank(call) or names_a_rank(s, call):
            continue
        if s.qualname(call.func) == "wandb.log" and ranked_init is not None and not _under_wandb_test(s, call) \
                and not _under_run_test(s, call, project.memo("wandb run holders", lambda: _run_holders(inits))):
            if ("wandb", ctx.scope) in recorded:
                continue  # (the first log already stops the other ranks with the error: they never get here)
            recorded.add(("wandb", ctx.scope))
            x, init = ranked_init
            yield Hit(call, "DDP008", "warning",
                      f"wandb.log() runs on every rank, but wandb.init() runs under a rank check "
                      f"({os.path.basename(x.path)}:{init.lineno}): the other ranks log without a run, which wandb "
                      "refuses with an error", "log on rank 0 only: guard it with `if rank == 0:`")
        elif s.qualname(call.func) == "wandb.init" and project.runs(s, call) and not any(
                k.arg in ("group", "mode", "reinit") or k.arg is None for k in call.keywords) \
                and not class_of(s, call) and not _run_named_by_rank(s, call):
            # (a `group=` collects deliberate per-rank runs; a `mode=` may turn the others off; a logger class is
            # often built on rank 0 alone, `WandbLogger(cfg) if rank == 0 else None`, which its methods do not see)
            yield Hit(call, "DDP008", "warning",
                      "wandb.init() runs on every rank (no rank check): each process opens its own wandb run, so the "
                      "project gets world_size runs of one job",
                      "start the run on rank 0 only (`if rank == 0: wandb.init(...)`) and log under the same check")
        elif every_rank_writer(s, call) and ("writer", _writer_key(s, call)) not in recorded:
            recorded.add(("writer", _writer_key(s, call)))  # (one per writer: the fix is one writer, on rank 0 only)
            made = _writer_made(s, call)
            yield Hit(made if made is not None else call, "DDP008", "warning",
                      f"every rank makes its own {ast.unparse(call.func.value)} (a SummaryWriter made without a rank "
                      f"check, on the same folder) and writes the same tags into it (line {call.lineno}): the run's "
                      "log gets world_size event files and each curve world_size times",
                      "make the writer on rank 0 only (`writer = SummaryWriter(logdir) if rank == 0 else None`) and "
                      "write under `if rank == 0:`")
        elif (handed := handed_writer_record(s, call)) is not None and ("writer", id(handed[1])) not in recorded:
            name, made, x, record = handed  # (the writer handed to a function of the program that records into it)
            recorded.add(("writer", id(made)))
            yield Hit(made, "DDP008", "warning",
                      f"every rank makes its own {name} (a SummaryWriter made without a rank check, on the same "
                      f"folder) and hands it to {ast.unparse(call.func)}(), which writes the same tags into it "
                      f"({os.path.basename(x.path)}:{record.lineno}): the run's log gets world_size event files and "
                      "each curve world_size times",
                      "make the writer on rank 0 only (`writer = SummaryWriter(logdir) if rank == 0 else None`) and "
                      "write under `if rank == 0:`")


def _run_named_by_rank(s: Script, call: ast.Call) -> bool:
    """`wandb.init(name=run_name)` where the name is built from the rank (`f"{stamp}_GPU{rank}"`, also through the
    function's own assignments of it): one run per process, each named for its rank, is what the script asks for."""
    name = keyword(call, "name")
    todo, seen = [name] if name is not None else [], 0
    while todo and seen < 20:
        value = todo.pop()
        seen += 1
        for n in ast.walk(value):
            if isinstance(n, (ast.Name, ast.Attribute)) and s.kind(n):
                return True
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                todo.extend(v for v in s.local_values(n.id, call) if v is not value)
    return False


@check
def print_swap_opened_by_size(s: Script) -> Iterator[Hit]:
    """A builtins.print swap whose replacement lets every rank's line through on a test of the world size
    (`force = force or (get_world_size() > 8)` before `if is_master or force:`): in runs of that size the swap
    silences nothing, and every print repeats world_size times."""
    project = s.project
    if not project.distributed:
        return
    swaps = [n for n in s.nodes if isinstance(n, ast.Assign) and id(n) in project.print_swaps]
    for swap in swaps:
        if not isinstance(swap.value, ast.Name):
            continue
        scope = s.context(swap).scope
        made = [d for d in s.defs if d.name == swap.value.id and s.context(d).scope == scope]
        if len(made) != 1:
            continue
        for node in ast.walk(made[0]):
            if not (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)):
                continue
            sized = next((v for v in node.values if isinstance(v, ast.Compare) and len(v.ops) == 1
                          and isinstance(v.ops[0], (ast.Gt, ast.GtE)) and isinstance(v.comparators[0], ast.Constant)
                          and WORLD.search(ast.unparse(v.left).lower())), None)
            if sized is None:
                continue
            stmt = node
            while id(stmt) in s.parents and not isinstance(stmt, ast.stmt):
                stmt = s.parents[id(stmt)]
            yield Hit(stmt, "DDP008", "warning",
                      f"the print that replaces builtins.print off rank 0 lets every rank's line through when "
                      f"{ast.unparse(sized)}: in runs of that size every print appears world_size times",
                      "gate the replacement on the rank alone (`if is_master or force:`, with force passed "
                      "explicitly by the calls that mean it)")
            break
