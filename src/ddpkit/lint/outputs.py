"""The lint checks for what ranks report (DDP006, DDP008): metrics of one shard shown as global, output repeated."""

from __future__ import annotations

import ast
import builtins
import os
import re
from collections.abc import Iterator
from typing import Any

from ddpkit.lint.analysis import (EVAL_TOKENS, NONE, Script, function_apply, is_eval_name, rerun_by_workers,
                                  terminal)
from ddpkit.lint.doubt import library_logger
from ddpkit.lint.ranks import rank_side
from ddpkit.lint.flow import class_of, eval_samplers, flows, sampler_class, sharded_names, summaries_of
from ddpkit.lint.project import LOSS_NAME
from ddpkit.lint.reporting import (built_from, helper_report, leaves, ordered_sources, reduced_names,
                                   reducing_helpers, reporters, scope_of, shown_arguments, shows)
from ddpkit.lint.rules import Hit, argument, check, keyword, off_by_default

__all__ = ["padded_evaluation", "rank_zero_loss", "unreduced_metric", "shard_figure_reported", "sum_over_rank_count",
           "sum_of_averages",
           "every_rank_prints", "every_rank_records", "print_swap_opened_by_size", "EVAL_TOKENS"]

_METRIC = re.compile(r"(^|_)(acc|accuracy|correct|f1|precision|recall|auc|top1|top5|metric|metrics)($|_)"
                     r"|^(val|valid|eval|test)_?loss")
_LOG_CALLS = frozenset({"print", "info", "log", "add_scalar", "add_scalars", "write", "warning"})
_WORLD = re.compile(r"world_size|get_world_size|nprocs|num_gpus|ngpus|n_gpus|num_replicas|num_processes|world|"
                    r"\bws\b|n_?procs|num_?ranks|n_?ranks|gpu_?count|device_count")
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


_RANK_ZERO_TEXT = re.compile(r"\brank[ _-]?(0|zero)\b", re.IGNORECASE)
"""Text that says the figure is rank 0's own ("Rank-0 Batch Wise/train_loss"), not the run's."""


def _names_a_rank(s: Script, call: ast.Call) -> bool:
    """The line says whose it is: a rank value written into it, or text naming the rank. A rank read only by the
    test of a conditional expression inside an argument (`world_size if local_rank != -1 else 1`, a factor of
    a total) picks a value; it is not written out."""
    parts = [n for a in (*call.args, *(k.value for k in call.keywords)) for n in ast.walk(a)]
    tested = {id(n) for p in parts if isinstance(p, ast.IfExp) for n in ast.walk(p.test)}
    parts = [n for n in parts if id(n) not in tested]
    # (an object only some ranks hold, `self.writer` made on rank 0 alone, is handed along, not written out)
    return any(s.kind(n) for n in parts if isinstance(n, (ast.Name, ast.Attribute)) and _key(n) not in s.rank_only) \
        or any(
        isinstance(n, ast.Constant) and isinstance(n.value, str)
        and (re.search(r"rank ?0|rank\b", n.value) or _RANK_ZERO_TEXT.search(n.value)) for n in parts)


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
        if _names_a_rank(s, before.value):
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
               and any(_key(m) in shards for m in ast.walk(n.iter) if isinstance(m, (ast.Name, ast.Attribute)))
               for n in ast.walk(scope))


def _key(node: ast.Name | ast.Attribute) -> str:
    return node.id if isinstance(node, ast.Name) else "." + node.attr


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
    while isinstance(s.parents.get(id(stmt)), (ast.With, ast.For, ast.If)) and _reports_only(s, s.parents[id(stmt)]):
        stmt = s.parents[id(stmt)]
    return stmt


