"""Where ranks must agree after `ddpkit port`: data splits, loaders it must not replace, peeks, per-rank decisions.

ddpkit.init seeds each rank differently (augmentation and dropout differ per rank, as they should), so
a random split made after it needs its own fixed generator; a decision that steers training (early
stopping, ReduceLROnPlateau, a break) must read a value every rank shares, or ranks leave their loops
at different steps and the others wait forever in the next collective.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import ARGS_ROOTS, RANDOM_DRAW, dotted, root_name, walk

__all__ = ["plan_ranks", "plan_rank_values", "library_loader", "agreed", "apart", "random_apart", "tests_around",
           "saves_file"]

_LOADS = re.compile(r"(^|\.)(load\w*|open|read\w*|imread|File|exists|isfile|isdir|is_file|is_dir)$")
"""Calls that read or check a file they are handed (what a file check guards, not what makes the file)."""
_DISK = re.compile(r"(^|\.)(exists|isfile|isdir|listdir|glob|is_file|is_dir|iterdir|scandir)$")


def library_loader(facts: Any, call: cst.Call) -> str | None:
    """`DataLoader` from another library (torch_geometric.loader, dgl, ...): its module, else None."""
    name = dotted(call.func)
    imported: dict[str, str] = {}  # the name a module or class is bound to -> what it is
    for stmt in walk(facts.module):
        if isinstance(stmt, cst.Import):
            for alias in stmt.names:
                full = dotted(alias.name)
                bound = dotted(alias.asname.name) if alias.asname else full.split(".")[0]
                imported[bound] = full if alias.asname else full.split(".")[0]
        elif isinstance(stmt, cst.ImportFrom) and not isinstance(stmt.names, cst.ImportStar):
            module = dotted(stmt.module) if stmt.module is not None else ""
            for alias in stmt.names:
                bound = dotted(alias.asname.name) if alias.asname else dotted(alias.name)
                imported[bound] = f"{module}.{dotted(alias.name)}" if module else "a relative import"
    first, _, rest = name.partition(".")
    if first not in imported:
        return None  # a name the script defines itself
    resolved = f"{imported[first]}.{rest}" if rest else imported[first]
    if resolved == "torch" or resolved.startswith("torch."):
        return None
    return resolved.rsplit(".", 1)[0] if "." in resolved else resolved


def plan_ranks(plan: Any) -> None:
    """Random splits get a fixed generator, loader peeks and per-rank decisions get TODOs."""
    f = plan.f
    seeded_at = 0 if f.seeded_before_init() else min((plan.line_of(n) for key in f.ported for n in plan.nodes(key)
                                                       if isinstance(n, cst.Call) and f.is_seed_call(n)), default=None)
    for key in sorted(f.ported):
        for node in plan.nodes(key):
            if not isinstance(node, cst.Call):
                continue
            name = dotted(node.func)
            if f.is_seed_call(node) and name not in ("torch.cuda.manual_seed", "torch.cuda.manual_seed_all") and \
                    plan.line_of(node) == \
                    plan.line_of(plan._stmt.get(id(node), node)):
                plan.note(node, "this seeds every rank alike after ddpkit.init: splits and model init agree, but "
                          "dropout and augmentation draw the same numbers on every rank; delete it for per-rank "
                          "streams (ddpkit.init seeds each rank) once random splits have their own generator")
            keywords = {a.keyword.value for a in node.args if a.keyword is not None}
            early = seeded_at is None or plan.line_of(node) < seeded_at
            if name.rsplit(".", 1)[-1] == "random_split" and "generator" not in keywords and early:
                # each rank is seeded differently by ddpkit.init: one fixed generator gives every rank the same split
                plan.add_kwarg[id(node)] = ("generator", "torch.Generator().manual_seed(0)")
            elif name.rsplit(".", 1)[-1] == "train_test_split" and "random_state" not in keywords and early:
                plan.add_kwarg[id(node)] = ("random_state", "0")
            elif name in _ENTROPY and (not node.args or name.endswith("SystemRandom")) \
                    and plan.f.scopes[key].cls is None and not _in_train_loop(plan, key, node):
                plan.todo(node, f"`{plan.f.code(node)}` seeds itself from the operating system: each rank draws "
                          "different numbers from it whatever ddpkit seeds, so data it shuffles or splits differs "
                          "between ranks (overlap, leakage); give it one seed for every rank "
                          f"(`{name}(s)`), or draw from the seeded global generators")
            elif name == "next" and node.args and isinstance(node.args[0].value, cst.Call) \
                    and dotted(node.args[0].value.func) == "iter" and node.args[0].value.args \
                    and plan.role(key, dotted(node.args[0].value.args[0].value)) == "train":
                plan.todo(node, "next(iter(...)) on the training loader starts an epoch of ddpkit.loader and takes "
                          "its first step (the position a checkpoint resumes from): take the sample from the dataset "
                          "instead (`loader.dataset[i]`)")
            elif name == "iter" and node.args and plan.role(key, dotted(node.args[0].value)) == "eval":
                _first_eval_batch(plan, node, dotted(node.args[0].value))
            elif name.endswith("ReduceLROnPlateau"):
                _plateau(plan, key, node)
        for node in plan.nodes(key):
            if isinstance(node, cst.For) and plan.loop_role(key, node) == "eval":
                _by_position(plan, key, node)


def _first_eval_batch(plan: Any, node: cst.Call, loader: str) -> None:
    """`next(iter(test_loader))`, `dataiter = iter(test_loader)`: batches drawn one by one from this rank's evaluation
    shard (whole batches in dataset order, unpadded) are not the original's past rank 0, and none at all where the
    shard is empty. A TODO naming the loader."""
    plan.todo(node, f"`iter({loader})` draws batches from this rank's evaluation shard (ddpkit.eval_loader splits "
              "the set's whole batches over the ranks, unpadded): rank 0's first batch is the original's, another "
              "rank's is another one, and a rank whose shard is empty (fewer batches than ranks) raises "
              "StopIteration at next(); where every rank needs the original's batch (a fixed batch to show, a shape), "
              f"take it from the whole set: `next(iter(torch.utils.data.DataLoader({loader}.dataset, "
              "batch_size=...)))`")


def _by_position(plan: Any, key: str, loop: cst.For) -> None:
    """`for i, (x, y) in enumerate(test_loader): name = dataset.files[i]`: the running position counts batches of this
    rank's shard (ddpkit.eval_loader gives each rank a contiguous part), so on every rank but 0 it names another
    item of a list kept whole. A TODO at the first lookup by it; the batch's own items are left alone."""
    if not (isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "enumerate" and isinstance(
            loop.target, cst.Tuple) and loop.target.elements and isinstance(loop.target.elements[0].value, cst.Name)):
        return
    position = loop.target.elements[0].value.value
    local = {x.value for e in loop.target.elements[1:] for x in walk(e.value) if isinstance(x, cst.Name)}
    local |= {x.value for n in walk(loop.body) if isinstance(n, (cst.Assign, cst.AugAssign, cst.For)) for t in (
        [a.target for a in n.targets] if isinstance(n, cst.Assign) else [n.target]) for x in walk(t)
        if isinstance(x, cst.Name)}
    for node in walk(loop.body):
        if isinstance(node, cst.Subscript) and root_name(node.value) and root_name(node.value) not in local and any(
                isinstance(x, cst.Name) and x.value == position for e in node.slice for x in walk(e)):
            plan.todo(node, f"`{' '.join(plan.f.code(node).split())}` looks an item up by `{position}`, the batch's "
                      "position in this rank's shard of the evaluation data (ddpkit.eval_loader gives each rank a "
                      "part), so on every rank but 0 it names another item; look it up by the item's own index "
                      "(return it from the dataset), or run this loop over the whole set on rank 0")
            return


