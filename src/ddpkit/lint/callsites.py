"""Guards and values that cross files at call sites: the rank check around the calls of a helper, a class's
constructor or a parameter, given to the code they reach. `project` is a ddpkit.lint.project.Project and
`script` one of its ddpkit.lint.analysis.Script objects (not imported here: the project imports this module)."""

from __future__ import annotations

import ast

from ddpkit.lint.bindings import local_names, optional_parameters, passes, scope_of, switch_parameters, switched_on
from ddpkit.lint.ranks import GLOBAL, NONE, is_main_flag, rank_side, terminal

__all__ = ["external_levels", "global_parameter", "receivers", "through_reexport"]


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
    called_object = _called_objects(project)
    for path, script in project.scripts.items():
        ifs = {id(n): n for n in script.nodes if isinstance(n, ast.If)}
        for call in script.calls:
            target = project.resolve(script, call.func) or called_object(path, script, call)
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
            for param in switch_parameters(defs):
                if not switched_on(call, defs, target[1], param):  # see Script._visit: `if save_cur: ... else:`
                    key = f"{target[1]}(!{param})"
                    into[key] = min(into.get(key, GLOBAL), level)
    _constructor_levels(project, levels)
    _decorator_levels(project, levels)
    _helper_answers(project, levels)
    _flag_levels(project, levels)
    _flag_parameters(project, levels)
    _constructor_flags(project, levels)
    _rank_parameters(project, levels)
    _rank_attributes(project, levels)
    _mode_attributes(project, levels)
    _unlaunched_values(project, levels)
    _groupless_modes(project, levels)
    _single_process_functions(project, levels)
    return levels


def _unlaunched_values(project, levels: dict[str, dict[str, int]]) -> None:
    """A value that is None only where no process group runs: every init_process_group of the program takes it as
    its rank (`rank=args.local_rank`: torch refuses a rank that is not an integer) or sits where it is not None
    (`if rank is not None:`, the `else:` of `if rank is None:`, after `if rank is None: return`, under a flag set
    from `rank is not None`). Its name, and the names it is copied to or handed on as (a parameter, `self.rank =
    rank`, `rank = opt.local_rank`), are `0:name` in every file, so that `rank is None or rank == 0` is the rank-0
    check of every distributed run (Script.kind): the `is None` arm is the run without a process group. Names
    are matched by spelling, as attributes are elsewhere; with several init_process_group calls only a name all
    of them share counts."""
    starts = [(x, c) for x in project.scripts.values() for c in x.calls if terminal(c.func) == "init_process_group"]
    if not starts:
        return
    flags = {key.lstrip("."): _none_test(value) for s in project.scripts.values() for key, value in s.assignments
             if isinstance(value, ast.Compare)}
    gates = [_gates(x, call, flags) for x, call in starts]
    if not all(gates):
        return
    shared: set[str] | None = None
    for gate in gates:
        names = _aliases(project, gate)
        shared = names if shared is None else shared & names
        if not shared:
            return
    for path in project.scripts:
        into = levels.setdefault(path, {})
        for name in shared:
            into["0:" + name] = 1


def _none_test(test: ast.AST) -> tuple[str, bool] | None:
    """(name, True for `is not None`) of `x is None` / `x is not None` (also `==`/`!=`), else None."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, (ast.Name, ast.Attribute)) \
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None \
            and isinstance(test.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)):
        return terminal(test.left), isinstance(test.ops[0], (ast.IsNot, ast.NotEq))
    return None


def _gates(x, call: ast.Call, flags: dict[str, tuple[str, bool] | None]) -> set[str]:
    """Names that are not None wherever this init_process_group runs (see _unlaunched_values)."""
    found: set[str] = set()
    rank = next((k.value for k in call.keywords if k.arg == "rank"), call.args[4] if len(call.args) > 4 else None)
    while isinstance(rank, ast.Call) and terminal(rank.func) == "int" and rank.args:
        rank = rank.args[0]
    if isinstance(rank, (ast.Name, ast.Attribute)):
        found.add(terminal(rank))
    node = call
    while id(node) in x.parents:
        parent = x.parents[id(node)]
        if isinstance(parent, ast.If):
            test = _none_test(parent.test)
            if test is None and isinstance(parent.test, (ast.Name, ast.Attribute)):
                test = flags.get(terminal(parent.test))  # `args.distributed = args.local_rank is not None`
            if test is not None and test[1] == (node in parent.body):
                found.add(test[0])
        body = getattr(parent, "body", None)
        if isinstance(body, list) and node in body:  # `if rank is None: return` earlier in the same block
            for stmt in body[:body.index(node)]:
                test = _none_test(stmt.test) if isinstance(stmt, ast.If) else None
                if test is not None and not test[1] and stmt.body \
                        and isinstance(stmt.body[-1], (ast.Return, ast.Raise)):
                    found.add(test[0])
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            break
        node = parent
    return found


def _aliases(project, names: set[str]) -> set[str]:
    """`names` with what they are copied to or from (`rank = opt.local_rank`, `self.rank = rank`) and the
    parameters they are handed on as (`Trainer(cfg, args.local_rank)` -> `rank`), both ways, to a fixed point."""
    names = set(names)
    calls = _calls_by_name(project)
    defs = [(d, None) for x in project.scripts.values() for d in x.defs if d.name != "__init__"] + [
        (d, c) for x in project.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)
        for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "__init__"]
    for _ in range(4):
        before = len(names)
        for x in project.scripts.values():
            for key, value in x.assignments:
                if isinstance(value, (ast.Name, ast.Attribute)) and (key.lstrip(".") in names) != (
                        terminal(value) in names):
                    names |= {key.lstrip("."), terminal(value)}
        for d, owner in defs:
            callee = owner.name if owner is not None else d.name
            for param, values in _arguments(d, calls.get(callee, [])).items():
                given = {terminal(v) for _, v in values if isinstance(v, (ast.Name, ast.Attribute))}
                if param in names or given & names:
                    names |= {param} | given
        if len(names) == before:
            break
    return names


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
    assigns the parameter, gives nothing. A class's `__init__` is called by the class's name (`Trainer(model,
    device=rank)`); where another `__init__` of the same file takes a parameter of that name and is not so
    called, neither counts (the key names the function, not its class)."""
    methods = _method_names(project)
    calls = _calls_by_name(project)
    for path, script in project.scripts.items():
        refused: set[str] = set()
        found: dict[str, int] = {}
        for d in script.defs:
            owner = script.parents.get(id(d))
            constructor = d.name == "__init__" and isinstance(owner, ast.ClassDef)
            given_calls = calls.get(owner.name, []) if constructor else _calls_of(d.name, calls, methods)
            params = _arguments(d, given_calls, keyed=True)
            if constructor:
                refused |= {a.arg for a in (*d.args.posonlyargs, *d.args.args, *d.args.kwonlyargs)} - params.keys()
            for param, values in params.items():
                given = _rank_levels(values)
                if given and min(given):
                    found[f"~{d.name}({param})"] = min(given)
                elif constructor:
                    refused.add(param)
        for key, level in found.items():
            if not (key.startswith("~__init__(") and key[len("~__init__("):-1] in refused):
                levels.setdefault(path, {})[key] = level


