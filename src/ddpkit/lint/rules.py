"""The lint checks for data, checkpoint and launcher mistakes (DDP001-DDP005, DDP007, DDP009)."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ddpkit.lint.analysis import (LOCAL, NONE, Script, argument, assigned_key, dropped_by_every_caller, is_eval_name,
                                  is_eval_sampler, keyword, terminal, without_grad)
from ddpkit.lint.passes import enclosing_function, passed_once, rerun_site

__all__ = ["Hit", "CHECKS", "check", "shuffle_arguments", "splat_keyword", "is_buffer",
           "DDP_ONLY_KWARGS", "off_by_default"]


@dataclass(frozen=True)
class Hit:
    """A finding before it is given a path: the node it points at, the rule and the advice."""

    node: ast.AST
    rule: str
    severity: str
    message: str
    fix: str


CHECKS: list[Callable[[Script], Iterator[Hit]]] = []


def check(func: Callable[[Script], Iterator[Hit]]) -> Callable[[Script], Iterator[Hit]]:
    CHECKS.append(func)
    return func


def _is_const(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


# ---- data ------------------------------------------------------------------------------------
def _never_shuffles(s: Script, call: ast.Call) -> bool:
    """`sampler.set_epoch(...)` where every assignment of `sampler` in the function builds a DistributedSampler with
    `shuffle=False` (by keyword or at its position)."""
    if not (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)):
        return False
    built = s.local_values(call.func.value.id, call)
    return bool(built) and all(isinstance(v, ast.Call) and terminal(v.func) == "DistributedSampler"
                               and _is_const(argument(v, "shuffle", 3), False) for v in built)


@check
def sampler_without_set_epoch(s: Script) -> Iterator[Hit]:
    set_epochs = s.project.calls_named("set_epoch")
    for script, call in set_epochs:
        if script is not s or not call.args:
            continue
        if isinstance(call.func, ast.Attribute) and any(is_eval_name(terminal(n)) for n in ast.walk(call.func.value)
                                                        if isinstance(n, (ast.Name, ast.Attribute))):
            continue  # `valid_queue.sampler.set_epoch(0)`: the order of evaluation data does not matter
        if _never_shuffles(s, call):
            continue  # the epoch only seeds the shuffle: a sampler built with shuffle=False ignores it
        if isinstance(call.args[0], ast.Constant) or _loop_invariant(s, call):
            yield Hit(call, "DDP001", "error",
                      f"set_epoch({ast.unparse(call.args[0])}) passes the same epoch every time, so every epoch "
                      "visits the data in the same order",
                      "pass the loop's epoch number: sampler.set_epoch(epoch)")
        elif len(set_epochs) == 1 and _before_the_epoch_loop(s, call):
            yield Hit(call, "DDP001", "error",
                      f"set_epoch({ast.unparse(call.args[0])}) is called once, before the epoch loop on line "
                      f"{_before_the_epoch_loop(s, call)}, so every epoch visits the data in the same order",
                      "call sampler.set_epoch(epoch) inside the epoch loop, before iterating the DataLoader")
        elif _advanced_by_some_ranks(s, call.args[0]):
            yield Hit(call, "DDP001", "error",
                      f"set_epoch({ast.unparse(call.args[0])}) gets a counter only some ranks advance (inside a rank "
                      "check): the other ranks shuffle every epoch alike, and the ranks' shards stop being disjoint",
                      "advance the epoch on every rank (or use the loop variable: sampler.set_epoch(epoch))")
    yield from _materialised_loaders(s, set_epochs)
    if not s.project.epoch_loop:
        return
    receivers = _set_epoch_receivers(set_epochs)
    if receivers is None:
        return  # a set_epoch whose sampler is not known by name may be this sampler's
    subclasses = s.project.memo("epoch-seeded samplers", lambda: _epoch_seeded_samplers(s.project))
    for x in s.project.scripts.values():
        for call in [*x.calls_named("DistributedSampler"), *(c for c in x.calls if terminal(c.func) in subclasses)]:
            yield from _unseeded(s, x, call, subclasses, receivers, set_epochs)


def _materialised_loaders(s: Script, set_epochs: list[tuple[Script, ast.Call]]) -> Iterator[Hit]:
    """`list(DataLoader(..., sampler=train_sampler))` where the program calls `train_sampler.set_epoch(epoch)`: the
    sampler's order is drawn once, when the list is built, so the later set_epoch calls reorder nothing."""
    receivers = {terminal(c.func.value) for _, c in set_epochs if isinstance(c.func, ast.Attribute)
                 and isinstance(c.func.value, (ast.Name, ast.Attribute))}
    for call in s.calls:
        if s.qualname(call.func) not in ("list", "tuple") or len(call.args) != 1 \
                or not isinstance(loader := call.args[0], ast.Call) or terminal(loader.func) != "DataLoader":
            continue
        sampler = keyword(loader, "sampler")
        if not isinstance(sampler, (ast.Name, ast.Attribute)) or terminal(sampler) not in receivers:
            continue
        if s.in_loop(call):
            continue  # built again on every pass (after that pass's set_epoch, perhaps)
        made = [v for k, v in s.assignments if k.lstrip(".") == terminal(sampler)]
        if made and all(isinstance(v, ast.Call) and terminal(v.func) == "DistributedSampler"
                        and not _is_const(argument(v, "shuffle", 3), False) for v in made) and s.project.runs(s, call):
            yield Hit(call, "DDP001", "error",
                      f"{s.qualname(call.func)}(DataLoader(...)) draws {ast.unparse(sampler)}'s order once, when "
                      f"the {s.qualname(call.func)} is built: its set_epoch(epoch) calls reorder nothing, so every "
                      "epoch replays the same batches in the same order",
                      "keep the DataLoader itself and iterate it anew each epoch, after sampler.set_epoch(epoch)")