_ENTROPY = frozenset({"np.random.default_rng", "numpy.random.default_rng", "np.random.RandomState",
                      "numpy.random.RandomState", "random.Random", "random.SystemRandom"})
"""Generators that seed themselves from the OS when given no seed: the port cannot make the ranks draw alike."""


def _in_train_loop(plan: Any, key: str, node: cst.CSTNode) -> bool:
    """Inside a loop over the training loader: a per-rank draw there (augmentation) is what data parallelism wants."""
    stmt = plan._stmt.get(id(node))
    while stmt is not None:
        if isinstance(stmt, cst.For) and plan.loop_role(key, stmt) == "train":
            return True
        stmt = plan._parent.get(id(stmt))
    return False


def _plateau(plan: Any, key: str, call: cst.Call) -> None:
    stmt = plan._stmt.get(id(call))
    target = dotted(stmt.body[0].targets[0].target) if isinstance(stmt, cst.SimpleStatementLine) and isinstance(
        stmt.body[0], cst.Assign) else ""
    steps = [n for k in plan.f.ported for n in plan.nodes(k) if isinstance(n, cst.Call) and target
             and dotted(n.func) == f"{target}.step" and n.args]
    for step in steps or [call]:
        value = step.args[0].value if step is not call else None
        if value is not None and agreed(plan, key, value):
            continue
        plan.todo(step, "ReduceLROnPlateau steps on a metric that may differ between ranks (it is not reduced "
                  "here): ranks would change their learning rates at different epochs; step it with a value "
                  "reduced over every rank (ddpkit.reduce_mean)")


