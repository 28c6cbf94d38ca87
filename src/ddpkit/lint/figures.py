"""The lint checks for figures of one rank's shard reported as global (DDP006): a metric, a loss, a sum, a count."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

from ddpkit.lint.analysis import (NONE, Script, argument, assigned_key, function_apply, is_eval_name, keyword,
                                  next_statements, terminal)
from ddpkit.lint.flow import class_of, eval_samplers, flows, sampler_class, sharded_names, summaries_of
from ddpkit.lint.logsetup import logging_per_rank
from ddpkit.lint.project import LOSS_NAME
from ddpkit.lint.ranks import WORLD
from ddpkit.lint.reporting import (built_from, every_rank_writer, helper_report, in_step_loop, leaves, names_a_rank,
                                   ordered_sources, reduced_names, reducing_helpers, reporters, reports_only, scope_of,
                                   shown_arguments, shows)
from ddpkit.lint.rules import Hit, check

__all__ = ["padded_evaluation", "rank_zero_loss", "unreduced_metric", "shard_figure_reported", "sum_over_rank_count",
           "sum_of_averages"]

_METRIC = re.compile(r"(^|_)(acc|accuracy|correct|f1|precision|recall|auc|top1|top5|metric|metrics)($|_)"
                     r"|^(val|valid|eval|test)_?loss")
_LOG_CALLS = frozenset({"print", "info", "log", "add_scalar", "add_scalars", "write", "warning"})


_ADVICE = ("on every rank, put the sum and the count in a tensor, dist.all_reduce(t, op=dist.ReduceOp.SUM) it, "
           "divide, then report on rank 0")


def _names(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, (ast.Name, ast.Attribute)):
            yield terminal(n)


def _sharded_eval(s: Script) -> bool:
    return s.project.memo("sharded eval", lambda: any(eval_samplers(x) for x in s.project.scripts.values()))


@check
def padded_evaluation(s: Script) -> Iterator[Hit]:
    if not s.distributed:
        return  # (a torchmetrics metric syncs its state across ranks, padded duplicates included)
    for call in eval_samplers(s):
        torch_sampler = sampler_class(s, call) == "DistributedSampler"
        drop_last = argument(call, "drop_last", 5) if torch_sampler else keyword(call, "drop_last")
        if isinstance(drop_last, ast.Constant) and drop_last.value is True:
            continue  # no padding; the remainder is evaluated apart (as torchvision's reference scripts do)
        what = "a DistributedSampler" if torch_sampler else \
            f"{ast.unparse(call.func)}(), a sampler that pads like DistributedSampler"
        yield Hit(call, "DDP006", "warning",
                  f"evaluation data goes through {what}, which pads it with repeated samples up to "
                  "a multiple of world_size: the reduced metric counts those twice unless len(dataset) divides",
                  "evaluate every sample once: DistributedSampler(..., drop_last=True) plus the remainder on one "
                  "rank, or gather predictions with their indices and drop the duplicates (ddpkit.eval_shard)")


def _logs(s: Script, call: ast.Call) -> bool:
    return terminal(call.func) in _LOG_CALLS and not s.qualname(call.func).startswith(("math.", "numpy.", "torch."))


def _under_rank_header(s: Script, call: ast.Call) -> bool:
    """The line is one of a run of console lines of the same function (`print(...)` after `print(...)`)
    headed by one that names the rank (`print("#### LOCAL RANK{} Iteration:{}".format(local_rank, i))`): the
    header says whose figures the lines under it are."""
    stmt = s.parents.get(id(call))
    if not (isinstance(stmt, ast.Expr) and stmt.value is call) or not (
            s.qualname(call.func) == "print" or terminal(call.func) in ("info", "debug", "warning")):
        return False  # (console lines; a record, `wandb.log({"Rank-0 loss": ...})`, names only its own figure)
    block = next((getattr(p, f) for p in [s.parents.get(id(stmt))] if p is not None
                  for f in ("body", "orelse", "finalbody") if stmt in getattr(p, f, ())), None)
    if block is None:
        return False
    for before in reversed(block[:block.index(stmt)]):
        if not (isinstance(before, ast.Expr) and isinstance(before.value, ast.Call)
                and s.qualname(before.value.func) == s.qualname(call.func)):
            return False
        if names_a_rank(s, before.value):
            return True
    return False


def _after_shard_pass(s: Script, call: ast.Call) -> bool:
    """A loop over a sharded loader ended before the call in its function (`for images, _ in val_loader:` above
    the report): what the call shows sums up that pass over the shard, whatever header it has."""
    scope = scope_of(s, call)
    shards = sharded_names(s)
    inside = set()
    node = call
    while id(node) in s.parents:
        node = s.parents[id(node)]
        inside.add(id(node))
    return any(isinstance(n, (ast.For, ast.AsyncFor)) and n.lineno < call.lineno and id(n) not in inside
               and any(assigned_key(m) in shards for m in ast.walk(n.iter) if isinstance(m, (ast.Name, ast.Attribute)))
               for n in ast.walk(scope))


def _from_evaluation(s: Script, name: str, depth: int = 0) -> bool:
    """`losses = estimate_loss()`: the value comes from an evaluation helper, not from the training batches; so
    does `maps, total_loss = validate(...)` that rank 0 runs alone (under a rank check, the evaluation is its
    own run over the set it is given; on every rank, each unpacks its own shard's figures); and a best-so-far
    copy of such a value (`best_loss = np.inf`, then `best_loss = val_loss`)."""
    values = [v for k, v in s.assignments if k == name]
    copies = [v for v in values if not _start_value(v)]
    if depth < 3 and copies and len(copies) < len(values) and all(
            isinstance(v, ast.Name) and v.id != name and _from_evaluation(s, v.id, depth + 1) or _eval_item(v)
            for v in copies):
        return True
    return any(isinstance(v, ast.Call) and is_eval_name(terminal(v.func)) for k, v in s.assignments
               if k.lstrip(".") == name) or name in s.project.memo(("unpacked from evaluation", id(s)), lambda: {
                   n.id for a in s.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
                   and is_eval_name(terminal(a.value.func)) and s.context(a.value).level != NONE
                   for t in a.targets if isinstance(t, (ast.Tuple, ast.List))
                   for n in ast.walk(t) if isinstance(n, ast.Name)})


def _set_just_before(s: Script, use: ast.Name) -> ast.AST | None:
    """The value of `name = value` that every path to `use` runs last: in a block around `use`, before it, with no
    other binding of the name between them in that block."""
    node = use
    while id(node) in s.parents and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        parent = s.parents[id(node)]
        block = next((b for f in ("body", "orelse", "finalbody") for b in [getattr(parent, f, None)]
                      if isinstance(b, list) and any(x is node for x in b)), None)
        for stmt in reversed(block[:next(i for i, x in enumerate(block) if x is node)] if block else []):
            if any(isinstance(n, ast.Name) and n.id == use.id and not isinstance(n.ctx, ast.Load)
                   for n in ast.walk(stmt)):
                return stmt.value if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                    and isinstance(stmt.targets[0], ast.Name) else None
        node = parent
    return None


def _eval_item(value: ast.AST | None) -> bool:
    """`avg_losses["val/mae"]`: an item whose string key names evaluation data."""
    return isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant) \
        and isinstance(value.slice.value, str) and is_eval_name(re.sub(r"\W+", "_", value.slice.value))


def _start_value(value: ast.AST) -> bool:
    """A best-so-far's starting value: a number, `np.inf`, `float("inf")`, `-math.inf`."""
    if isinstance(value, ast.UnaryOp):
        value = value.operand
    if isinstance(value, ast.Constant):
        return isinstance(value.value, (int, float)) or value.value is None
    if isinstance(value, ast.Attribute):
        return value.attr in ("inf", "nan")
    return isinstance(value, ast.Call) and terminal(value.func) == "float" and len(value.args) == 1 \
        and isinstance(value.args[0], ast.Constant) and str(value.args[0].value).lstrip("+-").lower() in ("inf", "nan")


def _object_attributes(s: Script, scope: ast.AST, leaf: ast.AST) -> set[str]:
    """'.attr' of each `self.attr` a value is built from, in the value itself or in the assignments (and loops)
    of `scope` that it is followed through (`tallies = dict(self.tallies)`)."""
    def attributes(node: ast.AST) -> set[str]:
        return {"." + n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")}

    by_name = s.project.memo(("object attributes", id(scope)), lambda: _attributes_by_name(scope, attributes))
    return attributes(leaf).union(*(by_name.get(n, set()) for n in built_from(s, scope, [leaf])))


def _attributes_by_name(scope: ast.AST, attributes) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in ast.walk(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found = attributes(node.value)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            targets, found = [node.target], attributes(node.iter)
        else:
            continue
        if found:
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, set()).update(found)
    return out


def _branches(s: Script, node: ast.AST) -> list[tuple[ast.If, str]]:
    """The `if` statements around a node in its function, with the branch ('body' or 'orelse') it is in."""
    out = []
    while id(node) in s.parents:
        parent = s.parents[id(node)]
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
        if isinstance(parent, ast.If) and node is not parent.test:
            out.append((parent, "body" if any(x is node for x in parent.body) else "orelse"))
        node = parent
    return out


def _choice(test: ast.AST) -> tuple[str, object] | None:
    """`cfg.logger == "wandb"` -> ('cfg.logger', 'wandb'): a test that picks one value of a setting."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq) \
            and isinstance(test.comparators[0], ast.Constant):
        return ast.unparse(test.left), test.comparators[0].value
    return None


def _exclusive(s: Script, a: ast.AST, b: ast.AST) -> bool:
    """Whether at most one of two nodes runs: the two branches of one `if`, or the bodies of two tests of one
    setting against different values."""
    around_a, around_b = _branches(s, a), _branches(s, b)
    taken = {id(i): branch for i, branch in around_a}
    if any(id(i) in taken and taken[id(i)] != branch for i, branch in around_b):
        return True
    picks_a = [c for i, branch in around_a if branch == "body" and id(i) not in {id(j) for j, _ in around_b}
               for c in [_choice(i.test)] if c]
    picks_b = [c for i, branch in around_b if branch == "body" and id(i) not in taken for c in [_choice(i.test)] if c]
    return any(x[0] == y[0] and x[1] != y[1] for x in picks_a for y in picks_b)


def _report_statement(s: Script, call: ast.Call) -> ast.stmt | None:
    """The statement a report call is (`writer.add_scalar(...)` on its own line, or the `with open(log) as f:`,
    `for` or `if` around it that only reports), else None."""
    stmt = s.parents.get(id(call))
    if not (isinstance(stmt, ast.Expr) and stmt.value is call):
        return None
    while isinstance(s.parents.get(id(stmt)), (ast.With, ast.For, ast.If)) and reports_only(s, s.parents[id(stmt)]):
        stmt = s.parents[id(stmt)]
    return stmt


def _one_per_block(s: Script, found: list[tuple[Hit, str]]) -> Iterator[Hit]:
    """The first finding of each run of report statements in a row (`add_scalar` of one loss after another),
    and of each value in branches of which one runs at most (the same loss sent to tensorboard under
    `if cfg.logger == "tensorboard":`, to wandb under `if cfg.logger == "wandb":`): one mistake, fixed by one
    reduction before the block, is reported once."""
    reported: set[int] = set()
    kept: list[tuple[ast.AST, str]] = []
    for hit, value in found:
        if any(v == value and _exclusive(s, node, hit.node) for node, v in kept):
            continue
        kept.append((hit.node, value))
        stmt = _report_statement(s, hit.node) if isinstance(hit.node, ast.Call) else None
        parent = s.parents.get(id(stmt)) if stmt is not None else None
        block = next((b for f in ("body", "orelse", "finalbody") for b in [getattr(parent, f, None)]
                      if isinstance(b, list) and any(x is stmt for x in b)), None)
        if block is not None:
            if id(stmt) in reported:
                continue  # another report inside the same `for`/`if` of reports
            i = next(j for j, x in enumerate(block) if x is stmt)
            earlier = []
            while i > 0 and reports_only(s, block[i - 1]):
                i -= 1
                earlier.append(id(block[i]))
            reported.add(id(stmt))
            if reported.intersection(earlier):
                continue
        yield hit


@check
def rank_zero_loss(s: Script) -> Iterator[Hit]:
    """Rank 0's own loss shown as the run's: a report under a rank check (or through a helper that reports on
    one rank only) of a loss value no code of the program reduces (see reporting.py); once per run of report
    statements."""
    yield from _one_per_block(s, sorted(_rank_zero_loss(s), key=lambda f: (f[0].node.lineno, f[0].node.col_offset)))


def _rank_zero_loss(s: Script) -> Iterator[tuple[Hit, str]]:
    project = s.project
    if not project.distributed or project.forward_collects:
        return  # a forward that all-reduces returns global losses
    reduced = reduced_names(s)
    for call in s.calls:
        ctx = s.context(call)
        if ctx.single or not shows(s, call):
            continue
        helper = helper_report(s, call)
        if helper is not None and any(LOSS_NAME.search(n) for n in helper.names) \
                and not (_loss_given(helper) and _one_call(project, terminal(call.func))):
            continue  # the helper's own report names the loss: judged there
        if _judged_in_helper(project, call, helper):
            continue  # the helper adds what it is given into a running figure of its own and reports that: judged there
        logged = ctx.level == NONE and not (helper and helper.rank_zero) and terminal(call.func) == "info" \
            and project.memo("logging per rank", lambda: logging_per_rank(project))
        # (a print after the builtins.print swap shows on rank 0 alone, as one under a rank check does)
        swapped = ctx.level == NONE and not helper and s.qualname(call.func) == "print" \
            and project.print_silenced(s, call)
        # (every rank recording its own loss into a SummaryWriter each of them makes for the run's one log directory)
        shared = ctx.level == NONE and not helper and every_rank_writer(s, call) and _named_log_dir(s, call)
        if ctx.level == NONE and not (helper and helper.rank_zero) and not logged and not swapped and not shared:
            continue  # (a `.info` line where logging is set up per rank shows on rank 0 alone)
        if any(is_eval_name(f) and "train" not in f.lower().split("_") for f in ctx.functions):
            continue  # an evaluation function (not `train_and_evaluate`): its report covers the data it was given
        if ctx.functions and _called_only_in_evaluation(s, ctx.functions[-1]):
            continue  # a helper an evaluation function hands its figures to (`save_summary(dir, final_loss)`)
        if names_a_rank(s, call) or _under_rank_header(s, call) and not _after_shard_pass(s, call):
            continue  # "rank 0 loss": the log (or the header line above it) says whose value it is
        scope = scope_of(s, call)
        called = s.project.memo(("called in", id(scope)), lambda: {
            terminal(c.func) for c in ast.walk(scope) if isinstance(c, ast.Call)})
        loss = None
        given = shown_arguments(call, helper) + _held_by_display(s, call)
        direct = {id(leaf) for a in given for leaf in leaves(s, scope, a, 0)}
        for leaf in (leaf for a in given for leaf in leaves(s, scope, a)):
            if built_from(s, scope, [leaf]) & reduced or _object_attributes(s, scope, leaf) & reduced:
                continue  # this value went through a collective (or was rebuilt from one)
            if isinstance(leaf, ast.Name) and _text_name(s, leaf.id):
                continue  # text cut from a setting (the loss's name), not a figure
            if isinstance(leaf, ast.Name) and _read_back(s, leaf):
                continue  # a figure read back from a checkpoint (`_, epoch, loss = load_checkpoint(path)`): not this run's batches
            if isinstance(leaf, ast.Name) and (_from_evaluation(s, leaf.id) or _eval_item(_set_just_before(s, leaf))):
                continue  # a best-so-far copy of an evaluation figure (`best = avg_losses["val/mae"]`)
            # an attribute's own name counts in the call itself (`meter.loss`), not in a string built
            # earlier (`run_name = f"...{args.loss_weight}"`)
            sources = _attribute_sources(s, leaf)
            if sources is None:
                # (`len(self.train_loader)` is not built from everything else the object holds: `self.x = v` anywhere)
                sources = ordered_sources(s, scope, [leaf], _RECEIVERS)
            # (a string key names its item as a variable would: `observation["loss"]`)
            # (an item, `losses['train']`, is judged by its container's name: see reporting._item)
            loss = next((n for n in [*(_names(leaf) if id(leaf) in direct else []), *_item_keys(leaf), *sources]
                         for b in [n.split("[", 1)[0]]
                         if LOSS_NAME.search(n) and not is_eval_name(n) and not n[:1].isupper() and b not in called
                         and not _from_evaluation(s, b) and not _constant_literal(s, b) and not _setting(s, b)
                         and not _dict_display(s, b, call) and not _loss_functions(s, b)), None)
            if loss is not None:
                break
        if loss is None and isinstance(scope, ast.FunctionDef):
            loss = _running_loss(s, scope, {n for a in given for n in ordered_sources(s, scope, [a])})
        elif loss is not None and isinstance(scope, ast.FunctionDef) and not _own_rank_check(s, call, scope) \
                and _loss_given(reporters(s).get(scope.name)) and loss in _params(scope) \
                and _one_call(project, scope.name):
            continue  # `add_observation(loss_dict)` shows what its one caller, under a rank check, hands it: judged there
        if loss is not None and _reduced_here(s, call, loss):
            continue  # this value went through a collective in this function (or was rebuilt from one)
        step = loss is not None and _progress_line(s, scope, call, loss)
        if step and not _kept_record(s, call):
            continue  # rank 0's batch loss inside the training loop; the epoch figure built from it is reduced
        # (but a record a writer keeps, `writer.add_scalar("train/loss_step", loss.item(), step)`, is a curve of
        # rank 0's batches presented as the run's, whatever the epoch figure is)
        if loss is not None and not step and _in_batch_loop(s, scope, call) and (
                swapped or not _kept_record(s, call) and _returns_epoch_figure(s, scope, loss)):
            continue  # a progress line of the current batch on the console, not a figure presented as the run's
            # (the epoch figure the function returns is judged where its caller reports it)
        if loss is not None and not step and _batch_progress(s, scope, call, [loss]):
            continue  # the batch's own loss on the console; the epoch figure built from it is reported after the loop
        if loss is not None and _from_whole_data(s, scope, call, given):
            continue  # every rank iterates the whole (unsharded) data: rank 0's figure is the run's
        if loss is not None:
            where = "from inside a rank check" if ctx.level != NONE else \
                f"by every rank into its own {ast.unparse(call.func.value)} of the run's one log directory (made " \
                "without a rank check), each under the same tag," if shared else \
                "through logging that only rank 0 shows (logging is set up per rank)," if logged else \
                "through a print only rank 0 shows (builtins.print is silenced on the others)," if swapped else \
                f"through {terminal(call.func)}(), which shows it on rank 0 only,"
            yield Hit(call, "DDP006", "warning",
                      f"'{loss}' is this rank's own loss (its own batches), reported {where} as "
                      "if it were the run's; " + ("only the epoch figure built from it is reduced across ranks"
                                                  if step else "the script never reduces it across ranks"),
                      "reduce it first: dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM) on every rank and divide "
                      "by the count, or name it as rank 0's in the log"), loss


def _read_back(s: Script, use: ast.Name) -> bool:
    """Every value reaching `use` in its function comes from `torch.load(...)` or from a call of a project function
    that reads its results with `torch.load` (`_, start_epoch, start_loss = load_checkpoint(path, model)`): a figure
    stored by an earlier run, not one computed from this rank's batches."""
    bound = s.local_assignments(use.id, use)
    if not bound:
        return False
    for stmt, _ in bound:
        value = getattr(stmt, "value", None)
        if not isinstance(value, ast.Call):
            return False
        if s.qualname(value.func) != "torch.load":
            found = _helper_def(s.project, terminal(value.func))
            if found is None or not any(isinstance(c, ast.Call) and found[0].qualname(c.func) == "torch.load"
                                        for c in ast.walk(found[1])):
                return False
    return True


def _item_keys(leaf: ast.AST) -> list[str]:
    """The string keys a value is read under (`observation["loss"]` -> "loss")."""
    return [n.slice.value for n in ast.walk(leaf) if isinstance(n, ast.Subscript)
            and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)]


def _loss_given(helper) -> bool:
    """A report helper whose loss-named values are all parameters it shows (`def add_observation(self, loss_dict)`):
    the loss is what each call hands it, judged at the call."""
    return helper is not None and all(n in helper.shown for n in helper.names if LOSS_NAME.search(n))


def _one_call(project, name: str) -> bool:
    """The program runs one call of its function `name` (defined once): a figure that helper shows is that call's
    (with several, the helper is the one place they meet, and the finding stays there)."""
    return _helper_def(project, name) is not None \
        and sum(x.project.runs(x, c) for x, c in project.calls_named(name)) == 1


def _params(func: ast.FunctionDef) -> set[str]:
    return {a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)}


