"""Where reported numbers come from: values computed from one rank's shard, followed to where they are shown.

A loop over a sharded loader (a DataLoader with a DistributedSampler, or a function parameter that
such a loader is passed to) yields this rank's batches. Everything computed from them inside a
function (assignments, `+=` counters, `meter.update(v)`, the values a project function returns) is a
figure of one shard until it goes through a collective (`dist.all_reduce(t)`, a helper that reduces,
`meter.synchronize_between_processes()`); a name reassigned from a reduced value is reduced from then
on. Names are followed, not objects, so where the flow is not visible (a value reduced in place by a
helper under another name) the value counts as reduced: precision first.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

from ddpkit.lint.analysis import (REDUCING_NAME, Script, assigned_key, dropped_by_every_caller, function_apply,
                                  is_eval_name, off_the_training_branch, terminal)
from ddpkit.lint.ranks import distributed_mode

__all__ = ["ScopeFlow", "class_of", "self_attribute", "flows", "sharded_names", "eval_samplers", "sampler_class"]

_LOADER_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "trange", "islice", "prefetch", "cycle"})
_COLLECTING = frozenset({"update", "append", "extend", "add_", "add", "log_metrics", "record"})
_NO_GRAD = frozenset({"no_grad", "inference_mode"})
_SIZES = frozenset({"len", "size", "numel", "dim", "nelement"})
_SPLITS = frozenset({"Subset", "shard", "split_dataset_by_node", "partition", "islice"})


def _walked(target: ast.AST, source: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(part of a loop target, the container its items come from) where that is plain: each argument of `zip(a, b)`,
    the values of `d.items()` and `d.values()`. Not `for k in d` alone: over a dict that walks the keys, names."""
    if not isinstance(source, ast.Call) or any(isinstance(a, ast.Starred) for a in source.args):
        return []
    if isinstance(source.func, ast.Name) and source.func.id == "zip" and isinstance(target, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(source.args):
        return [(t, a) for t, a in zip(target.elts, source.args)]
    if isinstance(source.func, ast.Attribute) and not source.args:
        if source.func.attr == "items" and isinstance(target, (ast.Tuple, ast.List)) and len(target.elts) == 2:
            return [(target.elts[1], source.func.value)]
        if source.func.attr == "values":
            return [(target, source.func.value)]
    return []


def _fed_a_pair(call: ast.Call) -> bool:
    """`ap_calculator.step(batch_preds, batch_gts)`: an object given predictions and targets batch by batch (a metric
    calculator), not `scheduler.step(val_loss)` nor `scaler.step(optimizer)`, which take one value."""
    return call.func.attr == "step" and len(call.args) >= 2


@dataclass
class ScopeFlow:
    """The shard-dependent and reduced names of one function (or of the module's own code)."""

    node: ast.AST
    tainted: set[str] = field(default_factory=set)
    """Names holding a figure of this rank's shard (not reduced)."""
    reduced: set[str] = field(default_factory=set)
    """Names that went through a collective, or were reassigned from one."""
    counts: set[str] = field(default_factory=set)
    """Names holding a per-rank count: `len(loader)` of a sharded loader, `n += 1` in a sharded loop."""
    evaluation: set[str] = field(default_factory=set)
    """Tainted names whose shard loop evaluates (under no_grad, or over evaluation data)."""
    returns: tuple[bool, ...] | bool = False
    """Whether what the function returns is a shard figure (a tuple: per returned element)."""
    nodes: list[ast.AST] = field(default_factory=list)
    """The scope's own nodes (not those of the functions it defines)."""
    in_loop: set[int] = field(default_factory=set)
    """ids of the nodes inside a loop over a sharded loader."""
    shard_loops: set[int] = field(default_factory=set)
    """ids of the loops over a sharded loader themselves."""
    attributes: dict[str, bool] = field(default_factory=dict)
    """`self.x` attributes this scope sets to a shard figure: attribute -> whether the figure is an evaluation's."""
    reduced_attributes: set[str] = field(default_factory=set)
    """`self.x` attributes this scope sets from a reduced value or hands to a collective."""
    displayed: dict[str, set[str]] = field(default_factory=dict)
    """Names tainted only by the dict displays the scope assigns them: name -> the string keys of shard figures
    (`checkpoint = {"epoch": epoch, "losses": losses}`: `checkpoint["epoch"]` is no figure)."""

    def is_tainted(self, s: Script, expr: ast.AST | None, summaries: dict[str, tuple[bool, ...] | bool]) -> bool:
        return bool(self.tainted_names(s, expr, summaries))

    def tainted_names(self, s: Script, expr: ast.AST | None, summaries) -> list[str]:
        """The shard-dependent names an expression reads (a reducing call's arguments excepted)."""
        found: list[str] = []
        todo = [expr] if expr is not None else []
        while todo:
            node = todo.pop()
            if isinstance(node, ast.Call):
                callee = terminal(node.func)
                if callee not in summaries and _reduces(s, node):
                    continue
                if callee in _SIZES:
                    continue  # len(x), x.size(0): a batch size (progress), not a figure of the shard
                if summaries.get(callee) is True or (isinstance(summaries.get(callee), tuple)
                                                     and any(summaries[callee])):
                    found.append(f"{callee}()")
                todo.extend(node.args)
                todo.extend(k.value for k in node.keywords)
                if isinstance(node.func, ast.Attribute):
                    todo.append(node.func.value)  # `correct.item()`, `meter.avg()`
                continue
            if isinstance(node, ast.Attribute) and node.attr in ("shape", "ndim"):
                continue
            held = _self_prefix(node)  # `self.val_acc`, `self.meter.avg`: set by another method of the class
            if held is not None and self_attribute(s, held, summaries) is not None:
                found.append(f"self.{held.attr}")
                continue
            if held is not None and not self._changes(held.attr):
                continue  # `self.best_model_path`: no method holds a figure there, whatever else `self` holds
            root = _root(node)
            if root is not None:
                keyed = isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
                    and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
                    and root in self.displayed
                if root in self.tainted and root not in self.reduced and (
                        not keyed or node.slice.value in self.displayed[root]):
                    found.append(root)
                if isinstance(node, ast.Subscript):
                    todo.append(node.slice)
                continue
            todo.extend(ast.iter_child_nodes(node))
        return found


    def _changes(self, attr: str) -> bool:
        """This scope stores into `self.<attr>` (`self.total += loss`, `self.meter.update(acc)`)."""
        for node in self.nodes:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else [node.func.value] if isinstance(node, ast.Call) and \
                isinstance(node.func, ast.Attribute) else []
            if any((_self_prefix(t) is not None and _self_prefix(t).attr == attr) for t in targets):
                return True
        return False


def class_of(s: Script, node: ast.AST) -> str:
    """The class whose method `node` is in ('' outside one)."""
    parents = s.parents
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.ClassDef):
            return node.name
    return ""