def agreed(plan: Any, key: str, expr: cst.CSTNode) -> bool:
    """Every name in `expr` is the same on every rank (see `apart`)."""
    return apart(plan, key, expr) is None


def apart(plan: Any, key: str, expr: cst.CSTNode) -> str | None:
    """None when every name in `expr` is the same on every rank: reduced, a reducing helper's result, a counter, an
    argument, each assigned under branches that every rank takes alike (`patience += 1` under `if score < best:` is
    as per-rank as `score`). A name is per-rank when one of its values or one of the tests around its assignments
    reads a per-rank name, calls the model, reads a file, draws from a generator that differs between ranks there
    (`random_apart`), or calls a function of the script whose return value is per-rank by such a draw (`action =
    self.choose_action(state)` drawing its action); names that only feed each other (`best = min(best, score)`)
    are decided by their other sources. The answer is a fixed point over every name `expr` reaches, so it does not
    depend on the order the names are met in (a set's order changes with PYTHONHASHSEED). Otherwise why the ranks
    may disagree, in words where a draw is the cause (`action` comes from ...), else ""."""
    found = _apart(plan, key, expr, frozenset())
    if found is None:
        return None
    name, origin = found
    name = f"len({name[4:]})" if name.startswith("len:") else name  # how many times it grew
    return "" if not origin else f"`{name}` comes from {origin}" if name else origin


def _counters(plan: Any, key: str, loop: cst.For) -> set[str]:
    """`i` of `for i, (x, y) in bar:` over `bar = tqdm(enumerate(loader))`: a step counter, alike on every rank."""
    if not (isinstance(loop.target, cst.Tuple) and loop.target.elements and isinstance(
            loop.target.elements[0].value, cst.Name) and isinstance(loop.iter, cst.Name)):
        return set()
    made = [n.value for n in plan.nodes(key) if isinstance(n, cst.Assign) and any(
        dotted(t.target) == loop.iter.value for t in n.targets)]
    if made and all(any(isinstance(c, cst.Call) and dotted(c.func) == "enumerate" for c in walk(v)) for v in made):
        return {loop.target.elements[0].value.value}
    return set()