def _rank_levels(values: list[tuple[object, ast.AST | None]]) -> list[int]:
    """How each call's value for a parameter holds the rank (the rank itself through a name or an attribute; not a
    rank test nor a main-process flag, see _flag_parameters): NONE for anything else."""
    return [x.kind(value) if isinstance(value, (ast.Name, ast.Attribute)) and not _is_flag(value)
            and not is_main_flag(terminal(value)) else NONE for x, value in values]


def _rank_attributes(project, levels: dict[str, dict[str, int]]) -> None:
    """`class Trainer: def __init__(self, model, device): self.device = device` where every `Trainer(...)` of the
    program gives `device` the rank itself (`Trainer(model, device=rank)`): the object's attribute holds the rank
    in the methods of its class, as `~Trainer.device`, so `if self.device == 0:` there is a rank check (Script.kind).
    A class that assigns the attribute anywhere else, or a call that gives anything but the rank (see
    _rank_parameters), gives nothing."""
    calls = _calls_by_name(project)
    for path, script in project.scripts.items():
        for c in (n for n in script.nodes if isinstance(n, ast.ClassDef)):
            init = next((d for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "__init__"), None)
            if init is None:
                continue
            stores: dict[str, list[ast.AST]] = {}
            for n in ast.walk(c):
                for t in n.targets if isinstance(n, ast.Assign) else (n.target,) if isinstance(
                        n, (ast.AnnAssign, ast.AugAssign)) else ():
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        stores.setdefault(t.attr, []).append(n)
            found = [(x, call) for x, call in calls.get(c.name, []) if isinstance(call.func, ast.Name)
                     or isinstance(call.func.value, ast.Name) and call.func.value.id in x.aliases]
            for param, values in _arguments(init, found, keyed=True).items():
                given = _rank_levels(values)
                if not given or not min(given):
                    continue
                for attr, assigns in stores.items():
                    if len(assigns) == 1 and isinstance(assigns[0], ast.Assign) and assigns[0] in init.body \
                            and isinstance(assigns[0].value, ast.Name) and assigns[0].value.id == param:
                        levels.setdefault(path, {})[f"~{c.name}.{attr}"] = min(given)


def _flag_parameters(project, levels: dict[str, dict[str, int]]) -> None:
    """`def fit(model, verbose):` where every call in the program gives `verbose` a rank test (`verbose=rank == 0`,
    `is_main`, `args.chatty` set from one) or a value only some ranks hold (`self.writer`, None off rank 0): the
    parameter is that rank check in its function, as `=fit(verbose)` (Script.kind). Functions are matched by
    name, as elsewhere; a call that spreads `*args`/`**kwargs`, or a function that assigns the parameter, gives
    nothing."""
    calls, methods = _calls_by_name(project), _method_names(project)
    for path, script in project.scripts.items():
        for d in script.defs:
            # a class's `__init__` is called by the class's name (`Logger(enable=is_main)`)
            owner = script.parents.get(id(d))
            called = owner.name if d.name == "__init__" and isinstance(owner, ast.ClassDef) else d.name
            found = calls.get(called, []) if called != d.name else _calls_of(called, calls, methods)
            for param, values in _arguments(d, found).items():
                given = [_flag_level(x, value) if value is not None else NONE for x, value in values]
                if given and min(given):
                    levels.setdefault(path, {})[f"={d.name}({param})"] = min(given)


