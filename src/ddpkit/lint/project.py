"""A lint project: the files of one program, how they import each other, and the facts rules read across them."""

from __future__ import annotations

import ast
import os
import re

from ddpkit.lint.analysis import GLOBAL, NONE, Script, is_eval_name, terminal

__all__ = ["Project", "LOSS_NAME", "eval_samplers", "programs"]

LOSS_NAME = re.compile(r"loss", re.IGNORECASE)
"""Names that hold a loss value or a loss meter (`loss`, `lossf`, `loss_value`, `losses`)."""
_AUGMENT = re.compile(r"^Random[A-Z]|ColorJitter|GaussianBlur|Solariz|RandAugment|AutoAugment|TrivialAugment|"
                      r"[Mm]ixup|[Cc]ut[Mm]ix|MultiCrop|multicrop|augment|horizontal_flip|color_distortion|"
                      r"random_crop|gaussian_blur")
"""Identifiers of random data augmentation: the stream a seed shared by every rank makes identical."""
_LOCAL_HOSTS = ("127.0.0.1", "localhost")
_REDUCING = re.compile(r"reduce|gather|sync")


class Project:
    """The files linted together (`ddpkit lint DIR`): each parsed once, imports of each other resolved.

    A function defined in one file and called from another gets the guard level of those calls
    (torch.save in utils.save_on_master, called under `if rank == 0:` in main.py, is guarded), and
    the facts below are taken over every file: a set_epoch in the trainer module counts for the
    DistributedSampler of the data module.
    """

    def __init__(self, trees: dict[str, ast.Module]) -> None:
        self.paths = list(trees)
        self.modules = _Modules(self.paths)
        self._memo: dict[object, object] = {}
        self.scripts = {path: _script(path, tree, {}) for path, tree in trees.items()}
        for _ in range(2):  # a helper of a helper in a third file needs a second round
            levels = self._external_levels()
            if not levels:
                break
            changed = False
            for path, tree in trees.items():
                if levels.get(path, {}) != self.scripts[path].external_levels:
                    self.scripts[path] = _script(path, tree, levels.get(path, {}))
                    changed = True
            if not changed:
                break
        for script in self.scripts.values():
            script.project = self
        self._collect_facts()
        self._liveness()

    # ---- imports -----------------------------------------------------------------------------
    def resolve(self, script: Script, func: ast.AST) -> tuple[str, str] | None:
        """(path, function name) of the project function a callee names (`utils.save_on_master`), else None."""
        qualname = script.qualname(func)
        if "." not in qualname:  # `from utils import *` then `save_model(...)`
            for module in script.star_modules:
                path = self.modules.locate(script.path, module)
                if path is not None and path != script.path and qualname in self.scripts[path].function_names:
                    return path, qualname
            return None
        module, name = qualname.rsplit(".", 1)
        path = self.modules.locate(script.path, module)
        if path is None or name not in self.scripts[path].function_names:
            return None
        return path, name


    def memo(self, key: object, compute):
        """A fact over every file, computed once per project (the checks run once per file)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _external_levels(self) -> dict[str, dict[str, int]]:
        levels: dict[str, dict[str, int]] = {}
        methods: dict[str, list[str]] = {}
        for path, script in self.scripts.items():
            for d in script.defs:
                if d.args.args and d.args.args[0].arg == "self":
                    methods.setdefault(d.name, []).append(path)
        for path, script in self.scripts.items():
            for call in script.calls:
                target = self.resolve(script, call.func)
                if target is None and isinstance(call.func, ast.Attribute):
                    # `trainer.save_checkpoint()` on an object of a class another file defines: followed when
                    # exactly one file of the program defines a method of that name (not module calls)
                    owner = call.func.value
                    while isinstance(owner, ast.Attribute):
                        owner = owner.value
                    homes = methods.get(call.func.attr, [])
                    if len(homes) == 1 and not (isinstance(owner, ast.Name) and owner.id in script.aliases):
                        target = (homes[0], call.func.attr)
                if target is None or target[0] == path:
                    continue
                level = script.context(call).level
                if script.context(call).functions:
                    level = max(level, script.function_level.get(script.context(call).functions[-1], NONE))
                into = levels.setdefault(target[0], {})
                into[target[1]] = min(into.get(target[1], GLOBAL), level)
        return levels

    # ---- which code runs ---------------------------------------------------------------------
    def _liveness(self) -> None:
        """Follow the program from its entry scripts: the functions some rank can run, by name.

        Roots are the module-level code of every file (a helper's own `if __name__ == "__main__":`
        block only in an entry script, the file Python runs), methods Python or a framework calls by
        convention (dunders, `forward`, every method of a class whose base is not the project's nor a
        plain nn.Module/Dataset) and decorated functions (a decorator may register them). A function
        is live when live code names it (a call, `self.f`, `f` passed along). A program whose entry
        scripts do nothing at import (a library linted alone) is taken as all live.
        """
        defs: dict[str, list[ast.AST]] = {}
        roots: list[ast.AST] = []
        # classes a framework calls into by convention: a base that is neither the project's nor a plain
        # nn.Module/Dataset, directly or through the project's own base classes
        classes = {n.name: n for x in self.scripts.values() for n in x.nodes if isinstance(n, ast.ClassDef)}
        self._framework_classes: set[str] = set()
        for _ in range(4):
            more = {name for name, c in classes.items() if any(
                terminal(b) in self._framework_classes or (terminal(b) not in _PLAIN_BASES and terminal(b) not in classes)
                for b in c.bases)}
            if more <= self._framework_classes:
                break
            self._framework_classes |= more
        self.dead_blocks: dict[str, set[int]] = {}
        entries = [p for p in self.paths if p not in self.imported]
        acts = False
        for path, s in self.scripts.items():
            entry = path in entries
            dead: set[int] = set()
            for d in s.defs:
                defs.setdefault(d.name, []).append(d)
                if any(terminal(x.func if isinstance(x, ast.Call) else x) not in _PLAIN_DECORATORS
                       for x in d.decorator_list):
                    roots.append(d)
            for stmt in s.tree.body:
                if _is_main_block(stmt):
                    if entry:
                        roots.append(stmt)
                    else:
                        dead.update(id(n) for n in ast.walk(stmt))
                elif isinstance(stmt, ast.ClassDef):
                    framework = stmt.name in self._framework_classes
                    for item in stmt.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            if framework or _conventional(item.name):
                                roots.append(item)
                        else:
                            roots.append(item)
                    roots.extend(stmt.bases + stmt.decorator_list + stmt.keywords)
                elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    roots.append(stmt)
            acts = acts or (entry and self._acts(s))
            self.dead_blocks[path] = dead
        if not acts:
            self.live_functions = None
            return
        # an entry file that does nothing when run is a library linted alongside: its functions count
        for path, s in self.scripts.items():
            if path in entries and not self._acts(s):
                roots.extend(s.defs)
        live: set[str] = set()
        todo = roots
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            for n in ast.walk(node):
                name = ""
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    name = n.id
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
                    name = n.attr
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is node:
                    live.add(n.name)
                if name and name not in live:
                    live.add(name)
                    todo.extend(defs.get(name, ()))
        self.live_functions = live

    @staticmethod
    def _acts(s: Script) -> bool:
        """The file does something when run, beyond defining names: a `__main__` block or a top-level call statement."""
        return any(_is_main_block(stmt) or isinstance(stmt, (ast.Expr, ast.For, ast.While, ast.With, ast.If, ast.Try))
                   and any(isinstance(n, ast.Call) for n in ast.walk(stmt)) for stmt in s.tree.body)

    def runs(self, script: Script, node: ast.AST) -> bool:
        """Whether some rank can run `node`: not in a helper's own `__main__` block nor in a function the
        program never calls (see _liveness). Functions are matched by name, so this errs towards running."""
        if id(node) in self.dead_blocks.get(script.path, ()):
            return False
        if self.live_functions is None:
            return True
        return all(f in self.live_functions for f in script.context(node).functions)

    # ---- facts -------------------------------------------------------------------------------
    def calls_named(self, *names: str) -> list[tuple[Script, ast.Call]]:
        return self.memo(("calls", names), lambda: [
            (s, c) for s in self.scripts.values() for c in s.calls if terminal(c.func) in names])

    def _collect_facts(self) -> None:
        scripts = list(self.scripts.values())
        nodes = [(s, n) for s in scripts for n in s.nodes]
        self.distributed = any(s.distributed for s in scripts)
        self.spawned = any(s.per_rank_functions is not None for s in scripts)
        """The ranks are started by mp.spawn/Process from the script itself, not by torchrun."""
        self.prints_silenced = any(_swaps_print(n) for _, n in nodes)
        """Some file replaces builtins.print (setup_for_distributed(is_master)): print is a no-op off rank 0."""
        self.augments = any(isinstance(n, (ast.Name, ast.Attribute)) and _AUGMENT.search(terminal(n))
                            for _, n in nodes) or any(_draws(s, n) for s, n in nodes)
        """The program draws random numbers per sample or per step (augmentation, noise, timesteps, masks):
        the stream a seed shared by every rank makes identical on every rank."""
        self.referenced = {terminal(c.func) for s in scripts for c in s.calls} | {
            n.id for _, n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        self.single_node = self._single_node(nodes)
        self.reducing_functions, looping = self._function_facts(scripts)
        self.epoch_loop = any(
            (isinstance(n, (ast.For, ast.While)) or isinstance(n, ast.Call) and terminal(n.func) in looping)
            and _in_loop(s, n) for s, n in nodes)
        """Some loop runs another loop (an epoch loop around the batches): set_epoch matters."""
        self.imported = {path for s in scripts for module in s.aliases.values()
                         for path in [self.modules.locate(s.path, module, parent=True)] if path and path != s.path}
        """Files another file of the project imports (their code runs on every rank of an importer)."""
        self.forward_collects = any(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward"
            and any(isinstance(c, ast.Call) and s.is_dist_collective(c) for c in ast.walk(n))
            for s, n in nodes)
        """A module's forward() makes a collective (Barlow Twins' all_reduce): its loss is already global."""

    def _single_node(self, nodes: list[tuple[Script, ast.AST]]) -> bool:
        """The script pins the rendezvous to this machine (MASTER_ADDR=localhost, tcp://127.0.0.1:...)."""
        addresses: list[tuple[str | None, bool]] = []
        for s, n in nodes:
            if isinstance(n, ast.Assign) and any(_is_master_addr(t) for t in n.targets):
                value = n.value.value if isinstance(n.value, ast.Constant) else None
                addresses.append((value, bool(s.context(n).branches)))
            elif isinstance(n, ast.Call) and terminal(n.func) == "init_process_group":
                method = next((k.value for k in n.keywords if k.arg == "init_method"), None)
                if isinstance(method, ast.Constant) and isinstance(method.value, str):
                    host = re.sub(r"^tcp://|:\d+$", "", method.value)
                    addresses.append((host, False))
        return bool(addresses) and all(v in _LOCAL_HOSTS for v, _ in addresses)

    def _function_facts(self, scripts: list[Script]) -> tuple[set[str], set[str]]:
        """Functions that reduce or gather across ranks (directly or through each other); functions with a loop."""
        direct: dict[str, set[str]] = {}
        found: set[str] = set()
        looping: set[str] = set()
        for s in scripts:
            for d in s.defs:
                callees = direct.setdefault(d.name, set())
                for n in ast.walk(d):
                    if isinstance(n, ast.Call):
                        callees.add(terminal(n.func))
                        if s.is_dist_collective(n):
                            found.add(d.name)
                    elif isinstance(n, (ast.For, ast.While)):
                        looping.add(d.name)
        changed = True
        while changed:
            changed = False
            for name, callees in direct.items():
                if name not in found and callees & found:
                    found.add(name)
                    changed = True
        return found, looping

    def reduces(self, pattern: re.Pattern[str]) -> bool:
        """Whether some value whose name matches `pattern` is reduced or gathered across ranks anywhere."""
        return self.memo(("reduces", pattern.pattern), lambda: self._reduces(pattern))

    def _reduces(self, pattern: re.Pattern[str]) -> bool:
        def reducing(s: Script, call: ast.AST) -> bool:
            if not isinstance(call, ast.Call):
                return False
            name = terminal(call.func)
            return s.is_dist_collective(call) or name in self.reducing_functions or bool(_REDUCING.search(name))

        for s in self.scripts.values():
            if any(pattern.search(k) and reducing(s, v) for k, v in s.assignments):
                return True  # `loss = ddpkit.reduce_mean(ctx, ...)`
            for call in s.calls:
                if not reducing(s, call):
                    continue
                for arg in (*call.args, *(k.value for k in call.keywords)):
                    if any(isinstance(n, (ast.Name, ast.Attribute)) and pattern.search(terminal(n))
                           for n in ast.walk(arg)):
                        return True
        return False


def _names(node: ast.AST) -> list[str]:
    return [terminal(n) for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))]