def _rank_check(s: Script, stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and s.kind(stmt.test) != NONE


def _reports_only(s: Script, stmt: ast.stmt) -> bool:
    """A report statement: a call that shows its arguments, or a `with`, `for` or `if` of nothing else
    (`for k, v in parts.items(): writer.add_scalar(k, v, step)`)."""
    if isinstance(stmt, ast.Expr):
        return isinstance(stmt.value, ast.Call) and shows(s, stmt.value)
    if isinstance(stmt, (ast.With, ast.For, ast.If)) and not _rank_check(s, stmt):
        # (a rank check starts a report block of its own)
        return all(_reports_only(s, x) for x in (*stmt.body, *getattr(stmt, "orelse", ())))
    return False


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
            while i > 0 and _reports_only(s, block[i - 1]):
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
            and project.memo("logging per rank", lambda: _logging_per_rank(project))
        # (a print after the builtins.print swap shows on rank 0 alone, as one under a rank check does)
        swapped = ctx.level == NONE and not helper and s.qualname(call.func) == "print" \
            and project.print_silenced(s, call)
        # (every rank recording its own loss into a SummaryWriter each of them makes for the run's one log directory)
        shared = ctx.level == NONE and not helper and _every_rank_writer(s, call) and _named_log_dir(s, call)
        if ctx.level == NONE and not (helper and helper.rank_zero) and not logged and not swapped and not shared:
            continue  # (a `.info` line where logging is set up per rank shows on rank 0 alone)
        if any(is_eval_name(f) and "train" not in f.lower().split("_") for f in ctx.functions):
            continue  # an evaluation function (not `train_and_evaluate`): its report covers the data it was given
        if ctx.functions and _called_only_in_evaluation(s, ctx.functions[-1]):
            continue  # a helper an evaluation function hands its figures to (`save_summary(dir, final_loss)`)
        if _names_a_rank(s, call) or _under_rank_header(s, call) and not _after_shard_pass(s, call):
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
    if not _in_step_loop(s, scope, call):
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


def _in_step_loop(s: Script, scope: ast.AST, call: ast.Call) -> bool:
    """The report sits in a loop of `scope` that runs `backward()`: a progress line of the current batch."""
    node = call
    while id(node) in s.parents and node is not scope:
        node = s.parents[id(node)]
        if isinstance(node, (ast.For, ast.While)) and any(
                isinstance(c, ast.Call) and terminal(c.func) == "backward" for c in ast.walk(node)):
            return True
    return False


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
        if not isinstance(data, ast.Name):
            return False
        built = [v for k, v in s.assignments if k == data.id]
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
    previous = {id(second): first for first, second in _next_statements(s).items()}
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
            if ctx.single or not s.per_rank(call) or _names_a_rank(s, call):
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
                if _every_rank_writer(s, call) and not _in_shard_loop(call, flow):
                    # `writer = SummaryWriter(logdir)` on every rank: each rank records its own shard's epoch figure
                    # into the run's log as if it were the run's
                    yield Hit(call, "DDP006", "warning",
                              f"'{names[0]}' is computed from this rank's batches of a sharded loader and every rank "
                              f"writes it to its own {ast.unparse(call.func.value)} (made without a rank check) as "
                              "the run's figure; it never goes through a collective on the way", _ADVICE)
                    continue
                if not evaluation or terminal(call.func) not in ("print", "info"):
                    continue
                per_rank_logging = project.memo("logging per rank", lambda: _logging_per_rank(project))
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


def _every_rank_writer(s: Script, call: ast.Call) -> bool:
    """`writer.add_scalar(...)` where `writer` is a tensorboard SummaryWriter this file makes on every rank (no rank
    check around it, no rank in its arguments) and only there."""
    if terminal(call.func) not in ("add_scalar", "add_scalars") or not isinstance(call.func, ast.Attribute) \
            or not isinstance(call.func.value, (ast.Name, ast.Attribute)):
        return False
    key = terminal(call.func.value) if isinstance(call.func.value, ast.Name) else "." + call.func.value.attr
    made = [v for k, v in s.assignments if k == key]
    return bool(made) and all(
        isinstance(v, ast.Call) and terminal(v.func) == "SummaryWriter" and not s.context(v).level
        and not s.context(v).single
        and not any(s.kind(n) for n in ast.walk(v) if isinstance(n, (ast.Name, ast.Attribute)))
        for v in made)


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
                    and parent.left is node and _WORLD.search(ast.unparse(parent.right).lower()):
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
                and _WORLD.search(ast.unparse(n.right).lower())
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


def _logger_helpers(project) -> set[str]:
    """Project functions and classes that make a logger and never look at the rank: a function that returns a
    `logging.getLogger()` logger, or the `logging` module itself after setting it up (`logging.basicConfig(...);
    return logging`), and a class that keeps a `logging.getLogger()` logger and whose `info` method hands its
    message to it (`self.logger.info(txt)`): what such a logger's `info` writes appears on every rank."""
    found = set()
    for x in project.scripts.values():
        if not any(terminal(c.func) in ("getLogger", "basicConfig") for c in x.calls):
            continue
        for d in x.defs:
            inner = list(ast.walk(d))
            if (any(isinstance(n, (ast.Name, ast.Attribute)) and x.kind(n) for n in inner)
                    or any(a.arg and x.kind(ast.Name(a.arg)) for a in d.args.args)) and not _rank_names_files(x, d):
                continue
            makes = any(isinstance(n, ast.Call) and x.qualname(n.func) in ("logging.getLogger", "getLogger")
                        for n in inner)
            returns = any(isinstance(n, ast.Return) and n.value is not None for n in inner)
            module = x.aliases.get("logging", "") == "logging"
            gives_module = module and any(isinstance(n, ast.Call) and x.qualname(n.func) == "logging.basicConfig"
                                          for n in inner) and any(
                isinstance(n, ast.Return) and isinstance(n.value, ast.Name) and n.value.id == "logging" for n in inner)
            if makes and returns or gives_module:
                found.add(d.name)
    return found


def _rank_names_files(x: Script, d: ast.AST) -> bool:
    """The rank read in a logger's set-up only names the file each rank logs to (`if rank > 0: filepath =
    f"{filepath}-{rank}"` before `logging.FileHandler(filepath)`): its console handler and level are every rank's."""
    statements = [n for n in ast.walk(d) if isinstance(n, ast.stmt) and n is not d]
    named: set[str] = set()
    for stmt in statements:
        own = [stmt.test] if isinstance(stmt, ast.If) else [] if isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)) \
            else [stmt]
        if not any(isinstance(n, (ast.Name, ast.Attribute)) and x.kind(n) for part in own for n in ast.walk(part)):
            continue
        if isinstance(stmt, ast.If):
            arms = [b for b in (*stmt.body, *stmt.orelse)]
            if not all(isinstance(b, ast.Assign) and all(isinstance(t, ast.Name) for t in b.targets) for b in arms):
                return False
            named |= {t.id for b in arms for t in b.targets}
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            named |= {t.id for t in stmt.targets}
        else:
            return False
    if not named:
        return False
    # every read of those names is in a file handler's arguments, in their own assignments, or in a test of whether
    # there is a file at all (`if filepath is not None:`: a path with the rank in it is never None)
    allowed = {id(m) for n in ast.walk(d) if isinstance(n, ast.Call) and terminal(n.func).endswith("FileHandler")
               for m in ast.walk(n)}
    allowed |= {id(n.left) for n in ast.walk(d) if isinstance(n, ast.Compare) and len(n.comparators) == 1
                and isinstance(n.ops[0], (ast.Is, ast.IsNot)) and isinstance(n.comparators[0], ast.Constant)
                and n.comparators[0].value is None}
    allowed |= {id(m) for n in statements if isinstance(n, ast.Assign) and all(
        isinstance(t, ast.Name) and t.id in named for t in n.targets) for m in ast.walk(n.value)}
    return all(id(n) in allowed for n in ast.walk(d)
               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in named)