def self_attribute(s: Script, node: ast.AST, summaries: dict) -> bool | None:
    """For `self.x` where a method of the same class sets `x` to a figure of this rank's shard (and none sets it
    from a reduced value): whether that figure is an evaluation's; None otherwise."""
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"):
        return None
    return summaries.get(f"{class_of(s, node)}.{node.attr}")


def _self_prefix(node: ast.AST) -> ast.Attribute | None:
    """`self.meter` of `self.meter.avg` (or of `self.meter["acc"]`), else None."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node
        node = node.value
    return None


def _root(node: ast.AST) -> str | None:
    """The variable an expression reads through attributes and subscripts (`meter.avg`, `t[0]`), else None."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _reduces(s: Script, call: ast.Call) -> bool:
    """A collective other than a barrier, a project function that makes one, or a library call whose name says
    it reduces/gathers/syncs across ranks (a project function named so that only waits, `distributed_sync`,
    moves no value)."""
    name = terminal(call.func)
    project = s.project
    if s.is_dist_collective(call):
        return "barrier" not in name.lower()
    if project is not None and function_apply(s, call) is not None:
        return True  # `gather = AllGather.apply; gather(t)`: an autograd Function whose forward all-gathers
    if project is not None and name in project.defined_functions and not _method_of_other(s, call):
        return name in project.exchanging_functions
    return bool(REDUCING_NAME.search(name.lower()))


def _reduces_a_copy(s: Script, call: ast.Call) -> bool:
    """A call of a project function (`def reduce_tensor(t): rt = t.clone(); dist.all_reduce(rt); return rt`) whose
    collectives all take local copies of its parameters, never a parameter itself: what it is given is not
    reduced in place, only what it returns is."""
    if not isinstance(call.func, ast.Name):
        return False
    defs = [d for x in s.project.scripts.values() for d in x.defs if d.name == call.func.id]
    return bool(defs) and all(_collects_copies(x, d) for x in s.project.scripts.values() for d in x.defs
                              if d.name == call.func.id)


def _collects_copies(s: Script, d: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    params = {a.arg for a in (*d.args.posonlyargs, *d.args.args, *d.args.kwonlyargs)}
    copies = {t.id for n in ast.walk(d) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
              and _new_tensor(s, n.value) for t in n.targets if isinstance(t, ast.Name)}
    collectives = [c for c in ast.walk(d) if isinstance(c, ast.Call) and s.is_dist_collective(c)
                   and "barrier" not in terminal(c.func).lower()]
    given = [a for c in collectives for a in (*c.args[:1], *(k.value for k in c.keywords if k.arg == "tensor"))]
    return bool(collectives) and bool(given) and all(isinstance(a, ast.Name) and a.id in copies - params
                                                     for a in given)


# torch functions that always return a new tensor, never their argument (`torch.tensor([loss])`, `torch.stack(xs)`)
_NEW_TENSOR = frozenset({"tensor", "stack", "cat", "zeros", "ones", "full", "empty", "zeros_like", "ones_like",
                         "full_like", "empty_like"})


def _new_tensor(s: Script, call: ast.Call) -> bool:
    """`x.clone()`, or a torch function that builds a new tensor from its arguments: reducing it changes no
    argument of the caller."""
    name = s.qualname(call.func)
    return terminal(call.func) == "clone" or name.startswith("torch.") and name.split(".")[-1] in _NEW_TENSOR \
        and name.count(".") == 1


def _method_of_other(s: Script, call: ast.Call) -> bool:
    """`model.train()` where the project's `train` is a plain function, no method: the call is the object's own
    method (nn.Module.train), not the project function of that name."""
    func = call.func
    if not isinstance(func, ast.Attribute) or isinstance(func.value, ast.Name) and func.value.id in s.aliases:
        return False
    methods = s.project.memo("method names", lambda: {
        item.name for x in s.project.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)
        for item in c.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))})
    return func.attr not in methods


def sharded_names(s: Script) -> set[str]:
    """Names (plain, or '.attr') that hold a sharded sampler or loader, over the whole project."""
    project = s.project

    def compute() -> set[str]:
        scripts = list(project.scripts.values())
        names: set[str] = set()
        factories: set[str] = set()
        returned = [(x, n, x.context(n).functions[-1]) for x in scripts for n in x.nodes
                    if isinstance(n, ast.Return) and n.value is not None and x.context(n).functions]
        unpacked = [(x, n) for x in scripts for n in x.nodes if isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], (ast.Tuple, ast.List)) and isinstance(n.value, ast.Call)]
        positions: dict[str, set[int]] = {}
        """factory -> positions of the sharded loaders in the tuple it returns (`return train_loader, val_loader`)"""
        for _ in range(4):
            before = (len(names), len(factories), sum(map(len, positions.values())))
            for x in scripts:
                for key, value in x.assignments:
                    if isinstance(value, ast.Call) and _makes_shards(x, value, names, factories):
                        names.add(key)
                for key in _kept_loaders(x, names, factories):
                    names.add(key)  # `self.val_loader = val_loader`, given a sharded loader by every caller
                for key in _sharded_containers(x, names, factories):
                    names.add(key)  # `self.data_loader["test"] = DataLoader(..., sampler=test_sampler)`, every item
                for n in _loader_classes(x, names, factories):
                    factories.add(n)  # `class ShardedLoader(DataLoader)` whose __init__ gives it a DistributedSampler
            # `def make_sampler(data): return DistributedSampler(data)`: calling it makes shards; so does a helper
            # returning a local name built that way (`loader = DataLoader(..., sampler=sampler); return loader`)
            for x, ret, f in returned:
                if _returns_shards(x, ret, ret.value, names, factories):
                    factories.add(f)
                elif isinstance(ret.value, ast.Tuple):
                    positions.setdefault(f, set()).update(
                        i for i, e in enumerate(ret.value.elts) if _returns_shards(x, ret, e, names, factories))
            for x, n in unpacked:  # `train_loader, val_loader = build_loaders(cfg)`
                if terminal(n.value.func) in positions and _left_unsharded(x, n.value, terminal(n.value.func)):
                    continue
                for i in positions.get(terminal(n.value.func), ()):
                    if i < len(n.targets[0].elts) and (key := assigned_key(n.targets[0].elts[i])):
                        names.add(key)
            if (len(names), len(factories), sum(map(len, positions.values()))) == before:
                break
        return names

    return project.memo("sharded names", compute)


def _returns_shards(s: Script, ret: ast.Return, value: ast.AST, known: set[str], factories: set[str]) -> bool:
    """A returned value that is a sharded sampler or loader: a call that makes one, or a local name of the
    function every assignment of which makes one."""
    if isinstance(value, ast.Call):
        return _makes_shards(s, value, known, factories)
    if isinstance(value, ast.Name):
        values = s.local_values(value.id, ret)
        return bool(values) and all(isinstance(v, ast.Call) and _makes_shards(s, v, known, factories)
                                    for v in values)
    return False


