"""A lint project: the files of one program, how they import each other, and the facts rules read across them."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ddpkit.lint.analysis import REDUCING_NAME, Script, terminal
from ddpkit.lint.bindings import local_names, scope_of
from ddpkit.lint.callsites import external_levels, global_parameter, receivers
from ddpkit.lint.imports import Modules, imported_at_run_time, members_read, runtime_imports
from ddpkit.lint.ranks import LOCAL

__all__ = ["Project", "LOSS_NAME"]

LOSS_NAME = re.compile(r"loss", re.IGNORECASE)
"""Names that hold a loss value or a loss meter (`loss`, `lossf`, `loss_value`, `losses`)."""
_AUGMENT = re.compile(r"^Random(?!\w*(Sampler|Dataset|Split)$)[A-Z]|ColorJitter|GaussianBlur|Solariz|RandAugment|"
                      r"AutoAugment|TrivialAugment|[Mm]ixup|[Cc]ut[Mm]ix|MultiCrop|multicrop|augment|horizontal_flip|"
                      r"color_distortion|random_crop|gaussian_blur")
"""Identifiers of random data augmentation: the stream a seed shared by every rank makes identical. A
`RandomSampler` orders the data and a `RandomDataset` makes a synthetic one: neither transforms samples."""
_LOCAL_HOSTS = ("127.0.0.1", "localhost")


class Project:
    """The files linted together (`ddpkit lint DIR`): each parsed once, imports of each other resolved.

    A function defined in one file and called from another gets the guard level of those calls
    (torch.save in utils.save_on_master, called under `if rank == 0:` in main.py, is guarded), and
    the facts below are taken over every file: a set_epoch in the trainer module counts for the
    DistributedSampler of the data module.
    """

    def __init__(self, trees: dict[str, ast.Module]) -> None:
        self.paths = list(trees)
        self.modules = Modules(self.paths, trees)
        self._memo: dict[object, object] = {}
        self._parent_only_open: set[object] = set()
        """parent_only questions being answered (a cycle of helpers calling each other ends there)."""
        self._star = {path: self._star_aliases(path, trees) for path in trees}
        self._world_names = frozenset(
            terminal(k.value).lower() for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.Call)
            and terminal(n.func) == "init_process_group" for k in n.keywords
            if k.arg == "world_size" and isinstance(k.value, (ast.Name, ast.Attribute)))
        """Names given to init_process_group as world_size anywhere in the program."""
        self.scripts = {path: _script(path, tree, {}, self._star[path], self._world_names)
                        for path, tree in trees.items()}
        for _ in range(2):  # a helper of a helper in a third file needs a second round
            levels = self._external_levels()
            if not levels:
                break
            changed = False
            for path, tree in trees.items():
                if levels.get(path, {}) != self.scripts[path].external_levels:
                    self.scripts[path] = _script(path, tree, levels.get(path, {}), self._star[path],
                                                 self._world_names)
                    changed = True
            if not changed:
                break
        for script in self.scripts.values():
            script.project = self
        self.runtime_imports = {path: runtime_imports(self.modules, path, s.nodes)
                                for path, s in self.scripts.items()}
        """{importer: {file: call}}: project files a file imports at run time (see imports.runtime_imports)."""
        self.acts = any(self._acts(s) for s in self.scripts.values())
        """Some file of the program does something when run (a `__main__` block, a top-level call)."""
        self._spawned_through_helpers()
        self._collect_facts()
        self._liveness()
        self._drop_dead_silencers()

    # ---- imports -----------------------------------------------------------------------------
    def _star_aliases(self, path: str, trees: dict[str, ast.Module]) -> dict[str, str]:
        """Modules a file reaches through `from ddp_utils import *` of a project file that imports them at its top
        (`import torch.multiprocessing as mp` there makes `mp.spawn` in the importer torch's), within `__all__`
        where the file declares one. One level deep."""
        found: dict[str, str] = {}
        for node in trees[path].body:
            if not (isinstance(node, ast.ImportFrom) and node.module and any(a.name == "*" for a in node.names)):
                continue
            source = self.modules.locate(path, node.module)
            if source is None or source == path:
                continue
            body = trees[source].body
            public = next((set(ast.literal_eval(b.value)) for b in body if isinstance(b, ast.Assign)
                           and any(isinstance(t, ast.Name) and t.id == "__all__" for t in b.targets)
                           and isinstance(b.value, (ast.List, ast.Tuple))
                           and all(isinstance(e, ast.Constant) for e in b.value.elts)), None)
            for stmt in body:
                if isinstance(stmt, ast.Import):
                    pairs = [(a.asname or a.name.split(".")[0], a.name if a.asname else a.name.split(".")[0])
                             for a in stmt.names]
                elif isinstance(stmt, ast.ImportFrom) and stmt.module and not stmt.level:
                    pairs = [(a.asname or a.name, f"{stmt.module}.{a.name}") for a in stmt.names if a.name != "*"]
                else:
                    continue
                found.update((k, v) for k, v in pairs if not k.startswith("_") and (public is None or k in public))
        return found

    def callee(self, script: Script, call: ast.Call) -> tuple[Script, str] | None:
        """(script, function name) of the project function `call` calls: a function of `script` itself by its bare
        name, else the one `resolve` finds in another file; None where it is not the project's."""
        if isinstance(call.func, ast.Name) and call.func.id in script.function_names:
            return script, call.func.id
        found = self.resolve(script, call.func)
        return None if found is None else (self.scripts[found[0]], found[1])

    def resolve(self, script: Script, func: ast.AST) -> tuple[str, str] | None:
        """(path, function name) of the project function a callee names (`utils.save_on_master`), else None."""
        qualname = script.qualname(func)
        if "." not in qualname:  # `from utils import *` then `save_model(...)`
            for module in script.star_modules:
                path = self.modules.locate(script.path, module)
                if path is not None and path != script.path:
                    found = self._exported(path, qualname)
                    if found is not None:
                        return found
            return None
        module, name = qualname.rsplit(".", 1)
        path = self.modules.locate(script.path, module)
        if path is None:
            # `from datasets import build_loader` of a package whose `__init__.py` is not linted: the one module of
            # the folder that defines the name
            member = self.modules.locate(script.path, qualname)
            return (member, name) if member is not None and name in self.scripts[member].function_names else None
        return self._exported(path, name)

    def _exported(self, path: str, name: str, seen: frozenset[str] = frozenset()) -> tuple[str, str] | None:
        """(path, function name) of the function `name` of the module at `path`: its own, or the one it re-exports,
        as a package's `__init__.py` does (`from .launch import launch`, `from .dist import *`, `from pkg.dist import
        get_rank`), through as many re-exporting modules as there are; also to a `from package import *` importer."""
        script = self.scripts[path]
        if name in script.function_names:
            return path, name
        seen = seen | {path}
        alias = script.aliases.get(name, "")
        if "." in alias:
            again = self.modules.locate(path, alias.rsplit(".", 1)[0])
            if again is not None and again not in seen:
                return self._exported(again, alias.rsplit(".", 1)[1], seen)
            return None
        if alias or name.startswith("_"):
            return None  # (a star import brings no name the module binds itself, nor a private one)
        for module in script.star_modules:
            again = self.modules.locate(path, module)
            if again is None or again in seen or not _star_exports(self.scripts[again].tree, name):
                continue
            found = self._exported(again, name, seen)
            if found is not None:
                return found
        return None

    def memo(self, key: object, compute):
        """A fact over every file, computed once per project (the checks run once per file)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def _external_levels(self) -> dict[str, dict[str, int]]:
        return external_levels(self)

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
        picks = {_picks_by_name(x, n) for x in self.scripts.values() for n in x.nodes
                 if not self._outside_lookup(x, n)}
        dynamic = "module" in picks
        """Some code picks a module's code by a string (`globals()[name]`, `getattr(models, args.arch)`): any class
        or function may run."""
        # `getattr(obj, name)` on an object: any method of obj's class may be the one named (of every class where the
        # program does not say which class obj is; of none on a library's object: `getattr(args, key)`)
        picked = self.memo("picked methods", self._picked_methods)
        by_string = dynamic or any(found is None for found in picked.values())
        """... or an object's method, on an object of a class the program does not say: any method of a class that
        runs may run."""
        every_method = [d for x in self.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)
                        for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
        kept: set[int] = set()
        """Methods a live lookup by string may pick."""
        classes_named: list[tuple[str, ast.ClassDef]] = []
        acts = False
        for path, s in self.scripts.items():
            entry = path in entries
            dead: set[int] = set()
            implicit = {id(item) for stmt in s.tree.body if isinstance(stmt, ast.ClassDef)
                        and not (stmt.decorator_list or dynamic or any(terminal(b) == "TestCase" for b in stmt.bases))
                        for item in stmt.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and (_conventional(item.name) or stmt.name in self._framework_classes)}
            for d in s.defs:
                if id(d) not in implicit:  # `super().__init__()` names the base's __init__, not every class's
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
                    # a plain class's dunders and forward run once something names the class (outside its
                    # own body): they are followed from that name, and the class is dead without one; so do all the
                    # methods of a class a framework calls into (a `pl.Callback` nothing builds is never called)
                    # (unittest finds a TestCase by itself)
                    named = not (stmt.decorator_list or dynamic or any(terminal(b) == "TestCase" for b in stmt.bases))
                    if named:
                        classes_named.append((path, stmt))
                    for item in stmt.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            if framework or _conventional(item.name):
                                (defs.setdefault(stmt.name, []) if named else roots).append(item)
                        else:
                            roots.append(item)
                    (defs.setdefault(stmt.name, []) if named else roots).extend(stmt.bases + stmt.keywords)
                    roots.extend(stmt.decorator_list)
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
        # a name a module exports in `__all__` may be imported by a file not linted: it counts as named there
        exports = [(path, ast.Name(id=e.value, ctx=ast.Load())) for path, s in self.scripts.items()
                   for stmt in s.tree.body if isinstance(stmt, ast.Assign) and any(
                       isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
                   and isinstance(stmt.value, (ast.List, ast.Tuple))
                   for e in stmt.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        roots.extend(n for _, n in exports)
        live: set[str] = set()
        by_attribute: set[str] = set()
        """Names live code reaches as an attribute (`obj.f`, `self.f`): only these can run a method."""
        rooted = {id(r) for r in roots}
        todo = roots
        seen: set[int] = set()
        outside = self._outside_attributes()
        # `from train import main as run_training`: calling the alias runs `main`
        renamed: dict[str, set[str]] = {}
        for s in self.scripts.values():
            for n in s.nodes:
                if isinstance(n, ast.ImportFrom):
                    for a in n.names:
                        if a.asname and a.asname != a.name:
                            renamed.setdefault(a.asname, set()).add(a.name)
        # a function defined at module level (and as no method) is reached through an attribute only on a
        # module (`utils.save(...)`), not on a value (`args.save`, a string of the parsed arguments)
        methods = {d.name for x in self.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)
                   for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
        module_level = {d.name for x in self.scripts.values() for d in x.tree.body
                        if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))} - methods
        qualified = {id(n) for x in self.scripts.values() for n in x.nodes if isinstance(n, ast.Attribute)
                     and n.attr in module_level | methods and _module_rooted(x, n)}
        # `importlib.import_module(name).main(cfg)`, `getattr(module, "run")(settings)`: a function of a module the
        # file imports at run time, named on the module object the import returns
        for path, targets in self.runtime_imports.items():
            top = {d.name for t in targets for d in self.scripts[t].tree.body
                   if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for n in self.scripts[path].nodes if top else ():
                if isinstance(n, ast.Attribute) and n.attr in top:
                    qualified.add(id(n))
                elif isinstance(n, ast.Call) and terminal(n.func) == "getattr" and len(n.args) >= 2 \
                        and isinstance(n.args[1], ast.Constant) and n.args[1].value in top:
                    roots.extend(d for t in targets for d in self.scripts[t].tree.body if isinstance(
                        d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == n.args[1].value)
        # `self.base.load_param(...)` in a class that defines load_param itself hands the call to a member (a
        # backbone), not to the class's own method, which is `self.load_param`
        siblings = {id(d): names for x in self.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)
                    for names in [{d.name for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}]
                    for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
        # a bare name in a module that defines that name at module level is that module's own function
        # (`main()` in train.py runs train.py's main, not the main of an imported val.py)
        owner: dict[int, str] = {}
        own_defs: dict[str, dict[str, list[ast.AST]]] = {}
        for path, s in self.scripts.items():
            owner.update((id(n), path) for n in (*s.tree.body, *s.defs))
            for d in s.tree.body:
                if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    own_defs.setdefault(path, {}).setdefault(d.name, []).append(d)
        owner.update((id(n), path) for path, n in exports)
        top_functions = {id(d) for found in own_defs.values() for ds in found.values() for d in ds}
        # a bare name a file imports from a module of the project (`from engine import train_one_epoch`, also through
        # a package's re-exports) is that module's function, not a namesake elsewhere (a legacy utils.train_one_epoch)
        imported_defs: dict[tuple[str, str], list[ast.AST]] = {}
        for path, s in self.scripts.items():
            for n in s.nodes:
                if isinstance(n, ast.ImportFrom):
                    for a in n.names:
                        bound = a.asname or a.name
                        target = self.resolve(s, ast.Name(id=bound, ctx=ast.Load())) if a.name != "*" else None
                        if target is not None and own_defs.get(target[0], {}).get(target[1]):
                            imported_defs[(path, bound)] = own_defs[target[0]][target[1]]
        """Module-level functions: reached by a bare name or on a module (`utils.step`), never on a value (`eng.step`
        runs a method named step, not utils.step)."""
        parent_of = {k: v for x in self.scripts.values() for k, v in x.parents.items()}
        off = self._switched_off()
        reached: set[int] = set()
        """Module-level functions reached through their own module's bare name."""
        scoped: set[str] = set()
        """Their names: live, though they do not make other modules' functions of the name live."""
        expanded: set[str] = set()
        """Names whose every function has been queued."""
        expanded_methods: set[str] = set()
        """Names whose methods (and classes) have been queued, by an attribute on a value."""
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            mine = own_defs.get(owner.get(id(node), ""), {})
            # a function nested in this one (`def encode(obj):` inside `get_dataset`) runs where its enclosing code
            # names it: its body is walked with this one's, its name is a local variable of the enclosing function
            nested = {d.name for d in ast.walk(node) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and d is not node} if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
            for n, shadowed in _scoped_walk(node, off):
                name, on_value = "", False
                # `getattr(dist_utils, "init_dist_%s" % launcher)(...)`, `globals()["init_" + backend]()`: every
                # function the built name can spell may be the one called
                for candidate in _built_name_candidates(n, defs):
                    if candidate not in expanded:
                        expanded.add(candidate)
                        live.add(candidate)
                        todo.extend(defs.get(candidate, ()))
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in shadowed and n.id in nested:
                    live.add(n.id)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in shadowed:
                    found = mine.get(n.id) or imported_defs.get((owner.get(id(node), ""), n.id))
                    if found:
                        for d in found:
                            if id(d) not in reached:
                                reached.add(id(d))
                                todo.append(d)
                            scoped.add(d.name)
                        continue
                    name = n.id
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and id(n) not in outside \
                        and not (n.attr in module_level and id(n) not in qualified) \
                        and not (n.attr in siblings.get(id(node), ()) and _on_a_member(n)) \
                        and not _read_as_data(n, parent_of):
                    name, on_value = n.attr, id(n) not in qualified
                    by_attribute.add(name)
                elif isinstance(n, ast.Call) and terminal(n.func) == "getattr" and len(n.args) >= 2 \
                        and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
                    # `getattr(self, "validate")()`: the attribute named by a constant
                    name, on_value = n.args[1].value, not (isinstance(n.args[0], ast.Name) and n.args[0].id in
                                                           self.scripts[owner.get(id(node), self.paths[0])].aliases)
                    by_attribute.add(name)
                elif id(n) in picked:
                    methods = every_method if picked[id(n)] is None else picked[id(n)]
                    kept.update(id(d) for d in methods)
                    todo.extend(methods)
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n is node:
                    live.add(n.name)
                    if id(n) not in reached and id(n) not in rooted:
                        # (a root, `@abstractmethod def _train_epoch` of a base class, is walked because of its
                        # decorator, not because code names it: a later call still reaches its namesakes, the
                        # subclass's `_train_epoch`)
                        (expanded if id(n) in top_functions else expanded_methods).add(n.name)
                for name in (name, *renamed.get(name, ())) if name else ():
                    if name in expanded or on_value and name in expanded_methods:
                        continue
                    # (a name live only as some module's own function still reaches its namesakes here)
                    (expanded_methods if on_value else expanded).add(name)
                    live.add(name)
                    todo.extend(d for d in defs.get(name, ()) if not (on_value and id(d) in top_functions))
        live |= scoped
        self.live_functions = live
        rooted |= {id(d) for path, n in exports for d in own_defs.get(path, {}).get(n.id, ())} | kept
        for path, s in self.scripts.items():
            self.dead_blocks[path].update(n for n in off.get(path, ()))
        # a module-level function whose name is live only through other modules' own functions of that name
        # (each reached by its module's bare name) never runs: nothing names it
        for path, s in self.scripts.items():
            for name, found in own_defs.get(path, {}).items():
                for d in found:
                    if id(d) not in seen and id(d) not in rooted and name in live:
                        self.dead_blocks[path].update(id(n) for n in ast.walk(d))
        if not dynamic:
            self._shadowed_functions(live, rooted)
        # a method named like a builtin (`def print(self)`) is not run by the bare `print(...)` calls that made
        # its name live: a method is reached through an attribute, or by a bare name in its class body (the
        # methods of a class a framework calls into run once the class is named)
        for path, s in self.scripts.items():
            for c in (n for n in s.nodes if isinstance(n, ast.ClassDef)
                      if n.name not in self._framework_classes) if not by_string else ():
                in_body = {n.id for item in c.body if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                           for n in ast.walk(item) if isinstance(n, ast.Name)}
                for item in c.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and id(item) not in rooted \
                            and not _conventional(item.name) and item.name not in by_attribute | in_body:
                        self.dead_blocks[path].update(id(n) for n in ast.walk(item))
        for path, c in classes_named:
            if c.name not in live:
                self.dead_blocks[path].update(id(n) for n in ast.walk(c))
        if not by_string:
            self._overridden_methods()
        self._methods_of_other_receivers(rooted)

    def _switched_off(self) -> dict[str, set[int]]:
        """path -> ids of the nodes of branches no call takes: an `if` on a local name its function binds once, to a
        literal (see _local_constants); an `if` whose test reads a parameter that every call
        of its function in the program fills with a literal (by position, by keyword or by its default; a
        module-level name bound once to a literal, in this file or imported, counts as that literal) and that
        those literals decide the same way (`if p:`, `if not p:`, `if p is None:`, `if p == "ddp":`, parts of an
        `and`/`or`); the same for `if self.p:` in the methods of a class whose `__init__` stores such a parameter
        as `self.p` (set nowhere else: not by a subclass, nor as `obj.p = ...`; another class's own `self.p` is
        another object's). `MyTrainer(model, data, opt, True, USE_RAM, rank)` with
        `use_ram` fifth and `USE_RAM = False` in the settings module: what runs only `if use_ram:` never runs.
        A function called with `*args`/`**kwargs`, or that reassigns the parameter gives nothing; nor does one
        nothing calls by name, or one also used as a value. A method (not a dunder, nor one of a class a
        framework calls into) counts by its name: every call of that name in the program."""
        return self.memo("switched off", self._compute_switched_off)

    def _compute_switched_off(self) -> dict[str, set[int]]:
        defs: dict[str, list[tuple[str, ast.AST, ast.ClassDef | None]]] = {}
        methods: dict[str, list[tuple[str, ast.AST, ast.ClassDef | None]]] = {}
        # (`vars(args)` reads a configuration's values: it picks no code, see _picks_by_name)
        dynamic = any(_picks_by_name(x, n) is not None for x in self.scripts.values() for n in x.nodes)
        # methods count by name only in classes of plain Python: torch calls methods of an nn.Module by name
        # itself (`eval()` calls `self.train(False)`)
        classes = {n.name: n for x in self.scripts.values() for n in x.nodes if isinstance(n, ast.ClassDef)}
        plain: set[str] = set()
        for _ in range(4):
            plain |= {name for name, c in classes.items()
                      if all(terminal(b) in ("object", "ABC", "Generic") or terminal(b) in plain for b in c.bases)}
        for path, s in self.scripts.items():
            for stmt in s.tree.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    defs.setdefault(stmt.name, []).append((path, stmt, None))
                elif isinstance(stmt, ast.ClassDef):
                    for item in stmt.body:
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__":
                            defs.setdefault(stmt.name, []).append((path, item, stmt))
                        elif isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not (
                                _conventional(item.name) or item.decorator_list or dynamic
                                or stmt.name in self._framework_classes or stmt.name not in plain):
                            methods.setdefault(item.name, []).append((path, item, None))
        calls: dict[str, list[tuple[Script, ast.Call]]] = {}
        for s in self.scripts.values():
            for c in s.calls:
                calls.setdefault(terminal(c.func), []).append((s, c))
        # a function or class also used as a value (`mp.spawn(worker, args=(..., True))`, a base class,
        # `partial(f, flag=True)`) may be called with other values where no call names it
        values = {terminal(n) for s in self.scripts.values() for n in s.nodes
                  if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load)
                  and not (isinstance(s.parents.get(id(n)), ast.Call) and s.parents[id(n)].func is n)}
        # who stores each attribute: `self.x = ...` in a class's own methods sets its objects' own (another class's
        # `self.x` is another object's), any other `obj.x = ...` may set it on any object
        own_stores: dict[tuple[str, str], int] = {}
        other_stores: dict[str, int] = {}
        derived_from: dict[str, set[str]] = {}
        for s in self.scripts.values():
            for n in s.nodes:
                if isinstance(n, ast.ClassDef):
                    for b in n.bases:
                        derived_from.setdefault(terminal(b), set()).add(n.name)
                    for m in ast.walk(n):
                        if isinstance(m, ast.Attribute) and isinstance(m.ctx, ast.Store) \
                                and isinstance(m.value, ast.Name) and m.value.id == "self":
                            own_stores[(n.name, m.attr)] = own_stores.get((n.name, m.attr), 0) + 1
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) \
                        and not (isinstance(n.value, ast.Name) and n.value.id == "self"):
                    other_stores[n.attr] = other_stores.get(n.attr, 0) + 1

        def stored_once(cls: ast.ClassDef, attr: str) -> bool:
            """`self.attr` is set once in the class and by nothing else: no subclass, no `obj.attr = ...`."""
            return own_stores.get((cls.name, attr)) == 1 and not other_stores.get(attr) and not any(
                own_stores.get((sub, attr)) for sub in derived_from.get(cls.name, ()))
        out: dict[str, set[int]] = {}
        # `if False:`, and `if DEBUG:` on a module constant the program binds once, to False/None/0: never entered
        bound: dict[str, int] = {}
        for s in self.scripts.values():
            for n in s.nodes:
                names = [n.id] if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load) else \
                    [n.attr] if isinstance(n, ast.Attribute) and not isinstance(n.ctx, ast.Load) else \
                    [n.arg] if isinstance(n, ast.arg) else n.names if isinstance(n, (ast.Global, ast.Nonlocal)) else \
                    [a.asname or a.name for a in n.names] if isinstance(n, ast.ImportFrom) else []
                for name in names:
                    bound[name] = bound.get(name, 0) + 1
        # (`exec(open("configurator.py").read())`, `globals().update(...)`, `setattr(sys.modules[__name__], ...)`
        # may rebind it)
        rebinds = any(terminal(c.func) in ("exec", "eval", "globals", "locals", "__import__", "import_module")
                      or terminal(c.func) == "setattr" and c.args and not isinstance(c.args[0], ast.Name)
                      for s in self.scripts.values() for c in s.calls)
        for path, s in self.scripts.items():
            falsy = set() if rebinds else {t.id for stmt in s.tree.body if isinstance(stmt, (ast.Assign, ast.AnnAssign))
                     and isinstance(stmt.value, ast.Constant) and not stmt.value.value
                     for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
                     if isinstance(t, ast.Name) and bound.get(t.id) == 1}
            _switch_off(s.tree, lambda t: isinstance(t, ast.Constant) and not t.value
                        or isinstance(t, ast.Name) and t.id in falsy, [False], out.setdefault(path, set()))
        for path, s in self.scripts.items():
            for d in s.defs:
                for name, value in _local_constants(d).items():
                    _switch_off(d, lambda t, n=name: isinstance(t, ast.Name) and t.id == n, [value],
                                out.setdefault(path, set()))
            for n in s.nodes:
                if isinstance(n, ast.If) and _after_cuda_required(s, n):
                    arm = n.orelse if _asks_cuda(s, n.test) else n.body
                    out.setdefault(path, set()).update(id(m) for stmt in arm for m in ast.walk(stmt))
        if not calls.get("DataParallel"):
            # `if isinstance(model, nn.DataParallel):` in a program that never builds a DataParallel (DDP is no
            # subclass of it): the branch never runs
            for path, s in self.scripts.items():
                for n in s.nodes:
                    if isinstance(n, ast.If) and isinstance(n.test, ast.Call) and terminal(n.test.func) == "isinstance" \
                            and len(n.test.args) == 2 and terminal(n.test.args[1]) == "DataParallel":
                        out.setdefault(path, set()).update(id(m) for stmt in n.body for m in ast.walk(stmt))
        # (a method's calls are every call of its name: each of its definitions is judged on all of them, which
        # holds the calls that do reach it)
        judged = [(name, entry) for name, found in defs.items() if len(found) == 1 and name not in methods
                  for entry in found]
        judged += [(name, entry) for name, found in methods.items() if name not in defs for entry in found]
        for name, (path, d, cls) in judged:
            if not calls.get(name) or name in values:
                continue
            made = calls[name]
            if any(isinstance(a, ast.Starred) for _, c in made for a in c.args) or any(
                    k.arg is None for _, c in made for k in c.keywords):
                continue
            positional = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
            if cls is not None or name in methods:
                positional = positional[1:]  # self
            defaults = dict(zip(positional[len(positional) - len(d.args.defaults):], d.args.defaults))
            defaults.update((a.arg, v) for a, v in zip(d.args.kwonlyargs, d.args.kw_defaults) if v is not None)
            rebound = {t.id for n in ast.walk(d) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
            for param in [*positional, *(a.arg for a in d.args.kwonlyargs)]:
                if param in rebound:
                    continue
                given = []
                for x, c in made:
                    value = next((k.value for k in c.keywords if k.arg == param), None)
                    if value is None and param in positional and positional.index(param) < len(c.args):
                        value = c.args[positional.index(param)]
                    given.append(self._literal(x, value) if value is not None
                                 else self._literal(self.scripts[path], defaults.get(param)))
                if not given or any(v is None for v in given):
                    continue
                literals = [v.value for v in given if v is not None]
                dead = out.setdefault(path, set())
                _switch_off(d, lambda t: isinstance(t, ast.Name) and t.id == param, literals, dead)
                if cls is None:
                    continue
                for n in ast.walk(d):
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name) and n.value.id == param:
                        for t in n.targets:
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                                    and t.value.id == "self" and stored_once(cls, t.attr):
                                _switch_off(cls, lambda x, a=t.attr: isinstance(x, ast.Attribute)
                                            and isinstance(x.value, ast.Name) and x.value.id == "self"
                                            and x.attr == a, literals, dead)
        return out

    def _literal(self, script: Script, node: ast.AST | None) -> ast.Constant | None:
        """The literal `node` always is: a literal, or a module-level name bound once to a literal in its
        module, this file's or the one it is imported from (`from settings import USE_RAM`), and nowhere
        rebound (no `global` of it, no `settings.USE_RAM = ...`)."""
        if isinstance(node, ast.Constant):
            return node
        if not isinstance(node, (ast.Name, ast.Attribute)):
            return None
        qualname = script.qualname(node)
        if isinstance(node, ast.Name) and "." not in qualname:
            home, name = script, node.id
        else:
            module, name = qualname.rsplit(".", 1) if "." in qualname else ("", "")
            path = self.modules.locate(script.path, module) if module else None
            if path is None or path not in self.scripts:
                return None
            home = self.scripts[path]
        return self.memo(("literal", home.path, name), lambda: _bound_once(self, home, name))

    def _shadowed_functions(self, live: set[str], rooted: set[int]) -> None:
        """A module-level function whose name is live only through bare calls in files that define a function of
        that name themselves (train.py's `main()` runs train.py's `main`, not val.py's) never runs: nothing in its
        own file's running code names it, and nothing imports it or reaches it as an attribute."""
        imported = {a.name for x in self.scripts.values() for n in x.nodes if isinstance(n, ast.ImportFrom)
                    for a in n.names}
        attributes = {n.attr for x in self.scripts.values() for n in x.nodes if isinstance(n, ast.Attribute)}
        own = {path: {d.name for d in x.tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
               for path, x in self.scripts.items()}
        loads: dict[str, list[tuple[str, ast.Name]]] = {}
        for path, x in self.scripts.items():
            for n in x.nodes:
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    loads.setdefault(n.id, []).append((path, n))
        for path, x in self.scripts.items():
            for d in x.tree.body:
                if not isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) or d.name not in live \
                        or id(d) in rooted or d.name in imported or d.name in attributes \
                        or sum(name == d.name for name in own[path]) > 1:
                    continue
                inside = {id(n) for n in ast.walk(d)}
                dead = self.dead_blocks[path]
                if not any(id(n) not in inside and id(n) not in dead if where == path else d.name not in own[where]
                           for where, n in loads.get(d.name, ())):
                    self.dead_blocks[path].update(id(n) for n in ast.walk(d))

    def _overridden_methods(self) -> None:
        """A base class's method every subclass overrides, on a base nothing builds itself, never runs: a call
        `obj.train()` reaches the subclass's method (the object is a subclass), and nothing calls the base's
        through `super().train()` or `Base.train(...)`."""
        classes: dict[str, list[tuple[str, ast.ClassDef]]] = {}
        for path, s in self.scripts.items():
            for n in s.nodes:
                if isinstance(n, ast.ClassDef):
                    classes.setdefault(n.name, []).append((path, n))
        built: set[str] = set()
        named: set[str] = set()
        for s in self.scripts.values():
            for n in s.nodes:
                if isinstance(n, ast.Call):
                    built.add(terminal(n.func))
                elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
                    owner = n.value
                    if isinstance(owner, ast.Call) and terminal(owner.func) == "super":
                        named.add(n.attr)
                    elif isinstance(owner, ast.Name) and owner.id in classes:
                        named.add(n.attr)
        for name, found in classes.items():
            if len(found) != 1 or name in built:
                continue
            path, base = found[0]
            if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("cls", "type")
                   for n in ast.walk(base)):
                continue  # a factory classmethod may build the base itself
            subclasses = [c for others in classes.values() for _, c in others
                          if any(terminal(b) == name for b in c.bases)]
            if not subclasses:
                continue
            for item in base.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("__") \
                        and item.name not in named and all(
                            any(isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == item.name
                                for d in c.body) for c in subclasses):
                    self.dead_blocks[path].update(id(n) for n in ast.walk(item))

    def _picked_methods(self) -> dict[int, list[ast.AST] | None]:
        """{id of a `getattr(obj, name)` call with a name not written out, on an object (not a module): the methods
        of obj's classes and their relatives, [] on a library's object, None where the program does not say}."""
        classes, relatives, receiver = receivers(self)
        found: dict[int, list[ast.AST] | None] = {}
        for path, x in self.scripts.items():
            for n in x.calls:
                if _picks_by_name(x, n) != "method" or self._outside_lookup(x, n):
                    continue
                obj = n.args[0]
                if isinstance(obj, ast.Name) and obj.id in ("self", "cls"):
                    scope = x.parents.get(id(n))
                    while scope is not None and not isinstance(scope, ast.ClassDef):
                        scope = x.parents.get(id(scope))
                    kinds = {scope.name} if scope is not None else None
                else:
                    kinds = receiver(path, x, ast.Attribute(value=obj, attr="", ctx=ast.Load()))
                found[id(n)] = None if kinds is None else [
                    d for k in kinds for r in relatives.get(k, {k}) for c in classes.get(r, ())
                    for d in c.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))]
        return found

    def _methods_of_other_receivers(self, rooted: set[int]) -> None:
        """A method every access of whose name is on an object of another class never runs: `logger.print(...)`
        where `logger = Logger(...)` is the only value the file gives `logger` runs Logger.print, not the
        `print` of a meter class nothing calls it on. The receiver's class is known from `self` (the class the
        access sits in), a class named directly, a name every assignment of which in its file builds one project
        class (not a parameter, loop or `with` target, import or global of that file), or an attribute every
        assignment of which in the program builds one (`self.meter = Meter()`). An access on anything else,
        on a class related to the method's (a base or a subclass), or a bare use of the name in the class body,
        keeps the method; so do dunders, decorated methods and the classes a framework calls into."""
        classes, relatives, receiver = receivers(self)
        for x in self.scripts.values():
            for n in x.calls:
                # `getattr(obj, name)` on an object (not on a module): any method may be the one named
                if terminal(n.func) == "getattr" and len(n.args) >= 2 and not (
                        isinstance(n.args[1], ast.Constant) or isinstance(n.args[0], ast.Call)
                        and terminal(n.args[0].func) == "import_module"
                        or isinstance(n.args[0], ast.Name) and n.args[0].id in x.aliases) \
                        and self.memo("picked methods", self._picked_methods).get(id(n), []) is None:
                    return  # (on an object of a known class the methods it may pick are kept: see _liveness)
        accesses: dict[str, list[set[str] | None]] = {}
        for path, x in self.scripts.items():
            for n in x.nodes:
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
                    accesses.setdefault(n.attr, []).append(receiver(path, x, n))
        for path, x in self.scripts.items():
            for c in (n for n in x.nodes if isinstance(n, ast.ClassDef)):
                if c.name in self._framework_classes or c.decorator_list or len(classes[c.name]) != 1:
                    continue
                in_body = {n.id for item in c.body if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                           for n in ast.walk(item) if isinstance(n, ast.Name)}
                for item in c.body:
                    if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) or id(item) in rooted \
                            or item.decorator_list or _conventional(item.name) or item.name in in_body:
                        continue
                    found = accesses.get(item.name, [])
                    found += [None] * sum(isinstance(n, ast.Call) and terminal(n.func) == "getattr" and len(n.args) > 1
                                          and isinstance(n.args[1], ast.Constant) and n.args[1].value == item.name
                                          for x2 in self.scripts.values() for n in x2.calls)
                    if found and all(k is not None and not k & relatives[c.name] for k in found):
                        self.dead_blocks[path].update(id(n) for n in ast.walk(item))

    def _spawned_through_helpers(self) -> None:
        """`pp.run(worker, world_size)` at module level or in a function (`def main(): launch(main_worker, ...)`),
        where run() in another file calls mp.spawn on the function it is given: the file is an mp.spawn script too,
        and the function that calls the helper is the parent's. The functions handed to the helper, and what they call
        here, run in the ranks, and so does module code outside the `__main__` block (each rank imports the
        file again, as `__mp_main__`); the `__main__` block is the parent's alone."""
        spawners = {(path, d.name) for path, x in self.scripts.items() if x.per_rank_functions is not None
                    for d in x.defs if d.name not in x.per_rank_functions and any(
                        isinstance(c, ast.Call) and x.qualname(c.func).endswith(("multiprocessing.spawn", "start_processes"))
                        for c in ast.walk(d))}
        for s in self.scripts.values():
            if s.per_rank_functions is not None or not spawners:
                continue
            calls = [c for c in s.calls if self.resolve(s, c.func) in spawners]
            handed = {a.id for c in calls for a in (*c.args, *(k.value for k in c.keywords))
                      if isinstance(a, ast.Name) and a.id in s.function_names}
            if not handed:
                continue
            named = {d.name: {n.id for n in ast.walk(d) if isinstance(n, ast.Name)} for d in s.defs}
            reached, todo = set(), list(handed)
            while todo:
                name = todo.pop()
                if name not in reached:
                    reached.add(name)
                    todo.extend(named.get(name, set()) & s.function_names)
            if any(f in reached for c in calls for f in s.context(c).functions):
                continue  # (a rank that starts ranks of its own: not a parent this reading knows)
            s.per_rank_functions = reached
            s.parent_nodes = {id(n) for stmt in s.tree.body if _is_main_block(stmt) for n in ast.walk(stmt)}

    def _outside_attributes(self) -> set[int]:
        """ids of `torch.save`, `np.load`, `os.path.join`: attributes of a module that is not the project's,
        which name none of the project's functions (a `State.save` method is not kept live by `torch.save`)."""
        found: set[int] = set()
        for s in self.scripts.values():
            for n in s.nodes:
                if isinstance(n, ast.Attribute):
                    root = n.value
                    while isinstance(root, ast.Attribute):
                        root = root.value
                    qualname = s.qualname(n)
                    if isinstance(root, ast.Name) and root.id in s.aliases \
                            and self.modules.locate(s.path, s.aliases[root.id], parent=True) is None \
                            and self.modules.locate(s.path, qualname.rsplit(".", 1)[0], parent=True) is None \
                            and self.modules.locate(s.path, qualname) is None:
                        found.add(id(n))  # (`mypkg.utils.save` stays the project's where mypkg/utils.py is linted;
                        # `tools.Scheduler` after `import kit.tools as tools`, the module of kit/tools/ defining it)
        return found

    def _outside_lookup(self, s: Script, node: ast.AST) -> bool:
        """`getattr(wandb, name)`: a lookup by string in a module that is not the project's picks none of its code."""
        if not (isinstance(node, ast.Call) and terminal(node.func) == "getattr" and node.args):
            return False
        owner = node.args[0]
        return isinstance(owner, ast.Name) and owner.id in s.aliases \
            and self.modules.locate(s.path, s.aliases[owner.id], parent=True) is None

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
            (s, c) for s in self.scripts.values() for c in s.calls_named(*names)])

    def _collect_facts(self) -> None:
        scripts = list(self.scripts.values())
        nodes = [(s, n) for s in scripts for n in s.nodes]
        self.distributed = any(s.distributed for s in scripts)
        self.spawned = any(s.per_rank_functions is not None for s in scripts)
        """The ranks are started by mp.spawn/Process from the script itself, not by torchrun."""
        self.silenced_streams = {stream for s, n in nodes for stream in _silenced_streams(s, n)}
        """'stdout'/'stderr' where ranks singled out by a rank check point sys.stdout at os.devnull (or the like)."""
        self.silencers = {id(n) for s, n in nodes if _swaps_print(n) or "stdout" in _silenced_streams(s, n)}
        """The statements that make print a no-op off rank 0: a builtins.print swap (setup_for_distributed(is_master))
        or `if rank != 0: sys.stdout = open(os.devnull, "w")`."""
        self.stderr_silencers = {id(n) for s, n in nodes if "stderr" in _silenced_streams(s, n)}
        """The statements that point sys.stderr away off rank 0, where a tqdm bar draws (`sys.stdout = sys.stderr =
        open(os.devnull, "w")` under `if local_rank != 0:`)."""
        self.launcher_streams = {stream for s in scripts for stream in _launcher_discards(s)}
        self.launched_by: tuple[str, int] | None = None
        """(file, line) of a launcher of the project that starts this program's ranks (see link_launchers)."""
        """'stdout'/'stderr' that a launcher in the program points elsewhere for the ranks a rank check singles out
        (`if rank > 0: kwargs["stdout"] = subprocess.DEVNULL` before `subprocess.Popen([sys.executable, *argv],
        **kwargs)`), or at a file of each rank's own: the ranks' output on it does not repeat on one console."""
        self.silenced_streams |= self.launcher_streams
        self.prints_silenced = bool(self.silencers)
        """Some file silences print off rank 0 (see silencers)."""
        self.augments = any(isinstance(n, (ast.Name, ast.Attribute)) and _AUGMENT.search(terminal(n))
                            and not _never_read(s, n) for s, n in nodes) or any(_draws(s, n) for s, n in nodes)
        """The program draws random numbers per sample or per step (augmentation, noise, timesteps, masks):
        the stream a seed shared by every rank makes identical on every rank."""
        self.referenced = {terminal(c.func) for s in scripts for c in s.calls} | {
            n.id for _, n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        self.single_node = self._single_node(nodes) or self._ranked_by_spawn_index(scripts) \
            or self._ranked_by_local_rank(scripts)
        self.reducing_functions, self.exchanging_functions, looping = self._function_facts(scripts)
        """Project functions that make a collective (a barrier included), and those that make one other than a
        barrier (directly or through each other)."""
        self.defined_functions = {d.name for s in scripts for d in s.defs}
        self.epoch_loop = any(
            (isinstance(n, (ast.For, ast.While)) or isinstance(n, ast.Call) and terminal(n.func) in looping)
            and s.in_loop(n) for s, n in nodes)
        """Some loop runs another loop (an epoch loop around the batches): set_epoch matters."""
        # (every `from m import *` of a file, where its aliases keep one)
        static = {s.path: {path for module in (*s.aliases.values(), *(
            "." * n.level + (n.module or "") + ".*" for n in s.nodes if isinstance(n, ast.ImportFrom)
            and any(a.name == "*" for a in n.names)), *(  # `tools.Scheduler` after `import kit.tools as tools`
            m for n in s.nodes if isinstance(n, ast.Import) for m in members_read(s.nodes, n)))
                           for path in [self.modules.locate(s.path, module, parent=True)] if path and path != s.path}
                  for s in scripts}
        trees = {path: x.tree for path, x in self.scripts.items()}
        self.imported = set().union(*static.values(), *(imported_at_run_time(found, trees)
                                                        for found in self.runtime_imports.values()))
        """Files another file of the project imports (their code runs on every rank of an importer), at its top or
        at run time (`importlib.import_module(f"app.{name}.train")`)."""
        self.reached_at_run_time = _reached_at_run_time(static, self.runtime_imports, self.imported)
        """{file: (importer, line)}: files the program reaches only through a run-time import, and where."""
        self.forward_collects = any(
            isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "forward"
            and any(isinstance(c, ast.Call) and s.is_dist_collective(c) for c in ast.walk(n))
            for s, n in nodes)
        """A module's forward() makes a collective (Barlow Twins' all_reduce): its loss is already global."""

    def _drop_dead_silencers(self) -> None:
        """Keep as silencers only the statements some rank runs: a builtins.print swap in a function the program never
        calls (`setup_for_distributed` whose only installer, `init_distributed_mode`, is commented out or called in a
        block that never runs) leaves print as it is on every rank."""
        live = {id(n) for x in self.scripts.values() for n in x.nodes
                if (id(n) in self.silencers or _swaps_print(n)) and self.runs(x, n)}
        self.silencers &= live
        self.stderr_silencers = {i for x in self.scripts.values() for n in x.nodes for i in [id(n)]
                                 if i in self.stderr_silencers and self.runs(x, n)}
        self.print_swaps = {i for x in self.scripts.values() for n in x.nodes if _swaps_print(n)
                            for i in [id(n)] if i in live}
        """The builtins.print swaps some rank runs (a subset of silencers)."""
        self.prints_silenced = bool(self.silencers)

    def _single_node(self, nodes: list[tuple[Script, ast.AST]]) -> bool:
        """The script pins the rendezvous to this machine (MASTER_ADDR=localhost, tcp://127.0.0.1:...)."""
        addresses: list[tuple[str | None, bool]] = []
        for s, n in nodes:
            if isinstance(n, ast.Assign) and any(_is_master_addr(t) for t in n.targets):
                value = n.value.value if isinstance(n.value, ast.Constant) else None
                addresses.append((value, bool(s.context(n).branches)))
            elif isinstance(n, ast.Call) and terminal(n.func) == "init_process_group":
                method = next((k.value for k in n.keywords if k.arg == "init_method"), n.args[1] if len(n.args) > 1
                              else None)
                if isinstance(method, ast.Attribute):
                    method = self._field_default(method.attr)  # `args.init_method` of a config class's default
                if isinstance(method, ast.Constant) and isinstance(method.value, str) \
                        and not method.value.startswith("env://"):  # env://: the MASTER_ADDR set elsewhere
                    host = re.sub(r"^tcp://|:\d+$", "", method.value)
                    addresses.append((host, False))
        return bool(addresses) and all(v in _LOCAL_HOSTS for v, _ in addresses)

    def _field_default(self, name: str) -> ast.AST | None:
        """The default a config class of the program gives the field `name` (`init_method: str = "tcp://127.0.0.1:23456"`
        in a dataclass), where that is the only value the program gives it: no other assignment of an attribute
        of that name and no command-line option of that name can change it. None otherwise."""
        fields = [item.value for x in self.scripts.values() for c in x.nodes if isinstance(c, ast.ClassDef)
                  for item in c.body if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                  and item.target.id == name and item.value is not None]
        changed = any(isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Store)
                      or isinstance(n, ast.Call) and terminal(n.func) == "add_argument" and any(
                          isinstance(a, ast.Constant) and isinstance(a.value, str)
                          and a.value.lstrip("-").replace("-", "_") == name for a in n.args)
                      or isinstance(n, ast.keyword) and n.arg == name
                      for x in self.scripts.values() for n in x.nodes)
        return fields[0] if len(fields) == 1 and not changed else None

    def _ranked_by_local_rank(self, scripts: list[Script]) -> bool:
        """Every init_process_group of the program takes a local rank as its rank (`rank=local_rank` from LOCAL_RANK,
        directly or through a parameter every call gives it): a second node would repeat those ranks, so the job
        is one node, where the local rank is the global one."""
        starts = [(s, call) for s in scripts for call in s.calls if s.call_name(call) == "init_process_group"]
        ranks = [(s, next((k.value for k in call.keywords if k.arg == "rank"), call.args[4] if len(call.args) > 4
                          else None)) for s, call in starts]
        return bool(ranks) and all(rank is not None and self._plain_local(s, rank, 5) for s, rank in ranks)

    def _plain_local(self, s: Script, expr: ast.AST, depth: int) -> bool:
        """A local rank as such (LOCAL_RANK, `args.local_rank`, a name or parameter only ever given one), not a value
        computed from it (`node * nprocs + local_rank` is a global rank)."""
        if depth < 0 or s.kind(expr) != LOCAL or s.is_global_rank(expr):
            return False
        if isinstance(expr, ast.Call):
            return terminal(expr.func) in ("int", "get", "getenv") and bool(expr.args) and (
                terminal(expr.func) != "int" or self._plain_local(s, expr.args[0], depth))
        if isinstance(expr, ast.Subscript):
            return True  # os.environ["LOCAL_RANK"]
        if isinstance(expr, ast.Attribute):
            values = [(x, v) for x in self.scripts.values() for k, v in x.assignments if k == "." + expr.attr]
            return all(self._plain_local(x, v, depth - 1) for x, v in values)
        if not isinstance(expr, ast.Name):
            return False
        scope = s.context(expr).scope
        func = next((d for d in s.defs if id(d) == scope), None)
        params = [a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)] if func else []
        if expr.id in params:
            positional = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
            given = []
            method = isinstance(s.parents.get(id(func)), ast.ClassDef)
            for x, call in self.calls_named(func.name):
                if not method and isinstance(call.func, ast.Attribute) and not (
                        isinstance(call.func.value, ast.Name) and call.func.value.id in x.aliases):
                    continue  # `model.train()` is another function than the module's `train(rank, ...)`
                value = next((k.value for k in call.keywords if k.arg == expr.id), None)
                if value is None and expr.id in positional and positional.index(expr.id) < len(call.args):
                    value = call.args[positional.index(expr.id)]
                given.append((x, value))
            return bool(given) and all(v is not None and self._plain_local(x, v, depth - 1) for x, v in given)
        values = s.local_values(expr.id, expr)
        return all(self._plain_local(s, v, depth - 1) for v in values)

    def _ranked_by_spawn_index(self, scripts: list[Script]) -> bool:
        """The process group takes as its rank the index mp.spawn gives each worker (`def worker(local_rank, ...)`
        ... `init_process_group(..., rank=local_rank)`, directly or through a helper's parameter): the global rank
        is then the index on this machine, so the job is one node (a second node's ranks would repeat them)."""
        workers = {terminal(c.args[0] if c.args else next(k.value for k in c.keywords if k.arg == "fn"))
                   for s in scripts for c in s.calls if s.qualname(c.func).endswith(("multiprocessing.spawn",
                                                                                      "start_processes"))
                   and (c.args or any(k.arg == "fn" for k in c.keywords))}
        return bool(workers) and any(
            isinstance(rank, ast.Name) and self._spawn_index(s, call, rank.id, workers, 2)
            for s in scripts for call in s.calls if s.call_name(call) == "init_process_group"
            for rank in [next((k.value for k in call.keywords if k.arg == "rank"), None)])

    def _spawn_index(self, s: Script, node: ast.AST, name: str, workers: set[str], depth: int) -> bool:
        """Whether `name` at `node` is the spawn index: the first parameter of a worker, or a parameter every call
        of its function gives the spawn index (`depth` calls up), never reassigned."""
        func = next((d for d in s.defs if id(d) == s.context(node).scope), None)
        if func is None:
            return False
        params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
        if name not in params or any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store)
                                     for n in ast.walk(func)):
            return False
        if func.name in workers and params[0] == name:
            return True
        if depth == 0 or params[:1] in (["self"], ["cls"]):
            return False
        given = [(x, c, next((k.value for k in c.keywords if k.arg == name),
                             c.args[params.index(name)] if params.index(name) < len(c.args) else None))
                 for x in self.scripts.values() for c in x.calls if terminal(c.func) == func.name
                 and not isinstance(c.func, ast.Attribute)]
        return bool(given) and all(isinstance(v, ast.Name) and self._spawn_index(x, c, v.id, workers, depth - 1)
                                   for x, c, v in given)

    def _function_facts(self, scripts: list[Script]) -> tuple[set[str], set[str], set[str]]:
        """Functions that make a collective (directly or through each other); those that make one other than a
        barrier; functions with a loop."""
        direct: dict[str, set[str]] = {}
        found: set[str] = set()
        exchanging: set[str] = set()
        looping: set[str] = set()
        for s in scripts:
            for d in s.defs:
                callees = direct.setdefault(d.name, set())
                for n in ast.walk(d):
                    if isinstance(n, ast.Call):
                        callees.add(terminal(n.func))
                        if s.is_dist_collective(n):
                            found.add(d.name)
                            if "barrier" not in terminal(n.func).lower():
                                exchanging.add(d.name)
                    elif isinstance(n, (ast.For, ast.While)):
                        looping.add(d.name)
        for made in (found, exchanging):
            changed = True
            while changed:
                changed = False
                for name, callees in direct.items():
                    if name not in made and callees & made:
                        made.add(name)
                        changed = True
        return found, exchanging, looping

    def print_silenced(self, script: Script, call: ast.Call, stdout: bool = True) -> bool:
        """Whether `call` (a print) runs after the program swaps builtins.print: every print does, except one in the
        function that makes the swap (`setup_for_distributed(rank == 0)` at the end of init_distributed_mode)
        written above the swap, which runs on every rank before print is replaced. `stdout=False`: the same for a
        tqdm bar, which writes to sys.stderr: only a silenced sys.stderr counts, not a print swap."""
        if ("stdout" if stdout else "stderr") in self.launcher_streams:
            return True  # a launcher sends the other ranks' console away (see launcher_streams)
        silencers = self.silencers if stdout else self.stderr_silencers
        if not silencers:
            return False
        swaps = self.memo(("print swaps", stdout), lambda: {d.name for x in self.scripts.values() for d in x.defs
                                                            if any(id(n) in silencers for n in ast.walk(d))})
        scope = script.context(call).scope
        func = next((d for d in script.defs if id(d) == scope), None)
        replacers = self.memo("print replacers", lambda: {d.name for x in self.scripts.values() for d in x.defs
                                                          if any(id(n) in self.print_swaps for n in ast.walk(d))})
        installers = self._print_installers(silencers, stdout)

        def installs(n: ast.AST) -> bool:  # a call of a function that swaps print, itself or through its callees
            if not isinstance(n, ast.Call):
                return False
            if not isinstance(n.func, ast.Attribute) and terminal(n.func) in swaps:
                return True
            target = self.resolve(script, n.func) if isinstance(n.func, ast.Attribute) or "." in script.qualname(
                n.func) else (script.path, terminal(n.func))
            return target in installers
        managers = self._silencing_managers(silencers, stdout)
        if managers and _inside_with(script, call, managers):
            return True  # `with HiddenPrints(rank):` silences its own block
        if func is None and managers and silencers <= set().union(*managers.values()):
            return False  # module code outside every such block: each gives the stream back at its end
        if func is None:  # module code: after a silencer (or a call that makes one) at module level of this file
            here = [n.lineno for n in script.nodes if (id(n) in silencers or installs(n))
                    and script.context(n).scope == scope]
            return not here or call.lineno > min(here)
        if stdout and func.name in replacers:
            return True
        swap_lines = [n.lineno for n in ast.walk(func) if id(n) in silencers or installs(n)]
        if swap_lines:
            return call.lineno > min(swap_lines)
        return not self._called_before_swap(script, func, silencers, stdout)

    def _silencing_managers(self, silencers: set[int], stdout: bool) -> dict[str, set[int]]:
        """{class name: its silencers} for the program's context managers that silence the stream in `__enter__`
        (`class HiddenPrints: def __enter__(self): sys.stdout = open(os.devnull, "w")`): for their `with` block."""
        def compute() -> dict[str, set[int]]:
            found: dict[str, set[int]] = {}
            for x in self.scripts.values():
                for c in (n for n in x.nodes if isinstance(n, ast.ClassDef)):
                    enter = next((d for d in c.body if isinstance(d, ast.FunctionDef) and d.name == "__enter__"), None)
                    held = {id(n) for n in ast.walk(enter) if id(n) in silencers} if enter is not None else set()
                    if held:
                        found[c.name] = held
            return found
        return self.memo(("silencing managers", stdout), compute)

    def _called_before_swap(self, script: Script, func: ast.AST, silencers: set[int], stdout: bool) -> bool:
        """Whether every call of `func` (a module-level function) sits above the swapping call in a function that
        makes one (`print_config(args)` then `init_distributed_mode(args)` in `main`): it runs before print is
        replaced, on every rank. A function also called elsewhere, or passed along, may run after the swap."""
        if not any(d is func for d in script.tree.body):
            return False

        def compute() -> bool:
            installers = self._print_installers(silencers, stdout)
            calls = [(x, c) for x, c in self.calls_named(func.name)
                     if (self.resolve(x, c.func) if "." in x.qualname(c.func) else (x.path, terminal(c.func)))
                     == (script.path, func.name)]
            named = any(isinstance(n, ast.Name) and n.id == func.name and isinstance(n.ctx, ast.Load)
                        and not (isinstance(x.parents.get(id(n)), ast.Call) and x.parents[id(n)].func is n)
                        for x in self.scripts.values() for n in x.nodes)
            if not calls or named:
                return False
            for x, c in calls:
                outer = next((d for d in x.defs if id(d) == x.context(c).scope), None)
                if outer is None or (x.path, outer.name) not in installers:
                    return False
                lines = [n.lineno for n in ast.walk(outer) if id(n) in silencers or isinstance(n, ast.Call) and (
                    (self.resolve(x, n.func) if "." in x.qualname(n.func) else (x.path, terminal(n.func)))
                    in installers)]
                if not lines or c.lineno >= min(lines):
                    return False
            return True
        return self.memo(("called before swap", script.path, func.name, stdout), compute)

    def _print_installers(self, silencers: set[int], stdout: bool) -> set[tuple[str, str]]:
        """(path, name) of the functions that swap print off rank 0 when called: those holding the swap and, in
        turn, those calling one of them (`init_distributed_mode` calling `setup_for_distributed`, `train` calling
        `init_distributed_mode`). A print above such a call in its function runs on every rank."""
        def compute() -> set[tuple[str, str]]:
            found = {(path, d.name) for path, x in self.scripts.items() for d in x.defs
                     if any(id(n) in silencers for n in ast.walk(d))}
            changed = True
            while changed:
                changed = False
                for path, x in self.scripts.items():
                    for d in x.defs:
                        if (path, d.name) in found or isinstance(d, ast.ClassDef):
                            continue
                        for c in ast.walk(d):
                            if not isinstance(c, ast.Call) or isinstance(c.func, ast.Attribute) and \
                                    isinstance(c.func.value, ast.Name) and c.func.value.id in ("self", "cls"):
                                continue
                            local = isinstance(c.func, ast.Name) and "." not in x.qualname(c.func)
                            if (path, terminal(c.func)) in found if local else self.resolve(x, c.func) in found:
                                found.add((path, d.name))
                                changed = True
                                break
            return found
        return self.memo(("print installers", stdout), compute)

    def parent_only(self, script: Script, node: ast.AST) -> bool:
        """Whether `node` sits in a module-level function of a file that starts no ranks itself, every call of which
        is in the parent of an mp.spawn/Process script (`utils.create_exp_dir(args.save)` in the `__main__`
        block before the workers start): only the parent runs it."""
        functions = script.context(node).functions
        if not functions or not self.spawned:
            return False
        name = functions[0]
        if not any(d.name == name for d in script.tree.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))):
            return self._parent_only_method(script, name)

        def compute() -> bool:
            # (a call in the helper's own `__main__` block runs in another program, not in this one's ranks)
            calls = [(x, c) for x, c in self.calls_named(name) if self.runs(x, c) and (
                self.resolve(x, c.func) == (script.path, name)
                or x is script and isinstance(c.func, ast.Name) and self.callee(x, c) == (script, name))]
            named = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                        and not (isinstance(x.parents.get(id(n)), ast.Call) and x.parents[id(n)].func is n)
                        for x in self.scripts.values() for n in x.nodes)  # passed along: runs where it is called
            # a call in a helper of a file that starts no ranks is parent code where that helper is
            # (`set_deterministic(seed)` in `get_args()`, which only the `__main__` blocks call before spawning)
            return bool(calls) and not named and all(
                not x.per_rank(c) if x.per_rank_functions is not None else self.parent_only(x, c) for x, c in calls)
        key = ("parent only", script.path, name)
        if key in self._parent_only_open:
            return False  # (a cycle of helpers: nothing shows it is parent code)
        self._parent_only_open.add(key)
        try:
            return self.memo(key, compute)
        finally:
            self._parent_only_open.discard(key)

    def _parent_only_method(self, script: Script, name: str) -> bool:
        """Whether `name` is a method of a module-level class of `script` (a file that starts no ranks) every call
        of which in the program sits in the parent of an mp.spawn/Process script: `DatasetTools.compose_dataset(cfg)`
        naming the class, `cfg.announce()` on any object (no rank calls a method of that name at all), or
        `cls.name(...)`/`self.name(...)` in a method that runs in the parent only: only the parent runs it. Not a
        dunder or `forward`, which Python and torch call without naming them."""
        if script.per_rank_functions is not None:
            return False
        if name.startswith("__") or name == "forward":
            return False
        owner = next((c for c in script.tree.body if isinstance(c, ast.ClassDef) and any(
            isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)) and d.name == name for d in c.body)), None)
        if owner is None:
            return False

        def compute() -> bool:
            calls = [(x, c) for x, c in self.calls_named(name) if self.runs(x, c)]
            if not calls or any(isinstance(n, ast.Attribute) and n.attr == name and not (
                    isinstance(x.parents.get(id(n)), ast.Call) and x.parents[id(n)].func is n)
                    for x in self.scripts.values() for n in x.nodes):
                return False  # (handed along as a value: it runs wherever it is called)
            return all(isinstance(c.func, ast.Attribute) and (
                not x.per_rank(c) if x.per_rank_functions is not None else self.parent_only(x, c)) for x, c in calls)
        key = ("parent only", script.path, owner.name, name)
        if key in self._parent_only_open:
            return False
        self._parent_only_open.add(key)
        try:
            return self.memo(key, compute)
        finally:
            self._parent_only_open.discard(key)

    def global_parameter(self, script: Script, use: ast.Name) -> bool:
        """Whether `use` is a parameter every call of its function gives the global rank (see
        ddpkit.lint.callsites.global_parameter)."""
        return global_parameter(self, script, use)

    def joins(self, script: Script) -> bool:
        """Whether every rank runs `script` because it starts the process group through a project function
        (`cfg = setup_gpu(cfg)` whose body, or a function it calls, runs `init_process_group`), though the file
        names nothing of torch.distributed itself."""
        return script.path in self.memo("joining files", self._joining)

    def _joining(self) -> set[str]:
        callees = {d.name: {terminal(c.func) for c in ast.walk(d) if isinstance(c, ast.Call)}
                   for s in self.scripts.values() for d in s.defs}
        callees.update(self._constructions())
        starters = {d.name for s in self.scripts.values() for d in s.defs
                    if any(isinstance(c, ast.Call) and terminal(c.func) == "init_process_group" for c in ast.walk(d))}
        # (a class whose own `__init__` calls init_process_group: `MetaModel(args.local_rank)` starts the group)
        starters |= {name for name, called in self._constructions().items() if "init_process_group" in called}
        changed = True
        while changed:
            more = {name for name, called in callees.items() if called & starters} - starters
            # `Exp = Exp_Imputation` ... `Exp(args)`: a name that holds a class which starts the group
            more |= {k for s in self.scripts.values() for k, v in s.assignments
                     if not k.startswith(".") and isinstance(v, ast.Name) and v.id in starters} - starters
            starters |= more
            changed = bool(more)
        return {s.path for s in self.scripts.values()
                if any(terminal(c.func) in starters and self.runs(s, c) for c in s.calls)}

    def _constructions(self) -> dict[str, set[str]]:
        """{class name: what building one runs}: the calls of its own `__init__` (`self._build_model()`) and its base
        classes, whose `__init__` runs through `super().__init__(...)` or by inheritance."""
        found: dict[str, set[str]] = {}
        for s in self.scripts.values():
            for cls in (n for n in s.nodes if isinstance(n, ast.ClassDef)):
                inits = [d for d in cls.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and d.name == "__init__"]
                called = {terminal(c.func) for d in inits for c in ast.walk(d)
                          if isinstance(c, ast.Call)} - {"__init__"}
                found[cls.name] = found.get(cls.name, set()) | called | {terminal(b) for b in cls.bases}
        return found

    def reduces(self, pattern: re.Pattern[str]) -> bool:
        """Whether some value whose name matches `pattern` is reduced or gathered across ranks anywhere."""
        return self.memo(("reduces", pattern.pattern), lambda: self._reduces(pattern))

    def _reduces(self, pattern: re.Pattern[str]) -> bool:
        def reducing(s: Script, call: ast.AST) -> bool:
            if not isinstance(call, ast.Call):
                return False
            name = terminal(call.func)
            return s.is_dist_collective(call) or name in self.reducing_functions or bool(REDUCING_NAME.search(name))

        for s in self.scripts.values():
            if any(pattern.search(k) and reducing(s, v) and self.runs(s, v) for k, v in s.assignments):
                return True  # `loss = ddpkit.reduce_mean(ctx, ...)`
            for call in s.calls:
                if not reducing(s, call) or not self.runs(s, call):
                    continue  # (a reduction in code no rank runs reduces nothing)
                for arg in (*call.args, *(k.value for k in call.keywords)):
                    if any(isinstance(n, (ast.Name, ast.Attribute)) and pattern.search(terminal(n))
                           for n in ast.walk(arg)):
                        return True
                    # `metrics = torch.tensor([avg_loss, accuracy])` then `all_reduce(metrics)`: what the name was
                    # built from in the same function
                    if isinstance(arg, ast.Name) and any(
                            value is not None and scope_of(stmt, s.parents) is scope_of(call, s.parents) and any(
                                isinstance(n, (ast.Name, ast.Attribute)) and pattern.search(terminal(n))
                                for n in ast.walk(value)) for stmt, value in s._bindings.get(arg.id, ())):
                        return True
        return False


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _asks_cuda(s: Script, test: ast.AST) -> bool | None:
    """True for `torch.cuda.is_available()`, False for its negation, None for any other test."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _asks_cuda(s, test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Call) and s.qualname(test.func) == "torch.cuda.is_available":
        return True
    return None


def _after_cuda_required(s: Script, branch: ast.If) -> bool:
    """A test of `torch.cuda.is_available()` after a statement of the same function that every path to it runs and
    that calls `.cuda()` (`model = Model().cuda()`): that call raises without a GPU, so the test always passes."""
    if _asks_cuda(s, branch.test) is None:
        return False
    node = branch
    while id(node) in s.parents and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        parent = s.parents[id(node)]
        block = next((b for f in ("body", "orelse", "finalbody") for b in [getattr(parent, f, None)]
                      if isinstance(b, list) and any(x is node for x in b)), None)
        if block is None or isinstance(parent, (ast.Try, ast.ExceptHandler)):
            return False  # (a `try:` may catch the error the call raises)
        for stmt in block[:next(i for i, x in enumerate(block) if x is node)]:
            if isinstance(stmt, (ast.Assign, ast.Expr)) and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "cuda"
                    for c in _unconditional(stmt.value)):
                return True
        node = parent
    return False


def _unconditional(expr: ast.AST) -> Iterator[ast.AST]:
    """The nodes of an expression that always run (not inside a lambda, comprehension, `x if c else y` or `and`/`or`)."""
    yield expr
    if isinstance(expr, (ast.Lambda, ast.IfExp, ast.BoolOp, ast.ListComp, ast.SetComp, ast.DictComp,
                         ast.GeneratorExp)):
        return
    for child in ast.iter_child_nodes(expr):
        yield from _unconditional(child)


def _local_constants(d: ast.AST) -> dict[str, object]:
    """Local names of a function that its code binds once, to a literal (`answer = "y"` where the prompt that read
    it is commented out): no parameter, loop target, `global`, `del`, augmented assignment or rebinding, and no
    `exec`/`locals()` in the function."""
    counts: dict[str, int] = {}
    values: dict[str, object] = {}
    for n in ast.walk(d):
        if n is not d and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            counts.update((a.arg, 2) for a in ast.walk(n) if isinstance(a, ast.arg))  # (a nested scope's names)
        if isinstance(n, ast.Call) and terminal(n.func) in ("exec", "eval", "locals", "vars"):
            return {}
        names = [n.id] if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load) else \
            [n.arg] if isinstance(n, ast.arg) else list(n.names) if isinstance(n, (ast.Global, ast.Nonlocal)) else []
        for name in names:
            counts[name] = counts.get(name, 0) + 1
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) \
                and isinstance(n.value, ast.Constant) and isinstance(n.value.value, (str, bool, int)):
            values[n.targets[0].id] = n.value.value
    return {name: value for name, value in values.items() if counts.get(name) == 1}


def _switch_off(scope: ast.AST, is_flag, literals: list[object], dead: set[int]) -> None:
    """Add to dead the nodes of each arm of an `if` in scope that the test never takes, the flag holding each of
    `literals` in turn (see _decide): the body of `if <flag>:` / `if <flag> and ...:` for False or None, the
    `else:` of `if <flag> is not None:` for 10. An arm is reached only by the values its enclosing tests let
    through: the last `else:` of `if mode == "train": ... elif mode == "eval": ... else:` is never taken where
    every call passes "train" or "eval"."""
    def visit(node: ast.AST, values: list[object]) -> None:
        if not isinstance(node, ast.If):
            for child in ast.iter_child_nodes(node):
                visit(child, values)
            return
        decided = [(value, _decide(node.test, is_flag, value)) for value in values]
        for arm, reaching in ((node.body, [v for v, d in decided if d is not False]),
                              (node.orelse, [v for v, d in decided if d is not True])):
            if not reaching:
                dead.update(id(m) for stmt in arm for m in ast.walk(stmt))
                continue
            for stmt in arm:
                visit(stmt, reaching)
    for child in ast.iter_child_nodes(scope):
        visit(child, literals)


def _decide(test: ast.AST, is_flag, value: object) -> bool | None:
    """What `test` comes to when the flag holds `value`, where that alone decides it; else None."""
    if is_flag(test):
        return bool(value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _decide(test.operand, is_flag, value)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        parts = [_decide(p, is_flag, value) for p in test.values]
        stop = isinstance(test.op, ast.Or)  # (True decides an `or`, False an `and`)
        return stop if stop in parts else (not stop if all(p is not None for p in parts) else None)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and is_flag(test.left) \
            and isinstance(test.comparators[0], ast.Constant):
        other, op = test.comparators[0].value, test.ops[0]
        if isinstance(op, (ast.Is, ast.IsNot)) and (other is None or isinstance(other, bool)):
            return (value is other) == isinstance(op, ast.Is)
        if isinstance(op, (ast.Eq, ast.NotEq)) and type(value) is type(other):
            return (value == other) == isinstance(op, ast.Eq)
    return None


def _bound_once(project: Project, script: Script, name: str) -> ast.Constant | None:
    """The literal a module-level `name = <literal>` binds, when that is the module's only binding of the name
    and no code rebinds it (`global name`, `module.name = ...`)."""
    binds = [stmt for stmt in script.tree.body for n in ast.walk(stmt)
             if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del))
             and not any(n in ast.walk(d) for d in ast.walk(stmt) if isinstance(d, (ast.FunctionDef,
                                                                                   ast.AsyncFunctionDef, ast.Lambda)))]
    rebound = any(isinstance(n, ast.Global) and name in n.names for n in script.nodes) or any(
        isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Store)
        for x in project.scripts.values() for n in x.nodes)
    if len(binds) != 1 or rebound:
        return None
    stmt = binds[0]
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
        else []
    if len(targets) == 1 and isinstance(targets[0], ast.Name) and isinstance(stmt.value, ast.Constant):
        return stmt.value
    return None


def _reached_at_run_time(static: dict[str, set[str]], runtime: dict[str, dict[str, ast.Call]],
                         imported: set[str]) -> dict[str, tuple[str, int]]:
    entries = [p for p in static if p not in imported]
    reach, todo = set(entries), list(entries)
    while todo:
        for t in static.get(todo.pop(), ()):
            if t not in reach:
                reach.add(t)
                todo.append(t)
    found: dict[str, tuple[str, int]] = {}
    todo = [p for p in static if p in reach or p in found]
    while todo:
        path = todo.pop()
        via = found.get(path)
        for t, call in runtime.get(path, {}).items():
            if t not in reach and t not in found:
                found[t] = via or (path, call.lineno)
                todo.append(t)
        for t in static.get(path, ()):
            if t not in reach and t not in found and via:
                found[t] = via
                todo.append(t)
    return found


def _scoped_walk(node: ast.AST, off: dict[str, set[int]] | None = None):
    """ast.walk, each node with the names that local variables hide from the module at that point
    (`log = logging.getLogger()` in a function does not name the module's `def log`); statements in `off`
    (path -> node ids: branches no call turns on) are not entered."""
    skip = set().union(*off.values()) if off else set()
    todo = [(node, frozenset(local_names(node)) if isinstance(node, _SCOPES) else frozenset())]
    while todo:
        n, shadowed = todo.pop()
        if id(n) in skip:
            continue
        yield n, shadowed
        for child in ast.iter_child_nodes(n):
            inner = shadowed | local_names(child) if isinstance(child, _SCOPES) else shadowed
            todo.append((child, inner))


def _script(path: str, tree: ast.Module, levels: dict[str, int], star: dict[str, str],
            world_names: frozenset[str]) -> Script:
    script = Script(tree, levels, star, world_names)
    script.path = path
    return script


_DRAWS = frozenset({"rand", "randn", "randint", "rand_like", "randn_like", "randint_like", "normal",
                    "bernoulli", "multinomial", "uniform", "choice", "shuffle", "random", "beta", "permutation",
                    "randrange"})


def _never_read(s: Script, node: ast.AST) -> bool:
    """`transform = Compose([RandomHorizontalFlip(), ...])` inside a function that never reads `transform` again
    (nor a function nested in it): the value the node is part of is built and dropped, so it draws nothing."""
    parents = s.parents
    stmt = node
    while id(stmt) in parents and not isinstance(stmt, ast.stmt):
        stmt = parents[id(stmt)]
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return False
    scope = parents.get(id(stmt))
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
        scope = parents.get(id(scope))
    if scope is None:
        return False  # a module name another file may import
    name = stmt.targets[0].id
    return not any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                   or isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names for n in ast.walk(scope))


def _draws(s: Script, node: ast.AST) -> bool:
    """A random draw (torch.randn, np.random.rand, random.random, a torch.distributions sample...) inside a
    loop, forward() or __getitem__."""
    if _samples_a_distribution(s, node):
        return _in_training_step(s, node) or _per_item(s, node)
    if not (isinstance(node, ast.Call) and terminal(node.func) in _DRAWS):
        return False
    name = s.qualname(node.func)
    if not name.startswith(("torch.", "numpy.random.", "np.random.", "random.")) or name.startswith("torch.nn.init"):
        return False
    # sized by a tensor (`randn_like(x)`, `randint(0, T, (x.shape[0],))`): noise, timesteps or masks drawn for
    # the data; `torch.randn(8, 4)` or `randint(0, vocab, (batch, seq))` is a synthetic batch. The size may come
    # through the function's own assignments: `n = len(tokens); start = random.randint(1, n - 1)`
    sized = terminal(node.func).endswith("_like") or any(
        _measures_data(s, a, node) for a in (*node.args, *(k.value for k in node.keywords
                                                          if k.arg in ("size", "low", "high", "input"))))
    if any(k.arg == "generator" for k in node.keywords):
        return False  # its own generator, seeded apart
    # a scalar of Python's `random` (`random.randint(0, 3)`) in a sample's own path picks that sample's crop or
    # augmentation: it is not a synthetic batch whatever its bounds
    scalar = name.startswith("random.")
    return (sized or scalar and _per_item(s, node)) and (_in_training_step(s, node) or _per_item(s, node))


def _per_item(s: Script, node: ast.AST) -> bool:
    """Inside forward(), __getitem__ or __call__ (run once per sample or batch), or in a method of the same class
    that one of them calls through `self` (`__getitem__` -> `self.get_audio(...)`), followed a few calls deep."""
    functions = s.context(node).functions
    if not functions:
        return False
    if functions[-1] in _PER_ITEM:
        return True
    cls = s.parents.get(id(next((d for d in s.defs if id(d) == s.context(node).scope), None)))
    if not isinstance(cls, ast.ClassDef) or len(functions) != 1:
        return False
    methods = {d.name: d for d in cls.body if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))}
    reached, todo = set(), [m for m in _PER_ITEM if m in methods]
    while todo and len(reached) < 50:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo += [c.func.attr for c in ast.walk(methods[name]) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)
                 and c.func.value.id == "self" and c.func.attr in methods]
    return functions[-1] in reached


_PER_ITEM = ("forward", "__getitem__", "__call__")


def _measures_data(s: Script, expr: ast.AST, within: ast.AST, depth: int = 3) -> bool:
    """`x.shape`, `x.size()`, `len(x)`, `x.numel()` in an expression, or in what the enclosing function assigns to a
    name it reads (followed `depth` assignments back)."""
    for n in ast.walk(expr):
        if isinstance(n, ast.Attribute) and n.attr == "shape" or isinstance(n, ast.Call) and terminal(n.func) in (
                "size", "len", "numel"):
            return True
    return depth > 0 and any(
        _measures_data(s, value, within, depth - 1) for n in ast.walk(expr)
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) for value in s.local_values(n.id, within))


def _samples_a_distribution(s: Script, node: ast.AST) -> bool:
    """`Normal(mu, sigma).rsample()` (or through a name bound to one): a draw shaped like its parameters, the
    data's tensors."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
            "rsample", "sample", "sample_n")):
        return False
    owner = node.func.value
    built = [owner] if isinstance(owner, ast.Call) else [
        v for k, v in s.assignments if isinstance(owner, ast.Name) and k == owner.id]
    return any(isinstance(v, ast.Call) and s.qualname(v.func).startswith("torch.distributions.") for v in built)


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