def eval_samplers(s: Script) -> list[ast.Call]:
    """DistributedSamplers over evaluation data that some DataLoader the program iterates uses.

    Evaluation data: the dataset or the variable the sampler goes to says val/test. A sampler no
    DataLoader uses, or whose loader is built but never read again, evaluates nothing.
    """
    def compute() -> list[ast.Call]:
        named = {id(v): k.lstrip(".") for k, v in s.assignments}
        loaded = s.project.memo("loaded names", lambda: {
            terminal(n) for x in s.project.scripts.values() for n in x.nodes
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load)})
        loaders = []
        for c in s.calls_named("DataLoader"):
            target = named.get(id(c), "")
            if target and target not in loaded:
                continue  # `val_loader = DataLoader(...)` that nothing reads
            loaders.append(c)
        loader_args = [n for c in loaders for a in (*c.args, *(k.value for k in c.keywords)) for n in ast.walk(a)]
        used = {id(n) for n in loader_args} | {terminal(n) for n in loader_args
                                                if isinstance(n, (ast.Name, ast.Attribute))}
        found = []
        for call in s.calls_named("DistributedSampler"):
            dataset = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "dataset"), None)
            target = named.get(id(call), "")
            if not (id(call) in used or (target and target in used)):
                continue
            if is_eval_name(target) or (dataset is not None and any(is_eval_name(n) for n in _names(dataset))):
                found.append(call)
        return found
    return s.project.memo(("eval samplers", s.path), compute)