def _constructor_flags(project, levels: dict[str, dict[str, int]]) -> None:
    """`Logger(enable=is_main)`, `Loader(args, verbose=local_rank == 0)`: where every construction of a project class
    gives a parameter of its `__init__` a rank test, a main-process flag or a value only some ranks hold (as
    _flag_parameters asks of a function's calls), the attribute `__init__` stores it in (`self.enable = enable`)
    is that rank check wherever the program reads it, as `=.enable` (Script.kind): `if self.enable: print(info)`
    prints on those ranks only. Not for a class defined twice, one another class derives from (its `__init__`
    runs with what the subclass passes), one handed around as a value, a construction that spreads
    `*args`/`**kwargs` or leaves the parameter to its default, nor an attribute the program assigns anywhere else."""
    classes: dict[str, list[ast.ClassDef]] = {}
    for script in project.scripts.values():
        for c in script.nodes:
            if isinstance(c, ast.ClassDef):
                classes.setdefault(c.name, []).append(c)
    for script in project.scripts.values():
        called = {id(call.func) for call in script.calls}
        for n in script.nodes:
            if isinstance(n, ast.ClassDef):
                for base in n.bases:
                    classes.pop(terminal(base), None)
            elif isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and id(n) not in called:
                classes.pop(terminal(n), None)
    calls = _calls_by_name(project)
    stored: dict[str, list[ast.AST]] = {}
    for script in project.scripts.values():
        for key, value in script.assignments:
            if key.startswith("."):
                stored.setdefault(key, []).append(value)
    found: dict[str, int] = {}
    for name, defs in classes.items():
        init = next((d for d in defs[0].body if isinstance(d, ast.FunctionDef) and d.name == "__init__"), None)
        if len(defs) != 1 or init is None:
            continue
        for param, values in _arguments(init, calls.get(name, [])).items():
            given = [_flag_level(x, value) if value is not None else NONE for x, value in values]
            if not given or not min(given):
                continue
            for stmt in ast.walk(init):
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Name) and stmt.value.id == param:
                    for target in stmt.targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                and target.value.id == "self" and len(stored.get("." + target.attr, ())) == 1:
                            found["=." + target.attr] = min(given)
    for path in project.scripts if found else ():
        into = levels.setdefault(path, {})
        for key, level in found.items():
            into[key] = max(into.get(key, NONE), level)


def given_arguments(project, script, d: ast.FunctionDef | ast.AsyncFunctionDef,
                    ) -> dict[str, list[tuple[object, ast.AST | None]]]:
    """What each call of `d` (a function of `script`) passes to each parameter `d` never assigns (see _arguments;
    None where a call passes nothing): calls by its name, or by its class's name for an `__init__` (the program's
    other calls of that name count too: matched by name, as everywhere here). Empty where nothing calls it so, or a
    call spreads `*args`/`**kwargs`."""
    owner = script.parents.get(id(d))
    name = owner.name if d.name == "__init__" and isinstance(owner, ast.ClassDef) else d.name
    return _arguments(d, _calls_by_name(project).get(name, []))


def _calls_by_name(project) -> dict[str, list[tuple[object, ast.Call]]]:
    """Every call of the program, by the name it calls (`f` of `f(...)` and of `obj.f(...)`)."""
    calls: dict[str, list[tuple[object, ast.Call]]] = {}
    for x in project.scripts.values():
        for call in x.calls:
            calls.setdefault(terminal(call.func), []).append((x, call))
    return calls


def _method_names(project) -> set[str]:
    """Names of the methods of the program's classes."""
    return {d.name for x in project.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)
            for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _calls_of(name: str, calls: dict[str, list[tuple[object, ast.Call]]],
              methods: set[str]) -> list[tuple[object, ast.Call]]:
    """The calls that can reach the program's function `name`. Where no class of the program has a method of that
    name, `obj.name(...)` is another library's method (`model.train()` beside `def train(model, writer=None)`),
    not a call of the function, unless `obj` is an imported module (`trainer.train(...)`)."""
    found = calls.get(name, [])
    if name in methods:
        return found
    return [(x, c) for x, c in found if not isinstance(c.func, ast.Attribute)
            or isinstance(c.func.value, ast.Name) and c.func.value.id in x.aliases]