_PLAIN_DECORATORS = frozenset({"staticmethod", "classmethod", "no_grad", "inference_mode", "enable_grad",
                               "wraps", "lru_cache", "cache", "jit", "script", "compile"})
"""Decorators that do not register a function anywhere: it still runs only when something calls it."""
_PLAIN_BASES = frozenset({"object", "Module", "Dataset", "IterableDataset", "Sampler", "Enum", "NamedTuple",
                          "Exception", "ABC", "Generic", "Protocol"})
"""Bases whose subclasses' methods run only when called by name (besides dunders and forward)."""


def _name_fragments(expr: ast.AST) -> tuple[str, str] | None:
    """(prefix, suffix) of the constant text around a string built at run time: `"init_dist_%s" % launcher`,
    `"init_" + backend`, `f"forward_{mode}"`, `"setup_{}".format(kind)`; None for a constant or no constant text."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mod) and isinstance(expr.left, ast.Constant) \
            and isinstance(expr.left.value, str) and expr.left.value.count("%") == 1:
        head, _, tail = expr.left.value.partition("%")
        return head, tail[1:]
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format" \
            and isinstance(expr.func.value, ast.Constant) and isinstance(expr.func.value.value, str) \
            and expr.func.value.value.count("{") == 1:
        head, _, rest = expr.func.value.value.partition("{")
        return head, rest.partition("}")[2]
    parts = []
    if isinstance(expr, ast.JoinedStr):
        parts = list(expr.values)
    else:
        todo = [expr]
        while todo:
            e = todo.pop(0)
            if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
                todo[:0] = [e.left, e.right]
            else:
                parts.append(e)
    if len(parts) < 2:
        return None
    text = [isinstance(p, ast.Constant) and isinstance(p.value, str) for p in parts]
    head = parts[0].value if text[0] else ""
    tail = parts[-1].value if text[-1] else ""
    if all(text) or not (head or tail) or sum(1 for t in text if not t) != 1:
        return None
    return head, tail


def _built_name_candidates(node: ast.AST, defs: dict[str, list[ast.AST]]) -> list[str]:
    """Project functions a name built at run time can spell, where the code looks a function up by it:
    `getattr(module, <built>)`, `globals()[<built>]`, `vars(module)[<built>]`, `module.__dict__[<built>]`."""
    built = None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
            and len(node.args) >= 2:
        built = node.args[1]
    elif isinstance(node, ast.Subscript) and (
            isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
            and node.value.func.id in ("globals", "vars", "locals")
            or isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__"):
        built = node.slice
    fragments = _name_fragments(built) if built is not None else None
    if fragments is None or len(fragments[0]) + len(fragments[1]) < 3:
        return []
    head, tail = fragments
    return [name for name in defs if name.startswith(head) and name.endswith(tail)
            and len(name) > len(head) + len(tail)]
def _inside_with(script: Script, node: ast.AST, managers: dict[str, set[int]]) -> bool:
    """`node` sits in the block of a `with` over one of `managers` (`with HiddenPrints(rank):`)."""
    child = node
    while (parent := script.parents.get(id(child))) is not None:
        if isinstance(parent, (ast.With, ast.AsyncWith)) and child in parent.body and any(
                isinstance(i.context_expr, ast.Call) and terminal(i.context_expr.func) in managers
                for i in parent.items):
            return True
        child = parent
    return False


def _star_exports(tree: ast.Module, name: str) -> bool:
    """`from module import *` brings `name`: within the module's `__all__` where it declares one."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets) \
                and isinstance(stmt.value, (ast.List, ast.Tuple)):
            return any(isinstance(e, ast.Constant) and e.value == name for e in stmt.value.elts)
    return True


