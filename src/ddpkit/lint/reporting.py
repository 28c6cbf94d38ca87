"""Where figures are shown: report calls, the project's own report helpers, and the names a shown value is built from.

A report call is `print`, `logging`, a writer's `add_scalar`, `wandb.log`, a progress bar's `set_postfix` or
`set_description`, ... A project function that hands one of its parameters to a report call (`Logger(msg)`,
`writer.log_training(loss_g, ...)`, `utils.summarize(scalars=...)`) is a report call too, followed through
the call graph; when every report inside it sits under a rank check (`if is_main_process(): print(msg)`),
calling it shows the value on one rank only. What a report shows is followed back through the
assignments of its function (`log_str = f"... {avg_loss.avg}"`, `scalars.update({"loss": loss_g})`), and a
name is reduced when some code of the program passes it to a collective (or to a project function whose
parameter reaches one) or assigns it from one: one reduction elsewhere does not vouch for other figures.
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

from ddpkit.lint.analysis import (COLLECTIVES, MPI_COLLECTIVES, NONE, REDUCING_NAME, Script, assigned_key,
                                  function_apply, terminal)

__all__ = ["SHOW_CALLS", "Reporter", "reporters", "shows", "shown_arguments", "helper_report", "built_from", "ordered_sources", "leaves", "scope_of",
           "reduced_names", "names_a_rank", "reports_only", "in_step_loop", "every_rank_writer",
           "handed_writer_record"]

SHOW_CALLS = frozenset({"print", "info", "log", "add_scalar", "add_scalars", "write", "writelines", "warning", "set_postfix",
                        "set_description", "log_metric", "log_metrics", "log_dict", "logkv", "logkv_mean", "record_tabular"})
"""Calls that show or record the values they are given."""
_FILE_WRITES = frozenset({"write", "writelines"})
"""Not what makes a function a report helper (`sys.stdout.write` excepted): `fout.write(yaml.dump(info))` records
state next to a checkpoint."""
_COLLECTING = frozenset({"update", "append", "extend", "add_", "add"})


def _params(d: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = d.args
    return {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if p is not None} - {"self",
                                                                                                           "cls"}


def _arguments(call: ast.Call) -> list[ast.AST]:
    return [*call.args, *(k.value for k in call.keywords)]


_CARRIERS = frozenset({"tensor", "as_tensor", "Tensor", "FloatTensor", "DoubleTensor", "LongTensor", "stack", "cat",
                       "float", "int", "round", "abs", "list", "tuple", "dict", "format", "join", "mean", "sum",
                       "zip", "enumerate", "sorted", "reversed", "str", "exp", "log", "log2", "log10", "sqrt"})
"""Calls whose arguments are the value they make: `torch.tensor([a, b])`, `float(x)`, `str(x)`, `"{}".format(x)`, the pairs
of `dict(zip(names, reduced))`, and the same figure on another scale (`np.log(loss)`, `math.exp(loss)`: a reduced
loss stays reduced)."""


def _value_names(expr: ast.AST, defined: set[str], passes: dict[str, set[int]] | None = None) -> list[str]:
    """The variables a value is computed from, in reading order: names and the roots of attributes, not the
    functions called, and not the arguments of a project function (what it returns is its own value).

    Given `passes` (project function -> positions of the parameters its return value carries), only what may
    carry the value itself is followed: a method's receiver (`loss.item()`), the arguments of a conversion
    (`torch.tensor([a, b])`) or of a project function that returns them (`to_python_float(reduced)`), not those
    of any other call (`criterion(out, y)` is a new value)."""
    out: dict[str, None] = {}
    todo = [expr]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Call):
            name = terminal(node.func)
            receiver = [node.func.value] if isinstance(node.func, ast.Attribute) else []
            if name in defined:
                given = [a for i, a in enumerate(node.args) if passes is not None and i in passes.get(name, ())]
            elif passes is None or name in ("format", "dict"):
                given = [*node.args, *(k.value for k in node.keywords)]
            else:  # `torch.tensor([n], device=device)` carries n alone
                given = list(node.args) if name in _CARRIERS else []
            todo.extend(reversed([*receiver, *given]))
            continue
        if isinstance(node, ast.Name):
            out[node.id] = None
            continue
        if passes is None and _item(node):
            out[_item(node)] = None  # `checkpoint["epoch"]`: that item, not all the container holds
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(node))))
    return list(out)


def _item(node: ast.AST) -> str:
    """`d['epoch']` for an item a name's string key reads (`d["epoch"]`), else ''."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Constant) \
            and isinstance(node.slice.value, str):
        return f"{node.value.id}[{node.slice.value!r}]"
    return ""


