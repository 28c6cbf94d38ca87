"""How the linted files import each other: the file an import names, and the programs the files form."""

from __future__ import annotations

import ast
import os
import re

__all__ = ["Modules", "programs", "runtime_imports", "imported_at_run_time"]


class Modules:
    """Finds the project file an import names, as Python would from the importing file's folder.

    `import utils` in a/b/train.py is a/b/utils.py (or a/b/utils/__init__.py), else a/utils.py and
    so on up; `from util.misc import f` is util/misc.py found the same way. Two scripts in different
    folders that each import their own `utils` stay apart.
    """

    def __init__(self, paths: list[str], trees: dict[str, ast.Module] | None = None) -> None:
        self.files = {os.path.normpath(p): p for p in paths}
        self._found: dict[tuple[str, str, bool], str | None] = {}
        self._defined = {os.path.normpath(p): _top_level_names(tree) for p, tree in (trees or {}).items()}
        """{file: the names its module code defines}, for a package whose `__init__.py` is not linted."""
        self._absolute = {pair for tree in (trees or {}).values() for pair in _absolute_imports(tree)}
        """(module, name) of every absolute import of the files (see own_packages)."""
        self._own: set[str] | None = None
        self._put_on_path = {os.path.normpath(p): _path_folders(p, tree) for p, tree in (trees or {}).items()}
        """{file: the folders it puts on sys.path itself, `sys.path.append("../utils")`}."""

    def locate(self, importer: str, dotted: str, parent: bool = False) -> str | None:
        """The file for module `dotted` seen from `importer`; parent=True also tries `dotted` minus its last part."""
        key = (os.path.dirname(os.path.normpath(importer)), dotted, parent)
        if key not in self._found:
            names = [dotted, dotted.rsplit(".", 1)[0]] if parent and "." in dotted else [dotted]
            self._found[key] = next((p for name in names if name for p in [self._search(key[0], name)] if p), None) \
                or next((p for name in names if "." in name for p in [self._unique(name)] if p), None) \
                or (self._package_member(key[0], dotted) if "." in dotted else None) \
                or next((p for name in names if "." in name for p in [self._own_package(name)] if p), None) \
                or self._on_added_path(importer, dotted)
        return self._found[key]

    def _on_added_path(self, importer: str, dotted: str) -> str | None:
        """`sys.path.append("../utils")` then `from utils_trainer import Trainer`: the module in the folder the
        importer put on sys.path (a relative folder read from the importer's own folder, where its launcher runs it)."""
        relative = os.path.join(*dotted.split("."))
        for folder in self._put_on_path.get(os.path.normpath(importer), ()):
            for candidate in (relative + ".py", os.path.join(relative, "__init__.py")):
                path = self.files.get(os.path.normpath(os.path.join(folder, candidate)))
                if path is not None:
                    return path
        return None

    def _own_package(self, dotted: str) -> str | None:
        """`import mae_st.util.misc` in a checkout of mae_st whose folder has another name (a renamed clone, an
        unpacked archive, a cache): the project installed as a package under its own name. The file at the rest of
        the name from the project's top folder, where `mae_st` is one of its own packages (see own_packages)."""
        package, rest = dotted.split(".", 1)
        return self._at_top(rest) if package in self.own_packages() else None

    def own_packages(self) -> set[str]:
        """Names the project imports itself under: a name that is no module or folder of the project, whose imports
        reach modules at the project's top under at least two different first parts (`mae_st.util.misc`,
        `mae_st.engine_pretrain` beside util/misc.py and engine_pretrain.py), more first parts than it names and the
        project does not hold, and every name it takes from such a module defined there (`from mae_st.util.misc
        import NativeScaler`). A library whose names only partly match the project's files (`from timm.models import
        create_model` beside a models.py that defines no create_model, `timm.data` with no data/) is not the project."""
        if self._own is None:
            folders = {os.path.basename(d) for f in self.files for d in _folders(f)} | {
                os.path.basename(f).removesuffix(".py") for f in self.files}
            verdicts: dict[str, dict[str, set[str]]] = {}
            for module, name in self._absolute:
                package, _, rest = module.partition(".")
                rest, name = (rest, name) if rest else (name, "")
                if rest and rest != "*":
                    kind = self._matches_top(rest, name)
                    verdicts.setdefault(package, {}).setdefault(kind, set()).add(rest.split(".", 1)[0])
            self._own = {p for p, v in verdicts.items() if p not in folders and not v.get("miss")
                         and len(v.get("hit", ())) >= 2 and len(v["hit"]) > len(v.get("unknown", set()) - v["hit"])}
        return self._own

    def _matches_top(self, rest: str, name: str) -> str:
        """'hit' where module `rest` is a file at the project's top (and defines `name`, or has it as a submodule),
        'miss' where it is but `name` is not there, 'unknown' where no linted file is that module."""
        found = self._at_top(rest)
        if found is None:
            return "unknown"
        if not name or name == "*" or name in self._defined.get(os.path.normpath(found), ()) \
                or self._at_top(f"{rest}.{name}"):
            return "hit"
        return "miss"

    def _at_top(self, dotted: str) -> str | None:
        """The project file of module `dotted` from the project's top folder (no folder above it is searched)."""
        relative = os.path.join(self._top(), *dotted.split("."))
        return next((self.files[c] for c in (relative + ".py", os.path.join(relative, "__init__.py"))
                     if c in self.files), None)

    def _top(self) -> str:
        """The folder that holds every project file."""
        return os.path.commonpath([os.path.dirname(f) or "." for f in self.files]) if self.files else ""

    def _package_member(self, folder: str, dotted: str) -> str | None:
        """`from datasets import build_loader` where the folder `datasets/` holds linted modules but its
        `__init__.py` (which re-exports the name) is not linted: the one module of that folder whose module code
        defines `build_loader`, found from `folder` upwards as `_search` finds modules; None if none or several."""
        package, name = dotted.rsplit(".", 1)
        relative = os.path.join(*package.split("."))
        while True:
            inside = os.path.normpath(os.path.join(folder, relative))
            if any(n.startswith(inside + os.sep) for n in self.files):
                return self._defining(inside, name)
            up = os.path.dirname(folder)
            if up == folder or not folder:
                break
            folder = up
        # a folder put on sys.path at run time (`lib/` by `_init_paths`): the one package folder of that name
        inside = {d for n in self.files for d in _folders(n) if d.endswith(os.sep + relative) or d == relative}
        return self._defining(next(iter(inside)), name) if len(inside) == 1 else None

    def _defining(self, inside: str, name: str) -> str | None:
        """The one linted module in package folder `inside`, or in its subpackages (an `__init__.py` that re-exports
        from `.datasets`, which re-exports from `.dataloader`), whose module code defines `name`; None if none or
        several, or if an `__init__.py` on the way is linted (it says what the package holds)."""
        members = [n for n in self.files if n.startswith(inside + os.sep) and n.endswith(".py")]
        if any(os.path.basename(n) == "__init__.py" and os.path.dirname(n) == inside for n in members):
            return None
        found = [self.files[n] for n in members if name in self._defined.get(n, ())]
        return found[0] if len(found) == 1 else None

    def matching(self, importer: str, pattern: re.Pattern[str]) -> list[str]:
        """Project files whose dotted module name matches `pattern`, seen from `importer`'s folder and each folder
        above it (as `locate` searches), the nearest folder with a match winning."""
        folder = os.path.dirname(os.path.normpath(importer))
        while True:
            found = []
            for normal, p in self.files.items():
                relative = os.path.relpath(normal, folder) if folder else normal
                if relative.startswith(os.pardir) or not relative.endswith(".py"):
                    continue
                dotted = relative[:-3].replace(os.sep, ".").removesuffix(".__init__")
                if pattern.match(dotted):
                    found.append(p)
            up = os.path.dirname(folder)
            if found or up == folder or not folder:
                return found
            folder = up

    def _unique(self, dotted: str) -> str | None:
        """`from core.function import train` in tools/train.py, whose folder `lib/` is put on sys.path at run time
        (`_init_paths`): the one file of the project at that dotted path in some folder (none if several)."""
        relative = os.path.join(*dotted.split("."))
        tails = (os.sep + relative + ".py", os.sep + os.path.join(relative, "__init__.py"))
        found = [p for normal, p in self.files.items() if normal.endswith(tails)]
        return found[0] if len(found) == 1 else None

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


