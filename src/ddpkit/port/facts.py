"""What `ddpkit port` reads from a plain script before changing it: entry point, scopes, loaders, models."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

__all__ = ["Scope", "Facts", "dotted", "root_name", "is_device_expr", "imported_names", "loader_expr", "walk", "bound",
           "statements_of", "ENTRY", "ARGS_ROOTS", "CONCAT", "RANDOM_DRAW", "accumulated", "names_a_device",
           "hands_to_unported", "runtime_modules"]

RANDOM_DRAW = re.compile(r"^(torch\.(randint|randn|rand|randperm|normal|bernoulli|multinomial|poisson)"
                         r"|(np|numpy)\.random\.(?!default_rng|RandomState|Generator|seed|get_state|set_state)\w+"
                         r"|random\.(random|randint|choice|choices|sample|shuffle|uniform|gauss|randrange))$")
"""Calls that draw from a process-wide generator (not `*_like`: those are drawn inside a step alike)."""
ARGS_ROOTS = frozenset({"args", "opt", "opts", "config", "cfg", "hparams", "FLAGS", "flags", "conf", "hp", "options"})
"""Names that usually hold parsed arguments or a config: `args.device` is the script's device setting."""
ENTRY = "<entry>"
"""Scope key of the training entry point's code when it is not a function (top level or a __main__ block)."""

_SETUP = re.compile(r"\b(argparse|parser|parse_args|parse_known_args|add_argument|ArgumentParser)\b")
_TRAINING = re.compile(r"DataLoader|backward\(|optim\.|\.parameters\(\)")
_BUSY = re.compile(r"DataLoader|cuda|device|\.to\(|print|save|optim|backward|tqdm|open\(|model|Module|seed|"
                   r"torch\.|download|\bfor\b|\bwith\b|\bif\b|def |class ")
_EVAL_NAME = re.compile(r"test|val|eval|holdout")
_DISTRIBUTED = re.compile(r"\b(torch\.distributed|DistributedDataParallel|init_process_group|DistributedSampler|"
                          r"accelerate|lightning|horovod|deepspeed|mp\.spawn|share_memory)\b")
_LAUNCHES = frozenset({"spawn", "start_processes", "Process"})
"""torch.multiprocessing calls that start worker processes; an import or `set_start_method` alone starts none."""


