"""Decisions a rank takes on its own values around the DDP step: where it stops, what it skips, its settings.

Under DDP every rank must run the same forwards and backwards in the same order: each backward() all-reduces the
gradients with every peer. A branch on a value this rank computed from its own batches or shard (`loss.item()`, a
validation score nobody reduced, a patience counter set by such a score) may go one way on one rank and the other
way on the next. When that branch leaves a loop that trains (`break`), skips the rest of a training step
(`continue`, `return`, an exit), the rank stops calling backward() while its peers wait for it in theirs: the job
hangs until the collective times out. When it changes a learning rate, the ranks step with different rates and
their copies of the model drift apart with no error. Both need a value every rank shares (reduced over ranks
first), so each TODO names the decision and the value.
"""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, walk
from ddpkit.port.inputs import RANDOM_DRAW
from ddpkit.port.models import is_optimizer, scope_holding
from ddpkit.port.ranks import apart, saves_file, tests_around

__all__ = ["plan_decisions", "plan_chosen_reads", "plan_searches"]

_EXITS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


def plan_decisions(plan: Any) -> None:
    """A TODO at each `if`/`while` whose test may differ between ranks and whose branch leaves or skips a training
    step, or changes a learning rate (a ReduceLROnPlateau fed a value is `ranks._plateau`'s)."""
    trains = _training_scopes(plan)
    for key in sorted(plan.f.ported):
        named: set[int] = set()
        tops: dict[int, cst.If] = {}  # an `elif` -> the `if` statement it belongs to (where its TODO goes)
        for node in plan.nodes(key):
            if isinstance(node, cst.If) and isinstance(node.orelse, cst.If) and id(node) not in tops:
                branch = node.orelse
                while isinstance(branch, cst.If):
                    tops[id(branch)] = node
                    branch = branch.orelse
            if not isinstance(node, (cst.If, cst.While)) or _inside(plan, tops.get(id(node), node), named) or \
                    _judged_in_own_scope(plan, key, node):
                continue
            what = _decided(plan, key, node, tops.get(id(node), node), trains)
            why = None if what is None else apart(plan, key, node.test)
            if why is None:
                continue
            node = tops.get(id(node), node)
            named.add(id(node))
            test = " ".join(plan.f.code(node.test).split())
            if why:  # a draw: each rank draws its own, so there is nothing to reduce
                plan.todo(node, f"`{test}` may differ between ranks: {why}; and {what}; give every rank the same "
                          "steps (a fixed number of training steps per round, or the value decided on rank 0 and "
                          "broadcast: ddpkit.collectives.broadcast_object)")
                continue
            plan.todo(node, f"`{test}` may differ between ranks (it reads a value this rank computed from its own "
                      f"batches or shard, not reduced over ranks), and {what}; decide on a value every rank shares: "
                      "reduce it first (ddpkit.reduce_mean, ddpkit.all_reduce_sum)")


_READ_BACK = re.compile(r"^(torch|np|numpy|pickle|joblib)\.load$|(^|\.)load_checkpoint$|^open$")
"""Calls that read back a file a run wrote (a checkpoint, an array); `open` only without a write mode."""
_CHECKS = re.compile(r"(^|\.)(exists|isfile|is_file)$")


def plan_chosen_reads(plan: Any) -> None:
    """A TODO at each read every rank makes (`torch.load(path)`, not under a rank test) of a file at a path that may
    differ between ranks (`ranks.apart`: `path` built from the best epoch by this rank's own validation score), in a
    script that saves files: rank 0 wrote the file under its own value, so another rank loads another epoch's file,
    or one nobody wrote (FileNotFoundError)."""
    keys = sorted(plan.f.ported)
    if not any(isinstance(n, cst.Call) and saves_file(plan, key, n) for key in keys for n in plan.nodes(key)):
        return
    for key in keys:
        for node in plan.nodes(key):
            if not (isinstance(node, cst.Call) and node.args and _READ_BACK.search(dotted(node.func))) or any(
                    isinstance(x, cst.SimpleString) and re.search(r"[wax]", str(x.evaluated_value))
                    for a in node.args[1:] for x in walk(a.value)) or _rank_only(plan, node):
                continue
            path = node.args[0].value
            code = " ".join(plan.f.code(path).split())
            if any(isinstance(c, cst.Call) and _CHECKS.search(dotted(c.func)) and c.args and " ".join(plan.f.code(
                    c.args[0].value).split()) == code for t in tests_around(plan, node) for c in walk(t)):
                continue  # `if os.path.isfile(p): torch.load(p)`: a cache read where the file exists, not a choice
            why = apart(plan, key, path)
            if why is None:
                continue
            cause = why or "it reads a value this rank computed from its own batches or shard, not reduced over ranks"
            give = f" (`{code} = ddpkit.collectives.broadcast_object(ctx, {code})`, where every rank passes)" \
                if isinstance(path, cst.Name) else " (ddpkit.collectives.broadcast_object)"
            plan.todo(node, f"`{' '.join(plan.f.code(node.func).split())}({code})` reads on every rank a file at a "
                      f"path that may differ between ranks ({cause}): rank 0 saved under its own value, so another "
                      "rank loads another file, or one nobody wrote (FileNotFoundError); choose the path on rank 0 and "
                      f"give it to every rank{give}, or reduce the value it is chosen by first")