def leaves(s: Script, scope: ast.AST, expr: ast.AST, depth: int = 3, line: int | None = None) -> list[ast.AST]:
    """The separate values a report shows: the fields of an f-string, of `.format()` and of `%`, a dict's values,
    also through the variable's assignment last before `line` (`line = f"..."; print(line)`)."""
    line = getattr(expr, "lineno", 0) if line is None else line

    def split(e: ast.AST) -> list[ast.AST]:
        return leaves(s, scope, e, depth, line)

    if isinstance(expr, ast.JoinedStr):
        return [leaf for v in expr.values if isinstance(v, ast.FormattedValue) for leaf in split(v.value)]
    if isinstance(expr, ast.Call) and terminal(expr.func) == "format" and isinstance(expr.func, ast.Attribute):
        return [leaf for a in (*expr.args, *(k.value for k in expr.keywords)) for leaf in split(a)]
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod) and isinstance(expr.left, (ast.Constant,
                                                                                               ast.BinOp)):
        return split(expr.right)
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) and any(
            isinstance(e, ast.JoinedStr) or isinstance(e, ast.Constant) and isinstance(e.value, str)
            for e in (expr.left, expr.right)):
        return [*split(expr.left), *split(expr.right)]  # f"..." + f"..."
    if isinstance(expr, (ast.Tuple, ast.List)):
        return [leaf for e in expr.elts for leaf in split(e)]
    if isinstance(expr, ast.Dict):
        return [leaf for v in expr.values for leaf in split(v)]
    if isinstance(expr, ast.Starred):
        return split(expr.value)
    if isinstance(expr, ast.Name) and depth:
        bindings = s.project.memo(("bindings", id(scope)), lambda: _bindings(_own(s.project, scope)))
        earlier = [(n, v) for n, v in bindings.get(expr.id, ()) if n <= line]
        value = earlier[-1][1] if earlier else None
        if value is not None and isinstance(value, (ast.JoinedStr, ast.Dict, ast.BinOp, ast.Call)):
            parts = leaves(s, scope, value, depth - 1, line)
            if len(parts) > 1:
                return parts
    return [expr]


def _bindings(nodes: list[ast.AST]) -> dict[str, list[tuple[int, ast.AST | None]]]:
    """name -> (line, value) of each place the scope binds or changes it, in line order; the value of a plain
    `name = value`, else None (`+=`, a loop, `d.update(...)`)."""
    out: dict[str, list[tuple[int, ast.AST | None]]] = {}
    for node in nodes:
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Assign):
            for t in node.targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, []).append((line, node.value if t is n else None))
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.NamedExpr)):
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    out.setdefault(n.id, []).append((line, None))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value,
                                                                                                ast.Name):
            out.setdefault(node.func.value.id, []).append((line, None))  # `d.update(...)` changes it
    return {k: sorted(v, key=lambda p: p[0]) for k, v in out.items()}


def _defined(project) -> set[str]:
    return project.memo("defined functions", lambda: {d.name for x in project.scripts.values() for d in x.defs})


def _flows_into(nodes: list[ast.AST], defined: set[str], passes: dict[str, set[int]] | None
                ) -> dict[str, list[str]]:
    """name -> the names its values in this scope are built from (assignments, `+=`, `x.update(v)`, `x[k] = v`;
    loops: given `passes`, every name of the target from the iterable, else see _loop_bindings; and given
    `passes` only what carries the value: see _value_names)."""
    out: dict[str, dict[str, None]] = {}
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            read = _value_names(node.value, defined, passes)
            for t in targets:
                for n in [t] if not isinstance(t, (ast.Tuple, ast.List)) else t.elts:
                    root = _root(n)
                    if root:
                        out.setdefault(root, {}).update(dict.fromkeys(read))
                    if passes is None and _item(n):  # `d["loss"] = v`: that item holds v
                        out.setdefault(_item(n), {}).update(dict.fromkeys(read))
                    if passes is None and isinstance(n, ast.Name) and isinstance(node.value, ast.Dict):
                        for k, v in zip(node.value.keys, node.value.values):  # `d = {"epoch": epoch, ...}`
                            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                                out.setdefault(f"{n.id}[{k.value!r}]", {}).update(
                                    dict.fromkeys(_value_names(v, defined, passes)))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and passes is not None:
            read = _value_names(node.iter, defined, passes)
            for n in ast.walk(node.target):
                if isinstance(n, ast.Name):
                    out.setdefault(n.id, {}).update(dict.fromkeys(read))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            # a report's names: `v` of `for k, v in meters.items()` comes from `meters`, `k` from no value
            for target, source in _loop_bindings(node.target, node.iter):
                read = _value_names(source, defined, passes)
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, {}).update(dict.fromkeys(read))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _COLLECTING:
            root = _root(node.func.value)
            if root:
                # `meter.update(value, n)`, `meters.update(loss=reduced, **parts)`: the values, not the weight
                given = _arguments(node) if passes is None else [*node.args[:1], *(
                    k.value for k in node.keywords if k.arg not in ("n", "count", "weight"))]
                out.setdefault(root, {}).update(dict.fromkeys(n for a in given for n in _value_names(a, defined, passes)))
    return {k: list(v) for k, v in out.items()}