def dotted(node: cst.CSTNode | None) -> str:
    """`self.model` -> 'self.model'; '' for anything that is not a name or an attribute chain."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted(node.value)
        return f"{head}.{node.attr.value}" if head else ""
    return ""


def root_name(node: cst.CSTNode) -> str:
    """The name an expression starts from: `batch["x"].float()` -> 'batch'."""
    while True:
        if isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        elif isinstance(node, cst.Name):
            return node.value
        else:
            return ""


def is_device_expr(node: cst.CSTNode) -> bool:
    """An expression that names a device: `device`, `self.device`, `ctx.device`, 'cuda', torch.device(...)."""
    if isinstance(node, cst.SimpleString):
        return re.fullmatch(r"[rbuRBU]*['\"](cuda|cpu|mps)(:\d+)?['\"]", node.value) is not None
    if isinstance(node, (cst.Name, cst.Attribute)):
        return "device" in dotted(node).rsplit(".", 1)[-1].lower()
    if isinstance(node, cst.Call):
        return dotted(node.func) in ("torch.device", "device")
    return False


_ITER_WRAPPERS = frozenset({"enumerate", "tqdm", "tqdm.tqdm", "trange", "iter", "tqdm.auto.tqdm"})


def loader_expr(expr: cst.BaseExpression) -> cst.BaseExpression:
    """The loader a `for` iterates: `enumerate(tqdm(loader))` -> `loader`."""
    while isinstance(expr, cst.Call) and dotted(expr.func) in _ITER_WRAPPERS and expr.args:
        expr = expr.args[0].value
    return expr


CONCAT = frozenset({"torch.cat", "np.concatenate", "numpy.concatenate", "np.vstack", "numpy.vstack"})
"""Calls that join arrays along their first dimension (`acc = torch.cat([acc, out])`)."""
_STACKS = frozenset({"torch.stack", "np.stack", "numpy.stack"})


def accumulated(node: cst.CSTNode) -> tuple[str, str] | None:
    """`x += v`, `d[k] += v`, `xs.append(v)`, `x = torch.cat([x, v])`: (what accumulates, how)."""
    if isinstance(node, cst.AugAssign):
        name = dotted(node.target) or (f"{root_name(node.target)}[...]" if root_name(node.target) else "")
        return (name, "accumulates") if name else None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in (
            "append", "extend"):
        owner = node.func.value  # `xs.append(v)`, or `out["preds"].append(v)`: an entry of a dict (or list)
        name = dotted(owner) or (f"{root_name(owner)}[...]" if isinstance(owner, cst.Subscript) and dotted(
            owner.value) else "")
        return (name, "collects values") if name else None
    if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call) \
            and dotted(node.value.func) in CONCAT | _STACKS:
        name = dotted(node.targets[0].target)
        if name and any(dotted(n) == name for n in walk(node.value)):
            return name, "concatenates values"
    return None


def bound(target: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The targets an assignment binds: `a`, each element of `a, (b, *c)`; not the names a subscript or an attribute
    target reads (`buf[i] = ...` reads `i`)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [target] + [x for e in target.elements for x in bound(e.value)]
    if isinstance(target, cst.StarredElement):
        return bound(target.value)
    return [target]


def walk(node: cst.CSTNode, *, into_functions: bool = False) -> Iterator[cst.CSTNode]:
    """Every node under `node` (pre-order), not descending into nested functions and classes by default."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if current is not node and not into_functions and isinstance(current, (cst.FunctionDef, cst.ClassDef)):
            continue
        stack.extend(reversed(current.children))


def statements_of(node: cst.CSTNode) -> list[cst.BaseStatement]:
    """The statements of a module, a function or a compound statement's block."""
    body = node.body
    if isinstance(node, cst.Module):
        return list(body)
    return list(body.body) if isinstance(body, cst.IndentedBlock) else []


def _returns_value(node: cst.FunctionDef) -> bool:
    """The function hands back something other than an exit status: `return args`, `return parser.parse_args()`
    (not `return 0`, `return 1`, `return None`, a bare `return`)."""
    for n in walk(node.body):
        if isinstance(n, cst.Return) and n.value is not None and not isinstance(n.value, cst.Integer) and not (
                isinstance(n.value, cst.Name) and n.value.value in ("None", "True", "False")) and not (
                isinstance(n.value, cst.UnaryOperation) and isinstance(n.value.expression, cst.Integer)):
            return True
    return False


def _is_main_guard(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.If) or not isinstance(stmt.test, cst.Comparison):
        return False
    parts = [stmt.test.left, *(c.comparator for c in stmt.test.comparisons)]
    texts = {dotted(p) or (p.value.strip("'\"") if isinstance(p, cst.SimpleString) else "") for p in parts}
    return texts == {"__name__", "__main__"}


def _is_definition(stmt: cst.BaseStatement) -> bool:
    """def, class, import, a docstring (whatever words it holds): module-level statements that build nothing."""
    return isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or isinstance(stmt, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) or isinstance(s, cst.Expr) and isinstance(
            s.value, (cst.SimpleString, cst.ConcatenatedString)) for s in stmt.body)


def _is_setup(stmt: cst.BaseStatement, code: str) -> bool:
    """Statements that may stay before ddpkit.init(): docstrings, imports, argument parsing, definitions."""
    if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        return True
    if isinstance(stmt, cst.SimpleStatementLine):
        if all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in stmt.body):
            return True
        if all(isinstance(s, cst.Expr) and isinstance(s.value, (cst.SimpleString, cst.ConcatenatedString))
               for s in stmt.body):
            return True
    if isinstance(stmt, cst.SimpleStatementLine) and _argparse_only(stmt):
        return True
    return _SETUP.search(code) is not None and "DataLoader" not in code


