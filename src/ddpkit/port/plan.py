"""The changes `ddpkit port` decides on before it edits: loaders, the model to wrap, sums to reduce, TODOs."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
import libcst as cst

from ddpkit.port.facts import ENTRY, Facts, dotted, loader_expr, root_name, statements_of, walk
from ddpkit.port.facts import names_a_device as _names_a_device
from ddpkit.port.backwards import plan_reused_graphs
from ddpkit.port.copies import plan_model_copies
from ddpkit.port.effects import check_rank0_bindings, plan_effects
from ddpkit.port.forwards import plan_forwards
from ddpkit.port.files import plan_rank_files
from ddpkit.port.feeds import plan_loader_reads, plan_no_loader, plan_rank_streams
from ddpkit.port.hostbatches import plan_kept_batches
from ddpkit.port.gathers import plan_gathers
from ddpkit.port.made import plan_copy_inputs, plan_made_tensors
from ddpkit.port.placement import host_loader_names, plan_placement
from ddpkit.port.roundtrip import plan_round_trips
from ddpkit.port.losses import plan_summed_losses
from ddpkit.port.inputs import passed_as, plan_batch_dependents, plan_batch_divisions, plan_device_datasets
from ddpkit.port.leftovers import plan_gpu_products, plan_prefixed_loads
from ddpkit.port.models import check_aliases, check_rebound, is_optimizer, move_receiver, plan_autograd_grad, plan_models
from ddpkit.port.unused import plan_parameter_changes, plan_unused_parameters
from ddpkit.port.decisions import plan_chosen_reads, plan_decisions, plan_searches
from ddpkit.port.ranks import library_loader, plan_rank_values, plan_ranks
from ddpkit.port.switches import option_dest, plan_device_flag, plan_foreign_switch, plan_unfollowed_switch
from ddpkit.port.sums import plan_reductions, plan_shard_figures
from ddpkit.port.wrapsites import check_wrap_sites
from ddpkit.port.heldsums import plan_model_held_sums

__all__ = ["Plan", "loader_expr", "is_optimizer", "move_receiver"]

_TRAIN_STEP = re.compile(r"train|step|loss|fit", re.I)

_CONFIG_READ = re.compile(r"json|yaml|yml|toml|omegaconf|config|cfg|pyobj|load")
"""Callees that read a settings file: `json.load`, `yaml.safe_load`, `OmegaConf.load`, `json_file_to_pyobj`,
`read_config`, `load_cfg`."""
_NODE_GPUS = 8
"""The ranks of one node of 8 GPUs, the common size: a training batch below it divides to 0 per rank there."""


def _undimmed_squeeze(module: cst.Module, loader: str) -> cst.Call | None:
    """The first `x.squeeze()` / `torch.squeeze(x)` naming no dim inside a loop over the training loader `loader`
    (`for x, y in train_loader`, `enumerate(train_loader)`): on a batch of 1 it drops the batch dimension as well, so
    each rank needs at least 2 samples; None where there is none (or the loader is not bound to a name)."""
    loops = [n for n in walk(module, into_functions=True) if isinstance(n, cst.For) and loader and any(
        isinstance(m, cst.Name) and m.value == loader for m in walk(n.iter))]
    for node in (m for loop in loops for m in walk(loop.body, into_functions=True)):
        if not isinstance(node, cst.Call) or dotted(node.func).rsplit(".", 1)[-1] != "squeeze":
            continue
        method = isinstance(node.func, cst.Attribute) and dotted(node.func) != "torch.squeeze"
        if len(node.args) == (0 if method else 1) and all(a.keyword is None for a in node.args):
            return node
    return None


def _config_source(plan: Plan, expr: cst.BaseExpression, depth: int = 0) -> cst.Call | None:
    """The call a setting is read from, through the names it is bound to (`train_opts = opts.training`, `opts =
    json_file_to_pyobj(path)`): one that loads a settings file (json, yaml, toml, a config reader), not argparse,
    whose options' defaults the port reads; None where it is not so bound."""
    while isinstance(expr, (cst.Attribute, cst.Subscript)):
        expr = expr.value
    values = plan._values_of(expr.value) if isinstance(expr, cst.Name) and depth < 4 else []
    if len(values) != 1:
        return None
    value = values[0]
    if isinstance(value, cst.Call):
        callee = dotted(value.func)
        if callee.rsplit(".", 1)[-1] in ("parse_args", "parse_known_args") or not _CONFIG_READ.search(callee.lower()):
            return None
        return value
    return _config_source(plan, value, depth + 1) if isinstance(value, (cst.Attribute, cst.Subscript, cst.Name)) \
        else None


def _closure_values(outer: cst.CSTNode, function: cst.FunctionDef, param: str) -> list[cst.BaseExpression]:
    """The values a function defined inside `outer` gets for `param` from the calls there (its default where a
    call leaves it out)."""
    params = list(function.params.params)
    names = [p.name.value for p in params]
    default = next((p.default for p in [*params, *function.params.kwonly_params] if p.name.value == param), None)
    out: list[cst.BaseExpression] = []
    for call in (n for n in walk(outer, into_functions=True) if isinstance(n, cst.Call)
                 and dotted(n.func) == function.name.value):
        positional = [a for a in call.args if a.keyword is None and not a.star]
        given = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param), None)
        if given is None and param in names and names.index(param) < len(positional):
            given = positional[names.index(param)].value
        if given is None and default is not None and not any(a.star for a in call.args):
            given = default
        if given is not None:
            out.append(given)
    return out