def _arguments(d: ast.FunctionDef | ast.AsyncFunctionDef, found: list[tuple[object, ast.Call]],
               keyed: bool = False) -> dict[str, list[tuple[object, ast.AST | None]]]:
    """For each parameter `d` never assigns: what each call passes to it, by keyword or position (None where a call
    passes nothing). Empty when there is no call, or a call spreads `*args`/`**kwargs`; with `keyed`, a spreading
    call still tells the parameters it names by keyword (`Trainer(model, device=rank, **cfg)`: the spread cannot
    give `device` again), and leaves the others out."""
    spreads = [c for _, c in found if any(isinstance(a, ast.Starred) for a in c.args)
               or any(k.arg is None for k in c.keywords)]
    if not found or spreads and not keyed:
        return {}
    named = set.intersection(*({k.arg for k in c.keywords} for c in spreads)) if spreads else None
    positional = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
    if positional[:1] in (["self"], ["cls"]):
        positional = positional[1:]
    stored = {n.id for n in ast.walk(d) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    out: dict[str, list[tuple[object, ast.AST | None]]] = {}
    for param in positional + [a.arg for a in d.args.kwonlyargs]:
        if param in stored or named is not None and param not in named:
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
    it, as `=.print_progress` (`=[chatty]`; matched by name, as functions are). So is the rank itself stored there
    (`args.proc = int(os.environ["RANK"])`, `cfg.who = dist.get_rank()`): `if opt.proc == 0:` in the file the
    config is handed to tests it, whatever the attribute's name; not arithmetic on it (`args.seed = seed + rank`)."""
    found: dict[str, int] = {}
    owners: dict[str, set[str]] = {}
    for script in project.scripts.values():
        pairs = [(key, value) for key, value in script.assignments if key.startswith(".")]
        pairs += [(f"[{n.targets[0].slice.value}]", n.value) for n in script.nodes  # `cfg["chatty"] = rank == 0`
                  if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Subscript)
                  and isinstance(n.targets[0].slice, ast.Constant) and isinstance(n.targets[0].slice.value, str)]
        for key, value in pairs:
            if _is_flag(value) or isinstance(value, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                level = script.kind(value)
                if level:
                    found["=" + key] = max(found.get("=" + key, NONE), level)
        for key in script.rank_flags:  # `if rank == 0: args.log = True` / `else: args.log = False`
            found["=" + key] = max(found.get("=" + key, NONE), script.derived[key])
        for n in script.nodes:  # who holds each attribute: `self.verb = ...` sets an object's own, not `args.verb`
            for t in n.targets if isinstance(n, ast.Assign) else ():
                if isinstance(t, ast.Attribute):
                    owners.setdefault(t.attr, set()).add(t.value.id if isinstance(t.value, ast.Name) else "")
    if _mirrors_items(project):  # `cfg["verbose"] = rank == 0` read as `cfg.verbose`
        found |= {"=." + k[2:-1]: level for k, level in found.items()
                  if k.startswith("=[") and "=." + k[2:-1] not in found}
    for key in [k for k in found if k.startswith("=.") and owners.get(k[2:]) == {"self"}]:
        # (an attribute only objects set on themselves: an `args.verb` parsed from the command line is another one)
        found["@self" + key] = found[key]
    for path in project.scripts if found else ():
        into = levels.setdefault(path, {})
        for key, level in found.items():
            into[key] = max(into.get(key, NONE), level)


def _mirrors_items(project) -> bool:
    """A class of the program keeps its items as attributes too: a `__setitem__` that sets the attribute of the
    key (`self.__setattr__(key, value)`, `setattr(self, key, value)`), or a `__getattr__` that reads the item of
    the name (`return self.params[name]`). Then `cfg["verbose"]` and `cfg.verbose` are one setting."""
    for script in project.scripts.values():
        for method in (n for n in script.nodes if isinstance(n, ast.FunctionDef) and len(n.args.args) > 1):
            key = method.args.args[1].arg
            if method.name == "__setitem__" and any(
                    isinstance(c, ast.Call) and terminal(c.func) in ("setattr", "__setattr__")
                    and any(isinstance(a, ast.Name) and a.id == key for a in c.args) for c in ast.walk(method)):
                return True
            if method.name == "__getattr__" and any(
                    isinstance(s, ast.Subscript) and isinstance(s.slice, ast.Name) and s.slice.id == key
                    for s in ast.walk(method)):
                return True
    return False


def _is_flag(value: ast.AST) -> bool:
    """A value that is true or false by a test (`rank == 0`, `not local_rank`, `True if r == 0 else False`)."""
    if isinstance(value, ast.UnaryOp):
        return isinstance(value.op, ast.Not)
    if isinstance(value, ast.IfExp):
        return all(isinstance(arm, ast.Constant) and isinstance(arm.value, bool) for arm in (value.body, value.orelse))
    if isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Mult, ast.BitAnd)):
        # `args.verb * (rank == 0)`: zero, so false, wherever the test fails; the setting where it holds
        return _is_flag(value.left) or _is_flag(value.right)
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


def _called_objects(project):
    """`called(path, script, call)`: (file, `def@line:col` of the `__call__`) for `early_stopping(val_loss, model)` on
    an object every binding of which builds the one project class of that name that defines `__call__` (keyed by
    place: a file may hold several `__call__`s); else None."""
    homes: dict[str, tuple[str, ast.FunctionDef]] = {}
    for path, x in project.scripts.items():
        for c in x.nodes:
            method = next((d for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "__call__"), None) \
                if isinstance(c, ast.ClassDef) else None
            if method is not None:
                homes[c.name] = (path, method)
    if not homes:
        return lambda path, x, call: None
    classes, _, receiver = receivers(project)

    def called(path: str, x, call: ast.Call) -> tuple[str, str] | None:
        if not isinstance(call.func, ast.Name) or call.func.id in x.function_names or call.func.id in x.aliases:
            return None
        kinds = receiver(path, x, ast.Attribute(value=call.func, attr="__call__", ctx=ast.Load()))
        kind = next(iter(kinds)) if kinds and len(kinds) == 1 else ""
        if len(classes.get(kind, ())) != 1 or kind not in homes:
            return None
        home, method = homes[kind]
        return home, f"def@{method.lineno}:{method.col_offset}"
    return called


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