_ARGPARSE_CALLS = frozenset({"add_argument", "add_parser", "add_subparsers", "add_argument_group", "set_defaults",
                             "add_mutually_exclusive_group", "ArgumentParser", "parse_args", "parse_known_args"})
_SEED_CALLS = frozenset({"torch.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all", "random.seed",
                         "np.random.seed", "numpy.random.seed"})
_SEED_NAME = re.compile(r"(set_?|setup_?|init_?|fix_?|make_?)?(random_?|global_?)?seeds?(_all|_everything|_torch)?|"
                        r"seed_?(everything|all|torch)", re.I)
"""A helper's name that says it seeds (`set_seed`, `seed_everything`, `setup_seed`, `init_seeds`, `fix_seed`)."""
_SEED_SIDE = ("torch.backends", "os.environ", "torch.use_deterministic", "print", "str", "int", "np.random.seed",
              "torch.cuda")
"""Calls a seed helper may make beside the seeds themselves (cudnn flags, PYTHONHASHSEED, a print)."""
_QUIET_CALLS = frozenset({"str", "int", "float", "bool", "list", "tuple", "dict", "set", "range", "len", "sorted",
                          "os.path.join", "os.path.dirname", "os.path.abspath", "os.path.realpath", "os.path.basename",
                          "os.path.expanduser", "os.getcwd", "sys.path.append", "sys.path.insert", "Path",
                          "pathlib.Path", "warnings.filterwarnings", "warnings.simplefilter"})
"""Calls that only compute a path or a constant: such a line may stay before ddpkit.init on every rank."""
_STRING = re.compile(r"""[rbuf]*("[^"\n]*"|'[^'\n]*')""", re.I)


def _argparse_only(stmt: cst.SimpleStatementLine) -> bool:
    """Every call in the statement builds or runs an argument parser (help texts may say anything)."""
    calls = [n for n in walk(stmt) if isinstance(n, cst.Call)]
    return bool(calls) and all(dotted(c.func).rsplit(".", 1)[-1] in _ARGPARSE_CALLS or dotted(c.func) in
                               ("str", "int", "float", "bool", "list", "tuple", "dict", "range") for c in calls)


@dataclass
class Scope:
    """One place that code runs in: a module-level function, a method, or the entry point's code."""

    key: str
    node: cst.CSTNode
    cls: str | None = None
    params: list[str] = field(default_factory=list)
    """Parameter names in order (without `self` for methods)."""
    calls: set[str] = field(default_factory=set)
    """Scope keys this scope calls directly."""
    roles: dict[str, str] = field(default_factory=dict)
    """Names in this scope that hold a 'train' or 'eval' loader or the 'model'."""
    instances: dict[str, str] = field(default_factory=dict)
    """Names bound to an instance of one of the module's classes: {'trainer': 'Trainer'}."""