def _looks_up_by_name(node: ast.AST) -> bool:
    """`getattr(models, args.arch)`, `models.__dict__[name]`, `globals()[name]`, `eval(...)`: code chosen by a
    string, so a class nothing names may still run."""
    if isinstance(node, ast.Call):
        name = terminal(node.func)
        builtin = isinstance(node.func, ast.Name) and name in ("eval", "exec", "globals", "vars", "locals",
                                                                "__import__", "getattr")
        return (builtin and (name != "getattr" or len(node.args) >= 2 and not isinstance(node.args[1], ast.Constant))) \
            or name in ("import_module", "instantiate")
    return isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
        and node.value.attr == "__dict__" and not (isinstance(node.value.value, ast.Name) and node.value.value.id == "self")


def _read_as_data(n: ast.Attribute, parent_of: dict[int, ast.AST]) -> bool:
    """`if args.resume:`, `not args.evaluate`, `args.epochs - 1`, `f"{args.save}"`: an attribute read where its
    value is tested, compared, computed with or formatted, which no method's value is; it neither calls nor hands
    over a method of that name (`trainer.resume` stays unnamed), unlike a call, an argument, an assignment or an
    `and`/`or` whose value is kept (`hook = hook or self.default_hook`)."""
    child, parent = n, parent_of.get(id(n))
    while isinstance(parent, ast.BoolOp) or isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
        if isinstance(parent, ast.UnaryOp):
            return True
        child, parent = parent, parent_of.get(id(parent))
    if isinstance(parent, (ast.If, ast.While, ast.IfExp, ast.Assert)):
        return parent.test is child
    if child is not n:
        return False  # (an `and`/`or` whose value is kept)
    return isinstance(parent, (ast.Compare, ast.BinOp, ast.FormattedValue)) \
        or isinstance(parent, ast.Subscript) and parent.value is n


