"""What the lint rules need to know about one script: import aliases, rank guards, per-rank code."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from ddpkit.lint.ranks import (GLOBAL, GLOBAL_CALLS, GLOBAL_ENV, LOCAL, NONE, QUERIES, distributed_mode,
                               is_main_flag, is_mode_sentinel, rank_name_kind, terminal)

__all__ = ["without_grad", "NONE", "LOCAL", "GLOBAL", "COLLECTIVES", "EVAL_TOKENS", "is_eval_name", "is_eval_sampler", "Context", "Script", "is_main_flag", "rank_name_kind",
           "terminal", "distributed_mode"]

COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
    "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
    "monitored_barrier",
})
"""torch.distributed functions that every rank of the group must call, or the job hangs."""

EVAL_TOKENS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev", "valset", "testset",
                         "valdir", "testdir", "validate", "evaluate", "estimate"})
"""Name parts that mark evaluation data (`dataset_val`, `val_sampler`, `test_set`)."""


def is_eval_name(name: str) -> bool:
    return any(t in EVAL_TOKENS for t in name.lower().split("_"))


def is_eval_sampler(s: Script, call: ast.Call) -> bool:
    """A DistributedSampler over evaluation data by its names (the variable it goes to, or its dataset)."""
    named = {id(v): k.lstrip(".") for k, v in s.assignments}
    dataset = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "dataset"), None)
    return is_eval_name(named.get(id(call), "")) or (dataset is not None and any(
        is_eval_name(terminal(n)) for n in ast.walk(dataset) if isinstance(n, (ast.Name, ast.Attribute))))


_TERMINATORS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


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

    def __init__(self, tree: ast.Module, external_levels: dict[str, int] | None = None) -> None:
        self.tree = tree
        self.nodes = list(ast.walk(tree))
        self.calls = [n for n in self.nodes if isinstance(n, ast.Call)]
        self.aliases = self._import_aliases()
        self.star_modules = [n.module for n in self.nodes if isinstance(n, ast.ImportFrom) and n.module
                             and any(a.name == "*" for a in n.names)]
        """Modules this file imports with `from m import *`."""
        self._derive_rank_names()
        self.contexts: dict[int, Context] = {}
        self.external_levels = external_levels or {}
        """Guard levels of this file's functions at their call sites in other files of the project."""
        self._analyse_functions()
        self.project = None
        """The Project this file belongs to (set by Project, which every lint run builds)."""
        self.path = ""
        self._parents: dict[int, ast.AST] | None = None
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
        return ".".join(reversed(parts))

    def call_name(self, node: ast.AST) -> str:
        """The terminal name of a call's callee ('' for anything that is not a call)."""
        return terminal(node.func) if isinstance(node, ast.Call) else ""

    def calls_named(self, *names: str) -> list[ast.Call]:
        return [c for c in self.calls if terminal(c.func) in names]

    def is_dist_collective(self, call: ast.Call) -> bool:
        name = self.qualname(call.func)
        return name.startswith("torch.distributed.") and name.rsplit(".", 1)[-1] in COLLECTIVES

    # ---- rank-dependence --------------------------------------------------------------------
    def kind(self, expr: ast.AST | None) -> int:
        """How an expression depends on the rank: NONE, LOCAL or GLOBAL (see rank_name_kind)."""
        if isinstance(expr, ast.Name):
            return self.derived.get(expr.id) or rank_name_kind(expr.id)
        if isinstance(expr, ast.Attribute):
            return self.derived.get("." + expr.attr) or rank_name_kind(expr.attr)
        if isinstance(expr, ast.Call):
            name = terminal(expr.func)
            if name in ("int", "bool", "str") and expr.args:
                return self.kind(expr.args[0])
            if name in ("get", "getenv") and expr.args and isinstance(expr.args[0], ast.Constant):
                return rank_name_kind(str(expr.args[0].value))
            return rank_name_kind(name)
        if isinstance(expr, ast.Subscript):
            key = expr.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return rank_name_kind(key.value)
            return NONE
        if isinstance(expr, ast.Compare):
            # `rank == -1` / `rank is None` ask "are we distributed at all?", not "which rank am I?"
            if all(is_mode_sentinel(c) for c in expr.comparators):
                return NONE
            return max(self.kind(e) for e in (expr.left, *expr.comparators))
        if isinstance(expr, ast.BoolOp):
            if isinstance(expr.op, ast.And):
                return max(self.kind(v) for v in expr.values)
            # `not distributed or rank == 0` is rank 0 of a distributed run, but in
            # `not args.multiprocessing_distributed or rank == 0` the left arm passes on every rank
            kinds = [self.kind(v) for v in expr.values if distributed_mode(v) >= 0]
            return min(kinds, default=NONE)
        if isinstance(expr, ast.UnaryOp):
            return self.kind(expr.operand)
        if isinstance(expr, ast.BinOp):
            return max(self.kind(expr.left), self.kind(expr.right))
        if isinstance(expr, ast.IfExp):
            # `SummaryWriter() if rank == 0 else None`: the value exists on the ranks the test picks, so
            # testing it later (`if writer is None: continue`) is a rank check
            if any(isinstance(arm, ast.Constant) and arm.value is None for arm in (expr.body, expr.orelse)) \
                    and distributed_mode(expr.test) == 0:
                return max(self.kind(expr.body), self.kind(expr.orelse), self.kind(expr.test))
            return max(self.kind(expr.body), self.kind(expr.orelse))
        if isinstance(expr, ast.NamedExpr):
            return self.kind(expr.value)
        return NONE

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
        self.assignments = pairs
        """(name, value) of every assignment: 'x' for `x = v`, '.x' for `self.x = v`, tuples unpacked."""
        self.global_rank_names: set[str] = set()
        """Names holding the global rank itself (`rank = dist.get_rank()`), not a value derived from it."""
        for _ in range(4):
            found = {key for key, value in pairs if self.is_global_rank(value)}
            if found <= self.global_rank_names:
                break
            self.global_rank_names |= found
        self.derived = {}
        for _ in range(8):
            derived: dict[str, int] = {}
            for key, value in pairs:
                k = self.kind(value)
                if k:
                    derived[key] = max(derived.get(key, NONE), k)
            if derived == self.derived:
                break
            self.derived = derived
        # `writer = None` ... `if rank == 0: writer = SummaryWriter()`: a value only some ranks hold
        nones = {key for key, value in pairs if isinstance(value, ast.Constant) and value.value is None}
        for node in self.nodes:
            if isinstance(node, ast.If) and nones:
                k = self.kind(node.test)
                if k and distributed_mode(node.test) == 0:
                    for stmt in node.body:
                        if isinstance(stmt, ast.Assign):
                            for target in stmt.targets:
                                for key, _ in _target_pairs(target, stmt.value):
                                    if key in nones and not self.derived.get(key):
                                        self.derived[key] = k

    def is_global_rank(self, expr: ast.AST | None) -> bool:
        """True for the global rank as such: get_rank(), os.environ['RANK'], int() of them, a name holding it."""
        if isinstance(expr, ast.Name):
            return expr.id in self.global_rank_names
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

    # ---- contexts --------------------------------------------------------------------------
    def context(self, node: ast.AST) -> Context:
        return self.contexts.get(id(node), Context())

    def _analyse_functions(self) -> None:
        """Walk the tree until the guard level of every function (from its call sites) is stable."""
        defs = [n for n in self.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        names = {d.name for d in defs}
        self.defs: list[ast.FunctionDef | ast.AsyncFunctionDef] = defs
        self.function_names = names
        refs = [n for n in self.nodes if _references(n, names)]
        self.function_level: dict[str, int] = {}
        self.function_single: set[str] = set()
        """Functions called only from single-process branches (`else: train_single(...)` of `if args.distributed:`)."""
        for _ in range(8):
            self.contexts = {}
            self._block(self.tree.body, Context())
            levels: dict[str, int] = dict(self.external_levels)
            single: dict[str, bool] = {}
            for ref in refs:
                name = terminal(ref)
                level = self.context(ref).level
                levels[name] = min(levels.get(name, GLOBAL), level)
                single[name] = single.get(name, True) and self.context(ref).single
            single_names = {n for n, alone in single.items() if alone}
            if levels == self.function_level and single_names == self.function_single:
                break
            self.function_level, self.function_single = levels, single_names
        self.per_rank_functions = self._spawned_functions(defs)

    def _block(self, stmts: list[ast.stmt], ctx: Context) -> None:
        before_first: Context | None = None
        for stmt in stmts:
            k = self.kind(stmt.test) if isinstance(stmt, ast.If) and not stmt.orelse else NONE
            barrier = k and any(terminal(n.func) == "barrier" for n in ast.walk(stmt) if isinstance(n, ast.Call))
            if barrier and before_first is not None:
                ctx, before_first = before_first, None
                self._visit(stmt, ctx)
                continue
            self._visit(stmt, ctx)
            if k and isinstance(stmt.body[-1], _TERMINATORS):
                # `if rank != 0: return` guards everything after it in the same block
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
            decorated = max((rank_name_kind(terminal(d.func if isinstance(d, ast.Call) else d))
                             for d in node.decorator_list), default=NONE)
            level = max(ctx.level, decorated, self.function_level.get(node.name, NONE))
            self._block(node.body, Context(level, (), ctx.functions + (node.name,), id(node),
                                           ctx.single or node.name in self.function_single))
            return
        if isinstance(node, (ast.If, ast.IfExp)):
            self._visit(node.test, ctx)
            k = self.kind(node.test)
            body_ctx = ctx.guarded(k, node, "body") if k else ctx
            else_ctx = ctx.guarded(k, node, "else") if k else ctx
            sense = distributed_mode(node.test)
            if sense:
                body_ctx, else_ctx = (body_ctx.alone(), else_ctx) if sense < 0 else (body_ctx, else_ctx.alone())
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

    def _spawned_functions(self, defs: list[ast.AST]) -> set[str] | None:
        """Functions run by the ranks of an mp.spawn/Process script (None: the whole file is per-rank)."""
        workers: set[str] = set()
        for call in self.calls:
            name = self.qualname(call.func)
            if name.endswith(("multiprocessing.spawn", "start_processes")) and call.args:
                workers.add(terminal(call.args[0]))
            elif name.endswith("Process"):
                workers.update(terminal(k.value) for k in call.keywords if k.arg == "target")
        workers.discard("")
        if not workers:
            return None
        # `mp.spawn(demo_fn, ...)` inside `def run_demo(demo_fn, ...)`: the workers are the functions passed in
        names = {d.name for d in defs}
        if workers - names:
            workers |= {a.id for c in self.calls for a in (*c.args, *(k.value for k in c.keywords))
                        if isinstance(a, ast.Name) and a.id in names}
        # `else: main_worker(args.gpu, ...)`: a function that also calls the worker directly runs on every
        # rank when torchrun starts the script (the ImageNet example's two modes)
        workers.update(d.name for d in defs if any(
            isinstance(c, ast.Call) and not isinstance(c.func, ast.Attribute) and terminal(c.func) in workers
            for c in ast.walk(d)))
        callees = {d.name: {terminal(c.func) for c in ast.walk(d) if isinstance(c, ast.Call)} for d in defs}
        reached, todo = set(), list(workers)
        while todo:
            name = todo.pop()
            if name not in reached:
                reached.add(name)
                todo.extend(callees.get(name, ()))
        return reached

    def local_callee(self, call: ast.Call) -> str:
        """The name of the function defined in this file that `call` calls (`f(...)`, `self.f(...)`), else ''."""
        return terminal(call.func) if _references(call.func, self.function_names) else ""

    def per_rank(self, node: ast.AST) -> bool:
        """True if every rank runs this node (False for the parent process of an mp.spawn script)."""
        if self.per_rank_functions is None:
            return True
        return any(f in self.per_rank_functions for f in self.context(node).functions)




def _target_pairs(target: ast.AST, value: ast.AST) -> list[tuple[str, ast.AST]]:
    if isinstance(target, ast.Name):
        return [(target.id, value)]
    if isinstance(target, ast.Attribute):
        return [("." + target.attr, value)]
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