def _loop_bindings(target: ast.AST, source: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(part of a loop target, the expression its values come from): the values of `d.items()` and `d.values()`
    (not the keys), the items of `enumerate(x)` (not the index), each element of `zip(a, b)` from its own
    argument, else the target from the whole iterable."""
    pair = isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) and not source.args:
        if source.func.attr == "items":
            return [(target.elts[1], source.func.value)] if pair else []
        if source.func.attr == "values":
            return [(target, source.func.value)]
        if source.func.attr == "keys":
            return []
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Name) and source.args:
        if source.func.id == "enumerate":
            return _loop_bindings(target.elts[1], source.args[0]) if pair else []
        if source.func.id == "zip" and isinstance(target, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(source.args):
            return [b for t, a in zip(target.elts, source.args) for b in _loop_bindings(t, a)]
    return [(target, source)]


def _call_positions(d: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The parameters a call fills by position: a method's `self`/`cls` is not one of them."""
    params = [p.arg for p in (*d.args.posonlyargs, *d.args.args)]
    return params[1:] if params[:1] in (["self"], ["cls"]) else params


def _own(project, scope: ast.AST) -> list[ast.AST]:
    """_own_nodes, once per scope and project (shared with flow.py's)."""
    return project.memo(("own nodes", id(scope)), lambda: _own_nodes(scope))


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a function (or module) outside the functions and classes it defines."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            out.append(node)
            todo.extend(ast.iter_child_nodes(node))
    return out


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def built_from(s: Script, scope: ast.AST, exprs: list[ast.AST]) -> set[str]:
    """The variables that may carry the values of `exprs`, followed through the assignments and loops of `scope`
    (the function the expressions are in, or the module); see _value_names."""
    return set(_follow(s, scope, exprs, _passes(s.project)))


def ordered_sources(s: Script, scope: ast.AST, exprs: list[ast.AST], kept: frozenset[str] = frozenset()
                    ) -> list[str]:
    """The names a report is built from, followed through the assignments of `scope`, nearest first (breadth
    first from the expressions, each in reading order); the names in `kept` are sources not followed further."""
    return _follow(s, scope, exprs, None, kept)


def _follow(s: Script, scope: ast.AST, exprs: list[ast.AST], passes: dict[str, set[int]] | None,
            kept: frozenset[str] = frozenset()) -> list[str]:
    defined = _defined(s.project)
    flows = s.project.memo(("flows into", id(scope), passes is None),
                           lambda: _flows_into(_own(s.project, scope), defined, passes))
    todo = [n for e in exprs for n in _value_names(e, defined, passes)]
    seen: dict[str, None] = {}
    while todo:
        name = todo.pop(0)
        if name not in seen:
            seen[name] = None
            if name.endswith("]") and name not in flows:  # an item the scope never stores: what the container holds
                todo.extend(flows.get(name.split("[", 1)[0], ()))
            else:
                todo.extend(flows.get(name, ()) if name not in kept else ())
    return list(seen)


def _passes(project) -> dict[str, set[int]]:
    """Project functions whose return value carries some of their parameters: name -> their positions
    (`def to_python_float(t): return t.item()`)."""
    def compute() -> dict[str, set[int]]:
        found: dict[str, set[int]] = {}
        defined = _defined(project)
        for _ in range(3):
            before = {k: set(v) for k, v in found.items()}
            for x in project.scripts.values():
                for d in x.defs:
                    params = _call_positions(d)
                    returns = [n.value for n in _own(project, d) if isinstance(n, ast.Return) and n.value is not None]
                    if not returns:
                        continue
                    flows = _flows_into(_own(project, d), defined, before)
                    todo = [n for r in returns for n in _value_names(r, defined, before)]
                    seen: set[str] = set()
                    while todo:
                        name = todo.pop()
                        if name not in seen:
                            seen.add(name)
                            todo.extend(flows.get(name, ()))
                    hit = {i for i, p in enumerate(params) if p in seen}
                    if hit:
                        found.setdefault(d.name, set()).update(hit)
            if found == before:
                break
        return found

    return project.memo("passes", compute)


def scope_of(s: Script, node: ast.AST) -> ast.AST:
    """The function `node` is in (the module for module code)."""
    scope = s.context(node).scope
    return next((d for d in s.defs if id(d) == scope), s.tree) if scope else s.tree


class Reporter(NamedTuple):
    """A project function that shows some of its parameters."""

    rank_zero: bool
    """Only a rank check's code shows them (`if is_main_process(): print(msg)`): calling it reports on one rank."""
    names: frozenset[str]
    """The names of what it shows itself, its own or its helpers'."""
    shown: frozenset[str]
    """The parameters whose values it shows."""
    order: tuple[str, ...]
    """Its positional parameters (`self` left out), to bind a call's arguments."""
    spread: frozenset[str] = frozenset()
    """Where it shows its `**kwargs`: the parameters it names, so a keyword not among them lands in `**kwargs`
    (`writer.update(loss=loss_value, head="loss")` for `def update(self, head="scalar", step=None, **kwargs)`)."""


def reporters(s: Script) -> dict[str, Reporter]:
    """Project functions that show one of their parameters, by name."""
    project = s.project

    def compute() -> dict[str, Reporter]:
        found: dict[str, Reporter] = {}
        for _ in range(3):
            before = dict(found)
            for x in project.scripts.values():
                for d in x.defs:
                    params = _params(d)
                    if not params:
                        continue
                    guarded: list[bool] = []
                    named: set[str] = set()
                    shown: set[str] = set()
                    for call in _calls(project, d):
                        if not _is_show(x, call, before) or (
                                terminal(call.func) in _FILE_WRITES
                                and not x.qualname(call.func).startswith(("sys.stdout.", "sys.stderr."))) \
                                or _prints_to_a_file(x, call):
                            continue
                        inner = before.get(terminal(call.func))
                        sources = built_from(x, d, shown_arguments(call, inner))
                        if not sources & params:
                            continue
                        guarded.append(x.context(call).level != NONE or bool(inner and inner.rank_zero))
                        named.update(sources, _direct_names(call), inner.names if inner else ())
                        shown.update(sources & params)
                    if guarded:
                        old = found.get(d.name)
                        spread = d.args.kwarg.arg if d.args.kwarg else ""
                        found[d.name] = Reporter(
                            (old is None or old.rank_zero) and all(guarded),
                            (old.names if old else frozenset()) | named,
                            (old.shown if old else frozenset()) | shown,
                            tuple(_call_positions(d)),
                            frozenset(a.arg for a in (*d.args.posonlyargs, *d.args.args, *d.args.kwonlyargs))
                            if spread and spread in shown | (old.shown if old else frozenset()) else frozenset())
            if found == before:
                break
        return found

    return project.memo("reporters", compute)


def _prints_to_a_file(s: Script, call: ast.Call) -> bool:
    """`print(msg, file=self.file)`: print into a file the program opened (each rank's log file), not the console
    (`file=sys.stdout`/`sys.stderr` is the console)."""
    target = next((k.value for k in call.keywords if k.arg == "file"), None)
    return isinstance(call.func, ast.Name) and call.func.id == "print" and target is not None \
        and not (isinstance(target, ast.Constant) and target.value is None) \
        and not s.qualname(target).startswith(("sys.stdout", "sys.stderr", "sys.__stdout__", "sys.__stderr__"))


def shown_arguments(call: ast.Call, helper: Reporter | None) -> list[ast.AST]:
    """The arguments a report call shows: all of a library call's, those a project helper binds to the
    parameters it shows (`train(model, loader, loss_fn=...)` shows only what `train` prints)."""
    if helper is None:
        return _arguments(call)
    positional = [a for name, a in zip(helper.order, call.args) if name in helper.shown]
    return [*positional, *(k.value for k in call.keywords if k.arg in helper.shown or k.arg is None
                           or helper.spread and k.arg not in helper.spread)]


def _direct_names(call: ast.Call) -> list[str]:
    return [terminal(n) for a in _arguments(call) for n in ast.walk(a) if isinstance(n, (ast.Name, ast.Attribute))]


def _is_show(s: Script, call: ast.Call, helpers: dict) -> bool:
    name = terminal(call.func)
    if name in helpers:
        return True
    return name in SHOW_CALLS and not s.qualname(call.func).startswith(
        ("math.", "numpy.", "torch.", "os.", "pickle.", "dill."))


def shows(s: Script, call: ast.Call) -> bool:
    """Whether `call` shows or records its arguments (directly, or through a project report helper)."""
    return _is_show(s, call, reporters(s)) and not _quiet_method(s, call)


def helper_report(s: Script, call: ast.Call) -> Reporter | None:
    """The project report helper a call calls, else None."""
    found = reporters(s).get(terminal(call.func))
    return None if found is None or _quiet_method(s, call) else found


def _quiet_method(s: Script, call: ast.Call) -> bool:
    """`meter.update(v)` where `meter` only ever holds an object of one project class whose own `update` shows
    nothing (an AverageMeter), though another class of the program has an `update` that reports: the method is
    picked by the receiver's class, not by its name."""
    if not (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, (ast.Name, ast.Attribute))):
        return False
    receiver = call.func.value
    key = receiver.id if isinstance(receiver, ast.Name) else "." + receiver.attr
    values = [v for k, v in s.assignments if k == key]
    if not values or not all(isinstance(v, ast.Call) for v in values) or len({terminal(v.func) for v in values}) != 1:
        return False
    project = s.project
    classes = project.memo("classes by name", lambda: _classes_by_name(project))
    made = terminal(values[0].func)
    defs = classes.get(made, [])
    if not defs and made[:1].isupper() and call.func.attr not in SHOW_CALLS and made not in project.defined_functions:
        # `meter = utils.AverageMeter()` of a class the program does not define: its `update` is not the project's
        # function of that name
        return True
    if len(defs) != 1:
        return False
    x, cls = defs[0]
    method = next((d for d in cls.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and d.name == call.func.attr), None)
    if method is None:
        return False  # (inherited, or set on the object: not known)
    helpers = reporters(s)
    return not any(isinstance(c, ast.Call) and _is_show(x, c, helpers) for c in ast.walk(method))