def _script(path: str, tree: ast.Module, levels: dict[str, int]) -> Script:
    script = Script(tree, levels)
    script.path = path
    return script


class _Modules:
    """Finds the project file an import names, as Python would from the importing file's folder.

    `import utils` in a/b/train.py is a/b/utils.py (or a/b/utils/__init__.py), else a/utils.py and
    so on up; `from util.misc import f` is util/misc.py found the same way. Two scripts in different
    folders that each import their own `utils` stay apart.
    """

    def __init__(self, paths: list[str]) -> None:
        self.files = {os.path.normpath(p): p for p in paths}
        self._found: dict[tuple[str, str, bool], str | None] = {}

    def locate(self, importer: str, dotted: str, parent: bool = False) -> str | None:
        """The file for module `dotted` seen from `importer`; parent=True also tries `dotted` minus its last part."""
        key = (os.path.dirname(os.path.normpath(importer)), dotted, parent)
        if key not in self._found:
            names = [dotted, dotted.rsplit(".", 1)[0]] if parent and "." in dotted else [dotted]
            self._found[key] = next((p for name in names if name for p in [self._search(key[0], name)] if p), None)
        return self._found[key]

    def _search(self, folder: str, dotted: str) -> str | None:
        relative = os.path.join(*dotted.split("."))
        while True:
            for candidate in (relative + ".py", os.path.join(relative, "__init__.py")):
                path = self.files.get(os.path.normpath(os.path.join(folder, candidate)))
                if path is not None:
                    return path
            up = os.path.dirname(folder)
            if up == folder or not folder:
                return None
            folder = up