def _own_rank_check(s: Script, node: ast.AST, func: ast.AST) -> bool:
    """`node` sits under a rank check of `func` itself (not only of its callers)."""
    child = node
    while id(child) in s.parents and child is not func:
        parent = s.parents[id(child)]
        if isinstance(parent, (ast.If, ast.IfExp, ast.While)) and child is not parent.test \
                and s.kind(parent.test) != NONE:
            return True
        child = parent
    return False


def _helper_def(project, name: str) -> tuple[Script, ast.FunctionDef] | None:
    """The one function of the program named `name`, else None."""
    found = project.memo(("defs named", name), lambda: [(x, d) for x in project.scripts.values() for d in x.defs
                                                       if d.name == name and isinstance(d, ast.FunctionDef)])
    return found[0] if len(found) == 1 else None


def _accumulated(func: ast.FunctionDef) -> set[str]:
    """Parameters of `func` that it adds into state kept across its calls (`self.summary[name] += val`): it reports a
    running figure of what it is given."""
    params = {a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)}
    return {n.id for a in ast.walk(func) if isinstance(a, ast.AugAssign)
            and isinstance(a.target, (ast.Attribute, ast.Subscript))
            for n in ast.walk(a.value) if isinstance(n, ast.Name) and n.id in params}


def _judged_in_helper(project, call: ast.Call, helper) -> bool:
    """A call of a report helper that shows on rank 0 alone and adds the values it is given into a running figure
    of its own, made of losses (see _running_loss): the finding is the helper's, at the line that writes it."""
    kept = _helper_def(project, terminal(call.func)) if helper is not None and helper.rank_zero else None
    return kept is not None and bool(_accumulated(kept[1]) & helper.shown) \
        and _running_loss(kept[0], kept[1], _accumulated(kept[1])) is not None