def _apart(plan: Any, key: str, expr: cst.CSTNode, seen: frozenset[str]) -> tuple[str, str] | None:
    """None when `expr` agrees on every rank; else (the per-rank name it reads, or "" for a draw in it; where the
    value comes from, in words, where a draw is the cause, else "")."""
    reduced = plan.reduced.get(key, set())
    assigns: dict[str, list[cst.CSTNode]] = {}
    for n in plan.nodes(key):
        if isinstance(n, cst.Assign):
            for name in {dotted(x) for t in n.targets for x in walk(t.target)}:
                assigns.setdefault(name, []).append(n)
        elif isinstance(n, cst.AugAssign):
            assigns.setdefault(dotted(n.target), []).append(n)
        elif isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in _GROWS \
                and n.args and dotted(n.func.value):
            assigns.setdefault(dotted(n.func.value), []).append(n)  # `rewards.append(r)`: `rewards` holds r
        elif isinstance(n, cst.Return) and n.value is not None:
            assigns.setdefault(_RETURNED, []).append(n)  # what the scope returns, for its callers
        elif isinstance(n, cst.For) and isinstance(n.iter, cst.Name) and plan.loop_role(key, n) is None:
            # `for board, z in history:` binds each target to an item of `history` (a list the scope fills); a
            # loader's batches and an `enumerate` counter are judged as before, by what is computed from them
            for name in {dotted(x) for x in walk(n.target) if isinstance(x, cst.Name)} - _counters(plan, key, n):
                assigns.setdefault(name, []).append(n)
    for n in plan.nodes(key):  # `env.step(action)`, its value dropped: it changes the object the scope made with it
        stmt = plan._stmt.get(id(n))
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and isinstance(n.func.value, cst.Name) \
                and n.args and n.func.attr.value not in _GROWS and n.func.value.value in assigns and isinstance(
                stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr) and stmt.body[0].value is n:
            assigns[n.func.value.value].append(n)
    seen = seen | {key}
    grown = _grown_in_callees(plan, key, assigns)

    def names_of(e: cst.CSTNode) -> set[str]:
        """The names in `e` that may hold a per-rank value: not reduced, not arguments, assigned in this scope."""
        sized = [c.args[0].value for c in walk(e) if isinstance(c, cst.Call) and dotted(c.func) == "len"
                 and len(c.args) == 1 and isinstance(c.args[0].value, (cst.Name, cst.Attribute))]
        inside = {id(n) for arg in sized for n in walk(arg)}
        found = {dotted(n) for n in walk(e) if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n)
                 and id(n) not in inside} | {f"len:{dotted(arg)}" for arg in sized if dotted(arg)}
        return {name for name in found if name.removeprefix("len:") not in reduced and name.removeprefix(
            "len:").split(".")[0] not in ARGS_ROOTS and name.split(".")[0] not in _AGREED_ROOTS
            and assigns.get(name.removeprefix("len:")) and not (  # a training loader runs as many steps everywhere
                name.startswith("len:") and plan.role(key, name[4:]) == "train")}

    def needs(value: cst.BaseExpression) -> cst.BaseExpression | None:
        """`value` as an assignment's source: None when it is alike on every rank whatever its names hold."""
        if isinstance(value, (cst.Integer, cst.Float, cst.Name)) and (
                not isinstance(value, cst.Name) or value.value in ("True", "False", "None")):
            return None
        calls = [c for c in walk(value) if isinstance(c, cst.Call)]
        if any(plan.reduced.get(callee) for c in calls for callee in plan.f.callees(c, key)):
            return None  # returned by a helper that reduces its sums
        if any(dotted(c.func).startswith("ddpkit.") and dotted(c.func) != "ddpkit.unwrap" for c in calls):
            return None  # a reduction of ddpkit's; `ddpkit.unwrap(agent).play()` is this rank's model's own value
        return value

    def drawn(value: cst.CSTNode) -> str | None:
        """Where `value` comes from, in words, when a draw it makes or a function of the script it calls makes it
        differ between ranks (a model's or a loss's value inside a callee stays the callee's own, as before)."""
        for c in (c for c in walk(value) if isinstance(c, cst.Call)):
            why = random_apart(plan, key, c)
            if why is not None:
                return f"`{' '.join(plan.f.code(c).split())}`, which {why}"
            for callee in _callees(plan, c, key):
                inner = None if callee in seen else _apart(plan, callee, cst.Name(_RETURNED), seen)
                if inner is not None and inner[1]:
                    via = f"`{inner[0]}`, from {inner[1]}" if inner[0] != _RETURNED else inner[1]
                    return f"`{' '.join(plan.f.code(c.func).split())}(...)`, whose result comes from {via}"
        return None

    # each name -> (the names its values and the tests around its assignments read, per-rank whatever they hold,
    # where it comes from in words where a draw is the cause)
    deps: dict[str, tuple[set[str], bool, str]] = {}
    todo = sorted(names_of(expr))
    while todo:
        name = todo.pop()
        if name in deps:
            continue
        # `len(rewards)`: how many times it grew, decided by the tests around its growth, whatever it holds
        sized = name.startswith("len:")
        exprs: list[cst.CSTNode] = [t for a in assigns[name.removeprefix("len:")] for t in tests_around(plan, a)]
        if sized:  # grown once per item of a `for` around it: as many times as that holds items
            exprs += [cst.Call(cst.Name("len"), [cst.Arg(loop.iter)]) if isinstance(loop.iter, cst.Name) else loop.iter
                      for a in assigns[name.removeprefix("len:")] if isinstance(a, cst.Call)
                      for loop in _loops_around(plan, a)]
        own = False
        for a in assigns[name.removeprefix("len:")]:
            if sized and (isinstance(a, cst.For) or isinstance(a, cst.Call) and a.func.attr.value != "extend"):
                continue
            value = needs(a.iter if isinstance(a, cst.For) else a.args[-1].value if isinstance(a, cst.Call)
                          else a.value)
            if value is None:
                continue
            exprs.append(value)
            own = own or any(plan.role(key, _model_root(c)) == "model" or "loss" in dotted(c.func).lower()
                             for c in walk(value) if isinstance(c, cst.Call))
        origin = next((o for o in map(drawn, exprs) if o), "")
        own = own or bool(origin) or any(_reads_disk(e) and _after_a_write(plan, key, a)
                                          for a in assigns[name.removeprefix("len:")] for e in exprs)
        # `val(model, loader, val_auc_list)` where val() appends its own shard's `auc`: the list holds per-rank values
        own = own or not sized and any(callee not in seen and _apart(plan, callee, value, seen) is not None
                                       for callee, value in grown.get(name, ()))
        reads = {n for e in exprs for n in names_of(e)}
        deps[name] = (reads, own, origin)
        todo.extend(sorted(reads - deps.keys()))
    # the largest set of agreed names consistent with every name's sources (a cycle alone agrees)
    per_rank = {name: (name, origin) for name, (_, own, origin) in deps.items() if own}
    grew = True
    while grew:
        grew = False
        for name, (reads, _, _) in sorted(deps.items()):
            if name not in per_rank and reads & per_rank.keys():
                per_rank[name] = next((per_rank[r] for r in sorted(reads & per_rank.keys()) if per_rank[r][1]),
                                      (name, ""))
                grew = True
    if _reads_disk(expr) and _after_a_write(plan, key, expr):
        return "", ""
    hit = sorted(names_of(expr) & per_rank.keys())
    if hit:
        return next((per_rank[n] for n in hit if per_rank[n][1]), (hit[0], ""))
    origin = drawn(expr)
    return ("", origin) if origin else None