def programs(trees: dict[str, ast.Module]) -> list[dict[str, ast.Module]]:
    """Split files into programs: each entry script (a file no other file imports) with what it imports.

    `ddpkit lint DIR` on a folder of unrelated scripts lints each on its own; a train.py that imports
    utils.py and model.py is one program with them. A helper two entry scripts share (datautils.py
    beside a single-GPU and a DDP script) belongs to both programs; files in an import cycle that
    nothing else imports form one.
    """
    modules = _Modules(list(trees))
    imports = {path: {t for name in _imported_names(tree) for t in [modules.locate(path, name)] if t and t != path}
               for path, tree in trees.items()}
    imported = set().union(*imports.values()) if imports else set()
    out: list[dict[str, ast.Module]] = []
    seen: set[str] = set()
    for root in [p for p in trees if p not in imported] + list(trees):
        if root in seen:
            continue
        program, todo = {}, [root]
        while todo:
            path = todo.pop()
            if path not in program:
                program[path] = trees[path]
                todo.extend(imports[path])
        seen.update(program)
        out.append(program)
    return out


def _imported_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if base:
                names.add(base)
            names.update(f"{base}.{a.name}" if base else a.name for a in node.names)
    return names


_DRAWS = frozenset({"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "normal",
                    "bernoulli", "multinomial", "uniform", "choice", "shuffle", "random", "beta", "permutation"})