def _unseeded(s: Script, x: Script, call: ast.Call, subclasses: set[str], receivers: set[str],
              set_epochs: list[tuple[Script, ast.Call]]) -> Iterator[Hit]:
    """The finding for a shuffling sampler of script x that no set_epoch reaches, if it is reported in script s: at
    the sampler, or where its loader is passed over again (rerun_site) when that loop is in another function than
    the sampler (a loader factory, a class's set-up method: the epochs, and the fix, are in the loop)."""
    torch_sampler = terminal(call.func) == "DistributedSampler"
    if _is_const(argument(call, "shuffle", 3) if torch_sampler else keyword(call, "shuffle"), False) \
            or is_eval_sampler(x, call):
        return  # the order of evaluation data does not matter
    site = rerun_site(x, call)
    if site is not None and enclosing_function(*site) is enclosing_function(x, call) and site[0] is x:
        site = (x, call) if not set_epochs else site
    at, node = site if site is not None else (x, call)
    if at is not s:
        return
    if set_epochs:  # other samplers get set_epoch: this one's loader must be seen passed over again
        holders = {k.lstrip(".") for k, v in x.assignments if v is call}
        if site is None or holders & receivers:
            return
    if _handed_to_unseen_code(x, call):
        return  # a batch sampler from a file not linted may call set_epoch itself
    if _under_an_unread_key(x, call) or dropped_by_every_caller(x, call) or _never_read(x, call):
        return  # `{"train_valid": DistributedSampler(...)}` whose key nothing reads: its loader never runs
    if _read_only_without_grad(x, call):
        return  # a feature-bank pass under no_grad: its order trains nothing
    if site is None and passed_once(x, call):
        return  # one iterator taken with next(): one pass over the data, no epoch to reorder
    what = "DistributedSampler shuffles (shuffle defaults to True)" if torch_sampler else \
        f"{terminal(call.func)} (a DistributedSampler subclass) seeds its shuffle with self.epoch"
    if node is call:
        driver = _driven_by_unseen_code(x, call)
        if driver:  # the finding rests on code not linted: it says so
            yield Hit(call, "DDP001", "warning",
                      f"{what} and nothing linted calls sampler.set_epoch(); its loader is iterated only by "
                      f"{driver}() from a module not linted: unless that calls set_epoch, every epoch visits the data "
                      "in the same order",
                      "call sampler.set_epoch(epoch) where each pass over the data starts (or check that "
                      f"{driver}() does)")
            return
        yield Hit(call, "DDP001", "error",
                  f"{what} but sampler.set_epoch() is never called, so every epoch visits the data in the same order",
                  "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the DataLoader")
        return
    others = f"set_epoch is called only for other samplers ({_line_of(*set_epochs[0], s)})" if set_epochs else \
        "sampler.set_epoch() is never called"
    yield Hit(node, "DDP001", "error",
              f"this loop passes again over the loader of the DistributedSampler built at {_line_of(x, call, s)}, "
              f"which shuffles, but {others}: every pass visits the data in the same order",
              "call sampler.set_epoch(epoch) at the start of every pass, before iterating the DataLoader")


def _read_only_without_grad(x: Script, call: ast.Call) -> bool:
    """Every loop over the loader this sampler feeds runs under `torch.no_grad()` (in its function, or in the project
    function the loader is handed to by position: `test(model, memory_loader)` looping over its parameter): the
    order of a pass that trains nothing does not matter."""
    samplers = {k.lstrip(".") for k, v in x.assignments if v is call}
    loaders = {k.lstrip(".") for k, v in x.assignments if isinstance(v, ast.Call) and terminal(v.func) == "DataLoader"
               and isinstance(keyword(v, "sampler"), (ast.Name, ast.Attribute))
               and terminal(keyword(v, "sampler")) in samplers}
    if not samplers or not loaders:
        return False
    loops: list[tuple[Script, ast.AST]] = []
    for node in x.nodes:
        if isinstance(node, ast.For) and any(isinstance(n, (ast.Name, ast.Attribute)) and terminal(n) in loaders
                                             for n in ast.walk(node.iter)):
            loops.append((x, node))
        if not isinstance(node, ast.Call):
            continue
        if any(isinstance(n, (ast.Name, ast.Attribute)) and terminal(n) in loaders
               for k in node.keywords for n in ast.walk(k.value)) or terminal(node.func) in ("iter", "next") and any(
                isinstance(n, (ast.Name, ast.Attribute)) and terminal(n) in loaders for n in node.args):
            return False  # handed on by keyword, or stepped by hand: not followed here
        for i, a in enumerate(node.args):
            if not (isinstance(a, (ast.Name, ast.Attribute)) and terminal(a) in loaders):
                continue
            defs = [(y, d) for y in x.project.scripts.values() for d in y.defs if d.name == terminal(node.func)]
            if len(defs) != 1 or not isinstance(node.func, ast.Name):
                return False  # handed to code not followed here
            y, d = defs[0]
            params = [p.arg for p in (*d.args.posonlyargs, *d.args.args)]
            if i >= len(params):
                return False
            loops += [(y, n) for n in ast.walk(d) if isinstance(n, ast.For) and any(
                isinstance(m, ast.Name) and m.id == params[i] for m in ast.walk(n.iter))]
    return bool(loops) and all(without_grad(y, n, y.parents) for y, n in loops)


def _set_epoch_receivers(set_epochs: list[tuple[Script, ast.Call]]) -> set[str] | None:
    """The names of the samplers the program's set_epoch calls are made on (`self.hr_sampler.set_epoch(...)` ->
    'hr_sampler'); None where one is not a sampler known by its own name (`loader.sampler.set_epoch`, `s.set_epoch`
    in a loop over samplers): which sampler it reaches is not known."""
    names = set()
    for x, call in set_epochs:
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        if not isinstance(receiver, (ast.Name, ast.Attribute)) or terminal(receiver) == "sampler" \
                or not any(isinstance(v, ast.Call) and terminal(v.func) == "DistributedSampler"
                           for k, v in x.assignments if k.lstrip(".") == terminal(receiver)):
            return None
        names.add(terminal(receiver))
    return names


def _line_of(script: Script, node: ast.AST, here: Script) -> str:
    return f"line {node.lineno}" if script is here else f"{script.path}:{node.lineno}"


def _epoch_seeded_samplers(project) -> set[str]:
    """Project subclasses of DistributedSampler whose code reads `self.epoch` (the seed set_epoch sets)."""
    return {c.name for x in project.scripts.values() for c in x.nodes
            if isinstance(c, ast.ClassDef) and any(terminal(b) == "DistributedSampler" for b in c.bases)
            and any(isinstance(n, ast.Attribute) and n.attr == "epoch" and isinstance(n.value, ast.Name)
                    and n.value.id == "self" and isinstance(n.ctx, ast.Load) for n in ast.walk(c))}