def _kept_loaders(s: Script, known: set[str], factories: set[str]) -> list[str]:
    """Attributes set from a sharded loader under another name: a local name every assignment of which makes one,
    or a parameter every call of the function (of the class, for `__init__`) in the project fills with one."""
    found = []
    project = s.project
    for node in s.nodes:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)):
            continue
        keys = [k for t in node.targets if isinstance(t, ast.Attribute) for k in [assigned_key(t)] if k not in known]
        if not keys:
            continue
        d = next((f for f in s.defs if id(f) == s.context(node).scope), None)
        params = [a.arg for a in d.args.args] if d is not None else []
        if node.value.id not in params:
            if _returns_shards(s, node, node.value, known, factories):
                found.extend(keys)
            continue
        callee = class_of(s, d) if d.name == "__init__" else d.name
        position = params.index(node.value.id) - (1 if params[0] in ("self", "cls") else 0)
        given = []
        by_name = project.memo("calls by name", lambda: _calls_by_name(project))
        for x, call in by_name.get(callee, ()):
            arg = next((k.value for k in call.keywords if k.arg == node.value.id), None)
            if arg is None and 0 <= position < len(call.args) and not any(
                    isinstance(a, ast.Starred) for a in call.args[:position + 1]):
                arg = call.args[position]
            given.append(arg is not None and _mentions_shards(x, arg, known, factories))
        if given and all(given):
            found.extend(keys)
    return found


def _calls_by_name(project) -> dict[str, list[tuple[Script, ast.Call]]]:
    found: dict[str, list[tuple[Script, ast.Call]]] = {}
    for x in project.scripts.values():
        for call in x.calls:
            found.setdefault(terminal(call.func), []).append((x, call))
    return found


def _loader_classes(s: Script, known: set[str], factories: set[str]) -> list[str]:
    """Project loader classes (a subclass of a `...Loader`, or a class that defines `__iter__`) whose `__init__`
    makes a sharded sampler or loader: an instance iterates this rank's shard."""
    found = []
    for c in s.nodes:
        if not isinstance(c, ast.ClassDef) or c.name in factories:
            continue
        if not (any(terminal(b).endswith("Loader") for b in c.bases)
                or any(isinstance(d, ast.FunctionDef) and d.name == "__iter__" for d in c.body)):
            continue
        init = next((d for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "__init__"), None)
        if init is not None and any(isinstance(n, ast.Call) and _makes_shards(s, n, known, factories)
                                    and not (isinstance(n.func, ast.Name) and n.func.id == c.name)
                                    for n in ast.walk(init)):
            found.append(c.name)
    return found


def _makes_shards(s: Script, call: ast.Call, known: set[str], factories: frozenset[str] | set[str] = frozenset()
                  ) -> bool:
    name = terminal(call.func)
    if name == "DistributedSampler" or (name.startswith("Distributed") and name.endswith("Sampler")):
        return True
    if s.project is not None and name in s.project.memo("rank sampler classes", lambda: _rank_samplers(s.project)):
        return True
    if name in factories:
        return not _left_unsharded(s, call, name)
    if "sampler" in name.lower() and any(_mentions_shards(s, a, known, factories) for a in call.args[:1]):
        return True  # a batch sampler over a sharded sampler: `BatchSampler(train_sampler, 32, True)`
    if s.qualname(call.func) in ("ddpkit.loader", "ddpkit.eval_loader", "ddpkit.data.loader",
                                 "ddpkit.data.eval_loader"):
        return True
    if name in _SPLITS and any(s.kind(n) for a in (*call.args, *(k.value for k in call.keywords))
                               for n in ast.walk(a) if isinstance(n, (ast.Name, ast.Attribute, ast.Call))):
        return True  # `Subset(data, range(rank, n, world))`, `data.shard(world, rank)`: split by rank by hand
    if name.endswith("DataLoader") or name.endswith("Loader"):
        for k in call.keywords:
            if k.arg in ("sampler", "batch_sampler", "dataset") and _mentions_shards(s, k.value, known, factories):
                return True
        return any(_mentions_shards(s, a, known, factories) for a in (*call.args[:1], *call.args[2:5]))
    return False


def _sharded_containers(s: Script, known: set[str], factories: set[str]) -> set[str]:
    """Dicts (names or attributes) every item stored into which is a sharded loader: whichever key a loop reads
    (`for x in self.data_loader[ln]`), it iterates a shard."""
    stores: dict[str, list[bool]] = {}
    for n in s.nodes:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Subscript):
            key = assigned_key(n.targets[0].value)
            value = n.value
            while isinstance(value, ast.Call) and terminal(value.func) in ("list", "iter") and value.args:
                value = value.args[0]  # `list(DataLoader(...))`: the same batches, held
            if key:
                stores.setdefault(key, []).append(isinstance(value, ast.Call)
                                                  and _makes_shards(s, value, known, factories))
    return {key for key, sharded in stores.items() if all(sharded) and key not in known}


def _rank_samplers(project) -> set[str]:
    """The project's sampler classes whose `__iter__` cuts the indices by the rank (`indices[self.rank *
    self.num_samples:(self.rank + 1) * self.num_samples]`, `indices[self.rank::self.num_replicas]`)."""
    found = set()
    for x in project.scripts.values():
        for c in x.nodes:
            if not (isinstance(c, ast.ClassDef) and (c.name.endswith("Sampler") or any(
                    terminal(b).endswith("Sampler") for b in c.bases))):
                continue
            for item in c.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__iter__" and any(
                        isinstance(n, ast.Subscript) and any(
                            isinstance(m, (ast.Name, ast.Attribute)) and terminal(m) == "rank"
                            for m in ast.walk(n.slice)) for n in ast.walk(item)):
                    found.add(c.name)
    return found


def _left_unsharded(s: Script, call: ast.Call, name: str) -> bool:
    """A call of a loader factory that shards only under a check of its own parameters, which this call leaves at
    defaults that fail it (`get_dataloader(path)` of `def get_dataloader(path, rank=-1, world_size=-1): if rank >= 0
    and world_size >= 0: sampler = DistributedSampler(...)`): every definition of that name builds no sampler."""
    defs = [d for x in s.project.scripts.values() for d in x.defs if d.name == name]
    return bool(defs) and all(_sampler_gated_off(d, call) for d in defs)


def _sampler_gated_off(d: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call) -> bool:
    """Every sampler `d` builds sits under an `if` that the parameter defaults `call` keeps make false."""
    args = d.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    defaults = dict(zip(positional[len(positional) - len(args.defaults):], args.defaults))
    defaults.update((a.arg, v) for a, v in zip(args.kwonlyargs, args.kw_defaults) if v is not None)
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return False
    given = set(positional[:len(call.args)]) | {k.arg for k in call.keywords}
    kept = {p: _literal(v) for p, v in defaults.items() if p not in given}
    kept = {p: v for p, v in kept.items() if v is not _UNKNOWN}
    parents = {id(c): p for p in ast.walk(d) for c in ast.iter_child_nodes(p)}
    samplers = [n for n in ast.walk(d) if isinstance(n, ast.Call) and terminal(n.func).startswith("Distributed")
                and terminal(n.func).endswith("Sampler")]
    if not samplers:
        return False
    for sampler in samplers:
        node, off = sampler, False
        while id(node) in parents and not off:
            parent = parents[id(node)]
            if isinstance(parent, ast.If) and any(node is x for x in parent.body):
                off = _false_with(parent.test, kept)
            node = parent
        if not off:
            return False
    return True