def _rank_only(plan: Any, node: cst.CSTNode) -> bool:
    """`node` runs on one rank only: a line under the port's rank-0 guard, or under a rank test of the script."""
    stmt = plan._stmt.get(id(node))
    return stmt is not None and (id(stmt) in plan.guard or plan.guarded_above(stmt))


def _judged_in_own_scope(plan: Any, key: str, node: cst.CSTNode) -> bool:
    """A top-level script's entry code holds the bodies of its functions too: a test inside a function the port
    plans on its own (`def test(): ... if test_loss < best_loss:`) is judged there, where the sums it reduces are
    known, not again from the entry point (where they are not, and a false TODO followed)."""
    owner = scope_holding(plan, node)
    return owner is not None and owner != key and owner in plan.f.ported


def _decided(plan: Any, key: str, node: cst.If | cst.While, stmt: cst.CSTNode, trains: set[str]) -> str | None:
    """What the branch does that ranks must do alike, in words; None when it does nothing of the kind. `stmt` is
    the statement the branch belongs to (the `if` of an `elif`)."""
    bodies = [node.body]
    if isinstance(node.orelse, cst.Else):
        bodies.append(node.orelse.body)
    if isinstance(node, cst.While):
        if _trains(plan, key, node.body, trains):
            return "the `while` loop it decides runs a training step (backward(), DDP's all-reduce): a rank that " \
                   "leaves it early leaves its peers waiting in their next backward()"
        bodies = bodies[1:]
    elif _one_arm_trains(plan, key, node, trains):
        return "on it this rank runs a training step (backward(), DDP's all-reduce) or skips it: a rank that " \
               "skips it leaves its peers waiting in that backward() (a hang until the timeout)"
    saved = None
    for body in bodies:
        for n, loops in _own_nodes(body):
            if saved is None and isinstance(n, cst.Call) and saves_file(plan, key, n):
                saved = n
            if isinstance(n, (cst.Break, cst.Continue)) and not loops:
                loop = plan.loop_around(stmt)
                if loop is None:
                    continue
                # `break` skips every later step of the loop; `continue` only what follows the branch in this pass
                steps = _trains(plan, key, loop.body, trains) if isinstance(n, cst.Break) else any(
                    plan.line_of(s) > plan.end_of(stmt) and _trains(plan, key, s, trains)
                    for s in walk(loop.body) if isinstance(s, cst.SimpleStatementLine))
                if steps and isinstance(n, cst.Break):
                    return "on it this rank takes `break` out of a loop that trains (early stopping on a per-rank " \
                           "value): one rank leaves while its peers wait for it in their next backward()"
                if steps:
                    return "on it this rank takes `continue` past a training step (backward(), DDP's all-reduce): " \
                           "one rank skips the step while its peers wait for it in their backward()"
            elif isinstance(n, cst.Return) or isinstance(n, cst.Call) and dotted(n.func) in _EXITS:
                word = "return" if isinstance(n, cst.Return) else dotted(n.func) + "()"
                if _steps_after(plan, key, stmt, trains):
                    return f"on it this rank takes `{word}` before a training step it would run next (backward(), " \
                           "DDP's all-reduce): its peers wait for it in their next backward()"
            elif (stepped := _optimizer_step(plan, n)) is not None:
                return f"on it this rank runs `{stepped}` or skips it: DDP averaged the gradients, but one rank " \
                       "applies them while another does not, so the copies of the model drift apart with no error"
            elif _changes_lr(plan, key, n):
                return f"on it this rank changes its learning rate (`{' '.join(plan.f.code(n).split())}`): the " \
                       "ranks step with different rates and their copies of the model drift apart"
    if saved is not None:  # `if loss.item() < best: torch.save(...)`: rank 0 alone saves, on its own batches' value
        return f"on it rank 0 saves (`{' '.join(plan.f.code(saved.func).split())}(...)`) the model it judges best " \
               "by its own shard's value alone, not by every rank's"
    return None