def _maker_method(s: Script, func: ast.AST, makers: set[str]) -> bool:
    """`config.get_logger("trainer")`: a method of a project object (not a module's function) that makes a logger
    without looking at the rank, the one function of that name in the program."""
    if not (isinstance(func, ast.Attribute) and func.attr in makers):
        return False
    owner = func.value
    while isinstance(owner, ast.Attribute):
        owner = owner.value
    if isinstance(owner, ast.Name) and owner.id in s.aliases:
        return False
    return sum(d.name == func.attr for x in s.project.scripts.values() for d in x.defs) == 1


def _logger_classes(project) -> dict[str, set[int]]:
    """Project classes that wrap a logger for every rank (see _forwards_to_a_logger), with the forwarding calls in
    their `info`: the line is reported where the program calls `info`, not inside the class."""
    found: dict[str, set[int]] = {}
    for x in project.scripts.values():
        if any(terminal(c.func) == "getLogger" for c in x.calls):
            for c in x.nodes:
                if isinstance(c, ast.ClassDef):
                    forwards = _forwards_to_a_logger(x, c)
                    if forwards:
                        found.setdefault(c.name, set()).update(forwards)
    return found


def _forwards_to_a_logger(x: Script, cls: ast.ClassDef) -> set[int]:
    """The calls by which a class that stores `self.<a> = logging.getLogger(...)` and never looks at the rank passes
    the message of its `info(self, msg)` to `self.<a>.info(...)`; empty for any other class."""
    inner = list(ast.walk(cls))
    if any(isinstance(n, (ast.Name, ast.Attribute)) and x.kind(n) for n in inner) or any(
            a.arg != "self" and x.kind(ast.Name(a.arg)) for d in inner if isinstance(d, ast.FunctionDef)
            for a in d.args.args):
        return set()
    held = {t.attr for n in inner if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and x.qualname(n.value.func) in ("logging.getLogger", "getLogger")
            for t in n.targets
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    info = next((d for d in cls.body if isinstance(d, ast.FunctionDef) and d.name == "info"), None)
    if not held or info is None or len(info.args.args) < 2:
        return set()
    message = info.args.args[1].arg
    return {id(n) for n in ast.walk(info)
            if isinstance(n, ast.Call) and terminal(n.func) == "info" and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Attribute) and n.func.value.attr in held
            and isinstance(n.func.value.value, ast.Name) and n.func.value.value.id == "self"
            and any(isinstance(m, ast.Name) and m.id == message for a in n.args for m in ast.walk(a))}