def _running_loss(s: Script, func: ast.FunctionDef, sources: set[str]) -> str | None:
    """The loss a helper's running figure is made of (`add_summary(writer, "loss/l1", l1_loss.item())` into
    `self.summary[name] += val`): what the calls that run hand the accumulated parameter the report reads, where one
    is named as a training loss and none went through a collective; else None."""
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
    wanted = _accumulated(func) & sources
    if not wanted or _helper_def(s.project, func.name) is None:
        return None
    found = None
    for x, c in s.project.calls_named(func.name):
        if not x.project.runs(x, c):
            continue
        bound = params[1:] if params[:1] == ["self"] and isinstance(c.func, ast.Attribute) else params
        for p in wanted:
            value = argument(c, p, bound.index(p)) if p in bound else keyword(c, p)
            if value is None:
                return None
            where = scope_of(x, c)
            if built_from(x, where, [value]) & reduced_names(x):
                return None
            names = [*_names(value), *ordered_sources(x, where, [value])]
            found = found or next((n for n in names if LOSS_NAME.search(n) and not is_eval_name(n)
                                   and not n[:1].isupper()), None)
    return found


def _called_only_in_evaluation(s: Script, name: str) -> bool:
    """Every call of the project function `name` that runs sits in an evaluation function (not `train_and_evaluate`):
    what it reports are the figures of the data that evaluation was given."""
    calls = [(x, c) for x, c in s.project.calls_named(name) if x.project.runs(x, c)]
    return bool(calls) and all(any(is_eval_name(f) and "train" not in f.lower().split("_")
                                   for f in x.context(c).functions) for x, c in calls)