def _never_read(s: Script, call: ast.Call) -> bool:
    """`sampler = DistributedSampler(data)` where the program reads `sampler` nowhere (no loader is given it, no
    `self.sampler` is read in any file): its order is never used, so set_epoch would change nothing."""
    parent = s.parents.get(id(call))
    if not (isinstance(parent, ast.Assign) and parent.value is call):
        return False
    for target in parent.targets:
        if isinstance(target, ast.Name):
            if any(isinstance(n, ast.Name) and n.id == target.id and not isinstance(n.ctx, ast.Store)
                   for n in s.nodes):
                return False
        elif isinstance(target, ast.Attribute):
            if any(isinstance(n, ast.Attribute) and n.attr == target.attr and not isinstance(n.ctx, ast.Store)
                   for x in s.project.scripts.values() for n in x.nodes):
                return False
        else:
            return False
    return True


def _under_an_unread_key(s: Script, value: ast.AST) -> bool:
    """The value is stored under a string key (`{"extra": DistributedSampler(...)}`, `samplers["extra"] = ...`)
    that the program names nowhere else: no `loaders["extra"]`, no `"extra"` in a list of phases or a comparison.
    What is built from it under that key (a loader per key) is never picked, so never iterated. Keys written
    (`datasets["extra"] = ...`), other dict literals' keys and the value's own arguments do not count as reads."""
    parent = s.parents.get(id(value))
    key = None
    if isinstance(parent, ast.Dict):
        key = next((k for k, v in zip(parent.keys, parent.values) if v is value), None)
    elif isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Subscript):
        key = parent.targets[0].slice
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return False
    def reads(x: Script) -> bool:
        written = {id(n.slice) for n in x.nodes if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)}
        keys = {id(k) for n in x.nodes if isinstance(n, ast.Dict) for k in n.keys if k is not None}
        # what is stored under the same key may read that key of another dict (`"extra": f(datasets["extra"])`)
        own = {id(m) for n in x.nodes if isinstance(n, ast.Dict) for k, v in zip(n.keys, n.values)
               if isinstance(k, ast.Constant) and k.value == key.value for m in ast.walk(v)}
        return any(isinstance(n, ast.Constant) and n.value == key.value and id(n) not in written | keys | own
                   for n in x.nodes)
    return not any(reads(x) for x in s.project.scripts.values())


def _handed_to_unseen_code(s: Script, sampler: ast.Call) -> bool:
    """The sampler reaches (directly or through torch's BatchSampler) a sampler class imported from a module the
    linted files do not include (`samplers.IterationBasedBatchSampler(batch_sampler)`), which may call set_epoch."""
    holders = {k for k, v in s.assignments if v is sampler}
    done: set[int] = set()
    for _ in range(4):
        more = set()
        for key, value in s.assignments:
            if not isinstance(value, ast.Call) or id(value) in done or not any(
                    isinstance(a, ast.Name) and a.id in holders for a in (*value.args, *(k.value for k in value.keywords))):
                continue
            done.add(id(value))
            if terminal(value.func) == "DataLoader":
                continue  # what a loader is handed to iterates batches; it does not drive the sampler's epochs
            root = value.func
            while isinstance(root, ast.Attribute):
                root = root.value
            name = s.qualname(value.func)
            if isinstance(root, ast.Name) and root.id in s.aliases and not name.startswith("torch.") \
                    and s.project.resolve(s, value.func) is None and "sampler" in terminal(value.func).lower():
                return True  # a batch sampler drives the epochs; a loader wrapper (timm's) does not
            more.add(key)
        if more <= holders:
            return False
        holders |= more
    return False


def _driven_by_unseen_code(s: Script, sampler: ast.Call) -> str:
    """The name of the function that drives the sampler's epochs out of sight, else '': the only loader of the
    sampler is handed to a function from a module the linted files do not include (not torch, not the standard
    library: `batches = make_iter_dataloader(loader)` then `next(batches)`) and the program iterates neither the
    loader nor what that function returns: the passes over the data, and where each epoch starts, are in code not
    linted, which may call set_epoch (the finding says so). A loader the program iterates itself (`for x in
    loader`, `for x in tqdm(loader)`, through a function of the program) does not count."""
    holders = {k for k, v in s.assignments if v is sampler}
    parent = s.parents.get(id(sampler))
    if isinstance(parent, ast.keyword):
        parent = s.parents.get(id(parent))
    loaders = {k for k, v in s.assignments if isinstance(v, ast.Call) and terminal(v.func) == "DataLoader"
               and (v is parent or any(isinstance(a, ast.Name) and a.id in holders
                                       for a in (*v.args, *(k.value for k in v.keywords))))}
    loaders = {k for k in loaders if not k.startswith(".")}
    if len(loaders) != 1:
        return ""
    name = next(iter(loaders))
    iterated = {n.id for node in s.nodes if isinstance(node, (ast.For, ast.comprehension))
                for n in ast.walk(node.iter) if isinstance(n, ast.Name)}
    uses = [n for n in s.nodes if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    unseen = ""
    for use in uses:
        call = s.parents.get(id(use))
        if not isinstance(call, ast.Call) or use not in call.args:
            return ""
        if isinstance(call.func, ast.Name) and call.func.id == "len" and call.func.id not in s.aliases:
            continue
        qualname = s.qualname(call.func)
        root = qualname.split(".")[0]
        if "." not in qualname or root in ("torch", *sys.stdlib_module_names) \
                or s.project.resolve(s, call.func) is not None or s.project.modules.locate(
                    s.path, qualname.rsplit(".", 1)[0]) is not None:
            return ""
        around = s.parents.get(id(call))
        if isinstance(around, (ast.For, ast.comprehension)) or isinstance(around, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in iterated for t in around.targets):
            return ""
        unseen = terminal(call.func)
    return unseen if name not in iterated else ""


def _advanced_by_some_ranks(s: Script, value: ast.AST) -> bool:
    """A plain name that is reassigned (or `+=`-ed) only inside rank checks after its first assignment."""
    if not isinstance(value, ast.Name):
        return False
    writes = [n for n in s.nodes if isinstance(n, (ast.Assign, ast.AugAssign)) and any(
        isinstance(t, ast.Name) and t.id == value.id
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))]
    guarded = [n for n in writes if s.context(n).level and not s.context(n).single]
    return bool(guarded) and len(writes) - len(guarded) <= 1 and not any(
        isinstance(n, ast.For) and value.id in {m.id for m in ast.walk(n.target) if isinstance(m, ast.Name)}
        for n in s.nodes)