def _classes_by_name(project) -> dict[str, list[tuple[Script, ast.ClassDef]]]:
    found: dict[str, list[tuple[Script, ast.ClassDef]]] = {}
    for x in project.scripts.values():
        for n in x.nodes:
            if isinstance(n, ast.ClassDef):
                found.setdefault(n.name, []).append((x, n))
    return found


def _calls(project, d: ast.AST) -> list[ast.Call]:
    """The calls a function makes, those of the functions it defines included."""
    return project.memo(("calls in", id(d)), lambda: [n for n in ast.walk(d) if isinstance(n, ast.Call)])


RECEIVER = -1
"""The position _reducers gives a method's own object (`meter.all_reduce()` carries `meter`)."""


def _reducers(project) -> dict[str, set[int]]:
    """Project functions that hand a parameter to a collective: name -> positions of those parameters."""
    found: dict[str, set[int]] = {}
    for _ in range(3):
        before = {k: set(v) for k, v in found.items()}
        for x in project.scripts.values():
            for d in x.defs:
                params = _call_positions(d)
                for call in _calls(project, d):
                    if not _collective(x, call, before):
                        continue
                    read = built_from(x, d, _carried(x, call, before))
                    for i, p in enumerate(params):
                        if p in read:
                            found.setdefault(d.name, set()).add(i)
                    # a method that reduces its object's own state (`def all_reduce(self): infos =
                    # torch.tensor([self.sum, self.cnt]); dist.all_reduce(infos)`): its receiver is carried
                    if d.args.args and d.args.args[0].arg == "self" and "self" in read \
                            and _reduces_own_state(d, call, before):
                        found.setdefault(d.name, set()).add(RECEIVER)
        if found == before:
            break
    return found


