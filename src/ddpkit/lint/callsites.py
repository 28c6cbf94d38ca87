"""Guards and values that cross files at call sites: the rank check around the calls of a helper, a class's
constructor or a parameter, given to the code they reach. `project` is a ddpkit.lint.project.Project and
`script` one of its ddpkit.lint.analysis.Script objects (not imported here: the project imports this module)."""

from __future__ import annotations

import ast

from ddpkit.lint.bindings import optional_parameters, passes
from ddpkit.lint.ranks import GLOBAL, NONE, is_main_flag, rank_side, terminal

__all__ = ["external_levels", "global_parameter", "through_reexport"]


def external_levels(project) -> dict[str, dict[str, int]]:
    """path -> {function name, `f(param)`, `__init__`, `.attribute`: guard level} from the calls in other files."""
    levels: dict[str, dict[str, int]] = {}
    methods: dict[str, list[str]] = {}
    for path, script in project.scripts.items():
        for d in script.defs:
            if d.args.args and d.args.args[0].arg == "self":
                methods.setdefault(d.name, []).append(path)
    sides: dict[tuple[str, str], dict[tuple[str, bool], int]] = {}
    """(file, function) -> {(rank expression, rank 0's side): the level around that rank check}"""
    for path, script in project.scripts.items():
        ifs = {id(n): n for n in script.nodes if isinstance(n, ast.If)}
        for call in script.calls:
            target = project.resolve(script, call.func)
            if target is None and isinstance(call.func, ast.Attribute):
                # `trainer.save_checkpoint()` on an object of a class another file defines: followed when
                # exactly one file of the program defines a method of that name (not module calls)
                owner = call.func.value
                while isinstance(owner, ast.Attribute):
                    owner = owner.value
                homes = methods.get(call.func.attr, [])
                if len(homes) == 1 and not (isinstance(owner, ast.Name) and owner.id in script.aliases):
                    target = (homes[0], call.func.attr)
            if target is None or target[0] == path or script.context(call).single:
                continue  # (a call in the single-process branch of a mode check is one process's)
            level = script.context(call).level
            if script.context(call).functions:
                level = max(level, script.function_level.get(script.context(call).functions[-1], NONE))
            into = levels.setdefault(target[0], {})
            into[target[1]] = min(into.get(target[1], GLOBAL), level)
            branches = script.context(call).branches
            side = rank_side(ifs[branches[-1][0]].test, branches[-1][1]) \
                if branches and branches[-1][0] in ifs else None
            if side is not None:
                found = sides.setdefault(target, {})
                found[side] = min(found.get(side, GLOBAL), script.context(ifs[branches[-1][0]]).level)
                if (side[0], not side[1]) in found:
                    # `if rank == 0: build()` ... `if rank != 0: build()`: the two calls run it on every rank
                    into[target[1]] = min(into[target[1]], max(found[side], found[(side[0], not side[1])]))
            defs = [d for d in project.scripts[target[0]].defs if d.name == target[1]]
            for param in optional_parameters(defs):
                if passes(call, defs, target[1], param):  # see Script._visit: `if model is not None:`
                    key = f"{target[1]}({param})"
                    into[key] = min(into.get(key, GLOBAL), level)
    _constructor_levels(project, levels)
    _decorator_levels(project, levels)
    _helper_answers(project, levels)
    _flag_levels(project, levels)
    _flag_parameters(project, levels)
    _rank_parameters(project, levels)
    _mode_attributes(project, levels)
    return levels


def _mode_attributes(project, levels: dict[str, dict[str, int]]) -> None:
    """`if cfg.MODEL.DIST_TRAIN: dist.init_process_group(...)` in one file: the attribute test, written the same,
    means a distributed run in every other file of the program too, as `!cfg.MODEL.DIST_TRAIN` (Script.
    _starts_group_arm); a test files read both ways, or a plain name, gives nothing."""
    found: dict[str, set[int]] = {}
    for script in project.scripts.values():
        for written, sign in script._group_flags().items():
            if "." in written and "(" not in written and "[" not in written:
                found.setdefault(written, set()).add(sign)
    for written, signs in found.items():
        if signs == {1}:
            for path in project.scripts:
                levels.setdefault(path, {})["!" + written] = 1