def receivers(project):
    """(classes by name, related classes by name, receiver): `receiver(path, script, attribute)` is the set of
    project classes the object an attribute is looked up on belongs to, or None where the program does not say:
    `self` (the class the access sits in), a class named directly, a name every assignment of which in its file
    builds a project class (not a parameter, loop or `with` target, import or global of that file), an attribute
    every assignment of which in the program builds one (`self.meter = Meter()`). The empty set where every
    assignment is a value made outside the project from no project object (`logger = logging.getLogger(__name__)`,
    `self.writer = SummaryWriter(log_dir) if rank == 0 else None`): none of the project's methods runs on it.
    Related classes: a class, its project bases and its project subclasses."""
    classes: dict[str, list[ast.ClassDef]] = {}
    functions = set()
    for x in project.scripts.values():
        for n in x.nodes:
            if isinstance(n, ast.ClassDef):
                classes.setdefault(n.name, []).append(n)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.add(n.name)
    relatives: dict[str, set[str]] = {name: {name} for name in classes}
    for _ in range(4):
        for name, found in classes.items():
            for c in found:
                for base in (terminal(b) for b in c.bases):
                    if base in relatives:
                        relatives[name] |= relatives[base]
                        relatives[base] |= relatives[name]
    built = {name for name in classes if name not in functions}
    attributes: dict[str, set[str] | None] = {}
    for x in project.scripts.values():
        for key, value in x.assignments:
            if key.startswith("."):
                made = terminal(value.func) if isinstance(value, ast.Call) else ""
                known = attributes.get(key, set())
                attributes[key] = known if known is not None and _made_outside(project, x, value, classes) \
                    else None if known is None or made not in built else known | {made}
    unbound: dict[str, set[str]] = {}
    for path, x in project.scripts.items():
        names = unbound.setdefault(path, set())
        for n in x.nodes:
            if isinstance(n, ast.arguments):
                names |= {a.arg for a in (*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg) if a}
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
                names |= {t.id for t in ast.walk(n.target) if isinstance(t, ast.Name)}
            elif isinstance(n, ast.withitem) and n.optional_vars is not None:
                names |= {t.id for t in ast.walk(n.optional_vars) if isinstance(t, ast.Name)}
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in n.names}
            elif isinstance(n, ast.Global):
                names |= set(n.names)

    outside_parameters = _outside_parameters(project, classes)

    def receiver(path: str, x, n: ast.Attribute) -> set[str] | None:
        owner = n.value
        if isinstance(owner, ast.Name) and owner.id in outside_parameters.get(path, {}).get(_enclosing(x, n), ()):
            return set()
        if isinstance(owner, ast.Name) and owner.id == "self":
            scope = x.parents.get(id(n))
            while scope is not None and not isinstance(scope, ast.ClassDef):
                scope = x.parents.get(id(scope))
            return {scope.name} if scope is not None else None
        if isinstance(owner, ast.Name) and owner.id in built and owner.id not in unbound[path]:
            return {owner.id}
        if isinstance(owner, ast.Name) and owner.id not in unbound[path]:
            bindings = x._bindings.get(owner.id, ())
            if bindings and all(v is not None and _made_outside(project, x, v, classes) for _, v in bindings):
                return set()
            made = {terminal(v.func) if isinstance(v, ast.Call) else "" for _, v in bindings}
            return made if made and made <= built else None
        if isinstance(owner, ast.Attribute):
            return attributes.get("." + owner.attr)
        return None

    return classes, relatives, receiver


def _enclosing(x, n: ast.AST) -> int:
    """id of the function `n` sits in (0 at module level)."""
    node = x.parents.get(id(n))
    while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        node = x.parents.get(id(node))
    return id(node) if node is not None else 0


def _outside_parameters(project, classes) -> dict[str, dict[int, set[str]]]:
    """path -> {id of a module function: its parameters every call of it in the program fills with a library's
    object made from no project object (`main(parser.parse_args())`)}. Not for a function defined twice, also used
    as a value (`mp.spawn(main, ...)`), or called with `*args`/`**kwargs`."""
    defs: dict[str, list[tuple[str, ast.AST]]] = {}
    for path, x in project.scripts.items():
        for d in x.tree.body:
            if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(d.name, []).append((path, d))
    calls: dict[str, list[tuple[object, ast.Call]]] = {}
    used: set[str] = set()
    for x in project.scripts.values():
        for n in x.nodes:
            if isinstance(n, ast.Call):
                calls.setdefault(terminal(n.func), []).append((x, n))
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in defs and not (
                    isinstance(x.parents.get(id(n)), ast.Call) and x.parents[id(n)].func is n):
                used.add(n.id)
    found: dict[str, dict[int, set[str]]] = {}
    for name, places in defs.items():
        made = calls.get(name, [])
        if len(places) != 1 or name in used or not made or any(
                isinstance(a, ast.Starred) for _, c in made for a in c.args) or any(
                k.arg is None for _, c in made for k in c.keywords):
            continue
        path, d = places[0]
        params = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
        rebound = {n.id for n in ast.walk(d) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)} | {
            a.arg for n in ast.walk(d) if isinstance(n, ast.arguments) and n is not d.args
            for a in (*n.posonlyargs, *n.args, *n.kwonlyargs)}
        for i, param in enumerate(params):
            if param in rebound:
                continue
            given = [next((k.value for k in c.keywords if k.arg == param), c.args[i] if i < len(c.args) else None)
                     for _, c in made]
            if all(v is not None and _outside_value(project, x, v, classes) for (x, _), v in zip(made, given)):
                found.setdefault(path, {}).setdefault(id(d), set()).add(param)
    return found