def _before_the_epoch_loop(s: Script, call: ast.Call) -> int:
    """The line of the epoch loop that follows a set_epoch outside any loop in the same function: a later
    `for ... in range(...)` that runs another loop, directly or through a function of the project that loops
    (0 if none, or if the epoch given is a parameter of the function: its callers may pass each epoch)."""
    node, parents, function = call, s.parents, None
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.Lambda)):
            return 0
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node
            break
    if function is None:
        return 0
    params = {a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)}
    if isinstance(call.args[0], ast.Name) and call.args[0].id in params:
        return 0  # `def train_epoch(loader, epoch): loader.sampler.set_epoch(epoch)`: its callers pass the epoch
    looping = s.project.memo("looping functions", lambda: {
        d.name for x in s.project.scripts.values() for d in x.defs
        if any(isinstance(n, (ast.For, ast.While)) for n in ast.walk(d))})
    for loop in ast.walk(function):
        if isinstance(loop, ast.For) and isinstance(loop.iter, ast.Call) and terminal(loop.iter.func) == "range" \
                and loop.lineno > call.lineno and any(
                isinstance(n, (ast.For, ast.While)) and n is not loop or isinstance(n, ast.Call)
                and terminal(n.func) in looping for n in ast.walk(loop)):
            return loop.lineno
    return 0


def _rebuilt_in(call: ast.Call, loop: ast.For, inner: ast.AST | None) -> bool:
    """`sampler.set_epoch(...)` where `loop` assigns `sampler` itself (`for group in groups: sampler =
    DistributedSampler(...)`), outside the loop `inner` it holds (already found rebuilding it): each pass of the
    loop has a fresh sampler."""
    holder = call.func.value if isinstance(call.func, ast.Attribute) else None
    if not isinstance(holder, (ast.Name, ast.Attribute)):
        return False
    text = ast.unparse(holder)
    todo = [loop]
    while todo:
        n = todo.pop()
        if n is inner:
            continue
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and any(
                ast.unparse(t) == text for t in (n.targets if isinstance(n, ast.Assign) else [n.target])):
            return True
        todo.extend(ast.iter_child_nodes(n))
    return False


def _loop_invariant(s: Script, call: ast.Call) -> bool:
    """`set_epoch(start_epoch)` in `for epoch in ...`: a plain name the enclosing loop neither binds nor changes. A
    loop whose target is the sampler's holder (`for loader in self.loaders:`) is a loop over samplers, not the
    epoch loop: the one around it (or the function's callers) decides. An attribute counts where it is the bound
    of the enclosing loop (`for epoch in range(args.epochs): sampler.set_epoch(args.epochs)`): the number of
    epochs, not the current one."""
    value = call.args[0]
    if isinstance(value, ast.Attribute):
        return _loop_bound(s, call, value)
    if not isinstance(value, ast.Name):
        return False
    node, parents, rebuilt = call, s.parents, None
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(node, ast.For):
            bound = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            if isinstance(call.func, ast.Attribute) and any(isinstance(n, ast.Name) and n.id in bound
                                                            for n in ast.walk(call.func.value)):
                continue  # `for loader in loaders: loader.sampler.set_epoch(epoch)` walks samplers, not epochs
            if _rebuilt_in(call, node, rebuilt):
                rebuilt = node
                continue  # a sampler built anew in each pass of this loop: the loop around it passes over epochs
            bound |= {n.id for stmt in ast.walk(node) if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign,
                                                                             ast.NamedExpr, ast.For))
                      for t in ([stmt.target] if not isinstance(stmt, ast.Assign) else stmt.targets)
                      for n in ast.walk(t) if isinstance(n, ast.Name)}
            return value.id not in bound
        if isinstance(node, ast.While):
            return False  # a counter advanced somewhere the loop calls is not visible here
    return False


def _loop_bound(s: Script, call: ast.Call, value: ast.Attribute) -> bool:
    """Whether `value` (`args.epochs`) is the stop of the `range()` the innermost `for` around `call` walks, and
    nothing in that loop assigns it."""
    text = ast.unparse(value)
    node = call
    while id(node) in s.parents:
        node = s.parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.While)):
            return False
        if isinstance(node, ast.For):
            it = node.iter
            if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and it.args):
                return False
            stop = it.args[-1] if len(it.args) > 1 else it.args[0]
            if not any(isinstance(n, ast.Attribute) and ast.unparse(n) == text for n in ast.walk(stop)):
                return False
            return not any(ast.unparse(t) == text for stmt in ast.walk(node)
                           if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                           for t in ([stmt.target] if not isinstance(stmt, ast.Assign) else stmt.targets))
    return False


def shuffle_arguments(s: Script, call: ast.Call) -> tuple[ast.AST | None, bool]:
    """The shuffle= a DataLoader gets, and whether it comes through `**kwargs` (a dict built elsewhere)."""
    shuffle = argument(call, "shuffle", 2)
    if shuffle is not None:
        return shuffle, False
    return splat_keyword(s, call, "shuffle")[0], True


def splat_keyword(s: Script, call: ast.Call, name: str) -> tuple[ast.AST | None, bool]:
    """The value keyword `name` gets through the call's `**kwargs` dicts (`DDP(m, **ddp_kwargs)` with
    `ddp_kwargs = {'device_ids': [rank]}`), and whether every `**` names dicts the script builds (False: a
    `**kwargs` from elsewhere may carry it)."""
    known = True
    for k in call.keywords:
        if k.arg is None:
            sources = list(_dict_sources(s, k.value))
            known = known and bool(sources)
            for value in sources:
                for key, item in value:
                    if key == name:
                        return item, True
    return None, known


def _dict_sources(s: Script, expr: ast.AST) -> Iterator[list[tuple[str, ast.AST]]]:
    """(key, value) pairs of the dict literals or dict(...) calls `expr` names."""
    yield from _dict_sources_of(s, expr, 0)