def _rank_parameters(project, levels: dict[str, dict[str, int]]) -> None:
    """`def train(args, model, device, loader):` where every call in the program gives `device` the rank itself
    (`train(args, model, rank, loader)`, a name that holds it): the parameter holds the rank in its function, as
    `~train(device)`, so `if device == 0:` is a rank check there (Script.kind). A module-level function is called
    by its name or through an imported module (`model.train()` is another function); a call that spreads
    `*args`/`**kwargs`, gives a rank test (see _flag_parameters) or anything but the rank, or a function that
    assigns the parameter, gives nothing."""
    methods = {d.name for x in project.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)
               for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
    calls = _calls_by_name(project)
    for path, script in project.scripts.items():
        for d in script.defs:
            found = calls.get(d.name, [])
            if d.name not in methods:
                found = [(x, c) for x, c in found if not isinstance(c.func, ast.Attribute)
                         or isinstance(c.func.value, ast.Name) and c.func.value.id in x.aliases]
            for param, values in _arguments(d, found).items():
                given = [x.kind(value) if isinstance(value, (ast.Name, ast.Attribute)) and not _is_flag(value)
                         and not is_main_flag(terminal(value)) else NONE for x, value in values]
                if given and min(given):
                    levels.setdefault(path, {})[f"~{d.name}({param})"] = min(given)


def _flag_parameters(project, levels: dict[str, dict[str, int]]) -> None:
    """`def fit(model, verbose):` where every call in the program gives `verbose` a rank test (`verbose=rank == 0`,
    `is_main`, `args.chatty` set from one) or a value only some ranks hold (`self.writer`, None off rank 0): the
    parameter is that rank check in its function, as `=fit(verbose)` (Script.kind). Functions are matched by
    name, as elsewhere; a call that spreads `*args`/`**kwargs`, or a function that assigns the parameter, gives
    nothing."""
    calls = _calls_by_name(project)
    for path, script in project.scripts.items():
        for d in script.defs:
            # a class's `__init__` is called by the class's name (`Logger(enable=is_main)`)
            owner = script.parents.get(id(d))
            called = owner.name if d.name == "__init__" and isinstance(owner, ast.ClassDef) else d.name
            for param, values in _arguments(d, calls.get(called, [])).items():
                given = [_flag_level(x, value) if value is not None else NONE for x, value in values]
                if given and min(given):
                    levels.setdefault(path, {})[f"={d.name}({param})"] = min(given)


def _calls_by_name(project) -> dict[str, list[tuple[object, ast.Call]]]:
    """Every call of the program, by the name it calls (`f` of `f(...)` and of `obj.f(...)`)."""
    calls: dict[str, list[tuple[object, ast.Call]]] = {}
    for x in project.scripts.values():
        for call in x.calls:
            calls.setdefault(terminal(call.func), []).append((x, call))
    return calls


def _arguments(d: ast.FunctionDef | ast.AsyncFunctionDef,
               found: list[tuple[object, ast.Call]]) -> dict[str, list[tuple[object, ast.AST | None]]]:
    """For each parameter `d` never assigns: what each call passes to it, by keyword or position (None where a call
    passes nothing). Empty when there is no call, or a call spreads `*args`/`**kwargs`."""
    if not found or any(any(isinstance(a, ast.Starred) for a in c.args)
                        or any(k.arg is None for k in c.keywords) for _, c in found):
        return {}
    positional = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
    if positional[:1] in (["self"], ["cls"]):
        positional = positional[1:]
    stored = {n.id for n in ast.walk(d) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    out: dict[str, list[tuple[object, ast.AST | None]]] = {}
    for param in positional + [a.arg for a in d.args.kwonlyargs]:
        if param in stored:
            continue
        values = []
        for x, c in found:
            value = next((k.value for k in c.keywords if k.arg == param), None)
            if value is None and param in positional and positional.index(param) < len(c.args):
                value = c.args[positional.index(param)]
            values.append((x, value))
        out[param] = values
    return out


def _flag_level(x, value: ast.AST) -> int:
    """How a value handed to a parameter picks ranks when tested: a rank test or main-process flag, or a value only
    some ranks hold (Script.rank_only); NONE for anything else (the rank itself, a seed made from it)."""
    if _is_flag(value) or isinstance(value, (ast.Name, ast.Attribute)) and is_main_flag(terminal(value)):
        return x.kind(value)
    if isinstance(value, ast.Name):
        key = value.id
    elif isinstance(value, ast.Attribute):
        key = "." + value.attr
        if x.external_levels.get("=" + key):
            return x.external_levels["=" + key]
    else:
        return NONE
    values = [v for k, v in x.assignments if k == key]
    if key in x.rank_only:
        return x.derived.get(key, NONE)
    return min((x.kind(v) for v in values), default=NONE) if values and all(_is_flag(v) for v in values) else NONE


def _flag_levels(project, levels: dict[str, dict[str, int]]) -> None:
    """`args.print_progress = RANK == 0` (or `self.is_main = ...`, `cfg["chatty"] = ...`) in one file of the
    program: an attribute (a dict item) whose value is a rank test is a rank check wherever the program reads
    it, as `=.print_progress` (`=[chatty]`; matched by name, as functions are). Only tests count, not the rank
    itself (`args.rank = get_rank()`)."""
    found: dict[str, int] = {}
    for script in project.scripts.values():
        pairs = [(key, value) for key, value in script.assignments if key.startswith(".")]
        pairs += [(f"[{n.targets[0].slice.value}]", n.value) for n in script.nodes  # `cfg["chatty"] = rank == 0`
                  if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Subscript)
                  and isinstance(n.targets[0].slice, ast.Constant) and isinstance(n.targets[0].slice.value, str)]
        for key, value in pairs:
            if _is_flag(value):
                level = script.kind(value)
                if level:
                    found["=" + key] = max(found.get("=" + key, NONE), level)
    for path in project.scripts if found else ():
        into = levels.setdefault(path, {})
        for key, level in found.items():
            into[key] = max(into.get(key, NONE), level)