def _draws(s: Script, node: ast.AST) -> bool:
    """A random draw (torch.randn, np.random.rand, random.random...) inside a loop, forward() or __getitem__."""
    if not (isinstance(node, ast.Call) and terminal(node.func) in _DRAWS):
        return False
    name = s.qualname(node.func)
    if not name.startswith(("torch.", "numpy.random.", "np.random.", "random.")) or name.startswith("torch.nn.init"):
        return False
    # sized by a tensor (`randn_like(x)`, `randint(0, T, (x.shape[0],))`): noise, timesteps or masks drawn for
    # the data; `torch.randn(8, 4)` or `randint(0, vocab, (batch, seq))` is a synthetic batch
    sized = terminal(node.func).endswith("_like") or any(
        isinstance(n, ast.Attribute) and n.attr == "shape" or isinstance(n, ast.Call) and terminal(n.func) in (
            "size", "len", "numel")
        for a in (*node.args, *(k.value for k in node.keywords if k.arg in ("size", "low", "high", "input")))
        for n in ast.walk(a))
    if any(k.arg == "generator" for k in node.keywords):
        return False  # its own generator, seeded apart
    functions = s.context(node).functions
    return sized and (_in_training_step(s, node) or bool(functions) and functions[-1] in (
        "forward", "__getitem__", "__call__"))


def _in_training_step(s: Script, node: ast.AST) -> bool:
    """Inside a loop of the same function that also runs backward() (a training step), not any loop: a
    `randperm` that picks the same subset on every rank needs the shared seed."""
    while id(node) in s.parents:
        node = s.parents[id(node)]
        if isinstance(node, (ast.For, ast.While)):
            return any(isinstance(n, ast.Call) and terminal(n.func) == "backward" for n in ast.walk(node))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


def _in_loop(s: Script, node: ast.AST) -> bool:
    """Whether a loop of the same function encloses the node."""
    while id(node) in s.parents:
        node = s.parents[id(node)]
        if isinstance(node, (ast.For, ast.While)):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
    return False


_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "no_grad", "inference_mode", "enable_grad",
                               "wraps", "lru_cache", "cache", "jit", "script", "compile"})
"""Decorators that do not register a function anywhere: it still runs only when something calls it."""
_PLAIN_BASES = frozenset({"object", "Module", "Dataset", "IterableDataset", "Sampler", "Enum", "NamedTuple",
                          "Exception", "ABC", "Generic", "Protocol"})
"""Bases whose subclasses' methods run only when called by name (besides dunders and forward)."""


def _conventional(name: str) -> bool:
    """Methods Python or torch call by convention: dunders, forward, hooks named on_*/training_step-style."""
    return (name.startswith("__") and name.endswith("__")) or name in ("forward", "extra_repr", "reset_parameters")


def _is_main_block(stmt: ast.stmt) -> bool:
    """`if __name__ == "__main__":`."""
    return isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) \
        and isinstance(stmt.test.left, ast.Name) and stmt.test.left.id == "__name__" \
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in stmt.test.comparators)


def _is_master_addr(target: ast.AST) -> bool:
    return isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) \
        and target.slice.value == "MASTER_ADDR"


def _swaps_print(node: ast.AST) -> bool:
    """`builtins.print = ...` / `__builtin__.print = ...` / `setattr(builtins, "print", ...)`."""
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Attribute) and t.attr == "print" and terminal(t.value) in
                   ("builtins", "__builtin__", "__builtins__") for t in node.targets)
    return isinstance(node, ast.Call) and terminal(node.func) == "setattr" and len(node.args) >= 2 \
        and terminal(node.args[0]) in ("builtins", "__builtin__") \
        and isinstance(node.args[1], ast.Constant) and node.args[1].value == "print"