class Plan:
    """Decisions keyed by id() of the MetadataWrapper module's nodes."""

    def __init__(self, facts: Facts, line_of: Callable[[cst.CSTNode], int],
                 end_of: Callable[[cst.CSTNode], int],
                 reports: dict[str, tuple[str, int, str] | None] | None = None,
                 fetches: dict[str, tuple[str, int, bool]] | None = None,
                 project_loaders: dict[str, str] | None = None, config_names: frozenset[str] = frozenset(),
                 groups: dict[str, list[tuple[int, str]]] | None = None) -> None:
        self.f, self.line_of, self.end_of = facts, line_of, end_of
        self.config_names = config_names
        """Names bound to a settings module of the project (or an object of one) that sets a device: `S` of `import
        settings as S`; `S.device` is the script's device setting."""
        self.reports = reports or {}
        """Calls of the project's own code: `report`, `Plotter.flush` -> (file, line, write) where they only write
        files, None where they do more (judged by the claim gate, not by their names)."""
        self.fetches = fetches or {}
        """Calls of the project's own code that download: `getMnistLoader` -> (file, line, also joins a collective)."""
        self.project_loaders = project_loaders or {}
        """Calls of the project's own code that return a torch DataLoader: `loader` -> its file (CPU batches)."""
        self.groups = groups or {}
        """Calls of the script's or its project's functions that build an optimizer's parameters from a module handed
        in: `add_weight_decay` -> (position, name) of that module's parameter."""
        self._local_names: dict[str, set[str]] = {}
        """Function scope -> the names it binds itself (see _locals)."""
        self.todos: list[tuple[int, str]] = []
        """(original line, what to do there by hand)."""
        self.notes: dict[int, list[str]] = {}
        self.loaders: dict[int, str] = {}
        self.wrap_inline: dict[int, str] = {}
        self.batch_moves: dict[int, list[str]] = {}
        """First statements of loops over a torch DataLoader the port keeps: the lines that move the batch before."""
        self.wrap_before: dict[int, list[str]] = {}
        """Statements before which the modules an optimizer trains are wrapped: `g = ddpkit.wrap(g, ctx)` lines."""
        self.reduce_after: dict[int, list[tuple[str, str]]] = {}
        self.reduced: dict[str, set[str]] = {}
        self.class_roles: dict[str, dict[str, str]] = {}
        self.spread: dict[int, dict[str, cst.BaseExpression]] = {}
        self.sampler_at: dict[int, cst.CSTNode] = {}  # a DataLoader's sampler set into its options by key
        """DataLoader(..., **kw) calls whose kw is built from dict literals here: the options it holds."""
        self.flagged: set[int] = set()
        """Accumulations already given a TODO (a loop is seen from each block around it)."""
        self.collected: list[tuple[str, cst.CSTNode, str, cst.For, bool, str]] = []
        """Values collected over an evaluation loader and used after the loop, for ddpkit.port.gathers: (scope, the
        accumulation, its name, the loop, whether the loop serves the training loader too, the TODO if not joined)."""
        self.gather_after: dict[int, list[str]] = {}
        """Loops over an evaluation loader after which lists they filled are joined across ranks (gather_list)."""
        self.gathered: set[int] = set()
        """Accumulations into a list joined across ranks after their evaluation loop (`xs.append(v)`)."""
        self.main_first: set[int] = set()
        """Statements that download: rank 0 runs them first, the others after a barrier."""
        self.first_note: dict[int, str] = {}
        """Of main_first statements that do not download: what rank 0 does first ("creates")."""
        self.guard: set[int] = set()
        """Statements that write files or log to a tracker: rank 0 only."""
        self.none_elsewhere: dict[int, str] = {}
        """Guarded statements that bind a tracker the script hands to its functions: `else: name = None` after them."""
        self.barrier_before: set[int] = set()
        self.barrier_after: set[int] = set()  # `if not os.path.isfile(p):` around a rank-0 write: all wait after it
        """Statements that read a file rank 0 may have written earlier in the run."""
        self.wait_after: set[int] = set()
        """Rank-0 calls of the project's code that only write files, at the entry point's top level (every rank
        passes there once): the files they write are not named here, so every rank waits until they are whole."""
        self.exist_ok: set[int] = set()
        """mkdir/makedirs calls that race between ranks without exist_ok=True."""
        self.reduce_read: dict[int, str] = {}
        """Reads of a per-rank sum inside its loop, in a report: 'mean' (of per-step values) or 'count'."""
        self.scale_world: set[int] = set()
        """Throughput assignments from this rank's batch (`tok_per_sec = x.numel() / dt`): times world_size."""
        self.scale_backward: set[int] = set()
        """`loss.backward()` calls of a loss summed over the batch: `(loss * ctx.world_size).backward()`."""
        self.add_kwarg: dict[int, tuple[str, str]] = {}
        """Calls that get one more keyword: random_split(..., generator=...) so every rank splits alike."""
        self.as_tensor: dict[int, str] = {}
        """`torch.FloatTensor(batch)` of a batch on ctx.device -> `torch.as_tensor(batch, dtype=torch.float32)`."""
        self.move_at: set[int] = set()
        """Reads of a CPU tensor where it meets a value on ctx.device: `y` -> `y.to(ctx.device)` there."""
        self.to_device: set[int] = set()
        self.model_copies: set[tuple[str, str]] = set()
        """(scope, name) of copies of the wrapped model the port builds on ctx.device (see plan_model_copies)."""
        """Assignments of a tensor made on the CPU that the model (or its output) meets: made on ctx.device."""
        self.unpinned: set[int] = set()
        """Loaders over a dataset that puts samples on the device itself: pin_memory=False."""
        self.reseed: set[int] = set()
        """The training loop of a script that seeds every rank alike: each rank's own stream starts before it."""
        self.summary: list[str] = []
        """What the port's summary line says besides the TODOs (data not sharded, a larger global batch)."""
        self.wrapped: dict[tuple[str, str], list[cst.CSTNode]] = {}
        """(scope, model) -> the statements where it is wrapped (its build, or before an optimizer)."""
        self.built: dict[tuple[str, str], cst.CSTNode] = {}
        """(scope, model) -> the statement that builds it."""
        self.train_sizes: set[str] = set()
        """Names that hold a training loader's batch size (`batch_size`, `args.batch_size`): the global batch."""
        self.drop_parallel: set[int] = set()
        """`nn.DataParallel(model)` calls: replaced by `model` (one process per device: DDP replaces it)."""
        self.replace: dict[int, str] = {}
        """Expressions read as another (`len(loader.sampler)` -> `len(loader.dataset)` on a ported loader)."""
        self.move_back: set[int] = set()
        """Moves of the model to the device that are not the placement the wrap does (after a move to the CPU, on a
        path without the wrap, before a use ahead of it): kept, `.cuda()` as `.to(ctx.device)`."""
        self.round_trip: set[int] = set()
        """`model.cpu()` statements whose model is moved back later: the name stays the wrapped model."""
        self.parallel_names: set[str] = set()
        """Names once bound to a DataParallel: their `.module` is the model itself (`ddpkit.unwrap(model)`)."""
        self._parent: dict[int, cst.CSTNode] = {}
        self._stmt: dict[int, cst.CSTNode] = {}
        self._any_stmt: dict[int, cst.CSTNode] | None = None
        self._block: dict[int, tuple[list[cst.BaseStatement], int]] = {}
        for key in sorted(facts.ported):
            self._index(facts.scope_statements(key))
        self._plan_loaders()
        model = plan_models(self)
        check_wrap_sites(self)
        plan_model_copies(self)
        plan_unused_parameters(self)
        plan_gpu_products(self)  # after plan_models and the loaders: which DataParallel went, which sizes they divide
        plan_prefixed_loads(self)
        start = facts.region[0] if facts.region else None
        if start is not None and facts.started_outside:
            self.todo(start, f"nothing in this file calls `{facts.started_outside}()` (a console script or another "
                      "module starts it): the port made it the training entry point; start it once per rank "
                      f"(`ddpkit run` of a script that calls {facts.started_outside}()) and check what it calls")
        if start is not None and model is None:
            self.todo(start, "no optimizer found in this file, so no model is wrapped: wrap the model once its weights "
                      "are set (after its initialisation and any loading, which then reach the module, not the "
                      "wrapper; an optimizer made before the wrap holds the same parameters), here or in the "
                      "project's code that trains it (model = ddpkit.wrap(model, ctx)), and compute the loss through "
                      "calls of the wrapper (its forward: DDP averages gradients only there)")
        no_loader = start is not None and "train" not in self.loaders.values() and not any(
            "DataLoader" in m or "sampler" in m for _, m in self.todos)
        self._propagate_roles()
        self.training_scopes = {k for k in facts.ported if _TRAIN_STEP.search(k.rsplit(".", 1)[-1]) or any(
            "backward" in facts.code(s) for s in facts.scope_statements(k))}
        """Scopes that run a training step (they call backward, or their name says so)."""
        self.loop_scopes = {k for k in facts.ported if any(
            isinstance(n, cst.For) and self.loop_role(k, n) == "train" for n in self.nodes(k))}
        """Scopes with a loop over a training loader: their training step is that loop's body."""
        if model not in (None, "?"):
            plan_autograd_grad(self)
            plan_reused_graphs(self)
            check_rebound(self)
            plan_parameter_changes(self)
        check_aliases(self)  # every wrapped model, also where the optimizers differ by branch
        self._plan_batch_size_uses()
        plan_batch_dependents(self)
        plan_batch_divisions(self)
        if model not in (None, "?"):
            plan_summed_losses(self)  # after the batch-size uses: a sum divided by the global batch stays a sum
        self.unwrap_calls: set[int] = set()
        """Forwards of the wrapped model whose output never reaches backward(): they call the unwrapped model."""
        plan_forwards(self)
        plan_made_tensors(self)  # after plan_forwards: it names what that rule cannot reach
        plan_round_trips(self)  # after plan_forwards: it reads which forwards call the unwrapped model
        plan_placement(self)  # after both: a CPU value that meets a device value elsewhere (arithmetic, a loss)
        plan_copy_inputs(self)  # after plan_placement: the inputs of a model's copy the port moved
        if no_loader:
            plan_no_loader(self, start)  # after plan_forwards: it reads which inputs are made on ctx.device
        else:
            plan_kept_batches(self)  # evaluation batches of a loader the project returns, in a CPU script
        plan_rank_streams(self)  # after plan_no_loader: a script drawing its own batches is reseeded there
        plan_effects(self)
        plan_rank_files(self)  # after plan_effects: it reads which pyplot lines rank 0 alone runs
        check_rank0_bindings(self)  # after both: every line they put under `if ctx.is_main:`
        for key in sorted(facts.ported):
            plan_reductions(self, key, facts.scope_statements(key))
        plan_gathers(self)  # after every reduction: a list used with a count the port reduced is joined
        plan_ranks(self)
        plan_decisions(self)  # after plan_reductions: it reads which values are reduced
        plan_searches(self)
        plan_rank_values(self)  # after plan_effects: it reads which lines rank 0 alone runs
        plan_chosen_reads(self)  # after plan_effects and plan_reductions: rank 0's lines, the reduced values
        plan_device_datasets(self)
        plan_loader_reads(self)
        plan_shard_figures(self)  # last: what every other rule left per rank is reduced or named
        plan_model_held_sums(self)
        self.seed = self._seed()
        self.device_flag = plan_device_flag(self)
        """`args.cuda` where the script moves its model or its inputs to the GPU only `if args.cuda:`
        (ddpkit.init's device)."""
        if self.device_flag is None and not plan_unfollowed_switch(self):
            plan_foreign_switch(self)
        self.init_device = f'"auto" if {self.device_flag} else "cpu"' if self.device_flag else None
        """ddpkit.init's device= expression, None for its default."""
        self.cpu_script = self.init_device is None and bool(self.loaders) and not _names_a_device(facts.module)
        """The script names no device, yet a ddpkit loader delivers batches on ctx.device: where the rewrite wraps
        no model either (each is left to a TODO) and the script's own modules name no device, codemod passes
        ddpkit.init(device="cpu") with a TODO, unless the training runs in project code that works on any device."""

    # ---- bookkeeping -------------------------------------------------------------------------
    def _index(self, block: list[cst.BaseStatement]) -> None:
        for i, stmt in enumerate(block):
            self._block[id(stmt)] = (block, i)
            if isinstance(stmt, cst.SimpleStatementLine):
                for node in walk(stmt):
                    self._stmt[id(node)] = stmt
                continue
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            for child in stmt.children:
                if isinstance(child, (cst.BaseSuite, cst.Else, cst.Finally, cst.ExceptHandler, cst.If)):
                    continue
                for node in walk(child):
                    self._stmt.setdefault(id(node), stmt)
            for inner in self.blocks_of(stmt):
                for child in inner:
                    self._parent[id(child)] = stmt
                self._index(inner)

    def guarded_above(self, node: cst.CSTNode) -> bool:
        """Whether a statement around `node` (not `node` itself) is one the port puts under `if ctx.is_main:`."""
        parent = self._parent.get(id(node))
        while parent is not None:
            if id(parent) in self.guard:
                return True
            parent = self._parent.get(id(parent))
        return False

    def loop_around(self, stmt: cst.CSTNode) -> cst.For | cst.While | None:
        """The innermost `for`/`while` of the scope around a statement, or None."""
        parent = self._parent.get(id(stmt))
        while parent is not None and not isinstance(parent, (cst.For, cst.While)):
            parent = self._parent.get(id(parent))
        return parent

    def under_branch(self, stmt: cst.CSTNode, key: str | None = None) -> bool:
        """Inside an if/try/while of its scope (a condition some ranks may take and others not), or inside a
        loop over an evaluation shard (shards may differ by a batch)."""
        node = self._parent.get(id(stmt))
        while node is not None:
            if isinstance(node, (cst.If, cst.Try, cst.While)):
                return True
            if key is not None and isinstance(node, cst.For) and self.loop_role(key, node) == "eval":
                return True
            node = self._parent.get(id(node))
        return False

    @staticmethod
    def blocks_of(stmt: cst.CSTNode) -> list[list[cst.BaseStatement]]:
        """The statement lists inside a compound statement (if/elif/else, loops, with, try)."""
        suites = []
        if isinstance(stmt, cst.If):
            node = stmt
            while isinstance(node, cst.If):
                suites.append(node.body)
                node = node.orelse
            if isinstance(node, cst.Else):
                suites.append(node.body)
        else:
            suites.append(getattr(stmt, "body", None))
            suites.extend(h.body for h in getattr(stmt, "handlers", ()))
            for attr in ("orelse", "finalbody"):
                extra = getattr(stmt, attr, None)
                if extra is not None:
                    suites.append(extra.body)
        return [list(s.body) for s in suites if isinstance(s, cst.IndentedBlock)]

    def todo(self, node: cst.CSTNode, message: str) -> None:
        stmt = self._statement_of(node)
        line = self.line_of(stmt)
        self.todos.append((line, message))
        self.notes.setdefault(id(stmt), []).append(f"# TODO(ddpkit port): {message}")

    def note(self, node: cst.CSTNode, text: str) -> None:
        stmt = self._statement_of(node)
        self.notes.setdefault(id(stmt), []).append(f"# ddpkit port: {text}")

    def _statement_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The statement whose comments carry a note on `node`: the rewriter writes notes before statements only,
        so a node of a function nested in a ported scope (not indexed) is looked up in the whole module."""
        stmt = self._stmt.get(id(node))
        if stmt is not None or isinstance(node, cst.BaseStatement):
            return stmt or node
        if self._any_stmt is None:
            self._any_stmt = {}
            for outer in walk(self.f.module, into_functions=True):
                if isinstance(outer, cst.SimpleStatementLine):
                    for inner in walk(outer):
                        self._any_stmt[id(inner)] = outer
                elif isinstance(outer, cst.BaseCompoundStatement):
                    for child in outer.children:
                        if not isinstance(child, (cst.BaseSuite, cst.Else, cst.Finally, cst.ExceptHandler, cst.If)):
                            for inner in walk(child):
                                self._any_stmt.setdefault(id(inner), outer)
        return self._any_stmt.get(id(node), node)

    def is_model_copy(self, key: str, name: str) -> bool:
        """`name` read in scope `key` is a copy of the model the port builds on ctx.device (plan_model_copies):
        `self.target` in any method of the class whose method builds it."""
        cls = self.f.scopes[key].cls if key in self.f.scopes else None
        return any(name == copy and (k == key or copy.startswith("self.") and cls and self.f.scopes[k].cls == cls)
                   for k, copy in self.model_copies)

    def role(self, key: str, name: str) -> str | None:
        scope = self.f.scopes[key]
        found = scope.roles.get(name)
        if found is None and name.startswith("self.") and scope.cls:
            found = self.class_roles.get(scope.cls, {}).get(name)
        if found is None and self.f.ctx_global and key != ENTRY and name not in scope.params and \
                name.split(".")[0] not in self._locals(key):
            found = self.f.scopes[ENTRY].roles.get(name)  # a module-level name read inside a function
        return found

    def _locals(self, key: str) -> set[str]:
        """Names a builder function binds itself and returns (not declared global, not wrapped there):
        `def model(): model = resnet18(); ...; return model` builds its own `model`, which is not yet the
        module-level one the port wrapped."""
        if key not in self._local_names:
            node = self.f.scopes[key].node
            bound: set[str] = set()
            declared: set[str] = set()
            returned: set[str] = set()
            if isinstance(node, cst.FunctionDef):
                for n in walk(node.body):
                    if isinstance(n, (cst.Global, cst.Nonlocal)):
                        declared |= {item.name.value for item in n.names}
                    elif isinstance(n, cst.Assign):
                        bound |= {t.target.value for t in n.targets if isinstance(t.target, cst.Name)}
                    elif isinstance(n, (cst.AnnAssign, cst.AugAssign, cst.For)) and isinstance(n.target, cst.Name):
                        bound.add(n.target.value)
                    elif isinstance(n, cst.Return) and n.value is not None:
                        values = n.value.elements if isinstance(n.value, cst.Tuple) else [n.value]
                        returned |= {dotted(v.value if isinstance(v, cst.Element) else v) for v in values}
            self._local_names[key] = (bound & returned) - declared
        return {n for n in self._local_names[key] if (key, n) not in self.wrapped}

    def _set_role(self, key: str, name: str, role: str) -> bool:
        scope = self.f.scopes[key]
        if name.startswith("self.") and scope.cls:
            table = self.class_roles.setdefault(scope.cls, {})
        else:
            table = scope.roles
        if table.get(name) == role:
            return False
        table[name] = role
        return True

    def nodes(self, key: str) -> Iterator[cst.CSTNode]:
        for stmt in self.f.scope_statements(key):
            yield from walk(stmt)

    # ---- loaders ------------------------------------------------------------------------------
    def _plan_loaders(self) -> None:
        found: list[tuple[str, cst.Call, str]] = []
        for key in sorted(self.f.ported):
            for node in self.nodes(key):
                if isinstance(node, cst.Call) and dotted(node.func).rsplit(".", 1)[-1] == "DataLoader":
                    stmt = self._stmt.get(id(node))
                    target = ""
                    if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign) \
                            and stmt.body[0].value is node and len(stmt.body[0].targets) == 1:
                        target = dotted(stmt.body[0].targets[0].target)
                    found.append((key, node, target))
        for key, call, target in found:
            self._plan_loader(key, call, target, found)
        kept = [(key, target) for key, call, target in found if target and id(call) not in self.loaders]
        kept += self._project_loader_names()
        self.host_loaders = host_loader_names(self, kept)
        """Scope -> names that may hold a torch DataLoader the port keeps: its batches stay on the CPU."""

    def _project_loader_names(self) -> list[tuple[str, str]]:
        """(scope, name) bound to a torch DataLoader the script's project returns: `train_loader = loader(ds, 16)`,
        or the parameter of a function of the script handed `loader(ds, 16)` itself."""
        out = []
        for key in sorted(self.f.ported):
            for n in self.nodes(key):
                if isinstance(n, cst.Assign) and len(n.targets) == 1 and dotted(n.targets[0].target) and isinstance(
                        n.value, cst.Call) and dotted(n.value.func) in self.project_loaders:
                    out.append((key, dotted(n.targets[0].target)))
                if not isinstance(n, cst.Call):
                    continue
                for callee in self.f.callees(n, key):
                    params = self.f.scopes[callee].params
                    positional = [a for a in n.args if a.keyword is None and not a.star]
                    given = [(params[i], a) for i, a in enumerate(positional) if i < len(params)] + [
                        (a.keyword.value, a) for a in n.args if a.keyword is not None and a.keyword.value in params]
                    out += [(callee, p) for p, a in given if isinstance(a.value, cst.Call) and dotted(
                        a.value.func) in self.project_loaders]
        return out

    def _plan_loader(self, key: str, call: cst.Call, target: str, found: list) -> None:
        library = library_loader(self.f, call)
        if library is not None:
            # a script that names no device moves no batch: the kept loader's batches stay on the CPU, while
            # ddpkit.wrap puts the model on ctx.device (a GPU on a GPU machine)
            where = ("; the script names no device, so this loader's batches stay on the CPU while ddpkit.wrap puts "
                     "the model on ctx.device: move each batch there (`batch = batch.to(ctx.device)`)"
                     if not _names_a_device(self.f.module) else "")
            self.todo(call, f"a DataLoader of {library}: ddpkit.loader would replace its collate (graphs, "
                      "variable-size samples); keep it and shard its dataset by rank yourself (e.g. "
                      f"torch.utils.data.Subset(dataset, range(ctx.rank, len(dataset), ctx.world_size))){where}")
            return
        kwargs = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        positional = [a for a in call.args if a.keyword is None and not a.star]
        spread = self._spread_kwargs(key, call)
        if spread is not None:
            kwargs = {**spread, **kwargs}
            self.spread[id(call)] = spread
        elif any(a.star for a in call.args):
            self.todo(call, "DataLoader options come from **kwargs, which the codemod cannot read: write "
                      "ddpkit.loader(dataset, ctx, batch_size=...) for training or ddpkit.eval_loader(...) "
                      "for evaluation by hand")
            return
        if len(positional) > 2 and "shuffle" not in kwargs:  # DataLoader(dataset, batch_size, shuffle, ...)
            kwargs["shuffle"] = positional[2].value
        for name in ("sampler", "batch_sampler"):  # `sampler=None` is DataLoader's default: no sampler at all
            if isinstance(kwargs.get(name), cst.Name) and kwargs[name].value == "None":
                del kwargs[name]
        if len(positional) > 3 and isinstance(positional[3].value, cst.Name) and positional[3].value.value == "None":
            positional = positional[:3]
        if "sampler" in kwargs or "batch_sampler" in kwargs or len(positional) > 3:
            which = "batch_sampler" if "batch_sampler" in kwargs else "sampler" if "sampler" in kwargs else ""
            given = f" `{which}={self.f.code(kwargs[which])}`" if which else ""
            where = self.sampler_at.get(id(call))
            given += f" (set into the options at line {self.line_of(where)})" if where is not None else ""
            self.todo(call, f"custom sampler{given}: ddpkit.loader shards and orders the data itself and has "
                      "no sampler option, so replacing this DataLoader would drop the sampling (weights, "
                      "subsets) even on one rank; keep it and shard the sampler's indices by ctx.rank yourself, "
                      "or drop the sampler and use ddpkit.loader(dataset, ctx, batch_size=...)")
            return
        if not positional and "dataset" not in kwargs:
            self.todo(call, "DataLoader without a dataset argument the codemod can read: use "
                      "ddpkit.loader(dataset, ctx, batch_size=...) by hand")
            return
        dataset_text = self.f.code(positional[0].value if positional else kwargs["dataset"])
        shuffle = kwargs.get("shuffle")
        shuffled = isinstance(shuffle, cst.Name) and shuffle.value == "True"
        name_text = target or dataset_text
        if not target and not self.f.is_eval_name(dataset_text) and "train" not in dataset_text.lower():
            name_text = f"{dataset_text} {key}"  # built in a helper: `def get_val_loader():` says which
        if "train" not in name_text.lower() and self.f.is_eval_name(name_text):
            kind = "eval"
        elif "train" in name_text.lower() or shuffled:
            kind = "train"
        elif len(found) == 1:
            kind = "train"
        else:
            self.todo(call, "cannot tell whether this DataLoader trains or evaluates: use ddpkit.loader "
                      "(training) or ddpkit.eval_loader (evaluation)")
            return
        self.loaders[id(call)] = kind
        literal = self._literal(key, kwargs.get("batch_size", positional[1].value if len(positional) > 1 else
                                                cst.Integer("1"))) if kind == "train" else None
        if literal == 1:
            self.todo(call, "the batch size is 1: 1 // world_size is 0 per rank on more than one rank; "
                      "keep batch_size=1 per rank (the global batch becomes world_size: scale the learning "
                      "rate) or raise the batch")
            return
        if kind == "train":
            size = self.f.code(kwargs["batch_size"]) if "batch_size" in kwargs else \
                self.f.code(positional[1].value) if len(positional) > 1 else "1"
            self._check_config_batch(key, call, kwargs.get("batch_size", positional[1].value if len(
                positional) > 1 else None))
            if dotted(kwargs.get("batch_size", positional[1].value if len(positional) > 1 else None)):
                self.train_sizes.add(size)
                self.train_sizes |= passed_as(self, key, size)
            squeeze = _undimmed_squeeze(self.f.module, target) if literal is not None else None
            if squeeze is not None and literal < 2 * _NODE_GPUS:
                most = literal // 2
                self.todo(call, f"the batch size is {literal} (`{size}`): {literal} // world_size is 1 per rank on "
                          f"more than {most} ranks and 0 on more than {literal} (a node of {_NODE_GPUS} GPUs), and "
                          f"`{self.f.code(squeeze)}` (line {self.line_of(squeeze)}) names no dim, so it also drops "
                          "the batch dimension of a batch of 1 (a 0-d tensor or a wrong shape after it); run on at "
                          f"most {most} ranks, or raise the batch to at least twice the number of ranks (it stays "
                          f"the global batch), or give each rank max(2, {size} // ctx.world_size) and scale the "
                          "learning rate, or name the dim (`squeeze(1)`)")
            elif literal is not None and literal < _NODE_GPUS:
                self.todo(call, f"the batch size is {literal} (`{size}`): {literal} // world_size is 0 per rank on "
                          f"more than {literal} ranks (a node of {_NODE_GPUS} GPUs), and ddpkit.loader then raises "
                          f"ValueError at start; run on at most {literal} ranks, or raise the batch to at least the "
                          f"number of ranks (it stays the global batch), or give each rank max(1, {size} // "
                          "ctx.world_size) and scale the learning rate")
            else:
                self.note(call, f"batch_size is per rank: {size} // world_size keeps the global batch of "
                          f"{size} samples per step")
        if target:
            self._set_role(key, target, kind)

    def _check_config_batch(self, key: str, call: cst.Call, size: cst.BaseExpression | None) -> None:
        """A training batch read from a settings file the port cannot read (`cfg["batch_size"]` with `cfg =
        json.load(f)`, `opts.training.batchSize`): divided by the world size it is 0 on more ranks than the setting,
        and ddpkit.loader refuses a batch of 0 at start. A `not checked:` TODO naming the setting and its source."""
        if size is None or self._literal(key, size) is not None:
            return
        source = _config_source(self, size)
        if source is None:
            return
        text = self.f.code(size)
        self.todo(call, f"not checked: the batch size `{text}` comes from `{self.f.code(source.func)}(...)` (line "
                  f"{self.line_of(self._stmt.get(id(source), source))}), a setting the port cannot read: each rank "
                  f"now gets {text} // ctx.world_size, which is 0 on more ranks than that setting (ddpkit.loader "
                  f"then raises ValueError at start): keep the setting at least the number of ranks (it stays the "
                  f"global batch), or give each rank max(1, {text} // ctx.world_size) and scale the learning rate")

    def _literal(self, key: str, expr: cst.BaseExpression, depth: int = 0) -> int | None:
        """The int a batch size expression holds: `32`, `BATCH = 1` at module level, a name bound once to
        `args.batch_size` or `config["batch_size"]`, the default of the argparse option that sets that
        attribute (`--batch_size`, `-b/--batch-size`, `dest="bs"`), or a key of a dict literal."""
        if isinstance(expr, cst.Integer):
            return int(expr.value)
        if isinstance(expr, cst.SimpleString) and str(expr.evaluated_value).strip().isdigit():
            return int(str(expr.evaluated_value))  # `type=int, default="1"`: argparse converts the string
        if depth > 3:
            return None
        name = dotted(expr)
        scope = self.f.scopes.get(key)
        if isinstance(expr, cst.Name) and scope is not None and isinstance(scope.node, cst.FunctionDef) and \
                name in scope.params:  # `def make_loader(ds, batch_size=1)`: its default and every call's argument
            found = [self._literal(caller, value, depth + 1) for caller, value in self._param_values(key, name)]
            return min((v for v in found if v is not None), default=None)
        inner = next((d for d in walk(scope.node, into_functions=True) if isinstance(d, cst.FunctionDef) and d is not
                      scope.node and name in [p.name.value for p in (*d.params.params, *d.params.kwonly_params)]
                      and any(n is expr for n in walk(d))), None) if isinstance(expr, cst.Name) and scope else None
        if inner is not None:  # a helper defined inside the function (`def make_loader(..., batch_size=1):`)
            found = [self._literal(key, value, depth + 1) for value in _closure_values(scope.node, inner, name)]
            return min((v for v in found if v is not None), default=None)
        if isinstance(expr, cst.Name):
            values = self._values_of(name)
            return self._literal(key, values[0], depth + 1) if len(values) == 1 else None
        if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Name) and len(expr.slice) == 1 and \
                isinstance(expr.slice[0].slice, cst.Index) and isinstance(expr.slice[0].slice.value, cst.SimpleString):
            field = str(expr.slice[0].slice.value.evaluated_value)
            dicts = [v for v in self._values_of(expr.value.value) if isinstance(v, cst.Dict)]
            found = [e.value for d in dicts for e in d.elements if isinstance(e, cst.DictElement) and isinstance(
                e.key, cst.SimpleString) and e.key.evaluated_value == field]
            return self._literal(key, found[0], depth + 1) if len(dicts) == 1 and len(found) == 1 else None
        if isinstance(expr, cst.Attribute) and "." in name:
            dest = name.rsplit(".", 1)[-1]
            adders = {dotted(t.target) for n in walk(self.f.module, into_functions=True) if isinstance(n, cst.Assign)
                      and dotted(n.value).endswith(".add_argument") for t in n.targets}  # `arg = parser.add_argument`
            for n in walk(self.f.module, into_functions=True):
                if isinstance(n, cst.Call) and (dotted(n.func).endswith("add_argument") or dotted(n.func) in adders) \
                        and option_dest(n) == dest:
                    default = next((a.value for a in n.args if a.keyword and a.keyword.value == "default"), None)
                    return self._literal(key, default, depth + 1) if default is not None else None
        return None

    def _param_values(self, key: str, param: str) -> list[tuple[str, cst.BaseExpression]]:
        """(scope, value) for each value a function's parameter gets: each call's argument, and its default where a
        call leaves it out."""
        node = self.f.scopes[key].node
        params = [*node.params.posonly_params, *node.params.params]
        names = [p.name.value for p in params]
        default = next((p.default for p in [*params, *node.params.kwonly_params]
                        if p.name.value == param and p.default is not None), None)
        out: list[tuple[str, cst.BaseExpression]] = []
        for caller in sorted(self.f.scopes):
            for call in (n for n in self.nodes(caller) if isinstance(n, cst.Call) and key in self.f.callees(n, caller)):
                positional = [a for a in call.args if a.keyword is None and not a.star]
                shift = 1 if names[:1] == ["self"] and isinstance(call.func, cst.Attribute) else 0
                given = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param), None)
                if given is None and param in names and 0 <= names.index(param) - shift < len(positional):
                    given = positional[names.index(param) - shift].value
                if given is None and default is not None and not any(a.star for a in call.args):
                    out.append((key, default))
                elif given is not None:
                    out.append((caller, given))
        return out

    def _values_of(self, name: str) -> list[cst.BaseExpression]:
        """Every value the script assigns to a plain name, anywhere in the file."""
        return [n.value for n in walk(self.f.module, into_functions=True) if isinstance(n, cst.Assign)
                and len(n.targets) == 1 and dotted(n.targets[0].target) == name]

    def _spread_kwargs(self, key: str, call: cst.Call) -> dict[str, cst.BaseExpression] | None:
        """`DataLoader(ds, **train_kwargs)` with `train_kwargs = {...}` (and `.update({...})` or
        `.update(cuda_kwargs)`) in the same scope: the options, the GPU branch's included; else None."""
        names = [dotted(a.value) for a in call.args if a.star == "**"]
        if not names or any(a.star == "*" for a in call.args) or not all(names):
            return None
        literals: dict[str, list[cst.Dict]] = {}
        updates: dict[str, list[cst.BaseExpression]] = {}
        stored: dict[str, list[tuple[str | None, cst.CSTNode]]] = {}  # `opts["sampler"] = s`, `del opts[k]`
        for node in self.nodes(key):
            if isinstance(node, (cst.Assign, cst.AugAssign, cst.Del)):
                for target in ([t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]):
                    if isinstance(target, cst.Subscript) and len(target.slice) == 1 \
                            and isinstance(target.slice[0].slice, cst.Index):
                        index = target.slice[0].slice.value
                        stored.setdefault(dotted(target.value), []).append(
                            (str(index.evaluated_value) if isinstance(index, cst.SimpleString) else None, node))
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                    and node.func.attr.value in ("pop", "setdefault", "clear", "popitem"):
                stored.setdefault(dotted(node.func.value), []).append((None, node))
            if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Dict):
                literals.setdefault(dotted(node.targets[0].target), []).append(node.value)
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                    and node.func.attr.value == "update" and len(node.args) == 1:
                updates.setdefault(dotted(node.func.value), []).append(node.args[0].value)
        out: dict[str, cst.BaseExpression] = {}

        def add(name: str) -> bool:
            if len(literals.get(name, [])) != 1:
                return False
            for element in literals[name][0].elements:
                if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                    return False
                out[element.key.evaluated_value] = element.value
            for extra in updates.get(name, []):
                if isinstance(extra, cst.Dict):
                    for element in extra.elements:
                        if not isinstance(element, cst.DictElement) or not isinstance(element.key, cst.SimpleString):
                            return False
                        out[element.key.evaluated_value] = element.value
                elif not add(dotted(extra)):
                    return False
            return True

        if not all(add(n) for n in names):
            return None
        changed = [(k, node) for n in names for k, node in stored.get(n, [])]
        samplers = [(k, node) for k, node in changed if k in ("sampler", "batch_sampler")]
        if samplers:  # the sampler TODO names it: the options themselves stay the script's
            self.sampler_at[id(call)] = samplers[0][1]
            return {**out, samplers[0][0]: samplers[0][1].value if isinstance(samplers[0][1], cst.Assign)
                    else cst.Name("None")}
        # an option set or removed by key (`opts["shuffle"] = False`) would be lost in the rewrite: not read
        return None if changed else out

    def _plan_batch_size_uses(self) -> None:
        """`images.reshape(batch_size, -1)`, `torch.ones(batch_size, 1)` in a training loop: the loader's batch
        size is the global batch, and each rank's batch now holds batch_size // world_size samples."""
        for key in sorted(self.f.ported):
            for loop in (n for n in self.nodes(key) if isinstance(n, cst.For) and self.loop_role(key, n) == "train"):
                body = list(walk(loop.body))
                skip = {id(n.keyword) for n in body if isinstance(n, cst.Arg) and n.keyword is not None}
                skip |= {id(n.attr) for n in body if isinstance(n, cst.Attribute)}
                use = next((n for n in body if isinstance(n, (cst.Name, cst.Attribute)) and id(n) not in skip
                            and dotted(n) in self.train_sizes), None)
                if use is not None:
                    self.todo(use, f"`{dotted(use)}` is the global batch, but each rank's batch now holds "
                              f"{dotted(use)} // ctx.world_size samples: in this training loop (first use here) "
                              "use the batch's own size (e.g. x.size(0))")

    # ---- role propagation ----------------------------------------------------------------------
    def _propagate_roles(self) -> None:
        for _ in range(10):
            changed = False
            for key in sorted(self.f.ported):
                for node in self.nodes(key):
                    if isinstance(node, cst.Assign) and len(node.targets) == 1:
                        target = dotted(node.targets[0].target)
                        value = dotted(loader_expr(node.value))
                        role = self.role(key, value) if value and target else None
                        if role and (target.startswith("self.") or role != "model" or self._alias_after_wrap(
                                key, node, value)):
                            changed |= self._set_role(key, target, role)
                        if isinstance(node.value, cst.Call):
                            changed |= self._returned_roles(key, node)
                    if not isinstance(node, cst.Call):
                        continue
                    for callee in self.f.callees(node, key):
                        params = self.f.scopes[callee].params
                        for i, arg in enumerate(a for a in node.args if a.keyword is None and not a.star):
                            role = self.role(key, dotted(arg.value))
                            if role and i < len(params):
                                changed |= self._set_role(callee, params[i], role)
                        for arg in node.args:
                            role = self.role(key, dotted(arg.value))
                            if role and arg.keyword is not None and arg.keyword.value in params:
                                changed |= self._set_role(callee, arg.keyword.value, role)
            if not changed:
                return

    def _alias_after_wrap(self, key: str, assign: cst.Assign, model: str) -> bool:
        """`best_model = model` below `model = ddpkit.wrap(model, ctx)` in the same scope: the name holds the DDP
        wrapper, so code that runs on rank 0 alone must get ddpkit.unwrap(best_model) (a forward of the wrapper there
        is a collective the other ranks never join). An alias bound before the wrap holds the bare module
        (check_aliases names it)."""
        placed = self.wrapped.get((key, model))
        return isinstance(assign.value, cst.Name) and bool(placed) and \
            self.line_of(assign) > min(self.line_of(w) for w in placed)

    def _returned_roles(self, key: str, assign: cst.Assign) -> bool:
        """`val_loader = make_val_loader(ds)`, `train_dl, val_dl = get_loaders()`, `model, opt = get_model(args)`
        (a model the helper wraps): the roles the helper returns."""
        changed = False
        target = assign.targets[0].target
        targets = [e.value for e in target.elements] if isinstance(target, (cst.Tuple, cst.List)) else [target]
        for callee in self.f.callees(assign.value, key):
            for ret in (n for n in walk(self.f.scopes[callee].node) if isinstance(n, cst.Return) and n.value):
                values = [e.value for e in ret.value.elements] if isinstance(ret.value, cst.Tuple) else [ret.value]
                if len(values) != len(targets):
                    continue
                for t, v in zip(targets, values):
                    role = self.loaders.get(id(v)) or self.role(callee, dotted(v))
                    if role in ("train", "eval") and dotted(t):
                        changed |= self._set_role(key, dotted(t), role)
                    elif role == "model" and dotted(t) and (callee, dotted(v)) in self.wrapped:
                        # `model, opt = get_model(args)` where get_model wraps it: the caller holds the wrapper
                        changed |= self._set_role(key, dotted(t), role)
        return changed

    def loop_role(self, key: str, for_node: cst.For) -> str | None:
        it = loader_expr(for_node.iter)
        if id(it) in self.loaders:  # `for x, y in DataLoader(test, batch_size=100):`
            return self.loaders[id(it)]
        role = self.role(key, dotted(it))
        if role not in ("train", "eval"):  # `for step in range(n): batch = next(batches)`, batches = iter(loader)
            role = next((self.role(key, dotted(n.args[0].value)) for n in walk(for_node.body) if isinstance(
                n, cst.Call) and dotted(n.func) == "next" and n.args and self.role(
                key, dotted(n.args[0].value)) in ("train", "eval")), None)
        return role if role in ("train", "eval") else None

    def host_loop(self, key: str, for_node: cst.For) -> bool:
        """A loop over a loader name that may hold a torch DataLoader the port keeps (on some path): its batches
        may be on the CPU, so their moves stay."""
        names = self.host_loaders.get(key, set())
        if not names:
            return False
        if dotted(loader_expr(for_node.iter)) in names:
            return True
        return any(isinstance(n, cst.Call) and dotted(n.func) == "next" and n.args and dotted(n.args[0].value) in names
                   for n in walk(for_node.body))

    # ---- init ---------------------------------------------------------------------------------
    def bound_before_init(self) -> set[str]:
        """Names the entry point binds before ddpkit.init() runs (its parameters, the parsed arguments)."""
        bound = set(self.f.scopes[self.f.entry_key].params) if not self.f.ctx_global else set()
        if not self.f.ctx_global:  # `args = parser.parse_args()` at module level, then `main()` is called
            for stmt in self.f.module.body:
                if any(isinstance(n, cst.Call) and dotted(n.func) == self.f.entry_key for n in walk(stmt)):
                    break
                if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                    bound.update(dotted(n.target) for n in walk(stmt) if isinstance(n, cst.AssignTarget))
        entry_node = self.f.entry_owner if self.f.ctx_global else self.f.scopes[self.f.entry_key].node
        for stmt in statements_of(entry_node):
            if stmt in self.f.region:
                break
            bound.update(dotted(n.target) for n in walk(stmt) if isinstance(n, cst.AssignTarget))
        return bound

    def _seed(self) -> cst.BaseExpression | None:
        bound = self.bound_before_init()
        for stmt in self.f.region:
            for node in walk(stmt):
                if isinstance(node, cst.Call) and dotted(node.func) == "torch.manual_seed" and node.args:
                    value = node.args[0].value
                    if isinstance(value, cst.Integer):
                        return value
                    # a setting read before ddpkit.init runs: only where the script seeds unconditionally (under
                    # an `if args.seed is not None:` it may be None) and has not set it again in between
                    plain = isinstance(stmt, cst.SimpleStatementLine)
                    if plain and root_name(value) in bound and dotted(value) and dotted(value) not in set().union(*(
                            _assigned(s) for s in self.f.region[:self.f.region.index(stmt)])):
                        return value
                    return None
        return None


def _assigned(stmt: cst.CSTNode) -> set[str]:
    """Names and attributes a statement binds (`args.seed = ...`, `seed = ...`)."""
    return {dotted(n.target) for n in walk(stmt) if isinstance(n, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign))}