def _reduces_own_state(d: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call,
                       helpers: dict[str, set[int]]) -> bool:
    """The method `d` reduces its object's own state in place through `call`: it stores the collective's result
    back into an attribute of `self` (`self.sum, self.cnt = infos.tolist()` after `all_reduce(infos)`), or `call`
    is such a method of an object `self` keeps (`self.metrics[idx].all_reduce(device)`). A method that only
    reads `self` into a collective (`eval` gathering `self.scores`) leaves its object's other figures alone."""
    if RECEIVER in helpers.get(terminal(call.func), ()) and isinstance(call.func, ast.Attribute):
        receiver = call.func.value
        return not (isinstance(receiver, ast.Name) and receiver.id == "self") and any(
            isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(receiver))
    carried = {n.id for a in call.args for n in ast.walk(a) if isinstance(n, ast.Name)}
    return any(isinstance(n, ast.Assign) and n.lineno > call.lineno
               and any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                       for target in n.targets for t in ast.walk(target))
               and any(isinstance(v, ast.Name) and v.id in carried for v in ast.walk(n.value))
               for n in ast.walk(d))


def reducing_helpers(project) -> dict[str, set[int]]:
    """Project functions that hand a parameter to a collective: name -> positions of those parameters."""
    return project.memo("reducing helpers", lambda: _reducers(project))


def _collective(s: Script, call: ast.Call, helpers: dict[str, set[int]]) -> bool:
    name = terminal(call.func)
    if name in helpers:
        return True
    if function_apply(s, call) is not None:
        return True
    if (name in COLLECTIVES or name.lower() in MPI_COLLECTIVES) and s.is_dist_collective(call):
        return True
    # `reduce_tensor(x)`, `gather_all(x)` from a library; not a class (`SyncBatchNorm`) nor a converter
    return name not in _defined(s.project) and name[:1].islower() and bool(REDUCING_NAME.search(name.lower())) \
        and "batchnorm" not in name.lower()