def _picks_by_name(s: Script, node: ast.AST) -> str | None:
    """What a lookup by string (see _looks_up_by_name) may pick: "module" for any class or function of a module
    (`globals()[name]`, `getattr(models, args.arch)`), "method" for a method of an object (`getattr(self, name)`,
    `getattr(args, key)`), None for no code at all (`vars(args)`: the values an object holds, a configuration)."""
    if not _looks_up_by_name(node):
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "vars") \
            and node.args and not _module_valued(s, node.args[0]):
        return "method" if node.func.id == "getattr" else None
    return "module"


def _module_valued(s: Script, expr: ast.AST) -> bool:
    """An expression that may hold a module: an imported name (`models`, `utils.registry`), a module fetched at run
    time (`import_module(...)`, `sys.modules[__name__]`, a local name only ever given one or a getattr of itself);
    not another local value, `self` or its attributes."""
    root = expr
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name) and root.id not in s.aliases and root is expr:
        # `mod = __import__(path[0])`, then `mod = getattr(mod, part)` down a dotted path: every value the function
        # gives the name is a module (or what a module holds)
        assigned = [(stmt, v) for stmt, v in s.local_assignments(root.id, expr)]
        return any(_imports_a_module(v) for _, v in assigned) and all(
            _imports_a_module(v) or isinstance(v, ast.Call) and terminal(v.func) == "getattr" and v.args
            and isinstance(v.args[0], ast.Name) and v.args[0].id == root.id for _, v in assigned)
    if isinstance(root, ast.Name):
        return root.id in s.aliases and root.id != "self"
    return not isinstance(root, ast.Constant)