def _is_flag(value: ast.AST) -> bool:
    """A value that is true or false by a test (`rank == 0`, `not local_rank`, `True if r == 0 else False`)."""
    if isinstance(value, ast.UnaryOp):
        return isinstance(value.op, ast.Not)
    if isinstance(value, ast.IfExp):
        return all(isinstance(arm, ast.Constant) and isinstance(arm.value, bool) for arm in (value.body, value.orelse))
    return isinstance(value, (ast.Compare, ast.BoolOp))


def _helper_answers(project, levels: dict[str, dict[str, int]]) -> None:
    """`dist.is_primary()` where another file of the project defines is_primary as a rank helper
    (Script.rank_helpers), also through a package `__init__` that re-exports it: `?dist.is_primary`."""
    for path, script in project.scripts.items():
        for call in script.calls:
            target = through_reexport(project, script, call.func)
            if target is None or target[0] == path:
                continue
            answer = project.scripts[target[0]].rank_helpers.get(target[1])
            if answer:
                levels.setdefault(path, {})["?" + script.qualname(call.func)] = answer


def through_reexport(project, script, func: ast.AST) -> tuple[str, str] | None:
    """project.resolve, and one step further where the module found only imports the name from another file."""
    target = project.resolve(script, func)
    if target is not None:
        return target
    qualname = script.qualname(func)
    if "." not in qualname:
        return None
    module, name = qualname.rsplit(".", 1)
    path = project.modules.locate(script.path, module)
    if path is None:
        return None
    for node in project.scripts[path].tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and any((a.asname or a.name) == name == a.name
                                                                    for a in node.names):
            source = project.modules.locate(path, node.module)  # `from .distributed import is_primary` too
            if source is not None and source != path and name in project.scripts[source].function_names:
                return source, name
    return None


def _decorator_levels(project, levels: dict[str, dict[str, int]]) -> None:
    """`@master_only` imported from another file of the project: the guard its wrapper puts around the call of
    the function it wraps (Script.decorator_levels of the defining file), as `@master_only`."""
    for path, script in project.scripts.items():
        for d in script.defs:
            for decorator in d.decorator_list:
                if not isinstance(decorator, (ast.Name, ast.Attribute)):
                    continue
                target = project.resolve(script, decorator)
                if target is None or target[0] == path:
                    continue
                level = project.scripts[target[0]].decorator_levels.get(target[1])
                if level is not None:
                    levels.setdefault(path, {})["@" + terminal(decorator)] = level