def _in_handler(s: Script, node: ast.AST) -> bool:
    parents = s.parents
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.ExceptHandler):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
    return False


def _logging_configured(project) -> bool:
    """The program itself makes INFO lines visible (basicConfig, a handler, a config): without it logging.info
    prints nothing (the root level is WARNING), and a setup the program does not show cannot be judged, except a
    library's set-up named for it (see _outside_log_setup)."""
    return any(terminal(c.func) in ("basicConfig", "addHandler", "dictConfig", "fileConfig")
               for x in project.scripts.values() for c in x.calls) or _outside_log_setup(project) is not None


_SETS_LOGGING_UP = re.compile(r"(init|setup|set_up|configure|config)_?(logging|logger|log)", re.IGNORECASE)


def _outside_log_setup(project) -> tuple[Script, ast.Call] | None:
    """The first call every rank makes, with nothing of the rank in its arguments, of a library's logging set-up:
    `coloredlogs.install()` (a console handler on the root logger, INFO unless told a higher level), or a function
    from outside the program named for it and called for that alone (`init_logging()`): read by its name as showing
    INFO lines on the console; None when the program's own basicConfig/handler/config decides it, or there is no
    such call."""
    if any(terminal(c.func) in ("basicConfig", "addHandler", "dictConfig", "fileConfig")
           for x in project.scripts.values() for c in x.calls):
        return None
    for x in project.scripts.values():
        statements = {id(n.value) for n in x.nodes if isinstance(n, ast.Expr)}
        for c in x.calls:
            level = keyword(c, "level")
            known = x.qualname(c.func) == "coloredlogs.install" and (level is None or (
                isinstance(level, ast.Constant) and str(level.value).upper() in ("INFO", "DEBUG", "20", "10")
                or isinstance(level, ast.Attribute) and level.attr in ("INFO", "DEBUG")))
            # by its name: a set-up of the process's logging, called for that alone (its result unused: not a
            # logger it builds and hands back), with no file or directory to write to
            named = _SETS_LOGGING_UP.fullmatch(terminal(c.func)) and id(c) in statements and not any(
                k.arg is None or re.search(r"file|path|dir|save", k.arg) for k in c.keywords) \
                and terminal(c.func) not in project.defined_functions and project.resolve(x, c.func) is None
            if (known or named) and not x.context(c).level and not _chosen_by_rank(x, c) and project.runs(x, c):
                return x, c
    return None