_UNKNOWN = object()


def _literal(node: ast.AST) -> object:
    """The value of a literal default (`-1`, `None`, `False`), else _UNKNOWN."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return _UNKNOWN


def _false_with(test: ast.AST, values: dict[str, object]) -> bool:
    """Whether `test` (comparisons, `and`/`or`/`not` of names in `values` and constants) is false with those values."""
    return _value(test, values) is False


_COMPARE = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
            ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b}


def _value(node: ast.AST, values: dict[str, object]) -> object:
    """The value of a small constant expression over `values`, else _UNKNOWN (also where Python would raise)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values.get(node.id, _UNKNOWN)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)):
        inner = _value(node.operand, values)
        if inner is _UNKNOWN or isinstance(node.op, ast.USub) and not isinstance(inner, (int, float)):
            return _UNKNOWN
        return not inner if isinstance(node.op, ast.Not) else -inner
    if isinstance(node, ast.BoolOp):
        parts = [_value(v, values) for v in node.values]
        if any(p is _UNKNOWN for p in parts):
            return _UNKNOWN
        return all(parts) if isinstance(node.op, ast.And) else any(parts)
    if isinstance(node, ast.Compare) and all(type(op) in _COMPARE for op in node.ops):
        sides = [_value(v, values) for v in (node.left, *node.comparators)]
        if any(v is _UNKNOWN for v in sides):
            return _UNKNOWN
        try:
            return all(_COMPARE[type(op)](a, b) for op, a, b in zip(node.ops, sides, sides[1:]))
        except TypeError:  # `None >= 0`
            return _UNKNOWN
    return _UNKNOWN


def _mentions_shards(s: Script, expr: ast.AST, known: set[str], factories: frozenset[str] | set[str] = frozenset()
                     ) -> bool:
    for n in ast.walk(expr):
        if isinstance(n, ast.Call) and _makes_shards(s, n, known, factories):
            return True
        if isinstance(n, ast.Name) and n.id in known or isinstance(n, ast.Attribute) and "." + n.attr in known:
            return True
    return False


def _sharded_params(s: Script) -> dict[int, set[str]]:
    """id(function) -> its parameters that some call in the project passes a sharded loader to."""
    project = s.project

    def compute() -> dict[int, dict[str, set[str]]]:
        known = sharded_names(s)
        defs = {d.name: (x, d) for x in project.scripts.values() for d in x.defs}
        out: dict[str, dict[int, set[str]]] = {}
        for _ in range(4):  # `run_eval(model, val_loader)` handing its `loader` on to `evaluate(model, loader)`
            votes: dict[tuple[str, int, str], list[bool]] = {}
            for x in project.scripts.values():
                mine = out.get(x.path, {})
                for call in x.calls:
                    target = defs.get(terminal(call.func))
                    if target is None:
                        continue
                    owner, d = target
                    params = [a.arg for a in d.args.args]
                    if params[:1] in (["self"], ["cls"]) and isinstance(call.func, ast.Attribute):
                        params = params[1:]
                    given = list(zip(params, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
                    for param, value in given:
                        sharded = isinstance(value, (ast.Name, ast.Attribute)) and _mentions_shards(x, value, known) \
                            or isinstance(value, ast.Call) and _makes_shards(x, value, known) \
                            or isinstance(value, ast.Name) and value.id in mine.get(x.context(call).scope, ())
                        votes.setdefault((owner.path, id(d), param), []).append(sharded)
            # a parameter is a sharded loader when every call passes one (evaluate(model, train_loader) and
            # evaluate(model, test_loader) with an unsharded test loader: unknown, so not followed)
            found: dict[str, dict[int, set[str]]] = {}
            for (path, scope, param), said in votes.items():
                if all(said):
                    found.setdefault(path, {}).setdefault(scope, set()).add(param)
            if found == out:
                break
            out = found
        return out

    return project.memo("sharded params", compute).get(s.path, {})


def _whole_names(s: Script, scope: ast.AST) -> set[str]:
    """Names of `scope` that surely hold a loader over the whole data, whatever other functions hold under the same
    name: a local name every assignment of which in `scope` builds one, or a parameter every call in the project
    fills with one (`report(model, eval_loader)` with `eval_loader = DataLoader(test_set, batch_size=64)`)."""
    if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return set()
    project = s.project
    known = sharded_names(s)
    found = {name for name in {n.id for n in _own_nodes(scope) if isinstance(n, ast.Name)} & known
             if _unsharded_loader(s, ast.Name(name, ast.Load()), id(scope))}
    params = [a.arg for a in (*scope.args.posonlyargs, *scope.args.args)]
    offset = 1 if params[:1] in (["self"], ["cls"]) else 0
    by_name = project.memo("calls by name", lambda: _calls_by_name(project))
    for i, param in enumerate(params[offset:]):
        if param not in known:
            continue
        given = []
        for x, call in by_name.get(scope.name, ()):
            if not x.project.runs(x, call):
                continue
            arg = next((k.value for k in call.keywords if k.arg == param), None)
            if arg is None and i < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:i + 1]):
                arg = call.args[i]
            given.append(arg is not None and _unsharded_loader(x, arg, x.context(call).scope))
        if given and all(given):
            found.add(param)
    return found


def _unsharded_loader(s: Script, value: ast.AST, scope: int, depth: int = 0) -> bool:
    """`DataLoader(data, batch_size=64)` with no sampler (or `sampler=None`), no `**kwargs`, nothing sharded nor
    rank-dependent in it; or a name every assignment of which in the function `scope` (its id, as
    Context.scope) is one (followed three names deep)."""
    if isinstance(value, ast.Name) and depth < 3:
        values = [v for stmt, v in s._bindings.get(value.id, ()) if s.context(stmt).scope == scope]
        return bool(values) and all(v is not None and _unsharded_loader(s, v, scope, depth + 1) for v in values)
    if not (isinstance(value, ast.Call) and terminal(value.func) == "DataLoader") or len(value.args) > 3:
        return False
    for k in value.keywords:
        if k.arg is None or k.arg in ("sampler", "batch_sampler") and not (
                isinstance(k.value, ast.Constant) and k.value.value is None):
            return False
    known = sharded_names(s)
    return not _mentions_shards(s, value, known) and not any(
        s.kind(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute, ast.Call)))