def _dict_sources_of(s: Script, expr: ast.AST, depth: int) -> Iterator[list[tuple[str, ast.AST]]]:
    if depth > 4:
        return
    values = [expr]
    if isinstance(expr, (ast.Name, ast.Attribute)):
        key = expr.id if isinstance(expr, ast.Name) else "." + expr.attr
        values = [v for k, v in s.assignments if k == key]
        # `train_kwargs.update(cuda_kwargs)` / `.update(shuffle=True)` merge into the dict
        for call in s.calls_named("update"):
            if isinstance(call.func, ast.Attribute) and ast.dump(call.func.value) == ast.dump(expr):
                values.extend(call.args[:1])
                if call.keywords:
                    values.append(ast.Call(ast.Name("dict", ast.Load()), [], call.keywords))
    for v in values:
        if isinstance(v, ast.Dict):
            yield [(k.value, item) for k, item in zip(v.keys, v.values)
                   if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            for k, item in zip(v.keys, v.values):
                if k is None:  # {**base, ...}
                    yield from _dict_sources_of(s, item, depth + 1)
        elif isinstance(v, ast.Call) and terminal(v.func) == "dict":
            yield [(k.arg, k.value) for k in v.keywords if k.arg]
            for a in v.args[:1]:
                yield from _dict_sources_of(s, a, depth + 1)
        elif isinstance(v, (ast.Name, ast.Attribute)) and v is not expr:
            yield from _dict_sources_of(s, v, depth + 1)


@check
def shuffle_beside_sampler(s: Script) -> Iterator[Hit]:
    for call in s.calls_named("DataLoader"):
        shuffle, through_kwargs = shuffle_arguments(s, call)
        if not _is_const(shuffle, True):
            continue
        for name, position in (("sampler", 3), ("batch_sampler", 4)):
            given = argument(call, name, position)
            if given is not None and not _is_const(given, None):
                where = " (through the **kwargs dict)" if through_kwargs else ""
                yield Hit(shuffle, "DDP002", "error",
                          f"DataLoader gets shuffle=True{where} together with {name}=; torch raises ValueError "
                          f"({name} option is mutually exclusive with shuffle)",
                          "remove shuffle=True from the DataLoader and let the sampler shuffle "
                          "(DistributedSampler(dataset, shuffle=True) plus sampler.set_epoch(epoch))")
                break


DDP_ONLY_KWARGS = ("find_unused_parameters", "broadcast_buffers", "bucket_cap_mb", "gradient_as_bucket_view",
                   "static_graph", "device_ids", "output_device")
_NOT_DDP = frozenset({"DataLoader", "DistributedSampler", "init_process_group", "compile", "to", "cuda",
                      "FullyShardedDataParallel", "fully_shard"})


@check
def ddp_kwargs_elsewhere(s: Script) -> Iterator[Hit]:
    for call in s.calls:
        callee = terminal(call.func)
        qualname = s.qualname(call.func)
        if callee not in _NOT_DDP and not qualname.startswith(("torch.optim.", "torch.utils.data.")):
            continue
        for k in call.keywords:
            if k.arg in DDP_ONLY_KWARGS:
                yield Hit(k.value, "DDP003", "error",
                          f"{k.arg}= is an argument of DistributedDataParallel but is passed to {callee}(), "
                          "which does not accept it",
                          f"move {k.arg}= to the wrapper: DistributedDataParallel(model, {k.arg}=...)")


# ---- checkpoints -----------------------------------------------------------------------------
def is_buffer(s: Script, expr: ast.AST | None, _seen: frozenset[str] = frozenset()) -> bool:
    """An in-memory file (`buf = io.BytesIO()`): writing or reading it touches no shared file. Names are followed
    through their assignments once each: a parameter bound to an argument of the same name (`mp.spawn(f,
    args=(path,))` into `def f(path)`) stores the name into itself."""
    if isinstance(expr, ast.Call):
        return terminal(expr.func) in ("BytesIO", "StringIO")
    if isinstance(expr, ast.Name) and expr.id not in _seen:
        return any(k == expr.id and is_buffer(s, v, _seen | {expr.id}) for k, v in s.assignments)
    return False


def _written_buffer(s: Script, call: ast.Call, expr: ast.AST | None) -> bool:
    """`with io.BytesIO() as f: torch.save(obj, f)` in the same function: the bytes go to memory (to be
    sent), not to a shared file."""
    return isinstance(expr, ast.Name) and any(
        isinstance(n, ast.withitem) and isinstance(n.optional_vars, ast.Name) and n.optional_vars.id == expr.id
        and is_buffer(s, n.context_expr) and s.context(n.context_expr).scope == s.context(call).scope
        for n in s.nodes)


def _per_rank_file(s: Script, path: ast.AST | None) -> bool:
    """A path that names the rank (`f"queue{rank}.pth"`, or a variable built so): each rank has its own file. A value
    only some ranks hold (`ckpt_dir = None`, set under `if local_rank == 0:`) names no rank: the path it builds is
    the one shared file."""
    if path is None:
        return False
    names = {n.id if isinstance(n, ast.Name) else "." + n.attr for n in ast.walk(path)
             if isinstance(n, (ast.Name, ast.Attribute))}
    sources = [path] + [v for k, v in s.assignments if k in names]
    return any(s.kind(n) and assigned_key(n) not in s.rank_only for source in sources for n in ast.walk(source))


_HOST_CALLS = frozenset({"gethostname", "getfqdn", "uname", "node"})
_HOST_ENV = frozenset({"HOSTNAME", "SLURMD_NODENAME", "SLURM_NODEID", "NODE_RANK", "GROUP_RANK"})


def _names_the_host(script: Script, node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and terminal(n.func) in _HOST_CALLS
               and script.qualname(n.func).split(".")[0] in ("socket", "os", "platform", "gethostname", "getfqdn")
               or isinstance(n, ast.Constant) and n.value in _HOST_ENV for n in ast.walk(node))


def _per_node_path(s: Script, path: ast.AST | None) -> bool:
    """A path that names the machine (`socket.gethostname()` in it, in a variable it is built from, or in the
    project function that returns it, like `log_dir = make_logdir(name)`): each node writes its own file, so a
    local-rank check is the right guard."""
    if path is None:
        return False
    names = {n.id for n in ast.walk(path) if isinstance(n, ast.Name)}
    sources = [path] + [v for k, v in s.assignments if k in names]
    for source in sources:
        if _names_the_host(s, source):
            return True
        for call in (n for n in ast.walk(source) if isinstance(n, ast.Call)):
            target = s.project.resolve(s, call.func)
            home, name = target if target else (s.path, s.local_callee(call))
            defs = [d for d in s.project.scripts[home].defs if d.name == name] if name else []
            if any(_names_the_host(s.project.scripts[home], d) for d in defs):
                return True
    return False


_EPOCHISH = re.compile(r"^(epoch|ep|e|step|steps|it|iter|iters|iteration|global_step|i_epoch|epoch_idx|n_iter|"
                       r"update|updates|round|cur_epoch|current_epoch)$")


def _per_item_file(s: Script, call: ast.Call, path: ast.AST | None) -> bool:
    """A cache file per sample or per item (`f"{index}.pt"` in a loop over data, or in a Dataset's __getitem__):
    each rank writes the items of its own shard, not one shared checkpoint."""
    if path is None or _checkpoint(s, call):
        return False
    names = {n.id for n in ast.walk(path) if isinstance(n, ast.Name)}
    names |= {m.id for k, v in s.assignments if k in names for m in ast.walk(v) if isinstance(m, ast.Name)}
    if any(f in _item_functions(s) for f in s.context(call).functions):
        return True
    node, parents = call, s.parents
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        loops = [node] if isinstance(node, ast.For) else list(node.generators) if isinstance(
            node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) else []
        for loop in loops:  # (`[torch.load(f + ".pt") for f in files]` loops over files too)
            bound = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
            counted = loop.iter
            while isinstance(counted, ast.Call) and terminal(counted.func) in ("tqdm", "enumerate") and counted.args:
                counted = counted.args[0]  # `tqdm(range(epochs))`: still a count
            counting = isinstance(counted, ast.Call) and terminal(counted.func) in ("range", "trange") and not any(
                isinstance(n, ast.Call) and terminal(n.func) == "len" for n in ast.walk(counted))
            if bound & names and not counting and not any(_EPOCHISH.match(b.lower()) for b in bound & names):
                return True
    return False


def _checkpoint(s: Script, call: ast.Call) -> bool:
    """torch.save of a model's or optimizer's state (a `.state_dict()`, also inside a dict or through a local name,
    or the module itself, `model.module`), or torch.load whose result goes into `load_state_dict`: a checkpoint,
    whatever loop names its file (`for name, m in models.items()`), not a cache of data items."""
    def state(expr: ast.AST | None, depth: int = 2) -> bool:
        if expr is None:
            return False
        for n in ast.walk(expr):
            if isinstance(n, ast.Call) and terminal(n.func) == "state_dict" \
                    or isinstance(n, ast.Attribute) and n.attr == "module" and n is expr:
                return True
            if isinstance(n, ast.Name) and depth and any(state(v, depth - 1) for v in s.local_values(n.id, call)):
                return True
        return False

    if s.qualname(call.func) == "torch.save":
        return state(argument(call, "obj", 0))
    # torch.load: `m.load_state_dict(torch.load(p))`, or `ckpt = torch.load(p)` then `m.load_state_dict(ckpt[...])`
    parent = s.parents.get(id(call))
    if isinstance(parent, ast.Call) and terminal(parent.func) == "load_state_dict":
        return True
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)):
        return False
    held = parent.targets[0].id
    scope = s.context(call).scope
    return any(isinstance(n, ast.Call) and terminal(n.func) == "load_state_dict" and s.context(n).scope == scope
               and any(isinstance(m, ast.Name) and m.id == held for a in n.args for m in ast.walk(a))
               for n in s.calls)