def _progress_line(s: Script, scope: ast.AST, call: ast.Call, loss: str) -> bool:
    """The report sits in a loop of `scope` that runs `backward()` (a progress line of the current batch), and the
    same function hands a collective a value built from `loss` (`metrics = torch.tensor([total_loss / n, acc])`;
    `dist.all_reduce(metrics)` after `total_loss += loss.item()`): the run's figure is the reduced one."""
    if not in_step_loop(s, scope, call):
        return False
    for c in ast.walk(scope):
        if isinstance(c, ast.Call) and s.is_dist_collective(c) and c.args and scope_of(s, c) is scope \
                and s.project.runs(s, c) and loss in built_from(s, scope, [c.args[0]]):
            return True
    return False


def _kept_record(s: Script, call: ast.Call) -> bool:
    """A record a writer keeps (`writer.add_scalar`, `wandb.log`): a curve presented as the run's, not a console
    line."""
    return terminal(call.func) in _RECORDS or s.qualname(call.func).startswith("wandb.")


def _returns_epoch_figure(s: Script, scope: ast.AST, loss: str) -> bool:
    """The function returns a figure built from `loss` (`return total_loss / len(loader)` after `total_loss +=
    loss.item()` in the batch loop): its per-batch lines are progress, the epoch figure is the one its caller
    reports."""
    return isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
        isinstance(r, ast.Return) and r.value is not None and loss in built_from(s, scope, [r.value])
        for r in ast.walk(scope) if scope_of(s, r) is scope)


def _batch_progress(s: Script, scope: ast.AST, call: ast.Call, names: list[str]) -> bool:
    """A console line (not a record a writer keeps) in a loop over batches (one that runs the step, or one over a
    sharded loader) of the batch's own figures, one of which is the term of an epoch figure the function reports
    after the loop (see _epoch_figure_after): a progress line; the mistake, if any, is the epoch figure's, judged at
    its report. (A best-so-far figure kept in a loop over folds or epochs and reported after it is no batch's.)"""
    batches = _in_batch_loop(s, scope, call) or any(id(call) in f.in_loop for f in flows(s))
    return batches and not _kept_record(s, call) \
        and any(_epoch_figure_after(s, scope, call, n) for n in names)


def _epoch_figure_after(s: Script, scope: ast.AST, call: ast.Call, loss: str) -> bool:
    """The report sits in a loop that sets `loss` anew each pass (`loss = criterion(...)`, the batch's own value),
    and the same function reports or returns, after that loop, a figure built from it (`step_losses.append(
    loss.item())` then `print(np.mean(step_losses))`): the line is progress, the epoch figure is judged at its own
    report."""
    loop = _innermost_loop(s, scope, call)
    if loop is None or not any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == loss
                                                                for t in n.targets) for n in ast.walk(loop)):
        return False
    inside = {id(n) for n in ast.walk(loop)}
    for n in ast.walk(scope):
        if id(n) in inside or getattr(n, "lineno", 0) <= loop.lineno or scope_of(s, n) is not scope:
            continue
        values = [n.value] if isinstance(n, ast.Return) and n.value is not None else \
            [*n.args, *(k.value for k in n.keywords)] if isinstance(n, ast.Call) and shows(s, n) else []
        if values and loss in built_from(s, scope, values):
            return True
    return False


def _innermost_loop(s: Script, scope: ast.AST, node: ast.AST) -> ast.For | ast.While | None:
    """The innermost `for`/`while` of `scope` around `node`, if any."""
    while id(node) in s.parents and node is not scope:
        node = s.parents[id(node)]
        if isinstance(node, (ast.For, ast.While)):
            return node
    return None


def _in_batch_loop(s: Script, scope: ast.AST, call: ast.Call) -> bool:
    """The innermost loop around the report runs the step itself (`backward()` or `zero_grad()`, not in a loop
    nested in it): the report is a line per batch, not the epoch's figure after the batch loop."""
    node = call
    while id(node) in s.parents and node is not scope:
        node = s.parents[id(node)]
        if isinstance(node, (ast.For, ast.While)):
            loops = {id(n) for n in ast.walk(node) if isinstance(n, (ast.For, ast.While)) and n is not node}
            inner = {id(m) for n in ast.walk(node) if id(n) in loops for m in ast.walk(n)}
            return any(isinstance(c, ast.Call) and terminal(c.func) in ("backward", "zero_grad") and id(c) not in inner
                       for c in ast.walk(node))
    return False


_RECEIVERS = frozenset({"self", "cls"})
"""A method's own object: a value read off it is what that attribute holds (see _attribute_sources)."""

_RECORDS = frozenset({"add_scalar", "add_scalars", "log_metric", "log_metrics"})
"""Calls that write a figure into a run's record (tensorboard, a tracker), not onto the console."""