def _loguru_default(project) -> bool:
    """loguru's `logger` keeps its default handler (sys.stderr, every level): the program never configures it
    (`logger.remove()`, `logger.add(...)`, `logger.configure(...)`, `logger.disable(...)`); where it does, who sees
    which line depends on that set-up, and nothing is reported."""
    uses = [(x, c) for x in project.scripts.values() for c in x.calls
            if x.qualname(c.func).startswith("loguru.logger.")]
    return bool(uses) and not any(terminal(c.func) in ("remove", "add", "configure", "disable") for _, c in uses)


def _logging_per_rank(project) -> bool:
    """Logging is set up per rank: a level, handler, filter or basicConfig chosen by the rank (in its arguments, or
    a value assigned under a rank check: `if rank != 0: level = logging.ERROR` before `basicConfig(level=level)`),
    or set under a rank check, or `propagate` switched by the rank, or a handler writing to a stream that ranks
    other than 0 silence (`if rank != 0: sys.stdout = open(os.devnull, "w")` before `basicConfig(stream=sys.stdout)`;
    basicConfig's default stream is sys.stderr). Propagation is followed: where the root logger shows INFO lines on
    the console of every rank, a named logger given its handlers (or its level) on rank 0 alone still prints on
    every rank through the root (the other ranks leave it unconfigured), so that set-up does not count."""
    if project.launcher_streams:
        return True  # a launcher sends the other ranks' console away: their log lines do not repeat on it
    root_console = _root_console_everywhere(project)
    setups = _LOG_SETUP | {d.name for d, _, _ in _logger_parameters(project)}
    for x in project.scripts.values():
        for call in x.calls:
            if project.silenced_streams and terminal(call.func) in ("basicConfig", "StreamHandler"):
                stream = keyword(call, "stream") or (call.args[0] if call.args and terminal(call.func)
                                                     == "StreamHandler" else None)
                named = terminal(stream) if stream is not None and x.qualname(stream).startswith("sys.") else \
                    "stderr" if stream is None else ""
                if named in project.silenced_streams:
                    return True
            if terminal(call.func) not in setups:
                continue
            chosen = _chosen_by_rank(x, call)
            guarded = bool(x.context(call).level) and x.qualname(call.func) != "logging.getLogger"
            if not (chosen or guarded):
                continue  # (getting a logger under a rank check configures nothing; one named by the rank is the
                # process's own: `getLogger(f"worker_{rank}")`)
            if library_logger(project, x, call):
                continue  # `getLogger("transformers.modeling_utils").setLevel(WARN)` on some ranks: that library's lines
            if root_console and (_adds_handlers_only(project, x, call) or _logger_target(project, x, call)
                                 == "named" and not chosen and _rank_zero_side(x, call)):
                # the other ranks' lines of this logger reach the root's console (doubt.py reads this fact)
                project.memo(THROUGH_THE_ROOT, set).add(id(call))
                continue
            return True
        for node in x.nodes:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == "propagate"
                                                    for t in node.targets):
                if x.context(node).level or any(x.kind(n) for n in ast.walk(node.value)):
                    return True  # `logger.propagate = rank == 0`
    return False


def _adds_handlers_only(project, x: Script, call: ast.Call) -> bool:
    """The set-up call only gives a logger one more handler: `addHandler(...)`, a set-up of a file handler
    (`fh.setLevel(...)` after `fh = logging.FileHandler(path)`: it does not write the console), or a project helper
    whose set-ups are only those (`log_to_file(path)`). More output on the ranks that run it, none hidden on the
    others."""
    if terminal(call.func) == "addHandler" or _on_a_file_handler(x, call):
        return True
    found = project.callee(x, call)
    helpers = [] if found is None else [d for d in found[0].defs if d.name == found[1]]
    if len(helpers) != 1:
        return False
    setups = [c for c in ast.walk(helpers[0])
              if isinstance(c, ast.Call) and terminal(c.func) in _LOG_SETUP - {"getLogger"}]
    return bool(setups) and all(terminal(c.func) == "addHandler" or _on_a_file_handler(found[0], c) for c in setups)