def _carried(s: Script, call: ast.Call, helpers: dict[str, set[int]]) -> list[ast.AST]:
    """What a collective call carries across ranks: its positional arguments (those a project helper hands on),
    or the receiver of a reducing method (`meter.synchronize_between_processes()`)."""
    if s.is_dist_collective(call):
        return list(call.args)
    name = terminal(call.func)
    if name in helpers:
        return [a for i, a in enumerate(call.args) if i in helpers[name]] + (
            [call.func.value] if RECEIVER in helpers[name] and isinstance(call.func, ast.Attribute)
            and not (isinstance(call.func.value, ast.Name) and call.func.value.id == "self") else [])
    applied = function_apply(s, call)
    if applied is not None:
        return [a for i, a in enumerate(call.args) if i in applied]
    return [*call.args, *([call.func.value] if isinstance(call.func, ast.Attribute) else [])]


def _reduced_values(project, arg: ast.AST) -> set[str]:
    """The variables a collective's argument carries: `t`, `loss.data`, `torch.tensor([a, b])`, `[x, y]`."""
    return set(_value_names(arg, _defined(project), _passes(project)))


_CONVERSIONS = frozenset({"item", "cpu", "tolist", "float", "double", "detach", "numpy", "clone"})


def _assigned_from(s: Script, call: ast.Call) -> ast.AST | None:
    """The statement a call's result is assigned by, through conversions that keep the whole value
    (`reduced = reduce_tensor(loss.data, n).item()`, `.cpu()`, `.tolist()`), else its parent."""
    node, parent = call, s.parents.get(id(call))
    while True:
        above = s.parents.get(id(parent)) if isinstance(parent, ast.Attribute) else None
        if isinstance(above, ast.Call) and above.func is parent and (parent.attr in _CONVERSIONS or parent.attr in (
                "mean", "sum") and node is call) and not above.args and not above.keywords:
            # (`gather(v).mean()`: the mean over the ranks' values is still the reduced figure)
            node, parent = above, s.parents.get(id(above))
            continue
        if isinstance(parent, ast.DictComp) and parent.value is node or isinstance(
                parent, (ast.ListComp, ast.SetComp, ast.GeneratorExp)) and parent.elt is node:
            # `logs = {k: gather(v).mean() for k, v in logs.items()}`: every item the comprehension builds is reduced
            node, parent = parent, s.parents.get(id(parent))
            continue
        return parent


def _syncs_on_compute(call: ast.Call) -> bool:
    """A torchmetrics Metric built without `sync_on_compute=False` or a `dist_sync_fn` of its own: compute()
    reduces every rank's state."""
    given = {k.arg: k.value for k in call.keywords}
    sync = given.get("sync_on_compute")
    return not (isinstance(sync, ast.Constant) and sync.value is False) and "dist_sync_fn" not in given


def _moved(s: Script, call: ast.Call) -> ast.AST | None:
    """The parent of `call` above the moves that keep the object (`.to(device)`, `.cuda(rank)`, `.cpu()`)."""
    node, parent = call, s.parents.get(id(call))
    while isinstance(parent, ast.Attribute) and parent.attr in ("to", "cuda", "cpu"):
        above = s.parents.get(id(parent))
        if not (isinstance(above, ast.Call) and above.func is parent):
            break
        node, parent = above, s.parents.get(id(above))
    return parent


_OBJECT = frozenset({"self", "cls"})