def _one_arm_trains(plan: Any, key: str, node: cst.If, trains: set[str]) -> bool:
    """backward() runs in the `if`'s body or in its other arm (`else`, `elif`, or nothing), not in both."""
    other = node.orelse.body if isinstance(node.orelse, cst.Else) else node.orelse
    return _trains(plan, key, node.body, trains) != (other is not None and _trains(plan, key, other, trains))


def _own_nodes(block: cst.CSTNode):
    """(node, the loops between `block` and it) for each node of `block`, not inside nested functions."""
    stack = [(block, ())]
    while stack:
        current, loops = stack.pop()
        yield current, loops
        if current is not block and isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        inner = (*loops, current) if isinstance(current, (cst.For, cst.While)) else loops
        stack.extend((c, inner if c is not getattr(current, "orelse", None) else loops) for c in reversed(
            current.children))


def _inside(plan: Any, node: cst.CSTNode, named: set[int]) -> bool:
    """A branch inside one already named: its TODO says it."""
    parent = plan._parent.get(id(node))
    while parent is not None:
        if id(parent) in named:
            return True
        parent = plan._parent.get(id(parent))
    return False


def _steps_after(plan: Any, key: str, stmt: cst.CSTNode, trains: set[str]) -> bool:
    """A training step the scope runs after `stmt` on its way out: later in a loop around it, or below it."""
    loop = plan.loop_around(stmt)
    if loop is not None and _trains(plan, key, loop.body, trains):
        return True
    end = plan.end_of(stmt)
    return any(plan.line_of(s) > end and _trains(plan, key, s, trains) for s in plan.f.scope_statements(key)
               for s in walk(s) if isinstance(s, cst.SimpleStatementLine))


def _trains(plan: Any, key: str, node: cst.CSTNode, trains: set[str]) -> bool:
    """`node` runs backward() (DDP's gradient all-reduce), itself or through a function of the script."""
    for call in (n for n in walk(node) if isinstance(n, cst.Call)):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
            return True
        if set(plan.f.callees(call, key)) & trains:
            return True
    return False


def _training_scopes(plan: Any) -> set[str]:
    """Scopes that call backward(), themselves or through the script's functions they call."""
    found = {k for k in plan.f.ported if any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                                             and n.func.attr.value == "backward" for n in plan.nodes(k))}
    grew = True
    while grew:
        grew = False
        for k in plan.f.ported:
            if k not in found and any(isinstance(n, cst.Call) and set(plan.f.callees(n, k)) & found
                                      for n in plan.nodes(k)):
                found.add(k)
                grew = True
    return found


def _optimizer_step(plan: Any, node: cst.CSTNode) -> str | None:
    """`optimizer.step()` (also `scaler.step(optimizer)`) of an optimizer the script builds, as written; else None."""
    if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "step"):
        return None
    built = {dotted(t.target) for k in plan.f.ported for n in plan.nodes(k) if isinstance(n, cst.Assign)
             and isinstance(n.value, cst.Call) and is_optimizer(n.value) for t in n.targets}
    receiver = dotted(node.func.value)
    handed = [dotted(a.value) for a in node.args]
    if receiver in built or any(h in built for h in handed):
        return " ".join(plan.f.code(node).split())
    return None


def _changes_lr(plan: Any, key: str, node: cst.CSTNode) -> bool:
    """An assignment into an optimizer's param groups (`g["lr"] *= 0.5` for `g in opt.param_groups`,
    `opt.param_groups[0]["lr"] = lr`), a call of a function of the script that makes one (`adjust_lr(opt, lr)`),
    or an assignment to a name such a write, such a call or an optimizer's `lr=` reads later."""
    if isinstance(node, cst.Call):
        return any(_writes_groups(plan, k) for k in plan.f.callees(node, key))
    if not isinstance(node, (cst.Assign, cst.AugAssign)):
        return False
    targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
    groups = _group_names(plan, key)
    for target in targets:
        if isinstance(target, cst.Subscript) and (dotted(target.value) in groups or "param_groups" in plan.f.code(
                target.value)):
            return True
        if isinstance(target, cst.Name) and target.value in _lr_sources(plan, key, groups):
            return True
    return False