def _constructor_levels(project, levels: dict[str, dict[str, int]]) -> None:
    """Guards of the calls that build a project class (`TensorboardLogger(...)` under `if rank == 0:`).

    Its `__init__` gets their guard. A parameter defaulting to None that only rank-checked calls pass
    (`Trainer(cfg, writer=w)` under `if rank == 0:`, `Trainer(cfg)` on the others) gets it too, as
    `__init__(writer)`, and the attribute `__init__` stores it in (`project.writer = writer`) holds a value
    some ranks only have: `if trainer.writer is not None:` is a rank check wherever it is written
    (attributes are matched by name, as functions are). Calls in a single-process branch are left out.
    """
    homes: dict[str, list[tuple[str, ast.FunctionDef | None]]] = {}
    inits: list[tuple[str, str, ast.FunctionDef]] = []
    for path, script in project.scripts.items():
        for c in script.nodes:
            if isinstance(c, ast.ClassDef):
                init = next((d for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "__init__"), None)
                homes.setdefault(c.name, []).append((path, init))
                if init is not None:
                    inits.append((c.name, path, init))
    # only a class built by calling it by name: not one another class derives from (its __init__ runs for
    # the subclass too) or one handed around as a value (`builder=Board`, a registry)
    for script in project.scripts.values():
        for c in script.nodes:
            if isinstance(c, ast.ClassDef):
                for base in c.bases:
                    homes.pop(terminal(base), None)
        called = {id(call.func) for call in script.calls}
        for n in script.nodes:
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and id(n) not in called:
                homes.pop(terminal(n), None)
    built: dict[str, list[tuple[ast.Call, int]]] = {}
    for script in project.scripts.values():
        for call in script.calls:
            name = terminal(call.func)
            ctx = script.context(call)
            if len(homes.get(name, ())) == 1 and homes[name][0][1] is not None and not ctx.single:
                level = ctx.level
                if ctx.functions:
                    level = max(level, script.function_level.get(ctx.functions[-1], NONE))
                built.setdefault(name, []).append((call, level))
    # keys are by name (`__init__`, `__init__(writer)`), so every class of the file with an `__init__`
    # (with that parameter) must agree: one built on every rank, or not by name, keeps them at NONE
    found: dict[str, dict[str, int]] = {}
    for name, path, init in inits:
        calls = built.get(name, []) if name in homes else []
        mine = found.setdefault(path, {})
        mine["__init__"] = min(mine.get("__init__", GLOBAL), min((level for _, level in calls), default=NONE))
        # an object exists only where it is built: the methods of a class every construction of which sits under a
        # rank check (`agent = Server(args); agent.train()` under `if rank == last:`) run there alone (a method
        # name another function of the file shares is left alone)
        owner = next(c for c in project.scripts[path].nodes if isinstance(c, ast.ClassDef) and init in c.body)
        names = [d.name for d in project.scripts[path].defs]
        for method in (d for d in owner.body if isinstance(d, ast.FunctionDef) and d.name != "__init__"):
            if names.count(method.name) == 1:
                mine[method.name] = min(mine.get(method.name, GLOBAL),
                                        min((level for _, level in calls), default=NONE))
        positional = [a.arg for a in (*init.args.posonlyargs, *init.args.args)][1:]
        for param in optional_parameters([init]):
            given = min((level for call, level in calls if _gives(call, positional, param)), default=NONE)
            key = f"__init__({param})"
            mine[key] = min(mine.get(key, GLOBAL), given)
            for stmt in init.body if given else ():
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id == param:
                    for target in stmt.targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                and target.value.id == "self":
                            for other in project.scripts:
                                held = levels.setdefault(other, {})
                                held["." + target.attr] = min(held.get("." + target.attr, GLOBAL), given)
    for path, mine in found.items():
        for key, level in mine.items():
            if level > NONE:
                into = levels.setdefault(path, {})
                into[key] = min(into.get(key, GLOBAL), level)


def global_parameter(project, script, use: ast.Name) -> bool:
    """Whether `use` is a parameter of its function that every call in the program gives the global rank
    (`Trainer(cfg, local_rank=dist.get_rank())`, `train(args, dist.get_rank())`), its function not
    assigning it itself. Followed one call deep."""
    if id(use) not in script.parents:
        return False
    scope = script.context(use).scope
    func = next((d for d in script.defs if id(d) == scope), None)
    if func is None:
        return False
    positional = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    if use.id not in positional + [a.arg for a in func.args.kwonlyargs]:
        return False
    known = project.memo("global parameters", dict)
    key = (script.path, func.name, use.id)
    if key in known:
        return known[key]
    known[key] = False  # (a cycle of calls gives no rank)
    if any(isinstance(n, ast.Name) and n.id == use.id and isinstance(n.ctx, ast.Store) for n in ast.walk(func)):
        return False
    owner = next((c for c in script.nodes if isinstance(c, ast.ClassDef) and func in c.body), None)
    callee = owner.name if owner is not None and func.name == "__init__" else func.name
    method = positional[:1] in (["self"], ["cls"])
    given = []
    for x in project.scripts.values():
        for call in x.calls:
            if terminal(call.func) != callee or x is script and call in ast.walk(func):
                continue
            if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
                return False
            args = positional[1:] if method else positional
            value = next((k.value for k in call.keywords if k.arg == use.id), None)
            if value is None and use.id in args and args.index(use.id) < len(call.args):
                value = call.args[args.index(use.id)]
            given.append((x, value))
    found = bool(given) and all(value is not None and x.is_global_rank(value) for x, value in given)
    known[key] = found
    return found


def _gives(call: ast.Call, positional: list[str], param: str) -> bool:
    """Whether a call of a class gives `param` of its `__init__` (whose parameters after self are `positional`)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return True
    value = next((k.value for k in call.keywords if k.arg == param), None)
    if value is None and param in positional and positional.index(param) < len(call.args):
        value = call.args[positional.index(param)]
    return value is not None and not (isinstance(value, ast.Constant) and value.value is None)