def _on_a_file_handler(x: Script, call: ast.Call) -> bool:
    """A call on a file handler the code builds (`fh.setLevel(...)` after `fh = logging.FileHandler(path)`)."""
    if not isinstance(call.func, ast.Attribute):
        return False
    receiver = call.func.value
    made = [receiver] if isinstance(receiver, ast.Call) else x.local_values(receiver.id, call) \
        if isinstance(receiver, ast.Name) else []
    return bool(made) and all(isinstance(v, ast.Call) and terminal(v.func).endswith("FileHandler") for v in made)


THROUGH_THE_ROOT = "logging set-ups whose logger prints through the root on every rank"
"""Project fact: ids of the set-up calls the logging model resolved (doubt.py leaves them alone): the per-rank
set-up of a named logger that does not silence it (see _logging_per_rank), and the call that gives the root its
console on every rank (see _root_console_everywhere)."""

_LOG_SETUP = frozenset({"basicConfig", "setLevel", "addHandler", "disable", "addFilter", "setup_logger",
                        "setup_logging", "get_logger", "create_logger", "getLogger"})


def _chosen_by_rank(x: Script, call: ast.Call) -> bool:
    """An argument of the call depends on the rank, directly (`level=INFO if rank == 0 else WARN`) or through a name
    this function assigns under a rank check or from the rank (`if not get_rank() == 0: level = ERROR`)."""
    for a in (*call.args, *(k.value for k in call.keywords)):
        for n in ast.walk(a):
            if x.kind(n):
                return True
            if isinstance(n, ast.Name) and any(
                    x.context(stmt).level or value is not None and any(x.kind(m) for m in ast.walk(value))
                    for stmt, value in x.local_assignments(n.id, call)):
                return True
    return False


def _rank_zero_side(x: Script, node: ast.AST) -> bool:
    """The node sits on rank 0's side of its innermost rank check (`if rank == 0:`, the `else:` of `rank != 0`)."""
    branches = x.context(node).branches
    if not branches:
        return False
    test = next((n.test for n in x.nodes if id(n) == branches[-1][0] and isinstance(n, (ast.If, ast.IfExp))), None)
    side = rank_side(test, branches[-1][1]) if test is not None else None
    return side is not None and side[1]


def _root_logger(x: Script, expr: ast.AST | None, within: ast.AST, depth: int = 0) -> str:
    """'root' for the root logger (`logging.root`, `logging.getLogger()`, `getLogger(None)`, a name holding one),
    'named' for a named logger (`getLogger(__name__)`, `getLogger("train")`), '' where unknown."""
    if isinstance(expr, ast.Attribute) and x.qualname(expr) == "logging.root":
        return "root"
    if isinstance(expr, ast.Call) and x.qualname(expr.func) in ("logging.getLogger", "getLogger"):
        name = expr.args[0] if expr.args else keyword(expr, "name")
        if name is None or isinstance(name, ast.Constant) and name.value in (None, ""):
            return "root"
        return "named" if isinstance(name, (ast.Constant, ast.JoinedStr)) or x.qualname(name) == "__name__" else ""
    if isinstance(expr, ast.Name) and depth < 3:
        kinds = {_root_logger(x, v, within, depth + 1) for v in x.local_values(expr.id, within)}
        return kinds.pop() if len(kinds) == 1 else ""
    return ""


def _logger_target(project, x: Script, call: ast.Call) -> str:
    """Which logger a set-up call configures: 'root', 'named' or '' (unknown). A project helper that configures
    `logging.getLogger(<its parameter>)` configures the logger its call names (`setup_logger(None, ...)`: the root)."""
    name = terminal(call.func)
    if name in ("basicConfig", "disable") and x.qualname(call.func).startswith("logging."):
        return "root"
    if isinstance(call.func, ast.Attribute) and name in ("setLevel", "addHandler", "addFilter"):
        return _root_logger(x, call.func.value, call)
    for d, param, default in _logger_parameters(project):
        if d.name == name:
            value = argument(call, param, [a.arg for a in d.args.args].index(param)) or default
            if value is None or isinstance(value, ast.Constant) and value.value in (None, ""):
                return "root"
            return "named" if isinstance(value, (ast.Constant, ast.JoinedStr)) or x.qualname(value) == "__name__" \
                else ""
    return ""