def _item_functions(s: Script) -> set[str]:
    """`__getitem__` and the functions of this file only it calls, directly or through each other
    (`self.get_mel(path)` that caches one sample's features): they run once per sample."""
    def compute() -> set[str]:
        callers: dict[str, set[str]] = {}
        for node in s.nodes:
            if isinstance(node, ast.Call) and s.local_callee(node):
                where = s.context(node).functions
                callers.setdefault(s.local_callee(node), set()).add(where[-1] if where else "")
            elif isinstance(node, (ast.Name, ast.Attribute)) and s.local_callee(ast.Call(node, [], [])) \
                    and getattr(s.parents.get(id(node)), "func", None) is not node:
                # passed along: called from anywhere, but mapped over items (`pool.imap(partial(f, ...), ids)`,
                # `map(f, paths)`) it runs once per item
                callers.setdefault(terminal(node), set()).add("__getitem__" if _mapped(s, node) else "")
        found = {"__getitem__"}
        for _ in range(8):
            more = {name for name, by in callers.items() if by and by <= found}
            if more <= found:
                break
            found |= more
        return found
    return s.project.memo(("item functions", id(s)), compute)


_MAPS = frozenset({"map", "imap", "imap_unordered", "starmap", "map_async", "starmap_async"})


def _mapped(s: Script, node: ast.AST) -> bool:
    """A function given as what a map applies to each item (`map(f, xs)`, `pool.imap(partial(f, k=v), ids)`)."""
    parent = s.parents.get(id(node))
    if isinstance(parent, ast.Call) and terminal(parent.func) == "partial" and parent.args and parent.args[0] is node:
        node, parent = parent, s.parents.get(id(parent))
    return isinstance(parent, ast.Call) and terminal(parent.func) in _MAPS and bool(parent.args) \
        and parent.args[0] is node


def _under_lock(s: Script, call: ast.Call) -> bool:
    """Inside `with FileLock(...):`: the ranks take turns writing the file."""
    node, parents = call, s.parents
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.With) and any(re.search(r"file_?lock|flock|portalocker", ast.unparse(
                i.context_expr).lower()) for i in node.items):
            return True  # a lock between processes (a threading.Lock orders one process's threads only)
    return False