def _loop_source(flow_names: set[str], s: Script, expr: ast.AST) -> bool:
    """`for b in loader` / `enumerate(loader)` / `tqdm(loader)` over a sharded loader, also where only rank 0 wraps
    it in a progress bar (`tqdm(loader) if rank == 0 else loader`: both arms walk the shard)."""
    if isinstance(expr, ast.IfExp):
        return _loop_source(flow_names, s, expr.body) and _loop_source(flow_names, s, expr.orelse)
    if isinstance(expr, ast.Call) and terminal(expr.func) in _LOADER_WRAPPERS:
        return any(_loop_source(flow_names, s, a) for a in expr.args)
    if isinstance(expr, ast.Name):
        return expr.id in flow_names
    if isinstance(expr, ast.Attribute):
        return "." + expr.attr in flow_names
    if isinstance(expr, ast.Subscript):
        return _loop_source(flow_names, s, expr.value)  # an item of a dict of sharded loaders
    return False


def _enumerates(call: ast.Call) -> bool:
    """`enumerate(loader)`, also inside a wrapper (`tqdm(enumerate(loader))`): the loop's first target is an index."""
    while isinstance(call, ast.Call) and terminal(call.func) in _LOADER_WRAPPERS:
        if terminal(call.func) == "enumerate":
            return True
        call = call.args[0] if call.args else None
    return False


def _scopes(s: Script) -> list[ast.AST]:
    return [s.tree, *s.defs]


def _own_nodes(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a function (or module) outside the functions it defines."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _names_of(target: ast.AST) -> list[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _analyse(s: Script, scope: ast.AST, summaries: dict) -> ScopeFlow:
    flow = ScopeFlow(scope)
    nodes = s.project.memo(("own nodes", id(scope)), lambda: _own_nodes(scope))
    flow.nodes = nodes
    sources = (sharded_names(s) - _whole_names(s, scope)) | _sharded_params(s).get(id(scope), set())
    # `pbar = tqdm(enumerate(train_loader))` then `for i, (x, y) in pbar:`: the wrapped loader, under a local name
    # (also `pbar = tqdm(loader) if rank == 0 else loader`)
    # (only a name every assignment of the scope gives a wrapped sharded loader: `pbar` over the training and
    # then an unsharded test loader is not followed)
    bound: dict[str, list[ast.AST]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    bound.setdefault(t.id, []).append(node.value)
    wrapped = {name: all(_enumerates(v) for v in values) for name, values in bound.items()
               if name not in sources and all((isinstance(v, ast.IfExp) or isinstance(v, ast.Call)
                                               and terminal(v.func) in _LOADER_WRAPPERS)
                                              and _loop_source(sources, s, v) for v in values)}
    sources = sources | set(wrapped)
    parents = s.parents
    evaluating = isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
        is_eval_name(scope.name) or any(terminal(d.func if isinstance(d, ast.Call) else d) in _NO_GRAD
                                        for d in scope.decorator_list))
    shard_loops: list[tuple[ast.For, bool]] = []
    for node in nodes:
        if isinstance(node, (ast.For, ast.AsyncFor)) and _loop_source(sources, s, node.iter):
            loop_eval = evaluating or _under_no_grad(node, parents) or any(
                is_eval_name(terminal(n)) for n in ast.walk(node.iter) if isinstance(n, (ast.Name, ast.Attribute)))
            shard_loops.append((node, loop_eval))
            target = node.target
            if (isinstance(node.iter, ast.Call) and terminal(node.iter.func) == "enumerate"
                    or isinstance(node.iter, ast.Name) and wrapped.get(node.iter.id)) \
                    and isinstance(target, ast.Tuple) and target.elts:
                flow.counts.update(_names_of(target.elts[0]))  # `for i, batch in enumerate(loader)`: a batch index
                target = ast.Tuple(target.elts[1:], ast.Store())
            flow.tainted.update(_names_of(target))
            if loop_eval:
                flow.evaluation.update(_names_of(target))
    # a name a loop over other data (or a comprehension) also binds is ambiguous without an order: drop it
    other = {n for node in nodes if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension))
             and not _loop_source(sources, s, node.iter) for n in _names_of(node.target)}
    flow.tainted -= other
    flow.evaluation -= other
    # names that went through a collective: passed to it, or the receiver of a reducing method; a model, a
    # device or a loader handed to a helper that reduces (`acc = test(model, loader, device)`) is not reduced
    # itself, nor is what the training loop computes with it
    tools = {r for n in nodes for r in [_tool_root(n, parents)] if r}
    for node in nodes:
        if isinstance(node, ast.Call) and terminal(node.func) not in summaries and _reduces(s, node):
            if _reduces_a_copy(s, node):
                continue  # `reduced = reduce_tensor(loss)` all-reduces `loss.clone()`: `loss` stays this rank's
            for a in (*node.args, *(k.value for k in node.keywords)):
                root = _root(a)
                if root and not (isinstance(a, ast.Name) and root in tools):
                    flow.reduced.add(root)
                elif isinstance(a, (ast.List, ast.Tuple)):
                    flow.reduced.update(r for e in a.elts for r in [_root(e)] if r)
            if isinstance(node.func, ast.Attribute) and _root(node.func.value):
                flow.reduced.add(_root(node.func.value))
    for node in nodes:
        if isinstance(node, ast.Call) and terminal(node.func) == "len" and node.args \
                and _loop_source(sources, s, node.args[0]):
            parent = parents.get(id(node))
            if isinstance(parent, ast.Assign):
                flow.counts.update(n for t in parent.targets for n in _names_of(t))
    for node in nodes:
        if isinstance(node, ast.Call) and terminal(node.func) not in summaries and _reduces(s, node):
            # `dist.all_reduce(self.correct)`, `self.meter.synchronize_between_processes()`, `self.acc =
            # reduce_mean(acc)`: what the attribute holds is reduced, in whichever method
            held = [_self_prefix(a) for a in (*node.args, *(k.value for k in node.keywords))]
            if isinstance(node.func, ast.Attribute):
                held.append(_self_prefix(node.func.value))
            parent = parents.get(id(node))
            if isinstance(parent, ast.Assign):
                held.extend(_self_prefix(t) for t in parent.targets)
            flow.reduced_attributes.update(h.attr for h in held if h is not None)
    if not shard_loops and not flow.counts and not any(
            isinstance(n, ast.Call) and terminal(n.func) in summaries for n in nodes):
        return flow
    in_loop = {id(n) for loop, _ in shard_loops for n in ast.walk(loop)}
    flow.in_loop = in_loop
    flow.shard_loops = {id(loop) for loop, _ in shard_loops}
    eval_loop = {id(n) for loop, ev in shard_loops if ev for n in ast.walk(loop)}
    refills = _refills([scope, *nodes])
    for _ in range(6):
        before = (len(flow.tainted), len(flow.reduced), len(flow.counts))
        for root, values in refills:
            # `meter.reset()` then `meter.update(gathered)`: what the meter holds from then on is reduced
            if all(_reassigned_from_reduced(s, flow, v) for v in values):
                flow.reduced.add(root)
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = node.value
                summary = summaries.get(terminal(value.func)) if isinstance(value, ast.Call) else None
                if summary is None and _reassigned_from_reduced(s, flow, value):
                    # (`accuracy, f1 = metrics.tolist()` after `all_reduce(metrics)`: each name unpacked is reduced)
                    for t in targets:
                        flow.reduced.update(r for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])
                                            for r in [_root(e)] if r)
                    continue
                if isinstance(summary, tuple) and len(targets) == 1 and isinstance(targets[0], ast.Tuple) \
                        and len(targets[0].elts) == len(summary):
                    hit = [_root(e) for e, t in zip(targets[0].elts, summary) if t]
                    flow.tainted.update(h for h in hit if h)
                    continue
                tainted = flow.tainted_names(s, value, summaries)
                counting = isinstance(node, ast.AugAssign) and id(node) in in_loop
                if counting and not tainted:
                    # `steps += 1`, `seen += y.size(0)`, `elapsed += time.time() - t0`: a per-rank count (for a
                    # division), not a figure of the shard's data
                    flow.counts.update(r for t in targets for r in [_root(t)] if r)
                    continue
                if tainted and len(targets) == 1 and isinstance(targets[0], ast.Name) and isinstance(value, ast.Dict) \
                        and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in value.keys) \
                        and (targets[0].id in flow.displayed or targets[0].id not in flow.tainted):
                    # (each key of the display holds its own value)
                    flow.displayed.setdefault(targets[0].id, set()).update(
                        k.value for k, v in zip(value.keys, value.values) if flow.tainted_names(s, v, summaries))
                elif tainted:
                    flow.displayed.pop(_root(targets[0]) or "", None)
                if tainted:
                    for t in targets:
                        # `images, labels = batch`: each name of a tuple target holds part of the batch
                        for root in ([_root(e) for e in t.elts] if isinstance(t, (ast.Tuple, ast.List)) else [_root(t)]):
                            if not root:
                                continue
                            flow.tainted.add(root)
                            # (a shard figure an evaluation function returns, `valid_rmse = self._eval()`, is an
                            # evaluation's, as the figures of that function's own loop are)
                            if id(node) in eval_loop or any(n in flow.evaluation or n.endswith("()")
                                                            and is_eval_name(n[:-2]) for n in tainted):
                                flow.evaluation.add(root)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and (node.func.attr in _COLLECTING or _fed_a_pair(node)) and _root(node.func.value) \
                    and not _told_distributed(s, node.func.value):
                # `meter.update(value, n)`: the value decides; n is the batch's weight
                values = node.args[:1] if node.args else [k.value for k in node.keywords if k.arg != "n"]
                tainted = [n for a in values for n in flow.tainted_names(s, a, summaries)
                           if not _set_anew_in_other_loop(s, flow, node, n, summaries)]
                if tainted:
                    root = _root(node.func.value)
                    flow.tainted.add(root)
                    if id(node) in eval_loop or any(n in flow.evaluation for n in tainted):
                        flow.evaluation.add(root)
            elif isinstance(node, (ast.For, ast.AsyncFor)) and id(node) not in in_loop:
                # `for p, g in zip(preds, gts)` after the shard loop: each name holds items of what it walks
                for target, source in _walked(node.target, node.iter):
                    tainted = flow.tainted_names(s, source, summaries)
                    if tainted:
                        flow.tainted.update(_names_of(target))
                        if any(n in flow.evaluation for n in tainted):
                            flow.evaluation.update(_names_of(target))
        if (len(flow.tainted), len(flow.reduced), len(flow.counts)) == before:
            break
    for node in nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _COLLECTING \
                and isinstance(node.func.value, ast.Attribute) and _root(node.func.value) == "self" \
                and isinstance(node.func.value.value, ast.Name) and not _told_distributed(s, node.func.value):
            # `self.meter.update(acc)`: the meter another method reports holds this shard's figures
            values = node.args[:1] if node.args else [k.value for k in node.keywords if k.arg != "n"]
            tainted = [n for a in values for n in flow.tainted_names(s, a, summaries)]
            if tainted:
                attr = node.func.value.attr
                flow.attributes[attr] = flow.attributes.get(attr, False) or id(node) in eval_loop or any(
                    n in flow.evaluation for n in tainted)
            continue
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
            continue
        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
            if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"):
                continue
            if _reassigned_from_reduced(s, flow, node.value):
                flow.reduced_attributes.add(t.attr)
                continue
            tainted = flow.tainted_names(s, node.value, summaries)
            if tainted:
                flow.attributes[t.attr] = flow.attributes.get(t.attr, False) or id(node) in eval_loop or any(
                    n in flow.evaluation or self_attribute(s, _attribute_of(n), summaries) for n in tainted)
    returns = [n.value for n in nodes if isinstance(n, ast.Return) and n.value is not None]
    if returns:
        value = returns[-1]
        if isinstance(value, ast.Tuple):
            flow.returns = tuple(flow.is_tainted(s, e, summaries) for e in value.elts)
        else:
            flow.returns = flow.is_tainted(s, value, summaries)
    return flow