def _grown_in_callees(plan: Any, key: str, assigns: dict[str, list[cst.CSTNode]]) -> dict[str, list[
        tuple[str, cst.BaseExpression]]]:
    """A name of scope `key` handed to a function of the script that grows the parameter it lands in
    (`def val(..., auc_list): auc_list.append(auc)`): name -> [(that function's scope, the value it puts in)]."""
    out: dict[str, list[tuple[str, cst.BaseExpression]]] = {}
    for call in (n for n in plan.nodes(key) if isinstance(n, cst.Call)):
        for callee in plan.f.callees(call, key):
            params = plan.f.scopes[callee].params
            for i, arg in enumerate(call.args):
                name = dotted(arg.value) if isinstance(arg.value, cst.Name) else ""
                param = arg.keyword.value if arg.keyword is not None else params[i] if i < len(params) and \
                    arg.star == "" else ""
                if not name or not param or name not in assigns:
                    continue
                for n in plan.nodes(callee):
                    if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in \
                            _GROWS and dotted(n.func.value) == param and n.args:
                        out.setdefault(name, []).append((callee, n.args[-1].value))
    return out


def _loops_around(plan: Any, node: cst.CSTNode) -> list[cst.For]:
    """The `for` loops of the scope around `node`, innermost first."""
    out, parent = [], plan._parent.get(id(plan._stmt.get(id(node), node)))
    while parent is not None:
        if isinstance(parent, cst.For):
            out.append(parent)
        parent = plan._parent.get(id(parent))
    return out


def _callees(plan: Any, call: cst.Call, key: str) -> list[str]:
    """plan.f.callees, and a method of the script's class an attribute of `self` holds, bound in any method of the
    caller's class (`self.env = Walk()` in __init__, `self.env.random_move()` in another method)."""
    found = plan.f.callees(call, key)
    scope = plan.f.scopes.get(key)
    if found or scope is None or not scope.cls or not isinstance(call.func, cst.Attribute):
        return found
    receiver = dotted(call.func.value)
    if not receiver.startswith("self.") or receiver.count(".") != 1:
        return []
    classes = {dotted(n.value.func) for k, other in plan.f.scopes.items() if other.cls == scope.cls
               for n in walk(other.node) if isinstance(n, cst.Assign) and isinstance(n.value, cst.Call)
               and any(dotted(t.target) == receiver for t in n.targets)}
    keys = [f"{cls}.{call.func.attr.value}" for cls in classes if cls in plan.f.classes]
    return [k for k in keys if k in plan.f.scopes] if len(keys) == len(classes) else []


_RETURNED = "__returned__"
"""The name `_apart` files a scope's return values under: what its callers receive."""


def random_apart(plan: Any, key: str, call: cst.Call) -> str | None:
    """Why a draw differs between ranks at this point, in words; None for a call that is no draw or draws alike.

    The process-wide generators (`random.random()`, `torch.rand`) draw alike on every rank until the port reseeds
    each rank before training (plan.reseed; ddpkit.init's first statement gives every rank one seed or the
    script's own streams), so they are per-rank only where the port reseeds. A generator the script makes without
    a seed (`np.random.default_rng()`) seeds itself from the operating system on each rank; `.sample()` of an
    object another library made (a gym space; not a torch distribution) draws from that library's own generator,
    which no seed of the port reaches."""
    name = dotted(call.func)
    if RANDOM_DRAW.search(name):
        if plan.reseed and not any(a.keyword is not None and a.keyword.value == "generator" for a in call.args):
            return "draws from this rank's own stream (the port reseeds each rank before training)"
        return None
    if not isinstance(call.func, cst.Attribute) or _callees(plan, call, key) or not dotted(call.func.value):
        return None
    receiver = dotted(call.func.value)
    if receiver in _unseeded_generators(plan):
        return f"draws from `{receiver}`, a generator seeded from the operating system on each rank"
    if call.func.attr.value == "sample" and not _process_wide(plan, receiver):
        return "draws from a generator of another library, which no seed of the port reaches: each rank draws its own"
    return None


