"""What the lint rules need to know about one script: import aliases, rank guards, per-rank code."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from ddpkit.lint.bindings import (local_names, optional_parameters, passes, path_up, presence_test, relation, scope_of,
                              switch_parameters, switched_on)
from ddpkit.lint.ranks import (GLOBAL, GLOBAL_CALLS, GLOBAL_ENV, LOCAL, NONE, QUERIES, distributed_mode, run_sense,
                               find_rank_helpers, is_gpu_index, is_main_flag, is_mode_sentinel, rank_name_kind,
                               own_returns, rank_side, single_setting, spawn_index_names, terminal)

__all__ = ["assigned_key", "keyword", "argument", "next_statements", "without_grad", "rerun_by_workers", "dropped_by_every_caller", "NONE", "LOCAL", "GLOBAL", "COLLECTIVES", "MPI_COLLECTIVES", "REDUCING_NAME", "EVAL_TOKENS", "is_eval_name", "is_eval_sampler", "off_the_training_branch", "Context", "Script", "is_main_flag", "rank_name_kind",
           "terminal", "distributed_mode", "BATCHNORM_ARCHITECTURES", "batchnorm_constructor", "function_apply"]

COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
    "monitored_barrier",
})
"""torch.distributed functions that every rank of the group must call, or the job hangs."""
MPI_COLLECTIVES = frozenset({"bcast", "allreduce", "reduce", "gather", "allgather", "scatter", "barrier", "alltoall",
                              "reduce_scatter"})
"""mpi4py communicator methods (lower- and upper-case spellings) that every rank of the communicator must call."""

REDUCING_NAME = re.compile(r"reduce|gather|synchroni[sz]e|sync_?(tensor|value|metric|loss|dict|across|between|mean|sum)")
"""A library call named like this moves values across ranks (`reduce_tensor`, `all_gather`, `accelerator.gather`,
`synchronize_between_processes`); `sync_batchnorm`, `SyncVectorEnv` and `distributed_sync` are not."""

EVAL_TOKENS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev", "valset", "testset",
                         "valdir", "testdir", "validate", "evaluate", "estimate"})
"""Name parts that mark evaluation data (`dataset_val`, `val_sampler`, `test_set`)."""


_EVAL_COMPOUND = re.compile(r"(val|valid|validation|eval|test|dev)(set|sets|data|dataset|ds|loader|sampler|dir)")


def is_eval_name(name: str) -> bool:
    """`val_loader`, `test_set`, `validset`, `evalloader`: a name part marks evaluation data or code."""
    return any(t in EVAL_TOKENS or _EVAL_COMPOUND.fullmatch(t) for t in name.lower().split("_"))


def is_eval_sampler(s: Script, call: ast.Call) -> bool:
    """A DistributedSampler over evaluation data by its names (the variable it goes to, or its dataset)."""
    named = {id(v): k.lstrip(".") for k, v in s.assignments}
    dataset = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "dataset"), None)
    return is_eval_name(named.get(id(call), "")) or (dataset is not None and any(
        is_eval_name(terminal(n)) for n in ast.walk(dataset) if isinstance(n, (ast.Name, ast.Attribute)))) \
        or _only_evaluated(s, call) or off_the_training_branch(s, call)


_TRAIN_WORDS = frozenset({"train", "training"})


def off_the_training_branch(s: Script, node: ast.AST) -> bool:
    """The node sits where a split test says the data is not for training: the `else:` of `if mode == "train":`
    (or of `if is_train:`), the body of `if split != "train":`."""
    child = node
    while (parent := s.parents.get(id(child))) is not None:
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(parent, ast.If) and child is not parent.test:
            test, branch = parent.test, "body" if any(child is b for b in parent.body) else "else"
            if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant) \
                    and test.comparators[0].value in _TRAIN_WORDS:
                training = {ast.Eq: "body", ast.NotEq: "else"}.get(type(test.ops[0]))
            elif isinstance(test, (ast.Name, ast.Attribute)) and terminal(test).lower() in ("is_train", "is_training"):
                training = "body"
            else:
                training = None
            if training == "body" and branch == "else" and _other_training_modes(test, parent):
                training = None  # `if mode == "train": ... elif mode == "train_seg": ...`: a choice among ways to train
            if training is not None:
                return branch != training
        child = parent
    return False


def _other_training_modes(test: ast.AST, node: ast.If) -> bool:
    """The elif chain after `if mode == "train":` compares the same subject with another training value
    (`elif mode == "train_seg":`), so the else of the train test is not where the data stops being for training."""
    if not isinstance(test, ast.Compare):
        return False
    subject = ast.dump(test.left)
    while len(node.orelse) == 1 and isinstance(node := node.orelse[0], ast.If):
        t = node.test
        if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq) \
                and ast.dump(t.left) == subject and isinstance(t.comparators[0], ast.Constant) \
                and isinstance(t.comparators[0].value, str) \
                and any(w in _TRAIN_WORDS for w in t.comparators[0].value.lower().split("_")):
            return True
    return False


def _only_evaluated(s: Script, call: ast.Call) -> bool:
    """The sampler is built in a loader helper (`def validation_dataloader(self, ...)`) whose every call the
    program loops over without a backward(): its batches are only evaluated."""
    functions = s.context(call).functions
    project = getattr(s, "project", None)
    if not functions or project is None:
        return False
    sites = project.calls_named(functions[-1])
    if not sites:
        return False
    for x, site in sites:
        loop = x.parents.get(id(site))
        if not (isinstance(loop, (ast.For, ast.AsyncFor)) and loop.iter is site) or any(
                isinstance(n, ast.Call) and terminal(n.func) == "backward" for b in loop.body for n in ast.walk(b)):
            return False
    return True


_TERMINATORS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _chosen_values(test: ast.AST) -> tuple[str, set[str], bool] | None:
    """(setting as written, the values the test names as written, True where the test passes for exactly those
    values; False where it passes for every other) for `args.dist == "ON"`, `mode != Mode.DDP`,
    `args.launcher in ("slurm", "pytorch")`; None for any other test."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, (ast.Name, ast.Attribute))):
        return None
    op, right = test.ops[0], test.comparators[0]

    def value(v: ast.AST) -> str | None:
        if isinstance(v, ast.Constant) and isinstance(v.value, (str, int)) and not isinstance(v.value, bool):
            return repr(v.value)
        return ast.unparse(v) if isinstance(v, ast.Attribute) and isinstance(v.value, (ast.Name, ast.Attribute)) else None
    if isinstance(op, (ast.Eq, ast.NotEq)):
        named = [value(right)]
    elif isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.Tuple, ast.List, ast.Set)) and right.elts:
        named = [value(e) for e in right.elts]
    else:
        return None
    if None in named:
        return None
    return ast.unparse(test.left), set(named), isinstance(op, (ast.Eq, ast.In))