def reduced_names(s: Script) -> set[str]:
    """Variables some code of the program passes to a collective (or to a project function whose parameter reaches
    one) or assigns from one, or from a project function that makes a collective; torchmetrics objects."""
    project = s.project

    def compute() -> set[str]:
        helpers = _reducers(project)
        out: set[str] = set()
        for x in project.scripts.values():
            for call in x.calls:
                if not project.runs(x, call):
                    continue  # a reduction helper nothing calls reduces nothing (`reduce_loss_dict` left unused)
                name = terminal(call.func)
                parent = _assigned_from(x, call)
                if isinstance(parent, (ast.Assign, ast.AnnAssign)) and (
                        _collective(x, call, helpers) or name in project.reducing_functions):
                    targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
                    out.update(r for t in targets for n in ([t] if not isinstance(t, (ast.Tuple, ast.List)) else t.elts)
                               for r in [_root(n)] if r)
                if x.qualname(call.func).startswith("torchmetrics.") and _syncs_on_compute(call):
                    # a torchmetrics object syncs its state across ranks in compute(), also once moved to the
                    # rank's device (`MeanMetric().cuda(rank)`)
                    made = _moved(x, call)
                    if isinstance(made, ast.Assign):
                        out.update(r for t in made.targets for r in [_root(t)] if r)
                if not _collective(x, call, helpers):
                    continue
                # a comprehension's own variable (`v` of `{k: gather(v) for k, v in logs.items()}`) is reduced only
                # in the item the comprehension builds: its assignment's target is (see _assigned_from)
                local = set()
                node = call
                while id(node) in x.parents and not isinstance(node, ast.stmt):
                    node = x.parents[id(node)]
                    if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                        local |= {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
                for a in _carried(x, call, helpers):
                    names = _reduced_values(project, a) - local
                    # `all_reduce(self.loss_sum)` reduces that attribute, not every value the object holds
                    # (`all_reduce_norm(self.model)` says nothing of `self.meter`)
                    attributes = {"." + n.attr for n in ast.walk(a) if isinstance(n, ast.Attribute)
                                  and isinstance(n.value, ast.Name) and n.value.id in _OBJECT}
                    out.update(attributes | (names - _OBJECT if attributes else names))
        out |= _refilled(project, out)
        out |= _returned_reduced(project, out)
        # imported modules and names (`torch` of `torch.tensor([a, b])`) carry no figure
        return out - {a for x in project.scripts.values() for a in x.aliases}

    return project.memo("reduced names", compute)


def _refilled(project, reduced: set[str]) -> set[str]:
    """Objects emptied and refilled with reduced values: `meter.reset()` followed at once by `meter.update(v)` (any
    method but `reset`) where `v` is built from reduced values (`v[key] = gathered_mean[i].item()`): what the meter
    holds from then on is the run's figure."""
    found: set[str] = set()
    for x in project.scripts.values():
        for block in (b for n in x.nodes for f in ("body", "orelse") for b in [getattr(n, f, None)]
                      if isinstance(b, list) and len(b) > 1 and isinstance(b[0], ast.stmt)):
            for first, then in zip(block, block[1:]):
                emptied = _method_call(first)
                refill = _method_call(then)
                if not (emptied and refill and emptied[1] in ("reset", "clear") and refill[1] not in ("reset", "clear")
                        and ast.dump(emptied[0]) == ast.dump(refill[0]) and refill[2].args):
                    continue
                scope = scope_of(x, then)
                if all(built_from(x, scope, [a]) & reduced for a in refill[2].args):
                    root = _root(emptied[0])
                    if root and root not in _OBJECT:
                        found.add(root)
    return found


def _returned_reduced(project, reduced: set[str]) -> set[str]:
    """`results = self.evaluate()` where every `return` of the project's `evaluate` gives a reduced variable
    (`return logs` after `logs = {k: gather(v).mean() ...}`): the caller's variable holds the reduced figure too."""
    returning: set[str] = set()
    for x in project.scripts.values():
        for d in x.defs:
            values = [r.value for r in ast.walk(d) if isinstance(r, ast.Return) and r.value is not None
                      and scope_of(x, r) is d]
            if values and all(isinstance(v, ast.Name) and v.id in reduced for v in values):
                returning.add(d.name)
    defined = [d.name for x in project.scripts.values() for d in x.defs]
    returning = {name for name in returning if defined.count(name) == 1}  # (one function of that name)
    found: set[str] = set()
    for x in project.scripts.values():
        for k, v in x.assignments:
            if isinstance(v, ast.Call) and terminal(v.func) in returning and not k.startswith("."):
                found.add(k)
    return found


def _method_call(stmt: ast.stmt) -> tuple[ast.AST, str, ast.Call] | None:
    """(receiver, method, call) of a statement that is one method call (`meter.reset()`), else None."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(stmt.value.func, ast.Attribute):
        return stmt.value.func.value, stmt.value.func.attr, stmt.value
    return None


_RANK_ZERO_TEXT = re.compile(r"\b(rank|gpu)[ _-]?(0|zero)\b", re.IGNORECASE)
"""Text that says the figure is rank 0's own ("Rank-0 Batch Wise/train_loss", "[GPU 0/{world_size}] loss"), not the
run's."""


def names_a_rank(s: Script, call: ast.Call) -> bool:
    """The line says whose it is: a rank value written into it, or text naming the rank. A rank read only by the
    test of a conditional expression inside an argument (`world_size if local_rank != -1 else 1`, a factor of
    a total) picks a value; it is not written out."""
    parts = [n for a in (*call.args, *(k.value for k in call.keywords)) for n in ast.walk(a)]
    tested = {id(n) for p in parts if isinstance(p, ast.IfExp) for n in ast.walk(p.test)}
    parts = [n for n in parts if id(n) not in tested]
    # (an object only some ranks hold, `self.writer` made on rank 0 alone, is handed along, not written out)
    return any(s.kind(n) for n in parts
               if isinstance(n, (ast.Name, ast.Attribute)) and assigned_key(n) not in s.rank_only) \
        or any(
        isinstance(n, ast.Constant) and isinstance(n.value, str)
        and (re.search(r"rank ?0|rank\b", n.value) or _RANK_ZERO_TEXT.search(n.value)) for n in parts)


def _rank_check(s: Script, stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and s.kind(stmt.test) != NONE


def reports_only(s: Script, stmt: ast.stmt) -> bool:
    """A report statement: a call that shows its arguments, or a `with`, `for` or `if` of nothing else
    (`for k, v in parts.items(): writer.add_scalar(k, v, step)`)."""
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Call) and shows(s, stmt.value)
    if isinstance(stmt, (ast.With, ast.For, ast.If)) and not _rank_check(s, stmt):
        # (a rank check starts a report block of its own)
        return all(reports_only(s, x) for x in (*stmt.body, *getattr(stmt, "orelse", ())))
    return False


def in_step_loop(s: Script, scope: ast.AST, call: ast.Call) -> bool:
    """The report sits in a loop of `scope` that runs `backward()`: a progress line of the current batch."""
    node = call
    while id(node) in s.parents and node is not scope:
        node = s.parents[id(node)]
        if isinstance(node, (ast.For, ast.While)) and any(
                isinstance(c, ast.Call) and terminal(c.func) == "backward" for c in ast.walk(node)):
            return True
    return False


def every_rank_writer(s: Script, call: ast.Call) -> bool:
    """`writer.add_scalar(...)` where `writer` is a tensorboard SummaryWriter this file makes on every rank (no rank
    check around it, no rank in its arguments) and only there."""
    if terminal(call.func) not in ("add_scalar", "add_scalars") or not isinstance(call.func, ast.Attribute) \
            or not isinstance(call.func.value, (ast.Name, ast.Attribute)):
        return False
    key = terminal(call.func.value) if isinstance(call.func.value, ast.Name) else "." + call.func.value.attr
    return _made_on_every_rank(s, key)


def _made_on_every_rank(s: Script, key: str) -> bool:
    """Every binding of `key` in this file is a SummaryWriter made with no rank check and no rank in its arguments."""
    made = [v for k, v in s.assignments if k == key]
    return bool(made) and all(
        isinstance(v, ast.Call) and terminal(v.func) == "SummaryWriter" and not s.context(v).level
        and not s.context(v).single
        and not any(s.kind(n) for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute)))
        for v in made)