_PROCESS_WIDE = ("random", "np", "numpy", "torch", "ddpkit")


def _process_wide(plan: Any, receiver: str) -> bool:
    """`receiver` is a module's process-wide generator (`np.random`), or is bound (`dist = Categorical(p)`,
    `self.dist = torch.distributions.Normal(...)`) to an object of torch, numpy or random, which draws from it."""
    root = receiver.split(".")[0]
    if root in _PROCESS_WIDE:
        return True
    bound = receiver if root != "self" else ".".join(receiver.split(".")[:2])
    imported = {dotted(a.asname.name if a.asname else a.name) for n in walk(plan.f.module, into_functions=True)
                if isinstance(n, cst.ImportFrom) and n.module is not None and not isinstance(n.names, cst.ImportStar)
                and dotted(n.module).split(".")[0] in _PROCESS_WIDE for a in n.names}
    return any(isinstance(n, cst.Assign) and isinstance(n.value, cst.Call) and any(
        dotted(t.target) in (bound, root) for t in n.targets) and dotted(n.value.func).split(".")[0] in (
        *_PROCESS_WIDE, *imported) for n in walk(plan.f.module, into_functions=True))


def _unseeded_generators(plan: Any) -> set[str]:
    """Names (`rng`, `self.rng`) the script binds to a generator made without a seed, anywhere in the file."""
    return {dotted(t.target) for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Assign)
            and isinstance(n.value, cst.Call) and dotted(n.value.func) in _ENTROPY and not n.value.args
            for t in n.targets if dotted(t.target)}


_GROWS = frozenset({"append", "extend", "insert", "add", "appendleft"})
"""Methods that put their (last) argument into the container they are called on."""


def _model_root(call: cst.Call) -> str:
    """The name a call starts from, seen through the port's unwrap: `ddpkit.unwrap(agent).play()` -> 'agent'."""
    node = call.func
    while isinstance(node, (cst.Attribute, cst.Subscript, cst.Call)):
        if isinstance(node, cst.Call) and dotted(node.func) == "ddpkit.unwrap" and node.args:
            return root_name(node.args[0].value)
        node = node.func if isinstance(node, cst.Call) else node.value
    return root_name(call.func)


_AGREED_ROOTS = frozenset({"math", "torch", "np", "float", "int", "len", "abs"})


def _reads_disk(expr: cst.CSTNode) -> bool:
    """Files on disk: one rank may see what another has not written yet."""
    return any(isinstance(c, cst.Call) and _DISK.search(dotted(c.func)) for c in walk(expr))


def _after_a_write(plan: Any, key: str, node: cst.CSTNode) -> bool:
    """A file check at `node` may see what rank 0 of this run has or has not written yet: inside a loop, after a
    save of the scope, or where the statement holding it makes that file (`if not os.path.exists(p):
    urlretrieve(url, p)`: rank 0 makes it first, the others then find it). Otherwise (`if os.path.isfile(ckpt): load
    it`, ahead of training) it sees the files of an earlier run, the same on every rank."""
    if _loops_around(plan, node):
        return True
    line = plan.line_of(node)
    stmt = plan._stmt.get(id(node), node)
    checked = {plan.f.code(c.args[0].value) for c in walk(node) if isinstance(c, cst.Call) and c.args
               and _DISK.search(dotted(c.func))}
    return any(isinstance(n, cst.Call) and (plan.line_of(n) < line and saves_file(plan, key, n) or line <= plan.line_of(
        n) <= plan.end_of(stmt) and not _LOADS.search(dotted(n.func)) and any(plan.f.code(a.value) in checked
                                                                          for a in n.args)) for n in plan.nodes(key))


def tests_around(plan: Any, node: cst.CSTNode) -> list[cst.BaseExpression]:
    """The tests of the `if`s and `while`s (with each earlier `elif` of the chain) that decide whether `node` runs."""
    out: list[cst.BaseExpression] = []
    child = plan._stmt.get(id(node), node)
    parent = plan._parent.get(id(child))
    while parent is not None:
        if isinstance(parent, cst.While):
            out.append(parent.test)
        elif isinstance(parent, cst.If):
            branch: cst.CSTNode | None = parent
            while isinstance(branch, cst.If):  # up to the branch that holds `child`: its own test and those before
                out.append(branch.test)
                if any(s is child for s in getattr(branch.body, "body", ())):
                    break
                branch = branch.orelse
        child, parent = parent, plan._parent.get(id(parent))
    return out


_PER_RANK = re.compile(r"^(uuid\.uuid[14]|uuid[14]|time\.time|time\.time_ns|time\.perf_counter|(datetime\.)?datetime\."
                       r"(now|today|utcnow)|date\.today|os\.getpid|getpid|socket\.gethostname|tempfile\.mkdtemp|"
                       r"mkdtemp|secrets\.\w+)$")