def _attribute_sources(s: Script, leaf: ast.AST) -> list[str] | None:
    """The names `self.completed_steps` is built from: those of the values the program stores in that attribute
    (`self.completed_steps += 1`), not everything else the object holds; None for any other value."""
    names = [n for n in ast.walk(leaf) if isinstance(n, ast.Name)]
    held = [a for a in ast.walk(leaf) if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name)
            and a.value.id in ("self", "cls")]
    if not held or any(n.id not in ("self", "cls") for n in names) or len(held) != len(names) or any(
            isinstance(c, ast.Call) for c in ast.walk(leaf)):
        return None  # (`self.pbar_step + 1` too; not `self.meter.avg()` nor a value mixing other names)
    found: list[str] = []
    for a in held:
        values = [v for x in s.project.scripts.values() for k, v in x.assignments if k == "." + a.attr]
        if not values:
            return None  # (set where the linter does not see it: follow the object as before)
        found += [n for v in values for n in _names(v) if n not in ("self", "cls")]
    return list(dict.fromkeys(found))


def _from_whole_data(s: Script, scope: ast.AST, call: ast.Call, given: list[ast.AST]) -> bool:
    """The report sits in a loop over a loader every rank iterates whole, or what it shows (`val_loss.value`) is
    fed only there (`val_loss.update(loss.item())`, `total += loss.item()` inside `for x, y in val_loader:`): a
    DataLoader with no sampler over a dataset built without the rank, so every rank sees all of the data and
    rank 0's figure is the run's (hubert-style validation on every rank)."""
    if _in_whole_data_loop(s, call):
        return True
    roots = {n.id for a in given for n in ast.walk(a) if isinstance(n, ast.Name) and LOSS_NAME.search(n.id)}
    feeds = [n for n in ast.walk(scope) if isinstance(n, ast.Call) and n.args and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id in roots
             or isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and n.target.id in roots]
    return bool(roots) and bool(feeds) and all(_in_whole_data_loop(s, n) for n in feeds)


def _in_whole_data_loop(s: Script, node: ast.AST) -> bool:
    """Whether `node` runs inside `for ... in loader` (through enumerate/tqdm too) over an unsharded loader."""
    while id(node) in s.parents:
        node = s.parents[id(node)]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(node, ast.For) and (any(isinstance(n, ast.Name) and _whole_data_loader(s, n.id)
                                              or _own_attribute(n) and _whole_data_loader(s, "." + n.attr)
                                              for n in ast.walk(node.iter)) or _wraps_whole_loader(s, node.iter, node)):
            return True
    return False


def _wraps_whole_loader(s: Script, expr: ast.AST, loop: ast.For, depth: int = 3) -> bool:
    """`enumerate(pbar)` with `pbar = tqdm(val_loader) if is_logger else val_loader` assigned last before the loop
    in its function: every value iterated is a loader every rank iterates whole (see _whole_data_loader)."""
    if isinstance(expr, ast.IfExp):
        return _wraps_whole_loader(s, expr.body, loop, depth) and _wraps_whole_loader(s, expr.orelse, loop, depth)
    if isinstance(expr, ast.Call) and terminal(expr.func) in ("tqdm", "enumerate", "iter") and expr.args:
        return _wraps_whole_loader(s, expr.args[0], loop, depth)
    if not isinstance(expr, ast.Name) or not depth:
        return False
    if _whole_data_loader(s, expr.id):
        return True
    earlier = [(stmt, v) for stmt, v in s.local_assignments(expr.id, loop) if stmt.lineno < loop.lineno]
    if not earlier:
        return False
    stmt, value = max(earlier, key=lambda a: a[0].lineno)
    return isinstance(stmt, ast.Assign) and value is not None and _wraps_whole_loader(s, value, loop, depth - 1)


def _whole_data_loader(s: Script, name: str, within: ast.Name | None = None) -> bool:
    """Every value the program (that reaches `within`, a use of the name, where given) gives `name` is
    `DataLoader(dataset, ...)` with no sampler but torch's whole-set ones, no batch sampler or `**kwargs`, nothing in
    it tells the rank, and its dataset is built without the rank by a class that does not ask for it (a project
    class whose code names no rank)."""
    if within is None and name in sharded_names(s):
        return False
    values = [v for k, v in s.assignments if k == name] if within is None else s.reaching_values(within)
    if not values:
        return False
    for value in values:
        if not (isinstance(value, ast.Call) and terminal(value.func) == "DataLoader") or any(
                k.arg in (None, "batch_sampler") or k.arg == "sampler" and not _whole_sampler(s, k.value)
                for k in value.keywords) or len(value.args) > 2:
            return False
        if any(s.kind(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute, ast.Call))):
            return False
        data = argument(value, "dataset", 0)
        if not (isinstance(data, ast.Name) or _own_attribute(data)):
            return False
        key = data.id if isinstance(data, ast.Name) else "." + data.attr
        built = [v for k, v in s.assignments if k == key]
        if not built or not all(isinstance(b, ast.Call) for b in built):
            return False
        for b in built:
            if any(s.kind(n) for n in ast.walk(b) if isinstance(n, (ast.Name, ast.Attribute, ast.Call))):
                return False
            classes = [(x, c) for x in s.project.scripts.values() for c in x.nodes
                       if isinstance(c, ast.ClassDef) and c.name == terminal(b.func)]
            if any(x.kind(n) or isinstance(n, ast.Call) and terminal(n.func) in ("get_world_size", "split_by_node")
                   for x, c in classes for n in ast.walk(c) if isinstance(n, (ast.Name, ast.Attribute, ast.Call))):
                return False
            if not classes and s.qualname(b.func).split(".")[0] not in ("torchvision", "torch") \
                    and not _also_under_a_sampler(s, terminal(b.func)):
                return False  # a dataset class from code not linted may shard by rank itself
    return True


def _own_attribute(node: ast.AST) -> bool:
    """`self.train_loader`: an attribute of the object a method works on, followed through what the program
    stores in it."""
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


_WHOLE_SAMPLERS = frozenset({"RandomSampler", "SequentialSampler"})


def _whole_sampler(s: Script, expr: ast.AST) -> bool:
    """torch's RandomSampler/SequentialSampler (`sampler=SequentialSampler(dev_set)`, or a name only ever bound to
    one): it walks the whole dataset, on every rank."""
    values = s.reaching_values(expr) if isinstance(expr, ast.Name) else [expr]
    return bool(values) and all(isinstance(v, ast.Call) and s.qualname(v.func).startswith("torch.")
                                and terminal(v.func) in _WHOLE_SAMPLERS for v in values)


def _evaluated_whole(s: Script, call: ast.Call, name: str) -> bool:
    """Every value of `name` that reaches the report is what a call returns that is handed loaders, each of them one
    every rank iterates whole (`dev_acc = evaluate(dev_loader, model)`): the figure covers the whole set, on any
    rank."""
    use = next((n for n in ast.walk(call) if isinstance(n, ast.Name) and n.id == name), None)
    values = s.reaching_values(use) if use is not None else []
    return bool(values) and all(
        isinstance(v, ast.Call) and (loaders := [a for a in (*v.args, *(k.value for k in v.keywords))
                                                 if isinstance(a, ast.Name) and _a_loader(s, a)])
        and all(_whole_data_loader(s, a.id, a) for a in loaders) for v in values)


def _a_loader(s: Script, name: ast.Name) -> bool:
    return any(isinstance(v, ast.Call) and terminal(v.func) == "DataLoader"
               for v in s.reaching_values(name))