def _set_anew_in_other_loop(s: Script, flow: ScopeFlow, node: ast.AST, name: str, summaries: dict,
                            depth: int = 6) -> bool:
    """`for mels, units in val_loader: loss = F.l1_loss(model(units), mels); meter.update(loss.item())`: inside a
    loop over other data than the shard (also one nested in the training loop), a name the loop binds (its target)
    or its body assigns before `node` holds that value there, whatever the same name holds elsewhere in the function
    (the training loop's `loss`, built from its own batches); true where that value reads no shard figure."""
    loop = s.parents.get(id(node))
    while loop is not None and not isinstance(loop, (ast.For, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef,
                                                     ast.Lambda, ast.Module)):
        loop = s.parents.get(id(loop))
    if not isinstance(loop, (ast.For, ast.AsyncFor)) or id(loop) in flow.shard_loops or depth == 0:
        return False
    line = getattr(node, "lineno", 0)
    # (the loop's own target holds items of what it walks: clean where that reads no shard figure, not
    # `for p, g in zip(preds, gts)` over the shard's collected predictions)
    stores: list[tuple[int, ast.AST | None]] = [(loop.lineno, loop.iter)] if name in _names_of(loop.target) else []
    for n in ast.walk(loop):
        if isinstance(n, ast.Assign) and loop.lineno < n.lineno < line:
            for t in n.targets:
                if isinstance(t, ast.Name) and t.id == name:
                    stores.append((n.lineno, n.value))
                elif isinstance(t, (ast.Tuple, ast.List)) and name in _names_of(t):
                    # `mels, units = mels.to(rank), units.to(rank)`: each name holds its own element
                    pairs = zip(t.elts, n.value.elts) if isinstance(n.value, (ast.Tuple, ast.List)) \
                        and len(n.value.elts) == len(t.elts) else [(t, n.value)]
                    stores += [(n.lineno, v) for e, v in pairs if name in _names_of(e)]
    if not stores:
        return False
    stored_at, value = max(stores, key=lambda st: st[0])
    if value is loop.iter:
        return not flow.tainted_names(s, value, summaries)
    # (`mels = mels.to(rank)` reads the binding before it: the loop's own target)
    return all(_set_anew_in_other_loop(s, flow, value, n, summaries, depth - 1)
               for n in flow.tainted_names(s, value, summaries))