"""Calls whose value differs between ranks whatever the seed: a time, a process id, a fresh uuid."""
_SAVES = re.compile(r"(^|\.)(save|save_checkpoint|savez|to_csv|to_json|to_pickle|savefig|save_image)$")
_READS = re.compile(r"(^|\.)(load|open|read_csv|read_json|read_pickle|imread|load_state_dict)$")
"""Calls that read a file's content (an existence check only decides, and reads nothing a peer wrote)."""


def plan_rank_values(plan: Any) -> None:
    """A name built from a per-rank value (`ckpt = 'runs/' + uuid.uuid4().hex + '.pt'`, `time.time()`) that
    a line only rank 0 runs writes to and a line every rank runs reads from: each rank holds another name, so
    the others read a file nobody wrote. A TODO at the assignment names the value."""
    f = plan.f
    assigns = [n for n in walk(f.module, into_functions=True) if isinstance(n, cst.Assign)]
    tainted: dict[str, tuple[cst.Assign, cst.Call, str]] = {}
    changed = True
    while changed:
        changed = False
        for a in assigns:
            source = _per_rank_call(a.value)
            reads = [x.value for x in walk(a.value) if isinstance(x, cst.Name)]  # in source order
            origin = next((tainted[r] for r in reads if r in tainted), None)
            if source is not None:
                names = [x.value for t in a.targets for x in walk(t.target) if isinstance(x, cst.Name)]
                origin = (a, source, names[0]) if names else None
            if origin is None:
                continue
            for t in a.targets:
                for x in (x for x in walk(t.target) if isinstance(x, cst.Name) and x.value not in tainted):
                    tainted[x.value] = origin
                    changed = True
    _per_rank_defaults(plan, tainted)
    if not tainted:
        return
    # rank 0 alone writes: lines under the file-write rule, and saves (torch.save is put under `if ctx.is_main:`)
    writes = [n for key in f.ported for s in f.scope_statements(key) for n in walk(s) if id(n) in plan.guard or (
        isinstance(n, cst.Call) and _SAVES.search(dotted(n.func)))]
    written = {x.value for n in writes for x in walk(n) if isinstance(x, cst.Name) and x.value in tainted}
    origins = {id(tainted[n][0]) for n in written}  # `save_dir` written, `best = join(save_dir, ...)` read: one value
    for key in sorted(f.ported):
        for node in plan.nodes(key):
            if not (isinstance(node, cst.Call) and _READS.search(dotted(node.func)) and node.args) or any(
                    isinstance(x, cst.SimpleString) and re.search(r"[wax]", str(x.evaluated_value))
                    for a in node.args[1:] for x in walk(a.value)):  # `open(path, "w")` writes
                continue
            name = next((x.value for a in node.args for x in walk(a.value) if isinstance(x, cst.Name)
                         and x.value in tainted and id(tainted[x.value][0]) in origins), None)
            if name is None or _under_guard(plan, node):
                continue
            assign, call, origin = tainted[name]
            origins.discard(id(assign))
            plan.todo(assign, _named_per_rank(origin, dotted(call.func), f"the line {plan.line_of(node)} read on every "
                                              f"rank goes through `{name}`, each rank's own path"))
    _handed_on(plan, tainted, origins)


def _per_rank_call(expr: cst.CSTNode) -> cst.Call | None:
    return next((c for c in walk(expr) if isinstance(c, cst.Call) and _PER_RANK.match(dotted(c.func))), None)


def _per_rank_defaults(plan: Any, tainted: dict[str, tuple[cst.Assign, cst.Call, str]]) -> None:
    """`parser.add_argument("--save", default=stamp + ".pt")` with `stamp` from the clock (or a fresh id): a run that
    does not pass the option gets another value on every rank (a file rank 0 saves that the others look for under
    their own name, a log directory per rank). A TODO at the option."""
    for call in (n for n in walk(plan.f.module, into_functions=True) if isinstance(n, cst.Call)
                 and dotted(n.func).endswith("add_argument")):
        default = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "default"), None)
        source = _per_rank_call(default) if default is not None else None
        name = next((x.value for x in walk(default) if isinstance(x, cst.Name) and x.value in tainted), None) \
            if default is not None and source is None else None
        source = source if source is not None else tainted[name][1] if name is not None else None
        option = next((str(a.value.evaluated_value) for a in call.args if a.keyword is None and isinstance(
            a.value, cst.SimpleString) and str(a.value.evaluated_value).startswith("--")), None)
        if source is None or option is None:
            continue
        dest = option.lstrip("-").replace("-", "_")
        plan.todo(call, f"`{option}`'s default is built from `{dotted(source.func)}()`"
                        f"{f' (through `{name}`)' if name else ''}, which differs on every rank even after seeding: a "
                        f"run that does not pass {option} gets another value on every rank (rank 0 saves under its "
                        "name, the others read or write under theirs); make it alike after parsing, where every "
                        f"rank passes: `args.{dest} = ddpkit.collectives.broadcast_object(ctx, args.{dest})`, or "
                        f"pass {option} on the command line")