def _logger_parameters(project) -> list[tuple[ast.FunctionDef, str, ast.AST | None]]:
    """(function, parameter, its default) for each project function that configures `logging.getLogger(<parameter>)`
    (`def setup_logger(name, ...): lg = logging.getLogger(name); lg.addHandler(...)`)."""
    def compute():
        found = []
        for x in project.scripts.values():
            for d in x.defs:
                params = [a.arg for a in d.args.args]
                defaults = dict(zip(params[len(params) - len(d.args.defaults):], d.args.defaults))
                for n in ast.walk(d):
                    if isinstance(n, ast.Call) and x.qualname(n.func) in ("logging.getLogger", "getLogger") \
                            and len(n.args) == 1 and isinstance(n.args[0], ast.Name) and n.args[0].id in params:
                        found.append((d, n.args[0].id, defaults.get(n.args[0].id)))
                        break
        return found
    return project.memo("logger parameters", compute)


def _root_console_everywhere(project) -> bool:
    """The root logger writes to the console on every rank: `basicConfig(level=...)` without a file, or a
    StreamHandler added to the root, outside any rank check, with arguments that do not depend on the rank; also
    a project helper that adds a StreamHandler to `logging.getLogger(<parameter>)`, called for the root
    (`setup_logger(None, ..., screen=True)`; a handler it adds under `if screen:` counts where the call passes a
    true constant for it)."""
    helpers = [d for d, _, _ in _logger_parameters(project)]
    for x in project.scripts.values():
        for call in x.calls:
            if x.context(call).level or _chosen_by_rank(x, call):
                continue
            name = terminal(call.func)
            if name == "basicConfig" and keyword(call, "level") is not None and keyword(call, "filename") is None:
                handlers = keyword(call, "handlers")
                if handlers is None or any(isinstance(n, ast.Call) and terminal(n.func) == "StreamHandler"
                                           for n in ast.walk(handlers)):
                    return True
            if name == "addHandler" and call.args and _root_logger(x, call.func.value, call) == "root" \
                    and _stream_handler(x, call.args[0], call):
                return True
            for d in helpers:
                shown = _helper_shows_on_console(project, d, call) if d.name == name \
                    and _logger_target(project, x, call) == "root" else None
                if shown is not None:
                    project.memo(THROUGH_THE_ROOT, set).add(id(shown))
                    return True
    return False


def _stream_handler(x: Script, expr: ast.AST, within: ast.AST) -> bool:
    if isinstance(expr, ast.Name):
        return any(_stream_handler(x, v, within) for v in x.local_values(expr.id, within)
                   if not isinstance(v, ast.Name))
    return isinstance(expr, ast.Call) and terminal(expr.func) == "StreamHandler"


def _helper_shows_on_console(project, d: ast.FunctionDef, call: ast.Call) -> ast.Call | None:
    """The helper's addHandler of a StreamHandler that runs for this call: unconditional, or under `if <parameter>:`
    that the call passes true; None where there is none."""
    x = next((s for s in project.scripts.values() if any(f is d for f in s.defs)), None)
    if x is None:
        return None
    params = [a.arg for a in d.args.args]
    defaults = dict(zip(params[len(params) - len(d.args.defaults):], d.args.defaults))
    for n in ast.walk(d):
        if not (isinstance(n, ast.Call) and terminal(n.func) == "addHandler" and n.args
                and _stream_handler(x, n.args[0], n)):
            continue
        node, shown = n, True
        while (node := x.parents.get(id(node))) is not None and node is not d:
            if isinstance(node, ast.If):
                test = node.test
                if not (isinstance(test, ast.Name) and test.id in params):
                    shown = False
                    break
                value = argument(call, test.id, params.index(test.id)) or defaults.get(test.id)
                if not (isinstance(value, ast.Constant) and value.value):
                    shown = False
                    break
        if shown:
            return n
    return None


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
        if not _logs(s, call) or ctx.single or not s.per_rank(call) or _names_a_rank(s, call):
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