def _attribute_of(name: str) -> ast.AST:
    return ast.Attribute(ast.Name("self"), name[5:]) if name.startswith("self.") else ast.Name(name)


def _refills(nodes: list[ast.AST]) -> list[tuple[str, list[ast.AST]]]:
    """(object, values) for each `m.reset()` (or `m.clear()`) followed at once by `m.<method>(values)` in the same
    block: the object is emptied and refilled with those values alone."""
    found = []
    for node in nodes:
        for block in (getattr(node, f, None) for f in ("body", "orelse")):
            if not isinstance(block, list):
                continue
            for first, then in zip(block, block[1:]):
                calls = [x.value for x in (first, then) if isinstance(x, ast.Expr) and isinstance(x.value, ast.Call)
                         and isinstance(x.value.func, ast.Attribute)]
                if len(calls) == 2 and calls[0].func.attr in ("reset", "clear") and calls[1].args \
                        and calls[1].func.attr not in ("reset", "clear") \
                        and ast.dump(calls[0].func.value) == ast.dump(calls[1].func.value) and _root(calls[0].func.value):
                    found.append((_root(calls[0].func.value), list(calls[1].args)))
    return found


def _told_distributed(s: Script, receiver: ast.AST) -> bool:
    """An accumulator of a class the program does not define, built with the run's distributed flag
    (`SegMetric(n_classes, args.distributed)`, `Meter(distributed=True)`): it may reduce inside, where the flow
    cannot be seen, so it is not followed."""
    if not isinstance(receiver, (ast.Name, ast.Attribute)):
        return False
    key = ("." + receiver.attr) if isinstance(receiver, ast.Attribute) else receiver.id
    project = s.project
    classes = project.memo("class names", lambda: {
        c.name for x in project.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)})
    for x in project.scripts.values():
        for k, v in x.assignments:
            if k != key or not isinstance(v, ast.Call) or terminal(v.func) in classes:
                continue
            if any(distributed_mode(a) > 0 for a in v.args) or any(
                    k2.arg and (distributed_mode(ast.Name(k2.arg)) > 0 or "sync" in k2.arg.lower())
                    and not (isinstance(k2.value, ast.Constant) and not k2.value.value) for k2 in v.keywords):
                return True
    return False


def _tool_root(node: ast.AST, parents: dict[int, ast.AST]) -> str:
    """The name a node uses as a tool rather than a value: called (`model(x)`), looped over (`for b in loader`)
    or a placement (`x.to(device)`)."""
    parent = parents.get(id(node))
    if isinstance(node, ast.Name) and isinstance(parent, ast.Call) and (
            parent.func is node or isinstance(parent.func, ast.Attribute) and parent.func.attr in ("to", "cuda")
            and any(a is node for a in parent.args)):
        return node.id
    if isinstance(node, ast.Name) and isinstance(parent, (ast.For, ast.AsyncFor)) and parent.iter is node:
        return node.id
    return ""


def _reassigned_from_reduced(s: Script, flow: ScopeFlow, value: ast.AST) -> bool:
    """`counts = across_ranks(counts)`, `correct, total = t.tolist()` after `all_reduce(t)`."""
    if isinstance(value, ast.Call) and _reduces(s, value):
        return True
    roots = {_root(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute, ast.Subscript))}
    return bool(roots & flow.reduced) and not (roots & (flow.tainted - flow.reduced))


def _under_no_grad(node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call)
                                              and terminal(i.context_expr.func) in _NO_GRAD for i in node.items):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
    return False


def flows(s: Script) -> list[ScopeFlow]:
    """The flow of every scope of this file, with what the project's functions return (to a fixed point)."""
    project = s.project

    def summaries() -> dict:
        out: dict = {}
        if not sharded_names(s):
            return out
        for _ in range(6):  # a helper of a helper of a helper: to a fixed point
            new: dict = {}
            attributes: dict[str, bool] = {}
            reduced: set[str] = set()
            for x in project.scripts.values():
                for d in x.defs:
                    flow = _analyse(x, d, out)
                    if flow.returns:
                        new[d.name] = flow.returns
                    # `self.val_acc = correct / total` in validate(), read by fit() of the same class
                    cls = class_of(x, d)
                    for attr, evaluation in flow.attributes.items():
                        key = f"{cls}.{attr}"
                        attributes[key] = attributes.get(key, False) or evaluation
                    reduced.update(f"{cls}.{a}" for a in flow.reduced_attributes)
            new.update({k: "evaluation" if v else True for k, v in attributes.items() if k not in reduced
                        and not k.startswith(".")})
            if new == out:
                break
            out = new
        return out

    known = project.memo("shard summaries", summaries)
    return project.memo(("flows", s.path), lambda: [_analyse(s, scope, known) for scope in _scopes(s)])


def summaries_of(s: Script) -> dict:
    flows(s)
    return s.project.memo("shard summaries", dict)


def _terminals(node: ast.AST) -> list[str]:
    return [terminal(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))] + [
        _item_name(n) for n in ast.walk(node) if _item_name(n)]