@check
def unguarded_save(s: Script) -> Iterator[Hit]:
    if not (s.distributed or s.project.distributed):
        return
    for call in s.calls:
        if s.qualname(call.func) != "torch.save" or not s.per_rank(call) or s.context(call).single:
            continue
        target = argument(call, "f", 1)
        if is_buffer(s, target) or _written_buffer(s, call, target) or _per_rank_file(s, target) or _per_item_file(s, call, target) \
                or _under_lock(s, call):
            continue
        level = s.context(call).level
        if level == NONE:
            yield Hit(call, "DDP004", "error",
                      "torch.save runs on every rank (no rank check around it): all ranks write the same "
                      "file at once and can leave it corrupt",
                      "save from one rank: `if dist.get_rank() == 0: torch.save(...)` "
                      "(with ddpkit: `if ctx.is_main:`), then dist.barrier() if other ranks read it")
        elif level == LOCAL and not s.project.single_node and not _per_node_path(s, target):
            # `if self.rank != 0: return` above the save: the local-rank test to change is that early exit's
            inner = s.context(call).branches[-1:]
            guard = next((n for n in s.nodes if inner and inner[0][1] == "after" and id(n) == inner[0][0]), call)
            yield Hit(guard, "DDP004", "warning",
                      "torch.save is guarded by a local-rank check only: on a multi-node job local rank 0 "
                      "of every node writes the file (this assumes the path is shared between the nodes; a "
                      "per-node local disk is fine)",
                      "test the global rank instead: `if dist.get_rank() == 0:`")


@check
def load_without_map_location(s: Script) -> Iterator[Hit]:
    if not (s.distributed or s.project.distributed):
        return
    for call in s.calls:
        if s.qualname(call.func) != "torch.load" or s.context(call).single or not s.per_rank(call):
            continue  # (the parent of mp.spawn loading after its workers end is one process)
        source = argument(call, "f", 0)
        if is_buffer(s, source) or _per_rank_file(s, source) or _per_item_file(s, call, source):
            continue  # a per-sample cache file (in __getitem__, or named by a loop over data) is no checkpoint
        weights_only = keyword(call, "weights_only")
        problems = []
        if argument(call, "map_location", 1) is None:
            problems.append("has no map_location, so it puts every tensor back on the device it was saved from "
                            "(cuda:0), on every rank")
        if _is_const(weights_only, False):
            problems.append("weights_only=False unpickles arbitrary objects from the checkpoint")
        if problems:  # one finding per call, however many arguments are wrong
            yield Hit(call, "DDP005", "warning", "torch.load " + "; ".join(problems),
                      "pass map_location='cpu' (or this rank's device) and load plain state_dicts with "
                      "weights_only=True (the default since torch 2.6)")


# ---- launcher and process group -----------------------------------------------------------------
_LAUNCH_FIX = "launch with `torchrun --nproc-per-node N train.py` (or `ddpkit run`) and read os.environ['LOCAL_RANK']"


def _only_a_hint(s: Script, node: ast.Constant) -> bool:
    """The string is only part of what the program tells a user who ran it wrongly: inside a `raise` statement,
    an `assert`'s message or an argparse `help=`, or in a message a function builds into a name that it reads
    only in a `raise` (`msg += ". Did you launch with torch.distributed.launch?"; raise ValueError(msg)`). It starts
    nothing and the program does not depend on the old launcher."""
    child, parent = node, s.parents.get(id(node))
    while parent is not None and not isinstance(parent, ast.stmt):
        if isinstance(parent, ast.keyword) and parent.arg == "help":
            return True
        child, parent = parent, s.parents.get(id(parent))
    if isinstance(parent, ast.Raise) or isinstance(parent, ast.Assert) and parent.msg is child:
        return True
    targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target] if isinstance(
        parent, ast.AugAssign) else []
    if len(targets) != 1 or not isinstance(targets[0], ast.Name):
        return False
    scope = s.parents.get(id(parent))
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        scope = s.parents.get(id(scope))
    if scope is None:
        return False
    reads = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == targets[0].id
             and isinstance(n.ctx, ast.Load) and not (isinstance(s.parents.get(id(n)), ast.AugAssign))]

    def in_raise(n: ast.AST) -> bool:
        while n is not None and not isinstance(n, ast.stmt):
            n = s.parents.get(id(n))
        return isinstance(n, ast.Raise)
    return bool(reads) and all(in_raise(n) for n in reads)


@check
def deprecated_launch(s: Script) -> Iterator[Hit]:
    for node in s.nodes:
        if isinstance(node, ast.Import):
            hit = any(a.name.startswith("torch.distributed.launch") for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            hit = (node.module or "").startswith("torch.distributed.launch") or (
                node.module == "torch.distributed" and any(a.name == "launch" for a in node.names))
        else:
            hit = False
        if hit:
            yield Hit(node, "DDP007", "error", "imports torch.distributed.launch, which is deprecated in favour "
                      "of torchrun and passes --local-rank instead of setting LOCAL_RANK", _LAUNCH_FIX)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and "torch.distributed.launch" in node.value and not isinstance(s.parents.get(id(node)), ast.Expr) \
                and not _only_a_hint(s, node):
            # (a string statement, a docstring explaining the old usage, starts nothing; a string the program
            # runs or builds a command line from does)
            before = node.value[:node.value.index("torch.distributed.launch")]
            at = ast.Constant(node.value, lineno=node.lineno + before.count("\n"),
                              col_offset=node.col_offset if "\n" not in before else 0)
            yield Hit(at, "DDP007", "warning",
                      "starts (or tells users to start) the deprecated `python -m torch.distributed.launch`",
                      _LAUNCH_FIX)
    for call in s.calls_named("add_argument"):
        flag = next((a.value for a in call.args if isinstance(a, ast.Constant)
                     and a.value in ("--local_rank", "--local-rank")), None)
        default = keyword(call, "default")
        if s.project.spawned:
            continue  # mp.spawn starts the ranks itself and passes each its rank; nothing passes --local_rank
        if flag and not (default is not None and "LOCAL_RANK" in ast.unparse(default)) \
                and not _absorbed(s, call, flag) and not _filled_from_env(s, _dest(call, flag)):  # torchrun-compatible
            yield Hit(call, "DDP007", "warning",
                      f"argparse argument {flag} is the torch.distributed.launch contract; torchrun does not "
                      "pass it and sets the LOCAL_RANK environment variable instead",
                      "remove the argument and use local_rank = int(os.environ['LOCAL_RANK'])")
    for call in s.calls:
        # absl's `flags.DEFINE_integer("local_rank", 0, ...)`: the same contract, through absl's flags
        if not (s.qualname(call.func).startswith("absl.flags.") and terminal(call.func).startswith("DEFINE_")
                and call.args and isinstance(call.args[0], ast.Constant)
                and call.args[0].value in ("local_rank", "local-rank")) or s.project.spawned:
            continue
        default = argument(call, "default", 1)
        if default is not None and "LOCAL_RANK" in ast.unparse(default):
            continue
        yield Hit(call, "DDP007", "warning",
                  f"absl flag {call.args[0].value} is the torch.distributed.launch contract (--local_rank); torchrun "
                  "does not pass it (it sets the LOCAL_RANK environment variable instead), so every rank keeps the "
                  "default", "remove the flag and use local_rank = int(os.environ['LOCAL_RANK'])")


def _absorbed(s: Script, call: ast.Call, flag: str) -> bool:
    """`--local_rank` that only absorbs the old launcher's argument: the program never reads it (no `args.local_rank`,
    no `"local_rank"` string key or getattr name outside add_argument) and takes LOCAL_RANK from the environment."""
    name = _dest(call, flag)
    scripts = list(s.project.scripts.values())
    if not any(isinstance(n, ast.Constant) and n.value == "LOCAL_RANK" for x in scripts for n in x.nodes):
        return False
    return not any(isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Load)
                   or isinstance(n, ast.Constant) and n.value == name
                   for x in scripts for n in x.nodes)