def handed_writer_record(s: Script, call: ast.Call) -> tuple[str, ast.Call, Script, ast.Call] | None:
    """(writer name, where it is made, file, record) where `call` hands a SummaryWriter this file makes on every rank
    (see every_rank_writer) to a function of the program that records through that parameter with no rank check
    (`train(model, loader, writer)` then `writer.add_scalars(...)` in train, or handed on once more:
    `evaluate(model, val_logger)` whose `log(logger, step)` calls `logger.add_scalar(...)`)."""
    for i, arg in [*enumerate(call.args), *((k.arg, k.value) for k in call.keywords if k.arg)]:
        if not isinstance(arg, ast.Name) or not _made_on_every_rank(s, arg.id):
            continue
        made = next(v for k, v in s.assignments if k == arg.id)
        found = _records_through(s, call, i, 0)
        if found is not None:
            return arg.id, made, *found
    return None


def _records_through(s: Script, call: ast.Call, at: int | str, depth: int) -> tuple[Script, ast.Call] | None:
    """The first record (`add_scalar`, `add_scalars`) through the parameter that argument `at` of `call` fills, in a
    module-level function of the program, run on every rank; followed through one more such call."""
    target = s.project.callee(s, call)
    if target is None or depth > 1:
        return None
    x, name = target
    d = next((f for f in x.tree.body if isinstance(f, ast.FunctionDef) and f.name == name), None)
    params = [a.arg for a in d.args.args] if d is not None else []
    param = params[at] if isinstance(at, int) and at < len(params) else at if at in params else None
    if param is None or d.args.vararg is not None and isinstance(at, int):
        return None
    if any(isinstance(n, ast.Name) and n.id == param and isinstance(n.ctx, ast.Store) for n in ast.walk(d)):
        return None  # (the function binds the name to something else)
    for c in sorted((n for n in ast.walk(d) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)):
        if x.context(c).level != NONE or x.context(c).single:
            continue
        if terminal(c.func) in ("add_scalar", "add_scalars") and isinstance(c.func, ast.Attribute) \
                and isinstance(c.func.value, ast.Name) and c.func.value.id == param:
            return x, c
        for j, a in [*enumerate(c.args), *((k.arg, k.value) for k in c.keywords if k.arg)]:
            if isinstance(a, ast.Name) and a.id == param:
                found = _records_through(x, c, j, depth + 1)
                if found is not None:
                    return found
    return None