def _named_per_rank(origin: str, source: str, how: str, after: str = "") -> str:
    """The TODO for a path named from a per-rank value (`source()`: the clock, a fresh id) that rank 0 writes and
    every rank reads back (`how`)."""
    return (f"`{origin}` is built from `{source}()`, which differs on every rank even after seeding: rank 0 writes a "
            f"file named from it, and {how}, which nobody wrote; make it alike on every rank (`{origin} = "
            f"ddpkit.collectives.broadcast_object(ctx, {origin})` right after this line, where every rank "
            f"passes){after}")


_SAYS = re.compile(r"^(print|tqdm\.write)$|^(logging|logger|log)\.")


def _handed_on(plan: Any, tainted: dict[str, tuple[cst.Assign, cst.Call, str]], origins: set[int]) -> None:
    """The per-rank name rank 0 wrote to, stored into an object (`args.eval_from = model_path`) that a call every
    rank makes is then handed (`linear_eval(args)`, code the port cannot see into): that code gets each rank's own
    name, and where it reads the file there, the others read a file nobody wrote."""
    for key in sorted(plan.f.ported):
        held: dict[str, tuple[str, str, int]] = {}  # `args` -> (`args.eval_from`, the tainted name, line stored)
        for a in (n for n in plan.nodes(key) if isinstance(n, cst.Assign)):
            value = next((x.value for x in walk(a.value) if isinstance(x, cst.Name) and x.value in tainted
                          and id(tainted[x.value][0]) in origins), None)
            for t in a.targets if value is not None else ():
                if isinstance(t.target, cst.Attribute) and isinstance(t.target.value, cst.Name):
                    held.setdefault(t.target.value.value, (dotted(t.target), value, plan.line_of(a)))
        for stmt in plan.f.scope_statements(key) if held else ():
            for line in (n for n in walk(stmt) if isinstance(n, cst.SimpleStatementLine)):
                expr = line.body[0] if len(line.body) == 1 and isinstance(line.body[0], cst.Expr) else None
                call = expr.value if expr is not None and isinstance(expr.value, cst.Call) else None
                func = dotted(call.func) if call is not None else ""
                if not func or _SAYS.search(func) or func.startswith(("ddpkit.", "ctx.")) or _under_guard(plan, call):
                    continue
                holder = next((a.value.value for a in call.args if isinstance(a.value, cst.Name)
                               and a.value.value in held and held[a.value.value][2] < plan.line_of(line)), None)
                if holder is None:
                    continue
                stored, name, _ = held.pop(holder)
                assign, source, origin = tainted[name]
                if id(assign) not in origins:
                    continue
                origins.discard(id(assign))
                plan.todo(assign, _named_per_rank(
                    origin, dotted(source.func), f"every rank hands it on in `{stored}` to `{func}(...)` (line "
                    f"{plan.line_of(line)}), whose reads of it open each rank's own path",
                    ", and put ddpkit.barrier(ctx) before that call"))


def _under_guard(plan: Any, node: cst.CSTNode) -> bool:
    stmt = plan._stmt.get(id(node))
    return stmt is not None and (id(stmt) in plan.guard or plan.guarded_above(stmt))


def saves_file(plan: Any, key: str, call: cst.Call) -> bool:
    """torch.save, or a save helper of another module, named so (`utils.save_checkpoint(path, model)`): the rewriter
    runs it on rank 0 (its `_external_helper` rule); the script's own functions are followed instead."""
    name = dotted(call.func)
    return name == "torch.save" or _saves_file(plan, key, call)


def _saves_file(plan: Any, key: str, call: cst.Call) -> bool:
    """A save helper of another module, named so (`utils.save_checkpoint(path, model)`); torch.save is counted apart."""
    name = dotted(call.func)
    last = name.rsplit(".", 1)[-1]
    return bool(name) and not plan.f.callees(call, key) and bool(re.search(r"save|checkpoint", last, re.I)) and not \
        re.search(r"load|restore|resume", last, re.I) and last != "checkpoint" and name.split(".")[0] not in (
            "ddpkit", "np", "numpy", "plt", "self", "torch")