def _dest(call: ast.Call, flag: str) -> str:
    """The attribute argparse stores a flag under (`dest=`, else the flag's name)."""
    dest = keyword(call, "dest")
    return dest.value if isinstance(dest, ast.Constant) and isinstance(dest.value, str) else \
        flag.lstrip("-").replace("-", "_")


def _filled_from_env(s: Script, name: str) -> bool:
    """The program stores the LOCAL_RANK environment variable into the flag's attribute (`if args.local_rank is None:
    args.local_rank = int(os.environ["LOCAL_RANK"])`, or through a name of the same function read from it,
    `local_rank = int(os.environ.get("LOCAL_RANK", "0")); args.local_rank = local_rank`): under torchrun it reads
    the rank torchrun sets."""
    def reads_env(value: ast.AST) -> bool:
        return any(isinstance(c, ast.Constant) and c.value == "LOCAL_RANK" for c in ast.walk(value))

    def from_env(x: Script, value: ast.AST) -> bool:
        return reads_env(value) or isinstance(value, ast.Name) and any(
            reads_env(v) for v in x.local_values(value.id, value))

    return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == name for t in n.targets)
               and from_env(x, n.value) for x in s.project.scripts.values() for n in x.nodes)


def _in_spawn_parent(s: Script, call: ast.Call) -> bool:
    """The call runs in the process that calls mp.spawn (module code, or the function that spawns), not in a rank."""
    if s.per_rank_functions is None:
        return False
    spawning = {s.context(c).functions[-1] if s.context(c).functions else "" for c in s.calls
                if s.qualname(c.func).endswith(("multiprocessing.spawn", "start_processes"))}
    functions = s.context(call).functions
    return (not functions and "" in spawning) or bool(functions and functions[-1] in spawning)


def _destroys_default(call: ast.Call) -> bool:
    """destroy_process_group() or destroy_process_group(None): the default group (and every other) goes."""
    group = argument(call, "group", 0)
    return group is None or isinstance(group, ast.Constant) and group.value is None or (
        isinstance(group, ast.Attribute) and group.attr == "WORLD")  # dist.group.WORLD


def _in_handler(s: Script, node: ast.AST) -> bool:
    """The node lies in an `except` block of its function (or of the module code)."""
    while id(node) in s.parents and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        node = s.parents[id(node)]
        if isinstance(node, ast.ExceptHandler):
            return True
    return False


def _only_on_error(s: Script, call: ast.Call) -> bool:
    """The call runs only when something failed: in an `except` block (`except KeyboardInterrupt:
    destroy_process_group()`), or in a function the program calls only from such blocks (`cleanup()`)."""
    if _in_handler(s, call):
        return True
    functions = s.context(call).functions
    if not functions:
        return False
    callers = [(x, c) for x, c in s.project.calls_named(functions[-1].split(".")[-1])]
    return bool(callers) and all(_in_handler(x, c) for x, c in callers)


@check
def no_destroy(s: Script) -> Iterator[Hit]:
    # the parent of mp.spawn never joined the group: its destroy_process_group frees nothing of the ranks'
    # destroy_process_group(subgroup) frees only that group; the default one stays; one in an `except` block
    # frees nothing when training ends normally
    if any(not _in_spawn_parent(script, c) and script.project.runs(script, c) and _destroys_default(c)
           and not _only_on_error(script, c)
           for script, c in s.project.calls_named("destroy_process_group")):
        return
    for call in s.calls_named("init_process_group"):
        yield Hit(call, "DDP009", "warning",
                  "init_process_group is called but destroy_process_group never is, so the process "
                  "group's resources are not released at exit (torch warns, NCCL may hang at shutdown)",
                  "call dist.destroy_process_group() when training ends, in a `finally:` block")

def off_by_default(s: Script, value: ast.AST) -> bool:
    """`False`, or `args.disable_progress_bar` where the program declares `--disable-progress-bar` with
    `action="store_true"` (no other default than `False`), or with `default=False` and a boolean `type`
    (`type=str2bool`), and stores nothing else into that attribute: off unless the run is started with the flag, and
    nothing of the rank in it."""
    if isinstance(value, ast.Constant):
        return value.value is False
    if not isinstance(value, ast.Attribute):
        return False
    dest, declared = value.attr, []
    for x in s.project.scripts.values():
        if any(k.lstrip(".") == dest for k, _ in x.assignments):
            return False
        for c in x.calls:
            if terminal(c.func) != "add_argument" or not c.args:
                continue
            flags = [a.value for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            named = keyword(c, "dest")
            name = named.value if isinstance(named, ast.Constant) else next(
                (f.lstrip("-").replace("-", "_") for f in flags if f.startswith("--")), "")
            if name == dest:
                declared.append(c)
    if len(declared) != 1:
        return False
    action, default, kind = (keyword(declared[0], k) for k in ("action", "default", "type"))
    if isinstance(action, ast.Constant) and action.value == "store_true":
        return default is None or isinstance(default, ast.Constant) and default.value is False
    # `add_argument("--sync-bn", default=False, type=str2bool)`: a boolean parsed from the command line, off unless given
    return action is None and isinstance(default, ast.Constant) and default.value is False \
        and (kind is None or "bool" in terminal(kind).lower())