def _imports_a_module(value: ast.AST | None) -> bool:
    return isinstance(value, ast.Call) and terminal(value.func) in ("__import__", "import_module")


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


_DISCARD = re.compile(r"devnull|null|dummy|discard|quiet|silent", re.IGNORECASE)


def _on_a_member(node: ast.Attribute) -> bool:
    """`self.base.load_param`: an attribute of an attribute of self."""
    return isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name) \
        and node.value.value.id == "self"


def _module_rooted(s: Script, node: ast.Attribute) -> bool:
    """`utils.save` / `pkg.utils.save`: an attribute chain whose root is an imported name (a module, or a class or
    object imported from one), not a local value."""
    root = node.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id in s.aliases


def _silenced_streams(s: Script, node: ast.AST) -> set[str]:
    """'stdout'/'stderr' that `node` points at os.devnull (or None) on the ranks a rank check singles out:
    `sys.stdout = open(os.devnull, "w")`, `sys.stdout = sys.stderr = f` with `f = open(os.devnull, "w")` above it
    in the same function."""
    if not isinstance(node, ast.Assign):
        return set()
    streams = {t.attr for t in node.targets if isinstance(t, ast.Attribute) and t.attr in ("stdout", "stderr")
               and s.qualname(t.value) == "sys"}
    if not streams or not s.context(node).level:
        return set()

    def discards(value: ast.AST) -> bool:
        return isinstance(value, ast.Constant) and value.value is None or bool(_DISCARD.search(ast.unparse(value)))
    value = node.value
    if isinstance(value, ast.Name):  # a file opened above: every binding of the name in this function discards
        values = s.local_values(value.id, node)
        return streams if values and all(discards(v) for v in values) else set()
    return streams if discards(value) else set()