def _also_under_a_sampler(s: Script, maker: str) -> bool:
    """Whether the file hands a dataset `maker(...)` builds to a DistributedSampler too (`DistributedSampler(train_set)`
    with `train_set = AcousticUnits(...)`): a dataset class that needs a sampler to shard does not shard itself."""
    made = {k for k, v in s.assignments if isinstance(v, ast.Call) and terminal(v.func) == maker}
    return any(isinstance(a, ast.Name) and a.id in made for c in s.calls_named("DistributedSampler")
               for a in [argument(c, "dataset", 0)])


def _constant_literal(s: Script, name: str) -> bool:
    """Every value the file gives `name` is a literal of constants (`loss_names = ["labels", "boxes"]`, `loss_weight =
    0.5`) and nothing fills it later (`losses = {}` then `losses[k] = ...` is a figure): a setting handed to the code
    that computes the figure, not a figure itself."""
    values = [v for k, v in s.assignments if k == name]
    filled = any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) or isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "extend", "update", "insert")
                 for n in s.nodes for m in [n.value if isinstance(n, ast.Subscript) else getattr(n.func, "value", None)
                                            if isinstance(n, ast.Call) else None]
                 if isinstance(m, ast.Name) and m.id == name)
    return bool(values) and not filled and all(
        isinstance(v, (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict))
        and (isinstance(v, ast.Constant) or bool(getattr(v, "elts", None) or getattr(v, "keys", None))) and all(
            isinstance(n, (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Load, ast.UnaryOp, ast.USub))
            for n in ast.walk(v)) for v in values)


def _loss_functions(s: Script, name: str) -> bool:
    """Every value the file gives `name` (or the attribute of its last part) is a loss function, not a figure: an
    object of a class named `...Loss` (`criterion_loss = nn.CrossEntropyLoss()`) or made by a factory named for one
    (`loss_tr = get_loss_fn(cfg)`, `build_criterion(cfg)`), a list of them (`self.loss = []`
    then `self.loss.append(nn.MSELoss())`), or, never assigned, a function the file defines (`self.loss_func`).
    Printed, it shows the module or function, not this rank's loss."""
    last = name.rsplit(".", 1)[-1]
    values = [v for k, v in s.assignments if k in (name, "." + last)]
    if not values and any(d.name == last for d in s.defs):
        return True  # `print(self.loss_func)`: a method of the file's own, not a value
    added = [c.args[0] for c in s.calls if isinstance(c.func, ast.Attribute) and c.func.attr in ("append", "insert")
             and isinstance(c.func.value, (ast.Name, ast.Attribute)) and terminal(c.func.value) == last and c.args]
    def module(v: ast.AST) -> bool:  # `nn.CrossEntropyLoss()`, or a factory named for one: `get_loss_fn(cfg)`
        return isinstance(v, ast.Call) and isinstance(v.func, (ast.Name, ast.Attribute)) and (
            terminal(v.func).endswith("Loss") and terminal(v.func)[:1].isupper()
            or re.fullmatch(r"(get|build|make|create)_\w*(criterion|loss_(fn|func|function))", terminal(v.func).lower())
            is not None)  # (not `loss_fn(pred, y)` nor `criterion(pred, y)`: calling one gives a figure)
    items = [*added, *(e for v in values if isinstance(v, (ast.List, ast.Tuple)) for e in v.elts)]
    return bool(values) and any(module(v) for v in [*values, *items]) and all(
        module(v) or isinstance(v, (ast.List, ast.Tuple)) for v in values) and all(module(v) for v in items)


def _dict_display(s: Script, name: str, call: ast.Call) -> bool:
    """Every value the file gives `name` is a dict display of evaluation outputs (`lossinfo = {"AUC": round(auc *
    100, 4)}` with `auc, acc = evaluation(model, val_loader)`): named like a loss, it holds what an evaluation
    returned over the data it was given, not this rank's training batches. (Values given in the function of
    `call`.)"""
    values = s.local_values(name, call)
    if not values or not all(isinstance(v, ast.Dict) and v.keys and all(k is not None for k in v.keys)
                             for v in values):
        return False
    outputs = s.project.memo(("evaluation outputs", id(s)), lambda: {
        n.id for a in s.nodes if isinstance(a, ast.Assign) and isinstance(a.value, ast.Call)
        and is_eval_name(terminal(a.value.func)) for t in a.targets for n in ast.walk(t) if isinstance(n, ast.Name)})
    names = [n.id for v in values for e in v.values for n in ast.walk(e) if isinstance(n, ast.Name)
             and not (isinstance(s.parents.get(id(n)), ast.Call) and s.parents[id(n)].func is n)]
    return bool(names) and all(n in outputs for n in names)


def _setting(s: Script, name: str) -> bool:
    """Every value the file gives `name` is read from the parsed command line (`alpha_loss = args.alpha_loss`, with
    `args = parser.parse_args()`): a setting such as a loss weight, not a figure of the batches."""
    values = [v for k, v in s.assignments if k == name]
    if not values:  # `args.norm_pix_loss` read straight from the parsed options (`--norm_pix_loss`)
        return name in s.project.memo("option names", lambda: _option_names(s.project))
    parsed = {k for k, v in s.assignments if isinstance(v, ast.Call)
              and terminal(v.func) in ("parse_args", "parse_known_args")}
    for v in values:
        if not isinstance(v, ast.Attribute):
            return False
        while isinstance(v, (ast.Attribute, ast.Subscript)):
            v = v.value
        if not (isinstance(v, ast.Name) and v.id in parsed):
            return False
    return True


def _option_names(project) -> set[str]:
    """The attribute names the program's `add_argument` calls declare (`--norm-pix-loss` or `dest=`)."""
    names = set()
    for x in project.scripts.values():
        for c in x.calls:
            if terminal(c.func) != "add_argument":
                continue
            dest = next((k.value.value for k in c.keywords if k.arg == "dest" and isinstance(k.value, ast.Constant)),
                        None)
            flags = [a.value for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            names.add(str(dest) if dest is not None else next(
                (f.lstrip("-").replace("-", "_") for f in flags if f.startswith("--")), ""))
    return names - {""}


_STR_METHODS = frozenset({"split", "rsplit", "format", "join", "strip", "replace", "lower", "upper", "capitalize"})


def _text_name(s: Script, name: str) -> bool:
    """Every assignment of `name` in the file takes text (`loss_file, loss_name = cfg["loss_fn"].split(":")`, an
    f-string): the name of a loss, not its value."""
    found = s._bindings.get(name, [])
    return bool(found) and all(isinstance(stmt, ast.Assign) and (
        isinstance(stmt.value, ast.JoinedStr) or isinstance(stmt.value, ast.Call)
        and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr in _STR_METHODS
        or _text_setting(stmt.value)) for stmt, _ in found)


def _text_setting(value: ast.AST) -> bool:
    """`configs.get("loss-function", "cross_entropy")`: a setting looked up with a text default is text."""
    return isinstance(value, ast.Call) and terminal(value.func) == "get" and isinstance(value.func, ast.Attribute) \
        and len(value.args) == 2 and isinstance(value.args[1], ast.Constant) and isinstance(value.args[1].value, str)


def _held_by_display(s: Script, call: ast.Call) -> list[ast.AST]:
    """`progress = ProgressMeter(n, [losses, top1]); progress.display(i)`: the constructor's arguments that a project
    class stores on `self` (`self.meters = meters`) and whose method `display` prints (`str(m) for m in self.meters`)
    are shown by that call too."""
    if not (isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name)):
        return []
    built = [v for v in s.local_values(call.func.value.id, call) if isinstance(v, ast.Call)]
    if len(built) != 1:
        return []
    found = [c for x in s.project.scripts.values() for c in x.nodes
             if isinstance(c, ast.ClassDef) and c.name == terminal(built[0].func)]
    if len(found) != 1:
        return []
    cls = found[0]
    init = next((d for d in cls.body if isinstance(d, ast.FunctionDef) and d.name == "__init__"), None)
    method = next((d for d in cls.body if isinstance(d, ast.FunctionDef) and d.name == call.func.attr), None)
    if init is None or method is None:
        return []
    params = [a.arg for a in init.args.args[1:]]
    stored = {t.attr: n.value.id for n in ast.walk(init)
              if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id in params
              for t in n.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
              and t.value.id == "self"}
    if not any(isinstance(c, ast.Call) and terminal(c.func) in ("print", "info", "write") for c in ast.walk(method)):
        return []
    shown = {n.attr for n in ast.walk(method) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and n.value.id == "self" and n.attr in stored}
    given = {p: a for p, a in zip(params, built[0].args)}
    given.update((k.arg, k.value) for k in built[0].keywords if k.arg in params)
    return [given[stored[attr]] for attr in sorted(shown) if stored[attr] in given]