def _writes_groups(plan: Any, key: str) -> bool:
    """The scope assigns into an optimizer's param groups."""
    groups = _group_names(plan, key)
    return any(isinstance(n, (cst.Assign, cst.AugAssign)) and any(
        isinstance(t, cst.Subscript) and (dotted(t.value) in groups or "param_groups" in plan.f.code(t.value))
        for t in ([x.target for x in n.targets] if isinstance(n, cst.Assign) else [n.target]))
        for n in plan.nodes(key))


def _group_names(plan: Any, key: str) -> set[str]:
    """Loop variables over an optimizer's param groups (`for g in optimizer.param_groups:`)."""
    return {dotted(n.target) for n in plan.nodes(key) if isinstance(n, cst.For)
            and dotted(n.iter).endswith(".param_groups") and dotted(n.target)}


def _lr_sources(plan: Any, key: str, groups: set[str]) -> set[str]:
    """Names read by a write into param groups or by an optimizer's `lr=`: the learning rate the script holds."""
    out: set[str] = set()
    for n in plan.nodes(key):
        if isinstance(n, cst.Assign) and any(isinstance(t.target, cst.Subscript) and (
                dotted(t.target.value) in groups or "param_groups" in plan.f.code(t.target.value)) for t in n.targets):
            out |= {x.value for x in walk(n.value) if isinstance(x, cst.Name)}
        elif isinstance(n, cst.Call) and any(a.keyword is not None and a.keyword.value == "lr" for a in n.args):
            lr = next(a.value for a in n.args if a.keyword is not None and a.keyword.value == "lr")
            out |= {x.value for x in walk(lr) if isinstance(x, cst.Name)}
        elif isinstance(n, cst.Call) and any(_writes_groups(plan, k) for k in plan.f.callees(n, key)):
            out |= {x.value for a in n.args for x in walk(a.value) if isinstance(x, cst.Name)}
    return out


def _read_names(expr: cst.BaseExpression) -> list[cst.Name]:
    """The names `expr` reads: not a keyword it passes (`MNIST(root, train=True)` hands no function `train`) nor an
    attribute it names (`model.train`)."""
    skip = {id(n.keyword) for n in walk(expr) if isinstance(n, cst.Arg) and n.keyword is not None}
    skip |= {id(n.attr) for n in walk(expr) if isinstance(n, cst.Attribute)}
    return [n for n in walk(expr) if isinstance(n, cst.Name) and id(n) not in skip]


def plan_searches(plan: Any) -> None:
    """A hyperparameter search around DDP training: each rank would choose its own trials and train a different
    model while DDP averages their gradients. A TODO where another library is handed a function of the script that
    trains and asks what it is handed for its settings (`study.optimize(objective, ...)` with `trial.suggest_*`,
    `tune.run(train_fn)` with `config["lr"]`: the port cannot see which settings each rank's trials get), and where a value drawn from this rank's random stream inside a loop around training reaches the
    training as a setting (`lr = 10 ** random.uniform(-4, -2)` then `train(lr)`). A fixed grid (`for lr in
    [...]:`) runs alike on every rank and is left alone."""
    f = plan.f
    functions = {n.name.value: n for n in walk(f.module, into_functions=True) if isinstance(n, cst.FunctionDef)}
    training = _training_functions(functions)
    started = {f.entry_key.rsplit(".", 1)[-1]} if f.entry_key else set()
    named: set[int] = set()  # one TODO a statement (`study.optimize(functools.partial(objective, data))`)
    for key in sorted(f.ported):
        for node in plan.nodes(key):
            if not isinstance(node, cst.Call) or f.callees(node, key) or dotted(node.func).startswith("ddpkit.") \
                    or id(plan._stmt.get(id(node), node)) in named:
                continue
            root = dotted(node.func).split(".")[0]
            if not root or root in functions:
                continue
            handed = [x.value for a in node.args for x in _read_names(a.value)
                      if x.value in training and x.value not in started and not _called(a.value, x)
                      and _asks_settings(functions[x.value])]
            if handed:
                named.add(id(plan._stmt.get(id(node), node)))
                plan.todo(node, f"`{' '.join(f.code(node.func).split())}(...)` is handed `{handed[0]}`, a function of "
                          "the script that trains, and runs it as it chooses (a hyperparameter search: each rank "
                          "would sample its own trials and train another model while DDP averages their "
                          "gradients); choose the trials on rank 0 and broadcast them "
                          "(ddpkit.collectives.broadcast_object), or run one trial per job")
    if f.seeded_before_init():
        return  # the script's own seed: every rank draws the same settings
    trains = _training_scopes(plan)
    for key in sorted(f.ported):
        for node in plan.nodes(key):
            if isinstance(node, cst.Call) and RANDOM_DRAW.search(dotted(node.func)) and not any(
                    a.keyword is not None and a.keyword.value == "generator" for a in node.args):
                _drawn_setting(plan, key, node, trains)