def _launches_program(s: Script, node: ast.AST) -> bool:
    """`subprocess.Popen([sys.executable] + argv, ...)` in a function that reads sys.argv or sys.executable: a
    launcher starting this program again, once per rank."""
    if not (isinstance(node, ast.Call) and s.qualname(node.func) == "subprocess.Popen"):
        return False
    scope = s.context(node).scope
    home = next((d for d in s.defs if id(d) == scope), s.tree)
    return any(isinstance(n, ast.Attribute) and s.qualname(n) in ("sys.executable", "sys.argv") for n in ast.walk(home))


def _launcher_discards(s: Script) -> set[str]:
    """The streams a launcher of the program (_launches_program) sends away from the console for some ranks: a
    `stdout=`/`stderr=` of DEVNULL or an open file, given under a rank check or naming the rank (a file per
    rank), directly or through a dict of keyword arguments it passes (`kwargs["stdout"] = subprocess.DEVNULL`).
    PIPE is not counted: the launcher reads the ranks' output and may print all of it."""
    found: set[str] = set()
    for call in s.calls:
        if not _launches_program(s, call):
            continue
        given = [(k.arg, k.value, call) for k in call.keywords if k.arg in ("stdout", "stderr")]
        spread = {k.value.id for k in call.keywords if k.arg is None and isinstance(k.value, ast.Name)}
        scope = s.context(call).scope
        for n in s.nodes:
            target = n.targets[0] if isinstance(n, ast.Assign) and len(n.targets) == 1 else None
            if spread and isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                    and target.value.id in spread and isinstance(target.slice, ast.Constant) \
                    and target.slice.value in ("stdout", "stderr") and s.context(n).scope == scope:
                given.append((target.slice.value, n.value, n))
        for stream, value, where in given:
            away = s.qualname(value).endswith("DEVNULL") \
                or isinstance(value, ast.Call) and terminal(value.func) == "open"
            if away and (s.context(where).level or any(s.kind(m) for m in ast.walk(value))):
                found.add(stream)
    return found


def _swaps_print(node: ast.AST) -> bool:
    """`builtins.print = ...` / `__builtin__.print = ...` / `setattr(builtins, "print", ...)`."""
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Attribute) and t.attr == "print" and terminal(t.value) in
                   ("builtins", "__builtin__", "__builtins__") for t in node.targets)
    return isinstance(node, ast.Call) and terminal(node.func) == "setattr" and len(node.args) >= 2 \
        and terminal(node.args[0]) in ("builtins", "__builtin__") \
        and isinstance(node.args[1], ast.Constant) and node.args[1].value == "print"