def _outside_value(project, x, value: ast.AST, classes) -> bool:
    """A library's object made from no project object, directly or through the name it was assigned to."""
    if isinstance(value, ast.Name):
        bindings = x._bindings.get(value.id, ())
        return bool(bindings) and all(v is not None and _made_outside(project, x, v, classes) for _, v in bindings)
    return _made_outside(project, x, value, classes)


def _made_outside(project, x, value: ast.AST, classes, depth: int = 0) -> bool:
    """A value made by a library (a call on a module outside the project, or None where a test picks ranks:
    `SummaryWriter(d) if rank == 0 else None`) from no project object: constants, strings, the module's name,
    library names, and attributes of values no project class builds (`args.log_dir`), not `self` or a local
    holding a project object (`DDP(model)` or `copy.deepcopy(trainer)` may hand back the project's object)."""
    if isinstance(value, ast.IfExp):
        return all(isinstance(arm, ast.Constant) and arm.value is None
                   or _made_outside(project, x, arm, classes, depth) for arm in (value.body, value.orelse))
    if not isinstance(value, ast.Call):
        return False
    root = value.func
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name):
        return False
    if not _outside_module(project, x, root.id):
        # `args = parser.parse_args()` with `parser = argparse.ArgumentParser()`: a method of a library's object
        bindings = x._bindings.get(root.id, ()) if isinstance(value.func, ast.Attribute) and depth < 3 else ()
        if not bindings or root.id in ("self", "cls") or any(
                v is None or not _made_outside(project, x, v, classes, depth + 1) for _, v in bindings):
            return False
    for arg in (*value.args, *(k.value for k in value.keywords)):
        for n in ast.walk(arg):
            if isinstance(n, (ast.Lambda, ast.Starred)) or isinstance(n, ast.keyword) and n.arg is None:
                return False
            if isinstance(n, ast.Name) and not (n.id == "__name__" or _outside_module(project, x, n.id)
                                                or _in_text(x, n) or _plain_holder(project, x, n, classes)):
                return False
    return True


def _outside_module(project, x, name: str) -> bool:
    """`name` is imported from a module that is not the project's (`logging`, `SummaryWriter`)."""
    return name in x.aliases and project.modules.locate(x.path, x.aliases[name], parent=True) is None \
        and project.modules.locate(x.path, x.aliases[name].rsplit(".", 1)[0], parent=True) is None


def _in_text(x, n: ast.AST) -> bool:
    """A name formatted into a string (`f"runs/{rank}"`): the string is passed, not the object."""
    node = n
    while id(node) in x.parents:
        node = x.parents[id(node)]
        if isinstance(node, ast.JoinedStr):
            return True
        if isinstance(node, ast.stmt):
            return False
    return False


def _plain_holder(project, x, n: ast.Name, classes) -> bool:
    """`args` of `args.log_dir`: the root of an attribute read on a value that is not `self` and that no assignment
    in its file makes from a project class or function."""
    parent = x.parents.get(id(n))
    if not (isinstance(parent, ast.Attribute) and parent.value is n) or n.id in ("self", "cls"):
        return False
    return not any(isinstance(v, ast.Call) and (terminal(v.func) in classes or project.resolve(x, v.func) is not None)
                   for _, v in x._bindings.get(n.id, ()) if v is not None)


def _callees(project, path: str, x, call: ast.Call, found) -> list[ast.AST] | None:
    """The project functions a call runs (`f(...)`, `module.f(...)`, `self.m(...)`, `obj.m(...)` on an object of a
    known class, `Cls(...)` for its `__init__`): [] for a call of nothing in the project, None where the call names
    something of the project the program does not pin down. `found` is receivers(project) and the project's
    functions by name."""
    classes, relatives, receiver, named = found
    func = call.func
    name = terminal(func)
    if isinstance(func, ast.Name):
        own = [d for d in x.tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == name]
        if own:
            return own
        target = project.resolve(x, func)
        if target is not None:
            return [d for d in project.scripts[target[0]].tree.body
                    if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == target[1]]
        if name in classes:
            if len(classes[name]) != 1:
                return None
            return [d for d in classes[name][0].body if isinstance(d, ast.FunctionDef) and d.name == "__init__"]
        return None if name in named or name in x.function_names else []
    if not isinstance(func, ast.Attribute):
        return None
    owner = func.value
    while isinstance(owner, ast.Attribute):
        owner = owner.value
    target = project.resolve(x, func) if isinstance(owner, ast.Name) and owner.id in x.aliases else None
    if target is not None:  # `utils.save(...)` on a module of the project (not a variable named like one)
        return [d for d in project.scripts[target[0]].tree.body
                if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == target[1]] or None
    if isinstance(owner, ast.Name) and owner.id in x.aliases and not project.modules.locate(path, x.aliases[owner.id]):
        return []  # `torch.save(...)`, `os.path.join(...)`: a module outside the project
    if isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) and func.value.func.id == "super":
        cls = x.parents.get(id(call))
        while cls is not None and not isinstance(cls, ast.ClassDef):
            cls = x.parents.get(id(cls))
        return _inherited(cls, name, classes, 4) if cls is not None else None
    if name not in named:
        return []
    kinds = receiver(path, x, func)
    if kinds is not None and not kinds:
        return []  # `writer.flush()` on a library's object
    if kinds is None:
        methods = [d for _, d in named[name]]
        return methods if len(methods) == 1 else None
    return [d for k in kinds for c in classes.get(k, ()) for r in relatives.get(k, {k}) for c2 in classes.get(r, ())
            for d in c2.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == name] or None