def _item_name(node: ast.AST) -> str:
    """`sampler["dev"]` -> 'sampler_dev': the key of a dict item names the data as a variable would."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
            and terminal(node.value):
        return f"{terminal(node.value)}_{node.slice.value}"
    return ""


def _keyed_items(s: Script) -> dict[int, str]:
    """Values stored under a string key, by their item name: `sampler["dev"] = DistributedSampler(...)` and
    `samplers = {"dev": DistributedSampler(...)}` (see _item_name)."""
    found: dict[int, str] = {}
    for node in s.nodes:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        if _item_name(target):
            found[id(value)] = _item_name(target)
        elif isinstance(value, ast.Dict) and terminal(target):
            found.update({id(v): f"{terminal(target)}_{k.value}" for k, v in zip(value.keys, value.values)
                          if isinstance(k, ast.Constant) and isinstance(k.value, str)})
    return found


def eval_samplers(s: Script) -> list[ast.Call]:
    """Padding distributed samplers over evaluation data that some DataLoader the program iterates uses.

    A padding sampler: torch's DistributedSampler, a sampler class of the project whose code pads the
    indices the same way (`indices += indices[:total_size - len(indices)]`), or a project function that
    returns one built on its parameter (`make_data_sampler(val_set, False, distributed)`). Evaluation data:
    the dataset or the variable the sampler goes to says val/test. A sampler no DataLoader uses (directly
    or through a batch sampler built on it), or whose loader is built but never read again, evaluates nothing.
    """
    def compute() -> list[ast.Call]:
        named = {id(v): k.lstrip(".") for k, v in s.assignments}
        # `val_sampler = DistributedSampler(val_set) if distributed else None`: either arm is the value assigned
        named.update({id(arm): k.lstrip(".") for k, v in s.assignments if isinstance(v, ast.IfExp)
                      for arm in (v.body, v.orelse)})
        keyed = _keyed_items(s)
        loaded = s.project.memo("loaded names", lambda: {
            terminal(n) for x in s.project.scripts.values() for n in x.nodes
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load)})
        loaders = []
        for c in s.calls_named("DataLoader"):
            target = named.get(id(c), "")
            if target and (target not in loaded or dropped_by_every_caller(s, c)):
                continue  # `val_loader = DataLoader(...)` that nothing reads (also once returned to its callers)
            loaders.append(c)
        used = _loader_inputs(s, loaders)
        # a sampler that goes into a loader named for evaluation (`test_loader = DataLoader(ds2, **test_kwargs)`)
        # (its sampler argument only, and a name bound once: `sampler` reused for the train and test loaders, or
        # `shuffle=(train_sampler is None)` beside the test sampler, says nothing of the train sampler)
        once = {k for k, n in Counter(k.lstrip(".") for k, _ in s.assignments).items() if n == 1}
        evaluated = {x for x in _loader_inputs(s, [c for c in loaders if is_eval_name(named.get(id(c), ""))],
                                               samplers_only=True) if not isinstance(x, str) or x in once}
        held_out = _held_out_datasets(s)
        classes = s.project.memo("padding samplers", lambda: _padding_samplers(s.project))
        factories = s.project.memo("sampler factories", lambda: _sampler_factories(s.project, classes))
        aliases = _class_aliases(s, classes)
        found = []
        for call in s.calls:
            name = terminal(call.func)
            if name in classes or isinstance(call.func, ast.Name) and name in aliases:
                dataset = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "dataset"),
                                                              None)
            elif name in factories and isinstance(call.func, (ast.Name, ast.Attribute)):
                position, param = factories[name]
                dataset = call.args[position] if position < len(call.args) else next(
                    (k.value for k in call.keywords if k.arg == param), None)
            else:
                continue
            target = named.get(id(call), "") or keyed.get(id(call), "")
            if not (id(call) in used or (target and target in used)):
                continue
            if is_eval_name(target) or (dataset is not None and any(is_eval_name(n) for n in _terminals(dataset))) \
                    or id(call) in evaluated or (target and target in evaluated) \
                    or isinstance(dataset, ast.Name) and dataset.id in held_out or off_the_training_branch(s, call):
                found.append(call)
        return found
    return s.project.memo(("eval samplers", s.path), compute)


_SAMPLER_ARGS = frozenset({"sampler", "batch_sampler"})


def _loader_inputs(s: Script, loaders: list[ast.Call], samplers_only: bool = False) -> set:
    """What the given DataLoader calls are built from: node ids and names, followed through the assignments of
    a batch sampler built on a sampler (`batches = make_batch_sampler(val_sampler, ...)`, then
    `DataLoader(batch_sampler=batches)`) and of a keyword dict (`test_kwargs = {"sampler": sampler2}`, then
    `DataLoader(dataset2, **test_kwargs)`). `samplers_only`: only what goes in as the sampler."""
    def parts(call: ast.Call) -> list[ast.AST]:
        if not samplers_only:
            return [*call.args, *(k.value for k in call.keywords)]
        return [k.value for k in call.keywords if k.arg is None or k.arg in _SAMPLER_ARGS]

    def dict_values(d: ast.Dict) -> list[ast.AST]:
        return [v for k, v in zip(d.keys, d.values) if not samplers_only or k is None
                or isinstance(k, ast.Constant) and k.value in _SAMPLER_ARGS]

    loader_args = [n for c in loaders for a in parts(c) for n in ast.walk(a)]
    used = {id(n) for n in loader_args} | {terminal(n) for n in loader_args
                                            if isinstance(n, (ast.Name, ast.Attribute))} | {
        _item_name(n) for n in loader_args if _item_name(n)}
    for _ in range(2):
        used |= {terminal(n) for k, v in s.assignments if k.lstrip(".") in used and isinstance(v, (ast.Call, ast.Dict))
                 for a in (dict_values(v) if isinstance(v, ast.Dict) else (*v.args, *(kw.value for kw in v.keywords)))
                 if a is not None for n in ast.walk(a) if isinstance(n, (ast.Name, ast.Attribute))}
    return used


def _held_out_datasets(s: Script) -> set[str]:
    """Variables holding a dataset built with `train=False` (`datasets.MNIST(root, train=False, ...)`)."""
    once = {k for k, n in Counter(k for k, _ in s.assignments).items() if n == 1}
    return {k for k, v in s.assignments if k in once and isinstance(v, ast.Call)
            and any(kw.arg == "train" and isinstance(kw.value, ast.Constant) and kw.value.value is False
                    for kw in v.keywords)}


def _class_aliases(s: Script, classes: set[str]) -> dict[str, str]:
    """`sampler = DistributedSampler` (the class itself, not an instance), later `sampler(val_set)`: alias -> class."""
    return {k: terminal(v) for k, v in s.assignments if not k.startswith(".")
            and isinstance(v, (ast.Name, ast.Attribute)) and terminal(v) in classes}


def sampler_class(s: Script, call: ast.Call) -> str:
    """The sampler class an evaluation sampler call (one of eval_samplers) builds: its own name, or the class a
    local alias holds."""
    name = terminal(call.func)
    classes = s.project.memo("padding samplers", lambda: _padding_samplers(s.project))
    if name in classes or not isinstance(call.func, ast.Name):
        return name
    return _class_aliases(s, classes).get(name, name)


def _padding_samplers(project) -> set[str]:
    """torch's DistributedSampler and the project's sampler classes that pad their indices the same way."""
    found = {"DistributedSampler"}
    for x in project.scripts.values():
        for c in x.nodes:
            if isinstance(c, ast.ClassDef) and (c.name.endswith("Sampler") or any(
                    terminal(b).endswith("Sampler") for b in c.bases)) and any(
                    isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add) and isinstance(n.value, ast.Subscript)
                    and isinstance(n.target, ast.Name) and _terminals(n.value.value) == [n.target.id]
                    for n in ast.walk(c)):
                found.add(c.name)
    return found


def _sampler_factories(project, classes: set[str]) -> dict[str, tuple[int, str]]:
    """Project functions that return a padding sampler built on one of their parameters, with no drop_last:
    name -> (position, name) of that parameter."""
    found: dict[str, tuple[int, str]] = {}
    for x in project.scripts.values():
        defs = {id(d): d for d in x.defs}
        for value in x.calls:
            if not (terminal(value.func) in classes and value.args and isinstance(value.args[0], ast.Name)
                    and isinstance(x.parents.get(id(value)), ast.Return)
                    and not any(k.arg == "drop_last" for k in value.keywords)):
                continue
            d = defs.get(x.context(value).scope)
            params = [a.arg for a in d.args.args] if d is not None else []
            if value.args[0].id in params:
                found[d.name] = (params.index(value.args[0].id), value.args[0].id)
    return found