def _scope_flow(s: Script, node: ast.AST):
    scope = s.context(node).scope
    return next((f for f in flows(s) if (id(f.node) if f.node is not s.tree else 0) == scope), None)


def _reduced_here(s: Script, node: ast.AST, name: str) -> bool:
    flow = _scope_flow(s, node)
    return flow is not None and name in flow.reduced


_SINKS = _LOG_CALLS | {"set_postfix", "log_metrics", "dumps", "dump"}


@check
def shard_figure_reported(s: Script) -> Iterator[Hit]:
    """A figure computed from this rank's shard (followed by flow.py) reported without a collective; once per run of
    report statements (`writer.add_scalar("train/loss", ...)` then `writer.add_scalar("test/loss", ...)`)."""
    previous = {id(second): first for first, second in next_statements(s).items()}
    statement = {id(n.value): id(n) for n in s.nodes if isinstance(n, ast.Expr)}
    reported: set[int] = set()
    for hit in _shard_figures(s):
        stmt = statement.get(id(hit.node))
        if stmt is not None:
            if previous.get(stmt) in reported:
                reported.add(stmt)
                continue  # the report right before it in the same block is reported already: one mistake
            reported.add(stmt)
        yield hit


def _shard_figures(s: Script) -> Iterator[Hit]:
    project = s.project
    if not project.distributed or "torchmetrics" in s.aliases or not sharded_names(s):
        return
    summaries = summaries_of(s)
    reducers = reducing_helpers(project)
    attributes = any("." in k for k in summaries)  # `self.val_acc` set to a shard figure by another method
    for flow in flows(s):
        if not flow.tainted and not attributes:
            continue
        for call in s.calls:
            if (id(flow.node) if flow.node is not s.tree else 0) != s.context(call).scope:
                continue
            # a project report helper (`def print_rank0(msg): if rank == 0: print(msg)`) reports what it is given
            helper = helper_report(s, call)
            if helper is not None and terminal(call.func) in reducers:
                continue  # the helper reduces what it shows (or may): not followed
            if _judged_in_helper(project, call, helper):
                continue  # (see rank_zero_loss: reported where the helper writes its running figure)
            if helper is None and (terminal(call.func) not in _SINKS
                                   or s.qualname(call.func).startswith(("math.", "numpy.", "torch."))):
                continue
            ctx = s.context(call)
            if ctx.single or not s.per_rank(call) or names_a_rank(s, call):
                continue
            if helper is not None and ctx.level == NONE and not helper.rank_zero:
                continue  # a helper every rank reports through: DDP008's repeated output, not a figure
            names = [n for a in shown_arguments(call, helper) for n in flow.tainted_names(s, a, summaries)]
            if project.forward_collects:
                # a model whose forward all-reduces (Barlow Twins) returns global losses: keep evaluation figures
                names = [n for n in names if n in flow.evaluation and not LOSS_NAME.search(n)]
            if not names:
                continue
            evaluation = [n for n in names if n in flow.evaluation or n.startswith("self.") and summaries.get(
                f"{class_of(s, call)}.{n[5:]}") == "evaluation"]
            if _under_rank_header(s, call) and not _after_shard_pass(s, call):
                continue  # (a step's line under the rank's header; a total over a pass of the shard claims the set)
            if all(_evaluated_whole(s, call, n) for n in names):
                continue  # what reaches the report is an evaluation over the whole set (the name is sharded elsewhere)
            # (a training figure another method of the class keeps, `self.loss`, is read per step the same way)
            if not evaluation and (_in_shard_loop(call, flow) or all(n.startswith("self.") for n in names)) and all(
                    project.reduces(LOSS_NAME) if LOSS_NAME.search(n) else
                    bool(_METRIC.search(n)) and project.reduces(_METRIC) for n in names):
                # rank 0's own step loss (or batch accuracy) in the training loop, where the program reduces a
                # loss (an accuracy) elsewhere: a progress line, not the run's figure
                continue
            home = scope_of(s, call)
            if not evaluation and _in_shard_loop(call, flow) and _in_batch_loop(s, home, call) \
                    and not _kept_record(s, call) and all(_returns_epoch_figure(s, home, n) for n in names):
                continue  # a progress line of the batch; the epoch figure the function returns is judged at its report
            if _in_shard_loop(call, flow) and _batch_progress(s, home, call, names):
                continue  # the batch's own figures (one the term of an epoch figure reported after the loop): progress
            if ctx.level == NONE and helper is not None:
                where = f"through {terminal(call.func)}(), which shows it on rank 0 only, so it is rank 0's shard alone"
            elif ctx.level == NONE:
                # every rank shows its own figure: a wrong number only where it claims to cover the
                # evaluation set, after the loop (training values and per-batch lines printed on every rank
                # are DDP008's repeated output)
                if every_rank_writer(s, call) and not _in_shard_loop(call, flow):
                    # `writer = SummaryWriter(logdir)` on every rank: each rank records its own shard's epoch figure
                    # into the run's log as if it were the run's
                    yield Hit(call, "DDP006", "warning",
                              f"'{names[0]}' is computed from this rank's batches of a sharded loader and every rank "
                              f"writes it to its own {ast.unparse(call.func.value)} (made without a rank check) as "
                              "the run's figure; it never goes through a collective on the way", _ADVICE)
                    continue
                if not evaluation or terminal(call.func) not in ("print", "info"):
                    continue
                per_rank_logging = project.memo("logging per rank", lambda: logging_per_rank(project))
                if project.print_silenced(s, call) and s.qualname(call.func) == "print":
                    # the builtins.print swap shows rank 0's line alone: its shard's figure as the run's
                    where = "through a print only rank 0 shows (builtins.print is silenced on the others), so it " \
                        "is rank 0's shard alone"
                elif terminal(call.func) == "info" and per_rank_logging:
                    where = "through logging that only rank 0 shows (logging is set up per rank), so it is " \
                        "rank 0's shard alone"
                elif _in_shard_loop(call, flow) or project.print_silenced(s, call) or per_rank_logging:
                    continue
                else:
                    where = "by every rank, each showing its own shard's value"
            else:
                where = "from inside a rank check, so it is rank 0's shard alone"
            yield Hit(call, "DDP006", "warning",
                      f"'{names[0]}' is computed from this rank's batches of a sharded loader and reported {where}; "
                      "it never goes through a collective on the way", _ADVICE)