def _flag_test(test: ast.AST) -> tuple[ast.AST, int]:
    """(the flag a test asks, +1 where the test holds when the flag is true, -1 where when it is false): `not ddp`
    is (ddp, -1); a flag compared with a bool is the flag itself, `opt.parallel == True` is (opt.parallel, +1),
    `opt.parallel is False` and `opt.parallel != True` are (opt.parallel, -1). Any other test is (test, +1)."""
    sign = 1
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, sign = test.operand, -1
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, (ast.Name, ast.Attribute)) \
            and isinstance(test.comparators[0], ast.Constant) and isinstance(test.comparators[0].value, bool) \
            and isinstance(test.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
        same = test.comparators[0].value is isinstance(test.ops[0], (ast.Eq, ast.Is))
        return test.left, sign if same else -sign
    return test, sign


@dataclass(frozen=True)
class Context:
    """Where a node sits: the strongest rank guard around it and the rank branches it is in."""

    level: int = NONE
    """NONE, LOCAL or GLOBAL: the strongest rank check that must pass for this code to run."""
    branches: tuple[tuple[int, str, int], ...] = ()
    """(id of the `if`, which branch, line of the `if`) for each rank-dependent branch, innermost last."""
    functions: tuple[str, ...] = ()
    """Names of the enclosing functions, outermost first."""
    scope: int = 0
    """id() of the innermost enclosing function (0 at module level)."""
    single: bool = False
    """Inside the single-process branch of a mode check (`if not args.distributed:`): one process runs it."""

    def guarded(self, kind: int, node: ast.AST, branch: str) -> Context:
        entry = (id(node), branch, getattr(node, "lineno", 0))
        return Context(max(self.level, kind), self.branches + (entry,), self.functions, self.scope, self.single)

    def alone(self) -> Context:
        return Context(self.level, self.branches, self.functions, self.scope, True)


class Script:
    """One parsed script plus the facts the rules share; build it once per file."""

    def __init__(self, tree: ast.Module, external_levels: dict[str, int] | None = None,
                 star_aliases: dict[str, str] | None = None, world_names: frozenset[str] = frozenset()) -> None:
        self.tree = tree
        self.world_names = world_names
        """Names the program gives init_process_group as world_size (lower case): `num_gpus = 1` makes one process."""
        self.nodes = list(ast.walk(tree))
        self.calls = [n for n in self.nodes if isinstance(n, ast.Call)]
        self.aliases = {**(star_aliases or {}), **self._import_aliases()}
        """Import aliases: the file's own, over the modules a `from helper import *` of a project file brings."""
        self._parents: dict[int, ast.AST] | None = None
        self.star_modules = [n.module for n in self.nodes if isinstance(n, ast.ImportFrom) and n.module
                             and any(a.name == "*" for a in n.names)]
        """Modules this file imports with `from m import *`."""
        self.external_levels = external_levels or {}
        self._rank_attributes = any(k.startswith("~") and "(" not in k for k in self.external_levels)
        """Some class of the program keeps the rank in an attribute (callsites._rank_attributes)."""
        """Guard levels of this file's functions at their call sites in other files of the project; `?callee`
        keys give the answer of a rank helper another file defines (see rank_helpers)."""
        self.rank_helpers: dict[str, int] = {}
        """Functions of this file that answer a rank question (`def is_primary(): return get_rank() == 0`, or a
        call of such a helper): name -> how their answer depends on the rank, read from their returns."""
        self._derive_rank_names()
        self.contexts: dict[int, Context] = {}
        self._analyse_functions()
        self.project = None
        """The Project this file belongs to (set by Project, which every lint run builds)."""
        self.path = ""
        modules = set(self.aliases.values())
        self.uses_ddpkit = any((m == "ddpkit" or m.startswith("ddpkit.")) and not m.startswith("ddpkit.lint")
                               for m in modules)
        """The script uses ddpkit's runtime (importing only ddpkit.lint, a tool, does not count)."""
        self.uses_ddp = any(self.qualname(n).endswith("DistributedDataParallel")
                            for n in self.nodes if isinstance(n, (ast.Name, ast.Attribute)))
        self.uses_torch_distributed = self.uses_ddp or any(
            (self.qualname(n).startswith("torch.distributed.") and terminal(n) not in QUERIES)
            or terminal(n) == "DistributedSampler" or self.call_name(n) == "init_process_group"
            for n in self.nodes if isinstance(n, (ast.Name, ast.Attribute, ast.Call))
        )
        self.distributed = self.uses_torch_distributed or self.uses_ddpkit or self.per_rank_functions is not None
        """Every rank runs this file: it uses torch.distributed (more than asking whether it is initialised),
        DDP, ddpkit or mp.spawn. A single-process evaluation script that only checks
        `dist.is_initialized()` is not distributed."""

    @property
    def parents(self) -> dict[int, ast.AST]:
        """id(node) -> its parent node, built on first use."""
        if self._parents is None:
            self._parents = {id(c): p for p in self.nodes for c in ast.iter_child_nodes(p)}
        return self._parents

    # ---- names -------------------------------------------------------------------------------
    def _import_aliases(self) -> dict[str, str]:
        aliases: dict[str, str] = {}
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        aliases[a.asname] = a.name
                    else:
                        head = a.name.split(".")[0]
                        aliases[head] = head
            elif isinstance(node, ast.ImportFrom) and (node.module or node.level):
                # `from .util import misc` and `from util import misc` both name the project's util.misc
                for a in node.names:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}" if node.module else a.name
        return aliases

    def qualname(self, node: ast.AST) -> str:
        """Dotted name with import aliases resolved (`dist.barrier` -> 'torch.distributed.barrier')."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return ""
        parts.append(self.aliases.get(node.id, node.id))
        name = ".".join(reversed(parts))
        # `from torch.multiprocessing.spawn import spawn`: the function is torch.multiprocessing.spawn itself
        return name[:-len(".spawn")] if name.endswith("multiprocessing.spawn.spawn") else name

    def call_name(self, node: ast.AST) -> str:
        """The terminal name of a call's callee ('' for anything that is not a call)."""
        return terminal(node.func) if isinstance(node, ast.Call) else ""

    def calls_named(self, *names: str) -> list[ast.Call]:
        """Calls of these names, also through a plain alias of the callable (`sampler = DistributedSampler`
        ... `sampler(data)`)."""
        aliases = {k for k, v in self.assignments if not k.startswith(".") and isinstance(v, (ast.Name, ast.Attribute))
                   and terminal(v) in names}
        return [c for c in self.calls if terminal(c.func) in names
                or aliases and isinstance(c.func, ast.Name) and c.func.id in aliases]

    def is_dist_collective(self, call: ast.Call) -> bool:
        """A torch.distributed collective, or one of mpi4py's (`MPI.COMM_WORLD.bcast(...)`): every rank must call it."""
        name = self.qualname(call.func)
        last = name.rsplit(".", 1)[-1]
        return name.startswith("torch.distributed.") and last in COLLECTIVES or (
            name.startswith("mpi4py.") and last.lower() in MPI_COLLECTIVES)

    # ---- rank-dependence --------------------------------------------------------------------
    def kind(self, expr: ast.AST | None) -> int:
        """How an expression depends on the rank: NONE, LOCAL or GLOBAL (see rank_name_kind)."""
        if isinstance(expr, ast.Name):
            # a parameter every call fills with a rank holds that rank, whatever its name says (`def train(rank)`
            # called as `train(local_rank)` holds the local rank)
            return self._parameter_flag(expr, "~") or self.derived.get(expr.id) or rank_name_kind(expr.id) \
                or self._parameter_flag(expr)
        if isinstance(expr, ast.Attribute):
            # `args.print_progress = rank == 0` in another file of the program: a flag read by attribute name
            # (not an option read off this file's parsed command line, `args.verb`, that the program never sets:
            # another file's `self.verb = ...` is another object's attribute of the same name)
            own = self.derived.get("." + expr.attr) or self._rank_attribute(expr)
            return own or (NONE if self.external_levels.get("@self=." + expr.attr) and self._parsed_option(expr)
                           else self.external_levels.get("=." + expr.attr, NONE)) or rank_name_kind(expr.attr)
        if isinstance(expr, ast.Call):
            name = terminal(expr.func)
            if name in ("int", "bool", "str") and expr.args:
                return self.kind(expr.args[0])
            if name in ("get", "getenv") and expr.args and isinstance(expr.args[0], ast.Constant):
                return rank_name_kind(str(expr.args[0].value))
            helper, named = self._helper_kind(expr.func), rank_name_kind(name)
            if helper is not None and isinstance(expr.func, ast.Name) and self.before_init(expr):
                return NONE  # `not dist.is_initialized() or get_rank() == 0` asked before the group exists: every process
            # the body answers for a helper the name does not describe; where both do, the weaker
            # (`is_local_master()` over a `__local_rank` the file also derives from the global rank)
            return named if helper is None else min(helper, named) if named else helper
        if isinstance(expr, ast.Subscript):
            key = expr.slice
            rewritten = self._items_rewritten(expr.value)
            if rewritten:
                return rewritten
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                # `cfg["chatty"] = rank == 0` somewhere in the program: see callsites._flag_levels
                return rank_name_kind(key.value) or self.external_levels.get(f"=[{key.value}]", NONE)
            return NONE
        if isinstance(expr, ast.Compare):
            held = self._held_by_some(expr)
            if held:
                return held
            # `writer is not None` where only some ranks hold a writer (`SummaryWriter() if rank == 0 else None`)
            # asks which rank this is
            if len(expr.ops) == 1 and isinstance(expr.ops[0], (ast.Is, ast.IsNot, ast.Eq, ast.NotEq)) \
                    and isinstance(expr.comparators[0], ast.Constant) and expr.comparators[0].value is None \
                    and isinstance(expr.left, (ast.Name, ast.Attribute)):
                key = expr.left.id if isinstance(expr.left, ast.Name) else "." + expr.left.attr
                if key in getattr(self, "rank_only", ()):
                    return self.derived.get(key, NONE)
                if isinstance(expr.left, ast.Name) and self._parameter_flag(expr.left):
                    return self._parameter_flag(expr.left)  # `add_summary(self.writer, ...)`: `writer is not None`
            # `rank == -1` / `rank is None` ask "are we distributed at all?", not "which rank am I?"
            if all(is_mode_sentinel(c) for c in expr.comparators) or distributed_mode(expr):
                return NONE  # `local_rank >= 0` too: true on every rank of a distributed run
            return max(self.kind(e) for e in (expr.left, *expr.comparators))
        if isinstance(expr, ast.BoolOp):
            if isinstance(expr.op, ast.And):
                return max(self.kind(v) for v in expr.values)
            # `not distributed or rank == 0` is rank 0 of a distributed run, but in
            # `not args.multiprocessing_distributed or rank == 0` the left arm passes on every rank
            # (`cfg.NUM_GPUS == 1 or get_rank() % cfg.NUM_GPUS == 0` too: a one-process arm beside a rank arm)
            ranked = any(self.kind(v) for v in expr.values)
            kinds = [self.kind(v) for v in expr.values if (run_sense(v) if ranked else distributed_mode(v)) >= 0
                     and not (ranked and self._unlaunched(v))]
            return min(kinds, default=NONE)
        if isinstance(expr, ast.UnaryOp):
            return self.kind(expr.operand)
        if isinstance(expr, ast.BinOp):
            if isinstance(expr.op, ast.Mod) and self.kind(expr.left) == GLOBAL and self._gpus_per_node(expr.right):
                # `rank % ngpus_per_node` with `ngpus_per_node = torch.cuda.device_count()`: the rank within the
                # node (ranks numbered node by node), so `rank % ngpus_per_node == 0` holds on every node
                return LOCAL
            if self._node_offset(expr):
                return GLOBAL
            return max(self.kind(expr.left), self.kind(expr.right))
        if isinstance(expr, ast.IfExp):
            # `SummaryWriter() if rank == 0 else None`: the value exists on the ranks the test picks, so
            # testing it later (`if writer is None: continue`) is a rank check
            if any(isinstance(arm, ast.Constant) and arm.value is None for arm in (expr.body, expr.orelse)) \
                    and distributed_mode(expr.test) == 0:
                return max(self.kind(expr.body), self.kind(expr.orelse), self.kind(expr.test))
            if all(isinstance(arm, ast.Constant) and isinstance(arm.value, bool) for arm in (expr.body, expr.orelse)) \
                    and expr.body.value != expr.orelse.value:
                return self.kind(expr.test)  # `True if rank == 0 else False`: the test itself, as a flag
            return max(self.kind(expr.body), self.kind(expr.orelse))
        if isinstance(expr, ast.NamedExpr):
            return self.kind(expr.value)
        return NONE

    def _parsed_option(self, expr: ast.Attribute) -> bool:
        """`args.verb` where this file binds `args` only to `parser.parse_args()` (or to a function of its own that
        returns that) and never assigns `args.verb`: the command line's value, the same on every rank."""
        if not isinstance(expr.value, ast.Name):
            return False
        name = expr.value.id
        own = {d.name: d for d in self.nodes if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}

        def parsed(v: ast.AST | None, depth: int = 3, within: frozenset[str] = frozenset()) -> bool:
            # `parser.parse_args()`, or a function of this file that returns it (`args = get_parser()`)
            if isinstance(v, ast.Name) and depth:
                return all(parsed(w, depth - 1, within) for k, w in self.assignments if k == v.id
                           and not (isinstance(w, ast.Call) and terminal(w.func) in within))
            if not isinstance(v, ast.Call):
                return False
            if terminal(v.func) == "parse_args":
                return True
            d = own.get(v.func.id) if isinstance(v.func, ast.Name) and depth else None
            returns = [r.value for r in own_returns(d)] if d is not None else []
            return bool(returns) and all(parsed(r, depth - 1, within | {d.name}) for r in returns)

        values = [v for k, v in self.assignments if k == name]
        if not values or not all(parsed(v) for v in values):
            return False
        return not any(isinstance(t, ast.Attribute) and t.attr == expr.attr for n in self.nodes
                       if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))

    def _node_offset(self, expr: ast.BinOp) -> bool:
        """`local_rank + node_index * gpus_per_node` (either order): the local rank moved past the ranks of the
        nodes before this one, a product of two values that are no rank, is the global rank (as
        `args.local_rank += args.node_index * args.gpu_per_node` makes it)."""
        if not isinstance(expr.op, ast.Add):
            return False
        for local, offset in ((expr.left, expr.right), (expr.right, expr.left)):
            if self.kind(local) == LOCAL and isinstance(offset, ast.BinOp) and isinstance(offset.op, ast.Mult) \
                    and not self.kind(offset.left) and not self.kind(offset.right) \
                    and not any(isinstance(x, ast.Constant) for x in (offset.left, offset.right)):
                return True
        return False

    def _gpus_per_node(self, expr: ast.AST) -> bool:
        """`torch.cuda.device_count()`, or a name or attribute every store of which in this file is one: the GPUs
        of this machine."""
        if isinstance(expr, ast.Call):
            return self.qualname(expr.func) == "torch.cuda.device_count"
        if not isinstance(expr, (ast.Name, ast.Attribute)):
            return False
        stores = [n.value for n in self.nodes if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                  for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                  if isinstance(target, (ast.Name, ast.Attribute)) and terminal(target) == terminal(expr)]
        return bool(stores) and all(isinstance(v, ast.Call) and self.qualname(v.func) == "torch.cuda.device_count"
                                    for v in stores)

    def _unlaunched(self, test: ast.AST) -> bool:
        """`rank is None` where the program starts its process group only where the rank is not None (see
        callsites._unlaunched_values): true in the run without a process group, on no rank of a distributed one."""
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.Eq))):
            return False
        sides = [test.left, test.comparators[0]]  # (`None == rank` too)
        names = [x for x in sides if isinstance(x, (ast.Name, ast.Attribute))]
        return len(names) == 1 and any(isinstance(x, ast.Constant) and x.value is None for x in sides) \
            and self.external_levels.get("0:" + terminal(names[0]), 0) > 0

    def _items_rewritten(self, holder: ast.AST) -> int:
        """The rank check every item of a dict is, where a loop over the dict's own keys sets each item to one
        (`for k, v in self.flags.items(): self.flags[k] = v and self.enable`, `enable` a rank flag): any item
        read later (`self.flags["writer"]`) is that check."""
        if not isinstance(holder, (ast.Name, ast.Attribute)):
            return NONE
        written = ast.unparse(holder)
        loops = self.__dict__.get("_item_loops")
        if loops is None:  # (the loops that assign an item of what they walk, found once per file)
            loops = self._item_loops = [n for n in self.nodes if isinstance(n, ast.For) and any(
                isinstance(b, ast.Assign) and isinstance(b.targets[0], ast.Subscript) for b in n.body)]
        found = NONE
        for loop in loops:
            if not (isinstance(loop, ast.For) and isinstance(loop.iter, (ast.Call, ast.Name, ast.Attribute))):
                continue
            walked = loop.iter.func.value if isinstance(loop.iter, ast.Call) and isinstance(loop.iter.func, ast.Attribute) \
                and loop.iter.func.attr in ("items", "keys") else loop.iter
            if ast.unparse(walked) != written:
                continue
            target = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) and loop.target.elts else loop.target
            if not isinstance(target, ast.Name):
                continue
            for stmt in loop.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Subscript) \
                        and ast.unparse(stmt.targets[0].value) == written and isinstance(stmt.targets[0].slice, ast.Name) \
                        and stmt.targets[0].slice.id == target.id and isinstance(stmt.value, ast.BoolOp) \
                        and isinstance(stmt.value.op, ast.And):
                    found = max(found, max(self.kind(v) for v in stmt.value.values))
        return found

    def _rank_attribute(self, use: ast.Attribute) -> int:
        """The rank `self.device` holds in a method of a class whose constructor every call gives the rank
        (callsites._rank_attributes)."""
        if not (self._rank_attributes and isinstance(use.value, ast.Name) and use.value.id == "self"):
            return NONE
        node: ast.AST = use
        while id(node) in self.parents:
            node = self.parents[id(node)]
            if isinstance(node, ast.ClassDef):
                return self.external_levels.get(f"~{node.name}.{use.attr}", NONE)
        return NONE

    def _parameter_flag(self, use: ast.Name, mark: str = "=") -> int:
        """The rank check a parameter is where every call gives it one (see callsites._flag_parameters); with
        `mark` "~", the rank a parameter holds where every call gives it the rank (callsites._rank_parameters)."""
        if not any(key.startswith(mark) and key.endswith(")") for key in self.external_levels):
            return NONE
        node = use
        while id(node) in self.parents:
            node = self.parents[id(node)]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return self.external_levels.get(f"{mark}{node.name}({use.id})", NONE)
        return NONE

    def _starts_group_arm(self, node: ast.AST) -> int:
        """+1 for `if self.flag_ddp:` where some `if self.flag_ddp: ... else: ...` of this file starts the process
        group in that arm and not in the other (init_process_group, directly or through a function of this file
        that calls it): the flag says the run is distributed, so the other arm of every test of it is one
        process's (the `elif flag_dp:` DataParallel arm, the single-GPU `else:`); -1 for `if not flag:`, and for a
        test whose arm wraps the model in nn.DataParallel and not DDP (`if n_gpu > 1:`). An `if` with no `else`
        whose arm starts the group counts too, and an attribute test another file of the program reads so
        (`if cfg.MODEL.DIST_TRAIN:`, written the same) is read so here. Read from what the arm does, not from the
        flag's name."""
        if not isinstance(node, ast.If):
            return 0
        return self.group_sense(node.test)

    def group_sense(self, test: ast.AST) -> int:
        """+1 where `test` being true means the run starts the process group, -1 where it means one process, read
        from what the program does under it (see _starts_group_arm), else 0."""
        test, sign = _flag_test(test)
        if not isinstance(test, (ast.Name, ast.Attribute, ast.Compare)):
            return 0
        flags = getattr(self, "_mode_flags", None)
        if flags is None:
            flags = self._mode_flags = self._group_flags()
        chosen = _chosen_values(test)
        if chosen is not None and chosen[0] in self._mode_values:
            # `if args.dist == "OFF":` where the group starts only under `args.dist == "ON"`: the values a test lets
            # through either all start the group (+1), or none does (-1: one process runs the arm)
            started = self._mode_values[chosen[0]]
            if not chosen[1] & started:
                return -sign if chosen[2] else sign
            if chosen[1] <= started and len(started) == 1:
                return sign if chosen[2] else -sign
            return 0
        written = ast.unparse(test)
        if written not in flags and isinstance(test, ast.Attribute):
            # `if cfg.MODEL.DIST_TRAIN:` in processor.py, where train.py starts the group under the same test
            return sign * self.external_levels.get("!" + written, 0)
        return sign * flags.get(written, 0)

    def _group_flags(self) -> dict[str, int]:
        """{test as written: +1 where its truth means a distributed run, -1 where it means one process} (see
        _starts_group_arm)."""
        starters = {d.name for d in self.defs if any(
            isinstance(c, ast.Call) and terminal(c.func) == "init_process_group" for c in ast.walk(d))}

        def calls(stmts: list[ast.stmt]):  # not inside a nested `if` (`elif args.distributed:` decides there)
            todo = list(stmts)
            while todo:
                n = todo.pop()
                if isinstance(n, ast.Call):
                    yield n
                if not isinstance(n, ast.If):
                    todo.extend(ast.iter_child_nodes(n))

        def starts(stmts: list[ast.stmt]) -> bool:
            return any(terminal(c.func) == "init_process_group" or terminal(c.func) in starters
                       and (isinstance(c.func, ast.Name) or isinstance(c.func.value, ast.Name)
                            and c.func.value.id == "self") for c in calls(stmts))
        found: dict[str, int] = {}
        values: dict[str, set[str]] = {}
        covered: set[int] = set()
        for n in self.nodes:
            chosen = _chosen_values(n.test) if isinstance(n, ast.If) else None
            if chosen is not None and starts(n.body):
                values.setdefault(chosen[0], set()).update(chosen[1])
                covered.update(id(c) for c in ast.walk(ast.Module(body=n.body, type_ignores=[])))
        # `if args.dist == "ON": init_process_group(...)`: every start of the group in this file under such a test
        # (directly, or in a function every call of which is) makes any other value of the setting a one-process
        # run (see _starts_group_arm)
        starts_here = [c for c in self.calls if terminal(c.func) == "init_process_group"]
        for d in self.defs:
            if d.name in starters and any(isinstance(c, ast.Call) and terminal(c.func) == "init_process_group"
                                          for c in ast.walk(d)):
                called = [c for c in self.calls if terminal(c.func) == d.name]
                if called and all(id(c) in covered for c in called):
                    covered.update(id(c) for c in ast.walk(d))
        self._mode_values = values if values and all(id(c) in covered for c in starts_here) else {}
        for n in self.nodes:
            if not isinstance(n, ast.If):
                continue
            test, sign = _flag_test(n.test)
            if isinstance(test, (ast.Name, ast.Attribute)) and n.orelse:
                body, other = starts(n.body), starts(n.orelse)
                if body != other:
                    found[ast.unparse(test)] = sign if body else -sign
            elif isinstance(test, (ast.Name, ast.Attribute)) and starts(n.body):
                found.setdefault(ast.unparse(test), sign)  # `if cfg.DIST_TRAIN: init_process_group(...)`, no else
            # `if n_gpu > 1: model = nn.DataParallel(model)`: one process drives the GPUs where the test holds
            wraps = {terminal(c.func) for c in calls(n.body)}
            if isinstance(test, (ast.Name, ast.Attribute, ast.Compare)) and "DataParallel" in wraps \
                    and "DistributedDataParallel" not in wraps and not starts(n.body):
                found.setdefault(ast.unparse(test), -sign)
        return found

    def test_kind(self, test: ast.AST) -> int:
        """kind() of a condition, where `if cfg.mode.gpu:` asks whether the run uses GPUs: the truth of an attribute
        named like a GPU index that nothing in the file assigns (a config switch) does not pick ranks."""
        bare = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else test
        if isinstance(bare, ast.Attribute) and is_gpu_index(bare.attr) \
                and not any(key == "." + bare.attr for key, _ in self.assignments):
            return NONE
        return self.kind(test)

    def _helper_kind(self, func: ast.AST) -> int | None:
        """What calling a project rank helper answers (None: the callee is no helper the program defines)."""
        if isinstance(func, ast.Name) and func.id in self.rank_helpers:
            return self.rank_helpers[func.id]
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls") \
                and func.attr in self.rank_helpers:
            return self.rank_helpers[func.attr]
        return self.external_levels.get("?" + self.qualname(func))

    def before_init(self, call: ast.Call) -> bool:
        """`call` runs a helper of this file that answers True without a process group (`return not
        dist.is_initialized() or dist.get_rank() == 0`), above every init_process_group of the function it is in (and
        that function starts the group): there it is True on every process."""
        helpers = [d for d in self.nodes if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                   and d.name == call.func.id]
        if len(helpers) != 1 or not any(
                isinstance(r.value, ast.BoolOp) and isinstance(r.value.op, ast.Or) and any(
                    isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.Not) and isinstance(v.operand, ast.Call)
                    and terminal(v.operand.func) == "is_initialized" for v in r.value.values)
                for r in own_returns(helpers[0]) if r.value is not None):
            return False
        node = call
        while id(node) in self.parents and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node = self.parents[id(node)]
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
        inits = [c.lineno for c in ast.walk(node) if isinstance(c, ast.Call) and terminal(c.func) == "init_process_group"]
        return bool(inits) and call.lineno < min(inits)

    def _held_by_some(self, test: ast.Compare) -> int:
        """`trainer.writer is not None` where only rank-checked calls give the constructor a writer (see
        Project._constructor_levels): the test picks ranks."""
        if len(test.ops) != 1 or not isinstance(test.ops[0], (ast.Is, ast.IsNot)) \
                or not (isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None) \
                or not isinstance(test.left, ast.Attribute):
            return NONE
        return getattr(self, "external_levels", {}).get("." + test.left.attr, NONE)

    def _derive_rank_names(self) -> None:
        """Set self.derived: names assigned from the rank (`r = dist.get_rank()`, `main = r == 0`), to a fixed point."""
        pairs: list[tuple[str, ast.AST]] = []
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    pairs.extend(_target_pairs(target, node.value))
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                pairs.extend(_target_pairs(node.target, node.value))
            elif isinstance(node, ast.AugAssign):  # `seed += rank`: the new value depends on both
                pairs.extend(_target_pairs(node.target, ast.BinOp(node.target, node.op, node.value)))
        # `rk, tt = main()` where main() ends `return dist.get_rank(), total_time` (or `return 0, total_time` when
        # not distributed): each name holds what that position of the function's returns holds
        own = {d.name: d for d in self.nodes if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for node in self.nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Tuple) \
                    and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) \
                    and node.value.func.id in own:
                width = len(node.targets[0].elts)
                returns = [r.value for r in own_returns(own[node.value.func.id])]
                if returns and all(isinstance(r, ast.Tuple) and len(r.elts) == width for r in returns):
                    for r in returns:
                        pairs.extend(_target_pairs(node.targets[0], r))
        self.assignments = pairs
        """(name, value) of every assignment: 'x' for `x = v`, '.x' for `self.x = v`, tuples unpacked."""
        self._bindings: dict[str, list[tuple[ast.AST, ast.AST | None]]] = {}
        """Plain name -> (assigning statement, value or None where unknown) for each assignment, in source order."""
        for node in self.nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                value = None if isinstance(node, ast.AugAssign) else node.value
                for target in targets:
                    known = dict(_target_pairs(target, value)) if value is not None else {}
                    for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                        self._bindings.setdefault(name, []).append((node, known.get(name)))
        for found in self._bindings.values():
            found.sort(key=lambda b: (b[0].lineno, b[0].col_offset))
        self.global_rank_names: set[str] = set()
        """Names holding the global rank itself (`rank = dist.get_rank()`), not a value derived from it."""
        for _ in range(4):
            found = {key for key, value in pairs if self.is_global_rank(value)}
            if found <= self.global_rank_names:
                break
            self.global_rank_names |= found
        self.derived = {}
        seeds = spawn_index_names(self)
        # `init_process_group(..., rank=rank)`: what a process joins the group as is its global rank, however it
        # was computed (`rank = node_id * gpus_per_node + gpu` reads like a local rank by its parts)
        joined = {(k.value.id if isinstance(k.value, ast.Name) else "." + k.value.attr) for c in self.calls if terminal(c.func) == "init_process_group"
                  for k in c.keywords if k.arg == "rank" and isinstance(k.value, (ast.Name, ast.Attribute))}
        for _ in range(8):
            derived: dict[str, int] = dict(seeds)
            for key, value in pairs:
                k = self.kind(value)
                if k:
                    derived[key] = GLOBAL if key in joined else max(derived.get(key, NONE), k)
            helpers = find_rank_helpers(self)
            if derived == self.derived and helpers == self.rank_helpers:
                break
            self.derived, self.rank_helpers = derived, helpers
        self.rank_only: set[str] = {
            key for key, value in pairs if isinstance(value, ast.IfExp) and self.derived.get(key)
            and any(isinstance(arm, ast.Constant) and arm.value is None for arm in (value.body, value.orelse))
            and not self.kind(value.body) and not self.kind(value.orelse)}
        """Names of a value only some ranks hold (None on the others): testing it against None is a rank check."""
        # `writer = None` ... `if rank == 0: writer = SummaryWriter()`: a value only some ranks hold
        nones = {key for key, value in pairs if isinstance(value, ast.Constant) and value.value is None}
        for node in self.nodes:
            if isinstance(node, ast.If) and nones:
                k = self.kind(node.test)
                if k and distributed_mode(node.test) == 0:
                    # (also under an `if` inside it: `if not cfg.no_dis: self.dis_writer = SummaryWriter(...)`;
                    # not where the `None` is set in the same arm: those ranks alone hold either value)
                    inside = {id(n) for b in node.body for n in ast.walk(b)}
                    for stmt in (n for b in node.body for n in _statements(b)):
                        if isinstance(stmt, ast.Assign):
                            for target in stmt.targets:
                                for key, _ in _target_pairs(target, stmt.value):
                                    if key in nones and not self.derived.get(key) and any(
                                            id(v) not in inside for k2, v in pairs if k2 == key
                                            and isinstance(v, ast.Constant) and v.value is None):
                                        self.derived[key] = k
                                        self.rank_only.add(key)
        # `flag = True` ... `if dist.get_rank() != 0: flag = False`: a flag the rank decides (get_ddp_save_flag's
        # `return flag`), read like `flag = rank == 0`
        flags: dict[str, set[bool]] = {}
        for key, value in pairs:
            if isinstance(value, ast.Constant) and isinstance(value.value, bool):
                flags.setdefault(key, set()).add(value.value)
        flagged = False
        self.rank_flags: set[str] = set()
        """Attributes ('.log') this file sets True on some ranks and False on the others (`if rank % n == 0:
        args.log = True` / `else: args.log = False`): a rank check wherever the program reads them."""
        for node in self.nodes if flags else ():
            if isinstance(node, ast.If):
                k = self.kind(node.test)
                if k and distributed_mode(node.test) == 0:
                    for stmt in (*node.body, *node.orelse):
                        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant):
                            for target in stmt.targets:
                                key = target.id if isinstance(target, ast.Name) else \
                                    "." + target.attr if isinstance(target, ast.Attribute) else None
                                if len(flags.get(key, ())) == 2 and not self.derived.get(key):
                                    self.derived[key] = k
                                    flagged = True
                                    if key.startswith("."):
                                        self.rank_flags.add(key)
        if flagged:
            self.rank_helpers = find_rank_helpers(self)

    def local_values(self, name: str, within: ast.AST) -> list[ast.AST]:
        """What `name` is assigned in the same function as `within` (module level for module code)."""
        scope = self.context(within).scope
        return [value for stmt, value in self._bindings.get(name, ())
                if value is not None and self.context(stmt).scope == scope]

    def local_assignments(self, name: str, within: ast.AST) -> list[tuple[ast.AST, ast.AST | None]]:
        """(assigning statement, value or None) for each assignment of `name` in the same function as `within`."""
        scope = self.context(within).scope
        return [(stmt, value) for stmt, value in self._bindings.get(name, ()) if self.context(stmt).scope == scope]

    def reaching_values(self, use: ast.Name) -> list[ast.AST | None]:
        """The values (None: not a plain value) the assignments of `use`'s own function that may reach it give the
        name, nearest first: back to the last one that always runs before it (`dev_sampler = RandomSampler(...)`
        right above the loader, not the `DistributedSampler` of another branch further up); [] for none."""
        parents = self.parents
        path = path_up(use, parents)
        scope = scope_of(use, parents)
        found: list[ast.AST | None] = []
        for stmt, value in sorted(((st, v) for st, v in self._bindings.get(use.id, ())
                                   if (st.end_lineno, st.end_col_offset) <= (use.lineno, use.col_offset)
                                   and id(st) not in path and scope_of(st, parents) is scope),
                                  key=lambda a: (a[0].lineno, a[0].col_offset), reverse=True):
            how = relation(stmt, path, parents)
            if how != "exclusive":
                found.append(value)
            if how == "before":
                break
        return found

    def is_global_rank(self, expr: ast.AST | None) -> bool:
        """True for the global rank as such: get_rank(), os.environ['RANK'], int() of them, a name holding it."""
        if isinstance(expr, ast.Name):
            if expr.id in self.global_rank_names:
                return self._reaches_global(expr)
            project = getattr(self, "project", None)  # (set once the Project is built)
            return project is not None and project.global_parameter(self, expr)
        if isinstance(expr, ast.Attribute):
            return "." + expr.attr in self.global_rank_names
        if isinstance(expr, ast.Call):
            name = terminal(expr.func)
            if name in ("int", "str") and expr.args:
                return self.is_global_rank(expr.args[0])
            if name in ("get", "getenv") and expr.args and isinstance(expr.args[0], ast.Constant):
                return expr.args[0].value in GLOBAL_ENV
            return name in GLOBAL_CALLS
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
            return expr.slice.value in GLOBAL_ENV
        return False

    def _reaches_global(self, use: ast.Name) -> bool:
        """Whether an assignment of the global rank to this name can reach this use: the assignments in the
        same function before it are read newest first, skipping those in the other branch of an `if` the
        use is in (`if platform == "a": r = get_rank() elif ...: r = hvd.local_rank()`), and stopping at one
        that always runs before the use. A name this function never assigns keeps its name-level answer."""
        parents = self.parents
        if id(use) not in parents:
            return True  # a node made up by a check: no position to follow
        scope = scope_of(use, parents)
        where = (use.lineno, use.col_offset)
        path = path_up(use, parents)
        candidates = [(stmt, value) for stmt, value in self._bindings.get(use.id, ())
                      if (stmt.end_lineno, stmt.end_col_offset) <= where and id(stmt) not in path
                      and scope_of(stmt, parents) is scope]
        if not candidates:
            if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) and scope_of(scope, parents) is None \
                    and use.id not in local_names(scope) and not any(
                        isinstance(n, ast.Global) and use.id in n.names for n in self.nodes):
                # a module function reading a name it never binds reads the module's: `local_rank` from
                # LOCAL_RANK at the top, not another function's own `local_rank = get_rank()`
                held = [value for stmt, value in self._bindings.get(use.id, ()) if scope_of(stmt, parents) is None]
                if held and all(value is not None for value in held):
                    return any(self.is_global_rank(value) for value in held)
            # a parameter every call in the program fills with the local rank (`train(local_rank)` of
            # `def train(rank)`) is the local rank, whatever its name says
            return self._parameter_flag(use, "~") != LOCAL
        reached = False
        for stmt, value in reversed(candidates):
            how = relation(stmt, path, parents)
            if how == "exclusive":
                continue
            if value is None:
                value = self._returned_into(stmt, use.id)
            if value is not None and self.is_global_rank(value):
                return True
            if how == "before":
                return False
            reached = True
        return not reached  # only other branches assign it here: the value comes from outside

    def _returned_into(self, stmt: ast.AST, name: str) -> ast.AST | None:
        """`rank, world_size, device = setup()` of a function of this file with one return, `return rank,
        world_size, device`: what that return puts at `name`'s place (read in that function), else None."""
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call)):
            return None
        own = {d.name: d for d in self.defs}
        returned = _single_return(own, stmt.value)
        return None if returned is stmt.value else dict(_target_pairs(stmt.targets[0], returned)).get(name)

    # ---- contexts --------------------------------------------------------------------------
    def in_loop(self, node: ast.AST) -> bool:
        """A `for`/`while` loop of the node's own function (or module code) runs it."""
        while id(node) in self.parents:
            node = self.parents[id(node)]
            if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
                return True
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                return False
        return False

    def context(self, node: ast.AST) -> Context:
        return self.contexts.get(id(node), Context())

    def _analyse_functions(self) -> None:
        """Walk the tree until the guard level of every function (from its call sites) is stable."""
        defs = [n for n in self.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        names = {d.name for d in defs}
        self.defs: list[ast.FunctionDef | ast.AsyncFunctionDef] = defs
        self.function_names = names
        refs = [n for n in self.nodes if _references(n, names)]
        # `state.save(f)` on an object of a class this file defines once, whose method nothing else here names:
        # those calls are its call sites (precision: they only add a guard to a method that had no call site)
        methods = [d.name for d in defs if d.args.args and d.args.args[0].arg == "self"]
        lone = {m for m in methods if methods.count(m) == 1 and [d.name for d in defs].count(m) == 1} \
            - {terminal(r) for r in refs}
        refs += [c.func for c in self.calls if isinstance(c.func, ast.Attribute) and c.func.attr in lone
                 and isinstance(c.func.value, ast.Name) and c.func.value.id not in self.aliases
                 and c.func.value.id not in ("self", "cls")]
        # `save(model, optimizer, path, config)` of `def save(model, optimizer, path, config, score)`: the call
        # raises TypeError before the body runs, so it is no call site
        refs = [r for r in refs if not (isinstance(self.parents.get(id(r)), ast.Call) and self.parents[id(r)].func is r
                                        and isinstance(r, ast.Name) and misses_required(self.parents[id(r)], [
                                            d for d in defs if d.name == r.id]))]
        self.function_level: dict[str, int] = {}
        self.function_single: set[str] = set()
        """Functions called only from single-process branches (`else: train_single(...)` of `if args.distributed:`)."""
        self.decorator_levels: dict[str, int] = {}
        """Decorators defined in this file -> the rank check under which their wrapper calls the wrapped function."""
        for _ in range(8):
            self.contexts = {}
            self._block(self.tree.body, Context())
            ifs = {id(n): self.context(n) for n in self.nodes if isinstance(n, ast.If)}
            rank_ifs = {id(n): n for n in self.nodes if isinstance(n, ast.If)}
            levels: dict[str, int] = dict(self.external_levels)
            single: dict[str, bool] = {}
            sides: dict[str, set[tuple[int, str]]] = {}
            for ref in refs:
                name = terminal(ref)
                level = self.context(ref).level
                if not self.context(ref).single:  # (a call in a single-process branch is one process's)
                    levels[name] = min(levels.get(name, GLOBAL), level)
                if self.context(ref).branches:
                    sides.setdefault(name, set()).add(self.context(ref).branches[-1][:2])
                single[name] = single.get(name, True) and self.context(ref).single
                call = self.parents.get(id(ref))
                for param in optional_parameters([d for d in defs if d.name == name]):
                    if not (isinstance(call, ast.Call) and call.func is ref) or passes(call, defs, name, param):
                        key = f"{name}({param})"  # the guard of the calls that pass this optional parameter
                        levels[key] = min(levels.get(key, GLOBAL), level)
                for param in switch_parameters([d for d in defs if d.name == name]):
                    if not (isinstance(call, ast.Call) and call.func is ref and switched_on(call, defs, name, param)):
                        key = f"{name}(!{param})"  # the guard of the calls that leave this switch off
                        levels[key] = min(levels.get(key, GLOBAL), level)
            for name, seen in sides.items():
                # `if rank == 0: run(writer) else: run(None)`: the two calls together run it on every rank
                for check in {c for c, side in seen if side == "body" and (c, "else") in seen}:
                    levels[name] = min(levels[name], ifs[check].level)
                # so do `if rank == 0: build()` and, further on, `if rank != 0: build()`
                tests = {(c, b): rank_side(rank_ifs[c].test, b) for c, b in seen if c in rank_ifs}
                for (c, b), side in tests.items():
                    for (other, b2), side2 in tests.items():
                        if side is not None and side2 == (side[0], not side[1]):
                            levels[name] = min(levels[name], max(ifs[c].level, ifs[other].level))
            single_names = {n for n, alone in single.items() if alone}
            decorators = self._decorator_levels(defs)
            if levels == self.function_level and single_names == self.function_single \
                    and decorators == self.decorator_levels:
                break
            self.function_level, self.function_single = levels, single_names
            self.decorator_levels = decorators
        self.per_rank_functions = self._spawned_functions(defs)

    def _block(self, stmts: list[ast.stmt], ctx: Context) -> None:
        before_first: Context | None = None
        for stmt in stmts:
            k = self.test_kind(stmt.test) if isinstance(stmt, ast.If) and not stmt.orelse else NONE
            barrier = k and any(terminal(n.func) == "barrier" for n in ast.walk(stmt) if isinstance(n, ast.Call))
            if barrier and before_first is not None:
                ctx, before_first = before_first, None
                self._visit(stmt, ctx)
                continue
            self._visit(stmt, ctx)
            if isinstance(stmt, ast.Assert) and distributed_mode(stmt.test) < 0 or isinstance(stmt, ast.If) \
                    and not stmt.orelse and distributed_mode(stmt.test) > 0 and isinstance(stmt.body[-1], ast.Raise):
                # `assert local_rank == -1, "no DDP for --evolve"` (or `if distributed: raise ...`): one process
                # runs the rest of the block
                ctx = ctx.alone()
            elif isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.body[-1], _TERMINATORS) \
                    and presence_test(stmt.test)[1] == "else" and ctx.functions and self.function_level.get(
                        f"{ctx.functions[-1]}({presence_test(stmt.test)[0]})", NONE) > ctx.level:
                # `if model is None: return load(...)`: the rest runs for the calls that pass a model
                passed = self.function_level.get(f"{ctx.functions[-1]}({presence_test(stmt.test)[0]})", NONE)
                ctx = Context(passed, ctx.branches, ctx.functions, ctx.scope, ctx.single)
            elif isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.body[-1], _TERMINATORS) \
                    and isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.Or) \
                    and max(self.kind(v) for v in stmt.test.values):
                # `if rank != 0 or epoch % freq: return`: the rest runs only where every arm is false, so a rank
                # arm guards it whatever the other arms say
                ctx = ctx.guarded(max(self.kind(v) for v in stmt.test.values), stmt, "after")
            elif k and isinstance(stmt.body[-1], _TERMINATORS) and not (
                    isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.And)
                    and any(not self.kind(v) and run_sense(v) <= 0 for v in stmt.test.values)):
                # `if rank != 0: return` guards everything after it in the same block; `if n_gpus == 1 and
                # rank != 0: raise` stops only when the other condition holds too: the rest runs on every rank.
                # An arm true in every multi-process run (`dist.is_initialized() and get_rank() != 0`) stops
                # every rank but 0 there.
                ctx = ctx.guarded(k, stmt, "after")
            elif barrier:
                # `if rank != 0: barrier()` ... `if rank == 0: barrier()`: rank 0 runs the code in
                # between first (and e.g. writes a cache), the others after it; treat it as guarded.
                before_first = ctx
                ctx = Context(max(ctx.level, k), ctx.branches, ctx.functions, ctx.scope, ctx.single)

    def _visit(self, node: ast.AST, ctx: Context) -> None:
        self.contexts[id(node)] = ctx
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for child in (*node.decorator_list, *node.args.defaults, *node.args.kw_defaults):
                if child is not None:
                    self._visit(child, ctx)
            decorated = max((self.decorator_guard(d) for d in node.decorator_list), default=NONE)
            level = max(ctx.level, decorated, self.function_level.get(node.name, NONE),
                        self.external_levels.get(f"def@{node.lineno}:{node.col_offset}", NONE))
            self._block(node.body, Context(level, (), ctx.functions + (node.name,), id(node),
                                           ctx.single or node.name in self.function_single
                                           or f"1@{node.lineno}:{node.col_offset}" in self.external_levels))
            return
        if isinstance(node, (ast.If, ast.IfExp)):
            self._visit(node.test, ctx)
            k = self.test_kind(node.test)
            body_ctx = ctx.guarded(k, node, "body") if k else ctx
            else_ctx = ctx.guarded(k, node, "else") if k else ctx
            given, branch = presence_test(node.test)
            passed = self.function_level.get(f"{ctx.functions[-1]}({given})", NONE) if given and ctx.functions else NONE
            if passed > ctx.level:
                # `if model is not None: torch.save(...)` in a helper whose calls that pass a model all sit
                # under a rank check (the others only load): this branch has their guard
                raised = Context(passed, ctx.branches, ctx.functions, ctx.scope, ctx.single)
                body_ctx, else_ctx = (raised, else_ctx) if branch == "body" else (body_ctx, raised)
            off = self.function_level.get(f"{ctx.functions[-1]}(!{given})", NONE) if given and ctx.functions else NONE
            if off > ctx.level:
                # `if save_cur: ... else: print(...)` in a helper whose every call that leaves save_cur off sits
                # under a rank check (the every-rank call passes `save_cur=True`): the other branch has their guard
                raised = Context(off, ctx.branches, ctx.functions, ctx.scope, ctx.single)
                body_ctx, else_ctx = (body_ctx, raised) if branch == "body" else (raised, else_ctx)
            sense = distributed_mode(node.test) or (self._starts_group_arm(node) if not k else 0) or (
                self.external_levels.get(f"^{node.lineno}:{node.col_offset}", 0) if not k else 0)
            if sense:
                body_ctx, else_ctx = (body_ctx.alone(), else_ctx) if sense < 0 else (body_ctx, else_ctx.alone())
            if isinstance(node, ast.If) and "__name__" not in {n.id for n in ast.walk(node.test)
                                                               if isinstance(n, ast.Name)}:
                # `print("no launcher: one process"); world_size = 1`: a branch that makes the run one process
                # is that process's alone (not the `__main__` block, which every run goes through)
                body_ctx, else_ctx = (c.alone() if _turns_single(stmts, self.world_names) else c
                                      for c, stmts in ((body_ctx, node.body), (else_ctx, node.orelse)))
            if isinstance(node, ast.If):
                self._block(node.body, body_ctx)
                self._block(node.orelse, else_ctx)
            else:
                self._visit(node.body, body_ctx)
                self._visit(node.orelse, else_ctx)
            return
        if isinstance(node, ast.BoolOp):
            for i, value in enumerate(node.values):
                self._visit(value, ctx)
                k = self.kind(value)
                if k:  # `rank == 0 and print(...)`
                    ctx = ctx.guarded(k, node, f"operand{i}")
            return
        for value in ast.iter_fields(node):
            field = value[1]
            if isinstance(field, list):
                if field and isinstance(field[0], ast.stmt):
                    self._block(field, ctx)
                else:
                    for item in field:
                        if isinstance(item, ast.AST):
                            self._visit(item, ctx)
            elif isinstance(field, ast.AST):
                self._visit(field, ctx)

    def _decorator_levels(self, defs: list[ast.AST]) -> dict[str, int]:
        """`def master_only(func): def wrapper(*a): if rank == 0: return func(*a)`: the decorator's own code
        says whether it is a rank guard (the weakest check around the wrapper's calls of the wrapped function)."""
        found: dict[str, int] = {}
        for d in defs:
            if not d.args.args:
                continue
            wrapped = d.args.args[0].arg
            calls = [c for w in d.body if isinstance(w, (ast.FunctionDef, ast.AsyncFunctionDef))
                     for c in ast.walk(w) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                     and c.func.id == wrapped]
            if calls:
                found[d.name] = min(self.context(c).level for c in calls)
        return found

    def decorator_guard(self, decorator: ast.AST) -> int:
        """The rank check a decorator puts around the function it decorates: read from the decorator's code when
        the project defines it (this file, or another file through `external_levels`), by its name otherwise
        (`@rank_zero_only` of Lightning)."""
        name = terminal(decorator.func if isinstance(decorator, ast.Call) else decorator)
        if isinstance(decorator, ast.Call):
            return rank_name_kind(name)  # a decorator factory: its code is one call further away
        if "@" + name in self.external_levels:
            return self.external_levels["@" + name]
        if name in self.function_names and isinstance(decorator, ast.Name):
            return self.decorator_levels.get(name, NONE)
        return rank_name_kind(name)

    def _spawned_functions(self, defs: list[ast.AST]) -> set[str] | None:
        """Functions run by the ranks of an mp.spawn/Process script (None: the whole file is per-rank).

        The worker is the first argument or the `fn=` keyword of mp.spawn/start_processes, or Process's
        `target=`; a function the spawn hands the worker in its `args` tuple runs in the rank too where the
        worker calls that parameter (`Process(target=init_processes, args=(rank, size, train, args))` with
        `fn(rank, gpu, args)` inside); a class a rank builds runs its `__init__` there."""
        self.spawned_inits: set[int] = set()
        """ids of the `__init__` of classes a rank builds (`NetworkDeal(...)` in the worker)."""
        workers: set[str] = set()
        handed: list[tuple[str, list[ast.expr], int]] = []  # (worker, args tuple items, index of its first item)
        spawns: list[tuple[str, ast.Call]] = []
        for call in self.calls:
            name = self.qualname(call.func)
            keywords = {k.arg: k.value for k in call.keywords}
            if name.endswith(("multiprocessing.spawn", "start_processes")) and (call.args or "fn" in keywords):
                worker, offset = terminal(call.args[0] if call.args else keywords["fn"]), 1  # (the rank comes first)
            elif name.endswith("Process") and "target" in keywords and not self._after_own_group(call) \
                    and self._joins_process_group(defs, keywords["target"], keywords.get("args")):
                worker, offset = terminal(keywords["target"]), 0
            else:
                continue
            workers.add(worker)
            spawns.append((worker, call))
            given = keywords.get("args", call.args[1] if offset and len(call.args) > 1 else None)
            if isinstance(given, (ast.Tuple, ast.List)):
                handed.append((worker, list(given.elts), offset))
        workers.discard("")
        if not workers:
            return None
        # `mp.spawn(demo_fn, ...)` inside `def run_demo(demo_fn, ...)`: the workers are the functions passed in
        names = {d.name for d in defs}
        for worker, call in spawns:
            if worker in names:
                continue
            passed = self._passed_for(defs, worker, call, names)
            if passed is None:  # (not a parameter, or a call passes something else: any function handed along)
                workers |= {a.id for c in self.calls for a in (*c.args, *(k.value for k in c.keywords))
                            if isinstance(a, ast.Name) and a.id in names}
            workers |= passed or set()
        for worker, items, offset in handed:
            for d in (d for d in defs if d.name == worker):
                params = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
                called = {c.func.id for c in ast.walk(d) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                for i, item in enumerate(items):
                    if isinstance(item, ast.Name) and item.id in names and i + offset < len(params) \
                            and params[i + offset] in called:
                        workers.add(item.id)
        # `else: main_worker(args.gpu, ...)`: a function that also calls the worker directly runs on every
        # rank when torchrun starts the script (the ImageNet example's two modes); `else: train(0, a, h)`
        # (or `subprocess_fn(rank=0, ...)`) hands the worker a fixed rank: that path is one process, and the
        # caller stays the parent
        # `if opts.mode == "ddp": mp.spawn(worker, ...) else: worker(...)` where the worker starts its process
        # group only under that same test: the direct call is one process too; so is a direct call in the
        # single-process arm of a mode check (`if world_size > 1: mp.spawn(train, ...) else: train(...)`)
        firsts = {d.name: ([a.arg for a in (*d.args.posonlyargs, *d.args.args)] or [""])[0] for d in defs}
        workers.update(d.name for d in defs if any(
            isinstance(c, ast.Call) and not isinstance(c.func, ast.Attribute) and terminal(c.func) in workers
            and not _fixed_rank(c, firsts.get(terminal(c.func), ""))
            and not self.context(c).single
            and not self._ungrouped_arm(c, [s for w, s in spawns if w == terminal(c.func)], defs)
            for c in ast.walk(d)))
        # `solver.train(args, epoch)` on an object from another file does not call this file's module-level
        # `def train(args)` (the parent's function that spawns the workers): an attribute call reaches a method
        methods = {d.name for c in self.nodes if isinstance(c, ast.ClassDef)
                   for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
        callees = {d.name: {terminal(c.func) for c in ast.walk(d) if isinstance(c, ast.Call)
                            and (not isinstance(c.func, ast.Attribute) or terminal(c.func) in methods
                                 or terminal(c.func) not in names)} for d in defs}
        classes = {c.name: c for c in self.nodes if isinstance(c, ast.ClassDef)}
        reached, todo = set(), list(workers)
        while todo:
            name = todo.pop()
            if name not in reached:
                reached.add(name)
                todo.extend(callees.get(name, ()))
                # the rank runs the class's `__init__`, and its `forward` (`__call__`) where it calls the model
                for method in (d for d in classes[name].body if isinstance(d, ast.FunctionDef)
                               and d.name in ("__init__", "forward", "__call__")) if name in classes else ():
                    self.spawned_inits.add(id(method))
                    todo.extend(terminal(c.func) for c in ast.walk(method) if isinstance(c, ast.Call))
        return reached

    def _ungrouped_arm(self, call: ast.Call, spawns: list[ast.Call], defs: list[ast.AST]) -> bool:
        """Whether `call` (the worker called directly) sits in one arm of an `if` whose other arm spawns the
        worker, and the worker calls init_process_group only in an `if` of the same test, on the spawn's side:
        the direct call never starts a process group, it is a single process."""
        child, node = call, self.parents.get(id(call))
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(node, ast.If) and child in (*node.body, *node.orelse):
                other = node.orelse if child in node.body else node.body
                if any(s is n for stmt in other for n in ast.walk(stmt) for s in spawns):
                    break
            child, node = node, self.parents.get(id(node))
        else:
            return False
        spawn_side = child in node.orelse  # True: the spawn is in the `if` body, where the test holds
        test = ast.dump(node.test)
        worker = [d for d in defs if d.name == terminal(call.func)]
        starts = [c for d in worker for c in ast.walk(d)
                  if isinstance(c, ast.Call) and terminal(c.func) == "init_process_group"]
        if len(worker) != 1 or not starts:
            return False
        for start in starts:
            inner, up = start, self.parents.get(id(start))
            while up is not None and not (isinstance(up, ast.If) and ast.dump(up.test) == test
                                          and inner in (up.body if spawn_side else up.orelse)):
                if up is worker[0]:
                    return False
                inner, up = up, self.parents.get(id(up))
            if up is None:
                return False
        return True

    def _after_own_group(self, call: ast.Call) -> bool:
        """A `Process(...)` the file's top-level code starts after its own top-level init_process_group: this
        process is already a rank (torchrun started it), and the child it forks is a helper of that rank (a data
        generator reading dist.get_rank()), not another rank."""
        top = next((stmt for stmt in self.tree.body if any(n is call for n in ast.walk(stmt))), None)
        if top is None or isinstance(top, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return False
        return any(isinstance(n, ast.Call) and terminal(n.func) == "init_process_group"
                   for stmt in self.tree.body[:self.tree.body.index(top)] if isinstance(stmt, ast.Expr)
                   for n in ast.walk(stmt))

    def _joins_process_group(self, defs: list[ast.AST], target: ast.expr, given: ast.expr | None) -> bool:
        """Whether a `Process(target=...)` starts a rank: its target, the functions of this file it calls and
        those handed to it in `args`, set up or read a process group (`init_process_group`, a helper named for
        it, `dist.get_rank()`). A target of this file that does none of that is background work (an image
        writer fed by a queue) and not a rank; a target from another file may set one up, so it counts."""
        by_name: dict[str, list[ast.AST]] = {}
        for d in defs:
            by_name.setdefault(d.name, []).append(d)
        name = terminal(target)
        if name not in by_name:
            return True
        handed = [terminal(e) for e in given.elts] if isinstance(given, (ast.Tuple, ast.List)) else []
        seen, todo = set(), [name, *(h for h in handed if h in by_name)]
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            for d in by_name.get(current, ()):
                for c in ast.walk(d):
                    if not isinstance(c, ast.Call):
                        continue
                    qual, callee = self.qualname(c.func), terminal(c.func)
                    if "distributed" in qual or "init_process" in callee or "distributed" in callee.lower() \
                            or qual.startswith(("dist.", "torch.distributed")):
                        return True
                    if callee in by_name:
                        todo.append(callee)
                    elif isinstance(c.func, ast.Name) and callee in self.aliases:
                        return True  # (a function imported from another file: it may set the group up)
        return False

    def _passed_for(self, defs: list[ast.AST], param: str, call: ast.Call, names: set[str]) -> set[str] | None:
        """The functions the calls of the function around `call` give its parameter `param` (`run_demo(demo_basic,
        2)` for `def run_demo(demo_fn, world_size): mp.spawn(demo_fn, ...)`); None where that is not known."""
        around = [d for d in defs if any(n is call for n in ast.walk(d))]
        if not around:
            return None
        func = max(around, key=lambda d: d.lineno)
        params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
        if param not in params and param not in [a.arg for a in func.args.kwonlyargs]:
            return None
        found: set[str] = set()
        for c in self.calls:
            if terminal(c.func) != func.name:
                continue
            value = next((k.value for k in c.keywords if k.arg == param), None)
            if value is None and param in params:
                index = params.index(param) - (1 if params[:1] in (["self"], ["cls"]) else 0)
                value = c.args[index] if 0 <= index < len(c.args) else None
            if not (isinstance(value, ast.Name) and value.id in names):
                return None
            found.add(value.id)
        return found or None

    def local_callee(self, call: ast.Call) -> str:
        """The name of the function defined in this file that `call` calls (`f(...)`, `self.f(...)`), else ''."""
        return terminal(call.func) if _references(call.func, self.function_names) else ""

    def per_rank(self, node: ast.AST) -> bool:
        """True if every rank runs this node (False for the parent process of an mp.spawn script)."""
        if self.per_rank_functions is None:
            project = getattr(self, "project", None)  # (set once the Project is built)
            return project is None or not project.parent_only(self, node)
        ctx = self.context(node)
        parent = getattr(self, "parent_nodes", None)
        if parent is not None and not ctx.functions and id(node) not in parent:
            return True  # module code outside the `__main__` block: each rank imports the file again
        return any(f in self.per_rank_functions for f in ctx.functions) or ctx.scope in self.spawned_inits




def _turns_single(stmts: list[ast.stmt], counts: frozenset[str]) -> bool:
    return any(isinstance(s, ast.Assign) and any(single_setting(t, s.value, counts) for t in s.targets) for s in stmts)


def _fixed_rank(call: ast.Call, first: str) -> bool:
    """The call hands its function a constant as the rank, its first parameter (`train(0, ...)`, `fn(rank=0, ...)`)."""
    given = call.args[0] if call.args else next((k.value for k in call.keywords if first and k.arg == first), None)
    return isinstance(given, ast.Constant)


def _single_return(own: dict[str, ast.AST], value: ast.AST) -> ast.AST:
    """What `value` holds where it is a call of a function of this file with one return (`rank, world, device =
    setup()` of `return rank, world_size, device`): that return's value, each name read in the function; else
    `value` itself."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in own:
        returns = [r.value for r in own_returns(own[value.func.id])]
        if len(returns) == 1 and returns[0] is not None:
            return returns[0]
    return value


def assigned_key(node: ast.AST) -> str:
    """How Script.assignments names a target: 'x' for a name, '.x' for an attribute ('' for anything else)."""
    return node.id if isinstance(node, ast.Name) else "." + node.attr if isinstance(node, ast.Attribute) else ""


def keyword(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def argument(call: ast.Call, name: str, position: int) -> ast.AST | None:
    """The value passed for a parameter, by keyword or at its position."""
    value = keyword(call, name)
    if value is None and len(call.args) > position and not isinstance(call.args[position], ast.Starred):
        value = call.args[position]
    return value


def next_statements(s: Script) -> dict[int, ast.stmt]:
    after: dict[int, ast.stmt] = {}
    for node in s.nodes:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list):
                for first, second in zip(block, block[1:]):
                    after[id(first)] = second
    return after


def _target_pairs(target: ast.AST, value: ast.AST) -> list[tuple[str, ast.AST]]:
    if isinstance(target, (ast.Name, ast.Attribute)):
        return [(assigned_key(target), value)]
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts):
        return [p for t, v in zip(target.elts, value.elts) for p in _target_pairs(t, v)]
    return []


def _references(node: ast.AST, names: set[str]) -> bool:
    """A use of a locally defined function: `f(...)`, `f` passed along, or `self.f(...)`."""
    if isinstance(node, ast.Name):
        return node.id in names and isinstance(node.ctx, ast.Load)
    return (isinstance(node, ast.Attribute) and node.attr in names and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls"))


_NO_GRAD = frozenset({"no_grad", "inference_mode"})


def without_grad(s: Script, node: ast.AST, parents: dict[int, ast.AST]) -> bool:
    """Whether `node` runs under `torch.no_grad()`/`inference_mode()` (a with block or a decorator)."""
    while id(node) in parents:
        node = parents[id(node)]
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call) and terminal(
                i.context_expr.func) in _NO_GRAD for i in node.items):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                terminal(d.func if isinstance(d, ast.Call) else d) in _NO_GRAD for d in node.decorator_list):
            return True
    return False


BATCHNORM_ARCHITECTURES = re.compile(r"(resnet|resnext|wide_resnet|densenet|vgg\d+_bn|mobilenet_v[23]|efficientnet|"
                                 r"inception_v3|googlenet|shufflenet|mnasnet|regnet)\w*")
"""torchvision (and timm) architectures built with BatchNorm layers by default."""


def batchnorm_constructor(s: Script, call: ast.Call) -> str | None:
    """`models.resnet18()`, `timm.create_model("resnet18")`: a library constructor of a BatchNorm architecture (its
    name, for a message), else None."""
    qualname = s.qualname(call.func)
    if qualname.startswith("torchvision.models.") and BATCHNORM_ARCHITECTURES.fullmatch(terminal(call.func)):
        return f"torchvision's {terminal(call.func)}()"
    if qualname == "timm.create_model" and call.args and isinstance(call.args[0], ast.Constant) \
            and isinstance(call.args[0].value, str) and BATCHNORM_ARCHITECTURES.fullmatch(call.args[0].value):
        return f"timm.create_model({call.args[0].value!r})"
    return None


def function_apply(s: Script, call: ast.Call) -> list[int] | None:
    """`AllGather.apply(t, args)` (or `gather = AllGather.apply; gather(t, args)`) of a project autograd Function whose
    `forward(ctx, tensor, args)` hands a parameter to a torch.distributed collective: the positions of the call's
    arguments that reach it; None for any other call."""
    func = call.func
    if isinstance(func, ast.Name):
        values = [v for k, v in s.assignments if k == func.id]
        func = values[0] if len(values) == 1 else None
    if not (isinstance(func, ast.Attribute) and func.attr == "apply" and isinstance(func.value, ast.Name)):
        return None
    for x in s.project.scripts.values():
        for c in x.nodes:
            if not (isinstance(c, ast.ClassDef) and c.name == func.value.id
                    and any(terminal(b) == "Function" for b in c.bases)):
                continue
            forward = next((d for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "forward"), None)
            if forward is None:
                return None
            params = [p.arg for p in (*forward.args.posonlyargs, *forward.args.args)][1:]  # (after ctx)
            carried = [a for n in ast.walk(forward) if isinstance(n, ast.Call) and x.is_dist_collective(n)
                       and terminal(n.func) in COLLECTIVES for a in n.args]
            read = {n.id for a in carried for n in ast.walk(a) if isinstance(n, ast.Name)}
            return [i for i, p in enumerate(params) if p in read] or None
    return None


def dropped_by_every_caller(s: Script, sampler: ast.Call) -> bool:
    """The value (a sampler, a loader) is returned in a tuple (`return dataset, sampler, collate`) by a function
    every call of which, in every file of the program, unpacks that item into a name nothing reads (`dataset, _, _
    = build(...)`): no loader is built from the sampler, the loader is never iterated."""
    holders = {k for k, v in s.assignments if v is sampler}
    func = next((d for d in s.defs if any(n is sampler for n in ast.walk(d))), None)
    if func is None or not holders:
        return False
    spots = {i for n in ast.walk(func) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)
             for i, e in enumerate(n.value.elts) if isinstance(e, ast.Name) and e.id in holders}
    if len(spots) != 1:
        return False
    spot = next(iter(spots))
    calls = [(x, c) for x, c in s.project.calls_named(func.name) if not isinstance(c.func, ast.Attribute)
             or isinstance(c.func.value, ast.Name) and c.func.value.id in x.aliases]
    if not calls or len(calls) != len(s.project.calls_named(func.name)):
        return False
    for x, c in calls:
        stmt = x.parents.get(id(c))
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple)
                and len(stmt.targets[0].elts) > spot and isinstance(stmt.targets[0].elts[spot], ast.Name)):
            return False
        name = stmt.targets[0].elts[spot].id
        scope = x.context(stmt).scope
        if any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
               and x.context(n).scope == scope for n in x.nodes):
            return False
    return True


def rerun_by_workers(script: Script, call: ast.Call) -> bool:
    """A seed in the module code of a script that mp.spawns its own workers, outside its `__main__` block: the
    spawn start method runs the main module again in every worker (as `__mp_main__`), so each rank runs it too
    (not where the workers are started with `start_method="fork"`)."""
    if script.per_rank_functions is None or script.context(call).functions:
        return False
    spawns = [c for c in script.calls if script.qualname(c.func).endswith(("multiprocessing.spawn", "start_processes"))]
    if not spawns or any(k.arg == "start_method" and not (isinstance(k.value, ast.Constant) and k.value.value == "spawn")
                         for c in spawns for k in c.keywords):
        return False
    node = call
    while id(node) in script.parents:
        node = script.parents[id(node)]
        if isinstance(node, ast.If) and "__name__" in {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}:
            return False
    return True


def _statements(stmt: ast.stmt) -> Iterator[ast.stmt]:
    """`stmt` and the statements nested in its `if`/`for`/`while`/`with`/`try` blocks (not in a function or class it
    defines): the statements that run only where it runs."""
    yield stmt
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(stmt, field, ()):
            if isinstance(child, ast.ExceptHandler):
                for inner in child.body:
                    yield from _statements(inner)
            else:
                yield from _statements(child)


def misses_required(call: ast.Call, defs: list[ast.AST]) -> bool:
    """The call leaves out a parameter without a default of the one module-level function of its name (no `*args`
    or `**kwargs` on either side): Python raises TypeError before the body runs."""
    if len(defs) != 1 or not isinstance(defs[0], (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    a = defs[0].args
    if a.vararg or a.kwarg or any(isinstance(v, ast.Starred) for v in call.args) \
            or any(k.arg is None for k in call.keywords):
        return False
    positional = [p.arg for p in (*a.posonlyargs, *a.args)]
    required = positional[:len(positional) - len(a.defaults)]
    given = set(positional[:len(call.args)]) | {k.arg for k in call.keywords}
    kw_required = {p.arg for p, v in zip(a.kwonlyargs, a.kw_defaults) if v is None}
    return bool(set(required) - given or kw_required - given)