def _next_statements(s: Script) -> dict[int, ast.stmt]:
    after: dict[int, ast.stmt] = {}
    for node in s.nodes:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                for first, second in zip(block, block[1:]):
                    after[id(first)] = second
    return after


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
                and _reports_only(s, s.parents[id(last)]):
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


def _handed_loggers(s: Script) -> set[str]:
    """`.logger` where a class of this file keeps a constructor parameter (`self.logger = logger`) and every
    construction of the class in the program hands it a name its own function binds only to `logging.getLogger(...)`
    (`Scheduler(args, optimizer, logging.getLogger())` through `logger = logging.getLogger()`)."""
    def is_logger(x: Script, value: ast.AST, within: ast.AST) -> bool:
        values = x.local_values(value.id, within) if isinstance(value, ast.Name) else [value]
        return bool(values) and all(isinstance(v, ast.Call) and x.qualname(v.func) in ("logging.getLogger", "getLogger")
                                    for v in values)

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
    after = _next_statements(s)
    statement_of = {id(n.value): n for n in s.nodes if isinstance(n, ast.Expr)}
    makers = project.memo("logger helpers", lambda: _logger_helpers(project))
    classes = project.memo("logger classes", lambda: _logger_classes(project))
    forwarding = set().union(*classes.values())
    streams = project.memo("stream writers", lambda: _stream_writer_functions(project))
    loggers = {k for k, v in s.assignments if isinstance(v, ast.Call) and (
        s.qualname(v.func) in ("logging.getLogger", "getLogger") or s.local_callee(v) in makers
        or (project.resolve(s, v.func) or ("", ""))[1] in makers or _maker_method(s, v.func, makers)
        or terminal(v.func) in classes and not s.qualname(v.func).startswith("logging."))} | _imported_loggers(s)
    loggers |= _logging_module_names(s) | _handed_loggers(s) | _logger_parameters_filled(s, makers)
    logging_open = project.memo("logging shown", lambda: _logging_configured(project)) \
        and not project.memo("logging per rank", lambda: _logging_per_rank(project))
    warnings_open = not project.memo("logging per rank", lambda: _logging_per_rank(project))
    outside = project.memo("logging set up outside", lambda: _outside_log_setup(project))
    loguru_open = project.memo("loguru shown", lambda: _loguru_default(project))
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
        is_log = logging_open and terminal(call.func) == "info" and isinstance(call.func, ast.Attribute) and (
            name == "logging.info" or (isinstance(call.func.value, (ast.Name, ast.Attribute))
                                       and terminal(call.func.value) in {k.lstrip(".") for k in loggers}))
        # a WARNING line is shown with no set-up at all (Python's last-resort handler), so only a set-up per rank hides
        # it; in the loop that runs the step it is the training log written at WARNING, a line every step on every rank
        # (a one-off notice elsewhere, `logging.warning("apex not available")`, is left alone)
        warned = not is_log and warnings_open and (name == "logging.warning" or _logger_warning(call, loggers)) \
            and _in_step_loop(s, s.tree, call)
        is_log = is_log or warned
        if is_log and name in ("logging.info", "logging.warning") and _not_the_logging_module(s, call) \
                or id(call) in forwarding:
            continue
        # loguru's logger writes to sys.stderr in every process until the program configures it
        is_loguru = loguru_open and name == "loguru.logger.info"
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
    folder (see _every_rank_writer)."""
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
        if ctx.level != NONE or ctx.single or not s.per_rank(call) or _names_a_rank(s, call):
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
        elif _every_rank_writer(s, call) and ("writer", _writer_key(s, call)) not in recorded:
            recorded.add(("writer", _writer_key(s, call)))  # (one per writer: the fix is one writer, on rank 0 only)
            made = _writer_made(s, call)
            yield Hit(made if made is not None else call, "DDP008", "warning",
                      f"every rank makes its own {ast.unparse(call.func.value)} (a SummaryWriter made without a rank "
                      f"check, on the same folder) and writes the same tags into it (line {call.lineno}): the run's "
                      "log gets world_size event files and each curve world_size times",
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
                          and _WORLD.search(ast.unparse(v.left).lower())), None)
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