def _path_folders(path: str, tree: ast.Module) -> list[str]:
    """The folders module code of `path` adds to sys.path by a literal, `sys.path.append("../utils")` or
    `sys.path.insert(0, "src")`, a relative one taken from the file's own folder."""
    out = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                and call.func.attr in ("append", "insert") and ast.unparse(call.func.value) == "sys.path" \
                and call.args and isinstance(call.args[-1], ast.Constant) and isinstance(call.args[-1].value, str):
            out.append(os.path.normpath(os.path.join(os.path.dirname(os.path.normpath(path)), call.args[-1].value)))
    return out


def _absolute_imports(tree: ast.Module) -> set[tuple[str, str]]:
    """(module, name) of each absolute import: `import a.b` -> (a.b, ""), `from a.b import c` -> (a.b, c); relative
    imports are the file's own folder's and left out."""
    pairs: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            pairs.update((a.name, "") for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            pairs.update((node.module, a.name) for a in node.names)
    return pairs


def _folders(path: str) -> list[str]:
    """The folders a file sits in, innermost first (`lib/data/loaders/build.py` -> lib/data/loaders, lib/data, lib)."""
    out = []
    while (path := os.path.dirname(path)) and path != os.sep:
        out.append(path)
    return out


def programs(trees: dict[str, ast.Module]) -> list[dict[str, ast.Module]]:
    """Split files into programs: each entry script (a file no other file imports) with what it imports.

    `ddpkit lint DIR` on a folder of unrelated scripts lints each on its own; a train.py that imports
    utils.py and model.py is one program with them. A helper two entry scripts share (datautils.py
    beside a single-GPU and a DDP script) belongs to both programs; files in an import cycle that
    nothing else imports form one.
    """
    modules = Modules(list(trees), trees)
    imports, imported = {}, set()
    for path, tree in trees.items():
        nodes = list(ast.walk(tree))
        static = {t for name in _imported_names(nodes) | _module_members(nodes) for t in [modules.locate(path, name)]
                  if t and t != path}
        later = runtime_imports(modules, path, nodes)
        imports[path] = static | set(later)
        imported |= static | imported_at_run_time(later, trees)
    out: list[dict[str, ast.Module]] = []
    seen: set[str] = set()
    entries = [p for p in trees if p not in imported]
    for i, root in enumerate(entries + [p for p in trees if p not in entries]):
        if root in seen and i >= len(entries):  # (an entry a run-time import may reach is its own program too)
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


def _top_level_names(tree: ast.Module) -> set[str]:
    """Functions, classes and variables a module's own code defines (`def build_loader`, `class Net`, `X = ...`)."""
    names: set[str] = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return names


def _module_members(nodes: list[ast.AST]) -> set[str]:
    """The dotted names of what a file reads off a module it imports (`import lib.utils as utils` then
    `utils.dist_sum(...)` -> lib.utils.dist_sum): a package whose `__init__.py` is not linted reaches the module
    of it that defines the name (see Modules._package_member)."""
    bound = {a.asname or a.name: a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
    members: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and _dotted(n.value) in bound:
            members.add(f"{bound[_dotted(n.value)]}.{n.attr}")
    return members


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def _imported_names(nodes: list[ast.AST]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
            names.update(members_read(nodes, node))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if base:
                names.add(base)
            names.update(f"{base}.{a.name}" if base else a.name for a in node.names)
    return names


def members_read(nodes: list[ast.AST], node: ast.Import) -> set[str]:
    """`kit.tools.WarmupCosine` for each name the file reads off a package it imports (`import kit.tools as tools`
    then `tools.WarmupCosine(...)`): where the package's `__init__.py` is not linted, the module that defines the
    name is found by it (see Modules._package_member)."""
    bound = {a.asname or a.name: a.name for a in node.names}
    return {f"{bound[held]}.{n.attr}" for n in nodes if isinstance(n, ast.Attribute)
            and isinstance(n.value, (ast.Name, ast.Attribute)) and (held := ast.unparse(n.value)) in bound}


def runtime_imports(modules: Modules, path: str, nodes: list[ast.AST]) -> dict[str, ast.Call]:
    """Project files `path` imports at run time: {file: the call}; `nodes` are the file's (`list(ast.walk(tree))`).

    `importlib.import_module(name)` or `__import__(name)` where the name is a constant (`"lib.train.train_script"`)
    or is built at run time around a constant package part (`f"app.{app}.train"`, `"models." + name`,
    `"lib.train.%s" % name`, `"lib.train.{}".format(name)`, or a variable assigned one of these): every module of
    the project the pattern can name is a candidate. A name with no constant package part
    (`import_module(args.module)`) names none."""
    found: dict[str, ast.Call] = {}
    calls = [n for n in nodes if isinstance(n, ast.Call) and n.args and _import_call(n)]
    assigned: dict[str, list[ast.AST]] = {}
    for node in nodes if any(isinstance(c.args[0], ast.Name) for c in calls) else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            assigned.setdefault(node.targets[0].id, []).append(node.value)
    for node in calls:
        values = [node.args[0]]
        if isinstance(node.args[0], ast.Name):
            values = assigned.get(node.args[0].id, [])[:4]
        for value in values:
            parts = _pattern(value)
            if parts is None or not parts or not isinstance(parts[0], str):
                continue
            package = next((p for p in node.args[1:2] if isinstance(p, ast.Constant) and isinstance(p.value, str)),
                           next((k.value for k in node.keywords if k.arg == "package"
                                 and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)), None))
            if parts[0].startswith(".") and isinstance(package, ast.Constant):
                parts = [package.value + parts[0], *parts[1:]]
            if all(isinstance(p, str) for p in parts):  # a constant name: the one file Python would import
                target = modules.locate(path, "".join(parts))
                if target and target != path:
                    found.setdefault(target, node)
                continue
            if "." not in parts[0] or parts[0].startswith("."):
                continue  # no constant package part to look under
            pattern = re.compile("".join(re.escape(p) if isinstance(p, str) else r"[\w.]+" for p in parts) + "$")
            for target in modules.matching(path, pattern):
                if target != path:
                    found.setdefault(target, node)
    return found


def imported_at_run_time(found: dict[str, ast.Call], trees: dict[str, ast.Module]) -> set[str]:
    """The files of runtime_imports that stop being entry scripts: all that a constant name imports, and those a
    pattern may pick that have no `if __name__ == "__main__":` block (one that has is also run as a script)."""
    return {t for t, call in found.items() if isinstance(call.args[0], ast.Constant) or not any(
        isinstance(stmt, ast.If) and any(isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(stmt.test))
        for stmt in trees[t].body)}


def _import_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in ("__import__", "import_module")
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _pattern(node: ast.AST) -> list | None:
    """A module name as constant strings and None for each part known only at run time; None where not a string."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return [v.value if isinstance(v, ast.Constant) else None for v in node.values]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _pattern(node.left), _pattern(node.right)
        if left is None and right is None:
            return None
        return (left or [None]) + (right or [None])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and isinstance(node.left, ast.Constant) \
            and isinstance(node.left.value, str):
        return _split(node.left.value, r"%[-#0 +]*\d*(?:\.\d+)?[sdr]")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
            and isinstance(node.func.value, ast.Constant) and isinstance(node.func.value.value, str):
        return _split(node.func.value.value, r"\{[^{}]*\}")
    return [None] if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript, ast.Call)) else None


def _split(text: str, hole: str) -> list:
    out: list = []
    for i, piece in enumerate(re.split(hole, text)):
        if i:
            out.append(None)
        if piece:
            out.append(piece)
    return out