class Facts:
    """The analysis of one parsed module (nodes are those of the MetadataWrapper's module)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.distributed_hint = self._distributed_hint()
        self.ported_already = any(
            isinstance(n, cst.Call) and dotted(n.func) == "ddpkit.init" for n in walk(module, into_functions=True))
        self.scopes: dict[str, Scope] = {}
        self.classes: dict[str, cst.ClassDef] = {}
        for stmt in module.body:
            if isinstance(stmt, cst.FunctionDef):
                self._add_scope(stmt.name.value, stmt, None)
            elif isinstance(stmt, cst.ClassDef):
                self.classes[stmt.name.value] = stmt
                for item in statements_of(stmt):
                    if isinstance(item, cst.FunctionDef):
                        self._add_scope(f"{stmt.name.value}.{item.name.value}", item, stmt.name.value)
        self.parsers = {k for k, scope in self.scopes.items() if scope.cls is None and re.search(
            r"\.parse_(known_)?args\(", self.code(scope.node)) and not _TRAINING.search(self.code(scope.node))
            and _returns_value(scope.node)}
        """The script's own argument-parsing functions (`args = get_args()` stays before ddpkit.init): they hand
        back what they parsed. A `main()` that parses, runs a trainer of another module and returns an exit code
        (`exit(main())`) is the entry point, not a parser."""
        self.started_outside: str | None = None
        """The entry function when nothing in the file calls it (a console script starts it): a TODO says so."""
        self.entry_key, self.entry_owner, self.region = self._find_entry()
        self.ctx_global = self.entry_key == ENTRY
        if self.ctx_global:
            self.scopes[ENTRY] = Scope(ENTRY, self.entry_owner)
        for scope in self.scopes.values():
            scope.calls = self._calls_of(scope)
        self.ported = self._reachable()

    # ---- structure ---------------------------------------------------------------------------
    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    def _distributed_hint(self) -> str | None:
        imported = imported_names(self.module)
        for node in walk(self.module, into_functions=True):
            if isinstance(node, cst.Call):
                name = dotted(node.func)
                head, _, rest = name.partition(".")
                full = f"{imported.get(head, head)}.{rest}" if rest else imported.get(name, name)
                module, _, called = full.rpartition(".")
                if module == "torch.multiprocessing" and called in _LAUNCHES:
                    return full
        for stmt in walk(self.module, into_functions=True):
            if isinstance(stmt, (cst.Import, cst.ImportFrom, cst.Attribute, cst.Name)):
                match = _DISTRIBUTED.search(self.code(stmt)) if not isinstance(stmt, cst.Name) else None
                if match:
                    return match.group(1)
        return None

    def _add_scope(self, key: str, node: cst.FunctionDef, cls: str | None) -> None:
        names = [p.name.value for p in (*node.params.params, *node.params.kwonly_params)]
        if cls is not None and names and names[0] in ("self", "cls"):
            names = names[1:]
        self.scopes[key] = Scope(key, node, cls, names)

    def _find_entry(self) -> tuple[str, cst.CSTNode, list[cst.BaseStatement]]:
        """(scope key, the node whose body holds the region, the region's statements)."""
        guard = next((s for s in self.module.body if _is_main_guard(s)), None)
        module_setup = [s for s in self.module.body if s is not guard and not _is_definition(s)
                        and _TRAINING.search(self.code(s))]
        if guard is not None and not module_setup:
            called = [dotted(n.func) for n in walk(guard) if isinstance(n, cst.Call)]
            # `run_training(parse_args())`: the parser is setup, never the entry point
            targets = [c for c in called if c in self.scopes and self.scopes[c].cls is None and c not in self.parsers]
            body = statements_of(guard)
            inline = [s for s in body if not self._only_calls(s, targets)]
            # `best_loss = 0` beside the parser: a quiet line binds a global the entry function reads, runs nothing;
            # a block whose every line parses or sets up leaves no region of its own (`main(parser.parse_args())`)
            if targets and (not [s for s in inline if not _is_setup(s, self.code(s)) and not self._quiet(s)]
                            or not self._region_after_setup(body)):
                training = [t for t in targets if self._trains(t)]
                key = (training or targets)[0] if training else targets[-1]
                node = self.scopes[key].node
                return key, node, self._region_after_setup(statements_of(node))
            return ENTRY, guard, self._region_after_setup(body)
        # no guard, or training objects built at module level: the region runs to the end (the guard too)
        region = self._region_after_setup(list(self.module.body))
        if guard is None and not region:
            # only definitions: one top-level function that parses arguments and trains, called nowhere in the
            # file, is started from outside (a console script, `python -m package`): it is the entry point
            called = {dotted(n.func) for n in walk(self.module, into_functions=True) if isinstance(n, cst.Call)}
            starts = [k for k, sc in self.scopes.items() if sc.cls is None and "." not in k and k not in called
                      and _TRAINING.search(self.code(sc.node)) and re.search(r"\.parse_(known_)?args\(",
                                                                                self.code(sc.node))]
            if len(starts) == 1:
                self.started_outside = starts[0]
                node = self.scopes[starts[0]].node
                return starts[0], node, self._region_after_setup(statements_of(node))
        return ENTRY, self.module, region

    def _trains(self, key: str) -> bool:
        """The function, or a function of this file it calls (at any depth), builds a loader or an optimizer or
        steps backward: `run_training(args)` that calls `train_one_epoch(...)` and `build_optimizer(...)` trains."""
        seen, todo = {key}, [key]
        while todo:
            node = self.scopes[todo.pop()].node
            if _TRAINING.search(self.code(node)):
                return True
            for call in walk(node, into_functions=True):
                name = dotted(call.func) if isinstance(call, cst.Call) else ""
                if name in self.scopes and self.scopes[name].cls is None and name not in seen:
                    seen.add(name)
                    todo.append(name)
        return False

    def _only_calls(self, stmt: cst.BaseStatement, targets: list[str]) -> bool:
        """`main()`, `args = main()`, `sys.exit(main(args))`: the statement only runs the entry function."""
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            return False
        small = stmt.body[0]
        value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
        if isinstance(value, cst.Call) and dotted(value.func) in ("sys.exit", "exit", "quit") and value.args:
            value = value.args[0].value
        return isinstance(value, cst.Call) and dotted(value.func) in targets

    def _region_after_setup(self, body: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
        start = 0
        while start < len(body) and (_is_setup(body[start], self.code(body[start])) or self._parses(body[start])):
            start += 1
        # argument parsing after a few quiet lines (constants, paths): it stays before ddpkit.init too
        last = max((i for i in range(start, len(body)) if self._parses(body[i])
                    or _SETUP.search(self.code(body[i])) and isinstance(body[i], cst.SimpleStatementLine)), default=-1)
        if last >= start and not any(_BUSY.search(_STRING.sub("''", self.code(s))) for s in body[start:last + 1]
                                     if not (isinstance(s, cst.SimpleStatementLine) and _argparse_only(s))
                                     and not self._quiet(s)):
            start = last + 1
        return body[start:]

    def _quiet(self, stmt: cst.BaseStatement) -> bool:
        """A line that may run before ddpkit.init on every rank: `global opt, model`, `model_options = [...]`, imports,
        `sys.path.append("..")`, `BASE = os.path.dirname(__file__)`: it binds names or paths, calls nothing of
        torch and names no device (the names it binds may say `model`: only what it runs counts)."""
        if not isinstance(stmt, cst.SimpleStatementLine):
            return False
        if not all(isinstance(s, (cst.Global, cst.Nonlocal, cst.Pass, cst.Assign, cst.AnnAssign, cst.Expr, cst.Import,
                                  cst.ImportFrom))
                   for s in stmt.body):
            return False
        calls = [dotted(n.func) for n in walk(stmt) if isinstance(n, cst.Call)]
        if any(isinstance(s, cst.Expr) and not isinstance(s.value, cst.Call) for s in stmt.body):
            return False
        values = [s.value for s in stmt.body if isinstance(s, (cst.Assign, cst.AnnAssign, cst.Expr)) and s.value]
        # an import of the script's own module may be named `model`: importing it runs nothing of the port's
        text = " ".join(_STRING.sub("''", self.code(v)) for v in values)
        return all(c in _QUIET_CALLS or c.rsplit(".", 1)[-1] in _ARGPARSE_CALLS for c in calls) and \
            not re.search(r"cuda|device|seed|torch|DataLoader|\.to\(", text)

    def is_seed_call(self, call: cst.Call) -> bool:
        """A call that seeds the global generators: `torch.manual_seed(s)`, `random.seed(s)`, `np.random.seed(s)`,
        a function of this file whose body calls one of them (`def set_seed(s): random.seed(s); ...`), or a
        seed-like name the script imports (`from utils import setup_seed`, `seed_everything(args.seed)`)."""
        name = dotted(call.func)
        if name in _SEED_CALLS:
            return True
        if name in self.scopes and self.scopes[name].cls is None:
            # the entry point (`main()` seeds, then trains) is not a seed helper: its region runs after init
            calls = [dotted(n.func) for n in walk(self.scopes[name].node.body) if isinstance(n, cst.Call)]
            return name != getattr(self, "entry_key", None) and any(c in _SEED_CALLS for c in calls) and (
                _SEED_NAME.fullmatch(name) is not None or all(c in _SEED_CALLS or c.startswith(_SEED_SIDE)
                                                             for c in calls))
        return bool(name) and name.split(".")[0] in self.imported and \
            _SEED_NAME.fullmatch(name.rsplit(".", 1)[-1]) is not None

    @property
    def imported(self) -> set[str]:
        """Names the script's imports bind at module level (`utils`, `set_seed` of `from utils import set_seed`)."""
        names: set[str] = set()
        for stmt in self.module.body:
            for small in (stmt.body if isinstance(stmt, cst.SimpleStatementLine) else []):
                if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                    names.update((a.asname.name.value if a.asname else dotted(a.name).split(".")[0])
                                 for a in small.names if isinstance(a.asname.name if a.asname else a.name,
                                                                    (cst.Name, cst.Attribute)))
        return names

    def seeded_before_init(self) -> bool:
        """The script seeds its generators before ddpkit.init runs (module level, or before the region)."""
        ids = self.region_ids()
        guards = [s for s in self.module.body if _is_main_guard(s)]
        before = [s for s in self.module.body if not _is_main_guard(s)]
        before += [s for g in guards for s in statements_of(g)]
        if not self.ctx_global:
            before += statements_of(self.scopes[self.entry_key].node)
        before = [s for s in before if id(s) not in ids]
        return any(isinstance(n, cst.Call) and (self.is_seed_call(n) or self._seeds_inside(n)) for s in before
                   if not isinstance(s, (cst.FunctionDef, cst.ClassDef)) for n in walk(s))

    def _seeds_inside(self, call: cst.Call) -> bool:
        """A call, before ddpkit.init, of a function of this file that seeds on its way (`args = init_config()`
        parses, then `torch.manual_seed(args.seed)`): whatever else it does, the generators are seeded before init."""
        name = dotted(call.func)
        if name not in self.scopes or self.scopes[name].cls is not None or name == getattr(self, "entry_key", None):
            return False
        return any(isinstance(n, cst.Call) and self.is_seed_call(n) for n in walk(self.scopes[name].node.body))

    def _parses(self, stmt: cst.BaseStatement) -> bool:
        """`args = get_args()`: a call of one of the script's argument-parsing functions."""
        return isinstance(stmt, cst.SimpleStatementLine) and any(
            isinstance(n, cst.Call) and dotted(n.func) in self.parsers for n in walk(stmt))

    def region_ids(self) -> set[int]:
        return {id(s) for s in self.region}

    def _calls_of(self, scope: Scope) -> set[str]:
        nodes = [n for s in self.region for n in walk(s)] if scope.key == ENTRY or scope.key == self.entry_key \
            else list(walk(scope.node))
        scope.instances = {dotted(t.target): dotted(n.value.func) for n in nodes if isinstance(n, cst.Assign)
                           and isinstance(n.value, cst.Call) and dotted(n.value.func) in self.classes
                           for t in n.targets if dotted(t.target)}
        return {k for n in nodes if isinstance(n, cst.Call) for k in self.callees(n, scope.key)}

    def callees(self, call: cst.Call, caller: str) -> list[str]:
        """The module's own functions or methods a call may run: `f()`, `C()` (its __init__), `self.m()`,
        `obj.m()` where `obj = C(...)` in the caller (also `ddpkit.unwrap(obj).m()`, as the port writes it)."""
        name = dotted(call.func)
        if name in self.scopes and self.scopes[name].cls is None:
            return [name]
        if name in self.classes:
            return [f"{name}.__init__"] if f"{name}.__init__" in self.scopes else []
        attr = call.func.attr.value if isinstance(call.func, cst.Attribute) else ""
        if not attr or attr.startswith("__") and attr.endswith("__"):  # a dunder; `self.__train()` is the class's own
            return []
        scope = self.scopes.get(caller)
        value = call.func.value
        if isinstance(value, cst.Call) and dotted(value.func) == "ddpkit.unwrap" and value.args:
            value = value.args[0].value  # `ddpkit.unwrap(model).sample(...)`: a method of model's class
        receiver = dotted(value)
        cls = scope.cls if scope is not None and receiver == "self" else \
            scope.instances.get(receiver) if scope is not None else None
        key = f"{cls}.{call.func.attr.value}"
        return [key] if cls and key in self.scopes else []

    def _reachable(self) -> set[str]:
        start = ENTRY if self.ctx_global else self.entry_key
        seen, todo = {start}, [start]
        while todo:
            for callee in self.scopes[todo.pop()].calls:
                if callee not in seen:
                    seen.add(callee)
                    todo.append(callee)
        return seen

    def scope_statements(self, key: str) -> list[cst.BaseStatement]:
        """The statements where ctx exists in a ported scope (the region for the entry point)."""
        if key in (ENTRY, self.entry_key):
            return self.region
        return statements_of(self.scopes[key].node)

    def is_eval_name(self, text: str) -> bool:
        return _EVAL_NAME.search(text.lower()) is not None


def hands_to_unported(f: Facts) -> tuple[cst.BaseStatement, list[str]] | None:
    """The entry's first statement that hands control to classes or functions of the script the port did not port
    (`Fire(Forecast)`, `runner.run(Experiment)`), and the scope keys of their code: training runs in there, out of
    the port's sight, so the one seed every rank got after ddpkit.init must be undone before it (or every rank draws
    the same samples and noise), and what that code writes is every rank's."""
    entry = ENTRY if f.ctx_global else f.entry_key
    owners = {s.cls or key for key, s in f.scopes.items() if key not in (ENTRY, f.entry_key)}
    unported = owners - {s.cls or key for key, s in f.scopes.items() if key in f.ported}  # none of its code ported
    for stmt in f.scope_statements(entry):
        named = set() if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) else {
            n.value for n in walk(stmt) if isinstance(n, cst.Name) and n.value in unported}
        if named:
            return stmt, sorted(key for key, s in f.scopes.items() if (s.cls or key) in named)
    return None


_RUNTIME_IMPORTS = frozenset({"import_module", "importlib.import_module", "__import__"})


def runtime_modules(module: cst.Module) -> frozenset[str]:
    """Names the script binds to a module it imports at run time (`module = import_module(args.script)`): a config
    module the user names on the command line, whose settings (`module.device`) the script reads as it reads
    `args`."""
    return frozenset(t.target.value for node in walk(module, into_functions=True) if isinstance(node, cst.Assign)
                     and isinstance(node.value, cst.Call) and dotted(node.value.func) in _RUNTIME_IMPORTS
                     for t in node.targets if isinstance(t.target, cst.Name))


def imported_names(module: cst.Module) -> dict[str, str]:
    """Local name -> the dotted name it was imported as (`Planetoid` -> `torch_geometric.datasets.Planetoid`)."""
    found: dict[str, str] = {}
    for node in walk(module, into_functions=True):
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted(alias.name)
                local = alias.asname.name.value if alias.asname else full.split(".")[0]
                found[local] = full if alias.asname else local
        elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar) and node.module:
            for alias in node.names:
                local = alias.asname.name.value if alias.asname else dotted(alias.name)
                found[local] = f"{dotted(node.module)}.{dotted(alias.name)}"
    return found


def names_a_device(module: cst.Module) -> bool:
    """The code (not its comments or docstrings) names a device: a name or attribute saying `device` or `cuda`
    (`torch.device(...)`, `x.cuda()`, `device=`), or a string naming an accelerator (`.to("cuda:0")`)."""
    for node in walk(module, into_functions=True):
        if isinstance(node, cst.Name) and re.search(r"device|cuda", node.value, re.IGNORECASE):
            return True
        if isinstance(node, cst.SimpleString) and re.match(r"(cuda|mps|xpu|npu|hpu)\b", str(node.evaluated_value)):
            return True
    return False