def _asks_settings(function: cst.FunctionDef) -> bool:
    """The function asks an object it is handed for its settings (`trial.suggest_float(...)`, `config["lr"]`):
    what a search library hands each trial. A runner of the script (`fire.Fire(main)`) hands plain values."""
    params = {p.name.value for p in function.params.params}
    return any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and dotted(n.func.value) in params
               or isinstance(n, cst.Subscript) and dotted(n.value) in params
               for n in walk(function.body, into_functions=True))


def _called(expr: cst.CSTNode, name: cst.Name) -> bool:
    """`name` is called inside `expr` (`lambda t: objective(t, data)` hands the lambda, `objective(t)` its result)."""
    return any(isinstance(c, cst.Call) and c.func is name for c in walk(expr)) and not isinstance(expr, cst.Lambda)


def _training_functions(functions: dict[str, cst.FunctionDef]) -> set[str]:
    """Functions of the script that call backward(), themselves or through another function of the script."""
    calls = {name: {dotted(c.func).rsplit(".", 1)[-1] for c in walk(fn, into_functions=True)
                    if isinstance(c, cst.Call)} for name, fn in functions.items()}
    found = {name for name, called in calls.items() if "backward" in called}
    grew = True
    while grew:
        grew = False
        for name, called in calls.items():
            if name not in found and called & found:
                found.add(name)
                grew = True
    return found


def _drawn_setting(plan: Any, key: str, draw: cst.Call, trains: set[str]) -> None:
    """A draw in a loop whose body trains through a nested loop or a training function, whose value the loop then
    hands to that training, to an optimizer or to a model it builds: a setting each rank draws for itself."""
    stmt = plan._stmt.get(id(draw))
    if not isinstance(stmt, cst.SimpleStatementLine) or not isinstance(stmt.body[0], cst.Assign):
        return
    loop = plan.loop_around(stmt)
    if loop is None or any(isinstance(c, cst.Call) and plan.f.is_seed_call(c) and plan.line_of(c) < plan.line_of(stmt)
                           for c in walk(loop.body)):
        return  # seeded in the loop before the draw: every rank draws the same settings
    steps = [n for n in walk(loop.body) if isinstance(n, (cst.For, cst.While)) and _trains(plan, key, n.body, trains)]
    steps += [c for c in walk(loop.body) if isinstance(c, cst.Call) and set(plan.f.callees(c, key)) & trains]
    if not steps:
        return  # the training step itself (noise, a batch drawn per step): data parallelism, not a setting
    names = {x.value for t in stmt.body[0].targets for x in walk(t.target) if isinstance(x, cst.Name)}
    users = [c for c in walk(loop.body) if isinstance(c, cst.Call) and plan.line_of(c) > plan.line_of(stmt) and (
        set(plan.f.callees(c, key)) & trains or is_optimizer(c) or plan.f.callees(c, key) and any(
            s.cls for s in (plan.f.scopes[k] for k in plan.f.callees(c, key))))
        and names & {x.value for a in c.args for x in walk(a.value) if isinstance(x, cst.Name)}]
    if users:
        plan.todo(stmt, f"`{' '.join(plan.f.code(stmt).split())}` is drawn from this rank's own random stream (each "
                  "rank is seeded differently for training) in a loop around training, and handed to "
                  f"`{' '.join(plan.f.code(users[0].func).split())}(...)`: each rank trains with another setting "
                  "while DDP averages their gradients (a random search per rank); draw it with a seed every rank "
                  "shares (`random.Random(trial)`) or on rank 0 and broadcast it "
                  "(ddpkit.collectives.broadcast_object)")