def _inherited(cls: ast.ClassDef, name: str, classes, depth: int) -> list[ast.AST] | None:
    """The method `super().name(...)` in `cls` runs: that of its nearest project bases that define it, [] where no
    base is the project's (`super().__init__()` of an `nn.Module` runs torch's), None where the program does not
    say which class it is."""
    own = [terminal(b) for b in cls.bases if terminal(b) in classes]
    found: list[ast.AST] = []
    for base in own:
        if len(classes[base]) != 1 or not depth:
            return None
        methods = [d for d in classes[base][0].body
                   if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == name]
        higher = methods or _inherited(classes[base][0], name, classes, depth - 1)
        if higher is None:
            return None
        found += higher
    return found


def _groupless_modes(project, levels: dict[str, dict[str, int]]) -> None:
    """`if config.do_prepare: runner.prepare() elif config.do_train: runner.train()` where train() starts the process
    group (directly or through what it calls) and nothing prepare() runs does, nor anything else in its function,
    a function only module code calls: the arm that starts no group is a mode the program runs as one process (`^line:col` of the `if`: -1
    for its body, +1 for its `else:`; Script._visit). Every call on that arm must be pinned down: a call of a
    project name the program does not resolve leaves the `if` alone."""
    if not _candidate_modes(project):
        return
    named, calls, owner = _resolution(project)

    def closure(seeds: set[int]) -> set[int]:
        for _ in range(8):
            more = {id(owner[id(c)]) for x in project.scripts.values() for c in x.calls if id(c) in owner
                    and any(id(d) in seeds for d in calls[id(c)] or ())} - seeds
            if not more:
                break
            seeds |= more
        return seeds
    surely = closure({id(owner[id(c)]) for x in project.scripts.values() for c in x.calls
                      if id(c) in owner and terminal(c.func) == "init_process_group"})
    maybe = closure(surely | {id(owner[id(c)]) for x in project.scripts.values() for c in x.calls
                              if id(c) in owner and calls[id(c)] is None})

    def starting(nodes: list[ast.AST]) -> bool | None:
        """True where these statements start the group, None where they may, False where they surely do not."""
        within = [n for stmt in nodes for n in ast.walk(stmt)]
        called = [n for n in within if isinstance(n, ast.Call)]
        if any(terminal(c.func) == "init_process_group" or any(id(d) in surely for d in calls.get(id(c)) or ())
               for c in called):
            return True  # (whatever else the statements run or hand along)
        funcs = {id(c.func) for c in called}
        if any(isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and id(n) not in funcs
               and terminal(n) in named for n in within):
            return None  # a project function handed along (`mp.spawn(worker)`) runs where it is called
        return None if any(calls.get(id(c)) is None or any(id(d) in maybe for d in calls[id(c)])
                           for c in called) else False

    entries: dict[int, bool] = {}

    def entry(scope: ast.AST) -> bool:
        """A function only module code calls (`run()` in the `__main__` block), or only such a function whose other
        calls surely start no group (`main()` calling `load_model()`), nothing handing it along: no group can have
        started in a caller before it runs."""
        if id(scope) not in entries:
            entries[id(scope)] = False  # (a recursive call is no entry)
            found = [(x, c) for x in project.scripts.values() for c in x.calls
                     if any(t is scope for t in calls.get(id(c)) or ())]
            handed = any(isinstance(n, ast.Name) and n.id == scope.name and isinstance(n.ctx, ast.Load)
                         and not (isinstance(x.parents.get(id(n)), ast.Call) and x.parents[id(n)].func is n)
                         for x in project.scripts.values() for n in x.nodes)
            entries[id(scope)] = bool(found) and not handed and all(
                id(c) not in owner or isinstance(owner[id(c)], (ast.FunctionDef, ast.AsyncFunctionDef))
                and entry(owner[id(c)]) and starting([ast.Expr(o) for o in ast.walk(owner[id(c)])
                                                      if isinstance(o, ast.Call) and o is not c]) is False
                for _, c in found)
        return entries[id(scope)]

    for path, x in project.scripts.items():
        for node in x.nodes:
            if not isinstance(node, ast.If) or not node.orelse:
                continue
            body, other = starting(node.body), starting(node.orelse)
            if {body, other} != {True, False}:
                continue
            scope = x.parents.get(id(node))
            while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = x.parents.get(id(scope))
            if scope is not None and not entry(scope):
                continue  # a caller may have started the group before
            inside = {id(n) for n in ast.walk(node)}
            top = [n for n in (scope.body if scope is not None else x.tree.body)
                   if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
            looped = x.in_loop(node)
            rest = [c for stmt in top for c in ast.walk(stmt) if isinstance(c, ast.Call) and id(c) not in inside
                    and (looped or (c.lineno, c.col_offset) < (node.lineno, node.col_offset))]
            if starting([ast.Expr(c) for c in rest]) is not False:
                continue  # the group may have started before (what runs after the `if` runs after its arms, but
                # where a loop of the function comes back to it)
            levels.setdefault(path, {})[f"^{node.lineno}:{node.col_offset}"] = -1 if other else 1


def _candidate_modes(project) -> bool:
    """Whether some `if` of the program has one arm that names a function starting the process group (by name,
    through the functions it names) and another that names none: the cheap test before _groupless_modes."""
    bodies: dict[str, set[str]] = {}
    for x in project.scripts.values():
        for c in x.calls:
            for f in x.context(c).functions:
                bodies.setdefault(f, set()).add(terminal(c.func))
    names = {"init_process_group"}
    for _ in range(8):
        more = {name for name, called in bodies.items() if called & names} - names
        if not more:
            break
        names |= more
    for x in project.scripts.values():
        for c in x.calls:
            if terminal(c.func) not in names:
                continue
            node = c
            while id(node) in x.parents:
                parent = x.parents[id(node)]
                if isinstance(parent, ast.If) and parent.orelse:
                    other = parent.orelse if node in parent.body else parent.body if node in parent.orelse else None
                    if other is not None and not any(isinstance(n, ast.Call) and terminal(n.func) in names
                                                     for stmt in other for n in ast.walk(stmt)):
                        return True
                node = parent
    return False


def _resolution(project):
    """(the project's functions by name, {id(call): _callees}, {id(call): the innermost function it sits in})."""
    def compute():
        named: dict[str, list[tuple[str, ast.AST]]] = {}
        for p, x in project.scripts.items():
            for d in x.defs:
                named.setdefault(d.name, []).append((p, d))
        found = (*receivers(project), named)
        calls: dict[int, list[ast.AST] | None] = {}
        owner: dict[int, ast.AST] = {}
        for path, x in project.scripts.items():
            for d in x.defs:  # (outer functions come first: the innermost one is kept)
                for c in ast.walk(d):
                    if isinstance(c, ast.Call):
                        owner[id(c)] = d
            for c in x.calls:
                calls[id(c)] = _callees(project, path, x, c, found)
        return named, calls, owner
    return project.memo(("resolution", tuple(id(x) for x in project.scripts.values())), compute)


def _single_process_functions(project, levels: dict[str, dict[str, int]]) -> None:
    """A function every call of which the program pins down and every such call sits in one process's code (the
    single-process branch of a mode check, a mode that starts no process group, or a function that is one
    process's itself), followed to a fixed point: `1@line:col` of its `def` in its file (Script._visit). A class's
    `__init__` is called by building the class; a name handed along as a value (a callback, a class given to a
    factory) or a call the program does not pin down leaves the function as it is."""
    if not any(x.context(c).single for x in project.scripts.values() for c in x.calls):
        return  # no call sits in one process's code: nothing is reached from there alone
    named, calls, owner = _resolution(project)
    refs: dict[str, list[tuple[object, ast.AST]]] = {}
    for x in project.scripts.values():
        for n in x.nodes:
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load):
                refs.setdefault(terminal(n), []).append((x, n))
    homes: dict[int, ast.ClassDef] = {}
    for x in project.scripts.values():
        for c in x.nodes:
            if isinstance(c, ast.ClassDef):
                homes.update((id(d), c) for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)))
    everything = [(path, d) for path, x in project.scripts.items() for d in x.defs]
    single: set[int] = set()
    for _ in range(8):
        more = set()
        for path, d in everything:
            if id(d) in single:
                continue
            cls = homes.get(id(d)).name if d.name == "__init__" and id(d) in homes else None
            pinned, called = True, False
            for x, n in refs.get(d.name, []) + (refs.get(cls, []) if cls else []):
                parent = x.parents.get(id(n))
                if cls and terminal(n) == cls and isinstance(parent, ast.Attribute) and parent.value is n:
                    continue  # `Cls.attr`: no object is built
                scope = scope_of(n, x.parents) if isinstance(n, ast.Name) else None
                if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.id in local_names(scope):
                    continue  # a local variable of that spelling (`DatasetInstance = pkl.load(f)`), not the function
                if not (isinstance(parent, ast.Call) and parent.func is n) or calls.get(id(parent)) is None:
                    pinned = False
                    break
                if not any(t is d for t in calls[id(parent)]):
                    continue
                called = True
                around = owner.get(id(parent))
                if not (x.context(parent).single or around is not None and id(around) in single):
                    pinned = False
                    break
            if pinned and called:
                more.add(id(d))
        if not more:
            break
        single |= more
    for path, d in everything:
        if id(d) in single:
            levels.setdefault(path, {})[f"1@{d.lineno}:{d.col_offset}"] = 1