def _named_log_dir(s: Script, call: ast.Call) -> bool:
    """The every-rank writer `call` records through is given its log directory (`SummaryWriter(out_dir)`): one
    directory for all ranks; with none, each process picks `runs/<time>_<host>` itself."""
    key = terminal(call.func.value) if isinstance(call.func.value, ast.Name) else "." + call.func.value.attr
    return all(v.args or any(k.arg in ("log_dir", "logdir") for k in v.keywords)
               for k, v in s.assignments if k == key and isinstance(v, ast.Call))


def _in_shard_loop(call: ast.Call, flow) -> bool:
    return id(call) in flow.in_loop


def _summed_flows(s: Script) -> Iterator[tuple[Any, set[str]]]:
    """(flow, the names in it summed over all ranks) for the flows of a distributed program that has any."""
    if not s.project.distributed or not sharded_names(s):
        return
    for flow in flows(s):
        summed = _summed(s, flow)
        if summed:
            yield flow, summed


@check
def sum_over_rank_count(s: Script) -> Iterator[Hit]:
    """`all_reduce(total)` then `total / len(loader)`: a sum over all ranks divided by one rank's count."""
    for flow, summed in _summed_flows(s):
        for node in flow.nodes:
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv))):
                continue
            left = {n.id for n in ast.walk(node.left) if isinstance(n, ast.Name)}
            if not left & summed:
                continue
            right = node.right
            counted = right.args[0] if isinstance(right, ast.Call) and terminal(right.func) == "len" \
                and right.args else None
            per_rank = (isinstance(counted, (ast.Name, ast.Attribute))
                        and bool({terminal(counted), "." + terminal(counted)} & set(sharded_names(s)))) or (
                isinstance(right, ast.Name) and right.id in flow.counts and right.id not in flow.reduced)
            parent = s.parents.get(id(node))
            if isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Div, ast.FloorDiv)) \
                    and parent.left is node and WORLD.search(ast.unparse(parent.right).lower()):
                continue  # `total / len(loader) / world_size`: divided by the global count after all
            if per_rank:
                yield Hit(node, "DDP006", "warning",
                          f"'{ast.unparse(node.left)}' is summed over all ranks (all_reduce) but divided by "
                          f"{ast.unparse(right)}, this rank's own count of batches: the figure is world_size "
                          "times too large",
                          "divide by the global count: all-reduce the count too (or divide by "
                          "len(loader) * world_size when every rank has the same number of batches)")


@check
def sum_of_averages(s: Script) -> Iterator[Hit]:
    """`acc = correct / total; dist.all_reduce(acc)` then reported: a sum of world_size averages, never divided."""
    for flow, summed in _summed_flows(s):
        nodes = flow.nodes
        for name in summed:
            values = [v for t, v in _assigned(nodes) if t == name]
            if not values or not all(_is_average(v) for v in values):
                continue
            divided = any(
                isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv))
                and any(isinstance(m, ast.Name) and m.id == name for m in ast.walk(n.left))
                and WORLD.search(ast.unparse(n.right).lower())
                or isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Div, ast.FloorDiv))
                and isinstance(n.target, ast.Name) and n.target.id == name
                or isinstance(n, ast.Call) and terminal(n.func) in ("div_", "mul_", "div")
                and isinstance(n.func, ast.Attribute) and _key_name(n.func.value) == name
                for n in nodes)
            if divided:
                continue
            for call in s.calls:
                if s.context(call).scope != (id(flow.node) if flow.node is not s.tree else 0):
                    continue
                if terminal(call.func) in _SINKS and any(
                        isinstance(m, ast.Name) and m.id == name for a in (*call.args, *(k.value for k in call.keywords))
                        for m in ast.walk(a)):
                    yield Hit(call, "DDP006", "warning",
                              f"'{name}' is this rank's average, all-reduced with SUM and reported without dividing "
                              "by world_size: the figure is the sum of world_size averages",
                              "all-reduce the sum and the count, then divide (or divide the summed average by "
                              "dist.get_world_size() when every rank has the same number of samples)")
                    break


def _assigned(nodes: list[ast.AST]) -> list[tuple[str, ast.AST]]:
    out = []
    for n in nodes:
        if isinstance(n, ast.Assign):
            out.extend((t.id, n.value) for t in n.targets if isinstance(t, ast.Name))
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None:
            out.append((n.target.id, n.value))
    return out


def _key_name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else ""


def _is_average(value: ast.AST) -> bool:
    """`a / b`, `x.mean()`, `torch.tensor(a / b)`: a value that is already an average of this rank's data."""
    while isinstance(value, ast.Call) and terminal(value.func) in ("tensor", "as_tensor", "float", "Tensor") \
            and value.args:
        value = value.args[0]
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div):
        return True
    return isinstance(value, ast.Call) and terminal(value.func) == "mean"


def _summed(s: Script, flow) -> set[str]:
    """Names all-reduced with SUM (the default) in this scope."""
    out: set[str] = set()
    if not flow.reduced:
        return out
    for node in flow.nodes:
        if isinstance(node, ast.Call) and s.is_dist_collective(node) and terminal(node.func) in ("all_reduce", "reduce"):
            op = keyword(node, "op") or (node.args[1] if len(node.args) > 1 else None)
            if op is not None and "SUM" not in ast.unparse(op).upper():
                continue
            if node.args and isinstance(node.args[0], ast.Name):
                out.add(node.args[0].id)
    return out


@check
def unreduced_metric(s: Script) -> Iterator[Hit]:
    project = s.project
    if not s.distributed or "torchmetrics" in s.aliases or not _sharded_eval(s):
        return
    if project.reduces(_METRIC) or any(
            s.local_callee(c) in project.reducing_functions or terminal(c.func) in project.reducing_functions
            or function_apply(s, c) is not None for c in s.calls):
        return  # (`gather = AllGather.apply; gather(embeddings)`: an autograd Function that all-gathers)
    for call in s.calls:
        ctx = s.context(call)
        if not _logs(s, call) or ctx.single or not s.per_rank(call) or names_a_rank(s, call):
            continue  # ("Valid_local_rank: {} acc {}".format(args.local_rank, acc): the line says whose it is)
        if ctx.level == NONE and (project.print_silenced(s, call) or terminal(call.func) != "print"):
            continue
        metric = next((n for a in (*call.args, *call.keywords) for n in _names(a) if _METRIC.search(n.lower())),
                      None)
        if metric is None:
            continue
        scope = scope_of(s, call)
        if built_from(s, scope, [*call.args, *(k.value for k in call.keywords)]) & reduced_names(s):
            continue  # computed from what a collective gathered (`f1 = all_stats[0].accuracy()`)
        if _evaluated_whole(s, call, metric):
            continue  # an evaluation over a loader every rank iterates whole: the figure is the whole set's
        if _batch_progress(s, scope, call, [metric]):
            continue  # a progress line of the batch; the epoch figure built from it is reported after the loop
        where = "from inside a rank check" if ctx.level else "by every rank"
        yield Hit(call, "DDP006", "warning",
                  f"'{metric}' is reported {where} but the script never reduces it across ranks, so it "
                  "describes one rank's shard (1/world_size of the data)", _ADVICE)
