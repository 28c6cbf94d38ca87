"""The script's own modules, read: which local files a script imports and how a name resolves to a definition."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

__all__ = ["python_files", "path_module", "parsed_module", "local_imports", "resolve", "definition", "imported_paths",
           "class_named"]

def parsed_module(modules: dict[str, str], path: str, cache: dict[str, ast.Module | None]) -> ast.Module | None:
    """The module at `path`, parsed once per port (None where it does not parse)."""
    if path not in cache:
        try:
            cache[path] = ast.parse(modules[path].removeprefix("\ufeff"))
        except SyntaxError:
            cache[path] = None
    return cache[path]


def _file_of(modules: dict[str, str], folder: str, dotted: str) -> str | None:
    """The file of module `dotted` in the project (`pkg.sub` -> folder/pkg/sub.py or folder/pkg/sub/__init__.py)."""
    relative = os.path.join(folder, *dotted.split("."))
    return next((c for c in (relative + ".py", os.path.join(relative, "__init__.py")) if c in modules), None)


_SKIPPED = {"__pycache__", "node_modules", "site-packages", "venv", "env", "build", "dist"}


def python_files(folder: str, depth: int) -> Iterator[str]:
    """Each `.py` file under `folder`, at most `depth` folder levels down, in a stable order; hidden folders, caches,
    environments and build output are skipped."""
    base = os.path.abspath(folder)
    for where, dirs, files in os.walk(base):
        level = os.path.relpath(where, base).count(os.sep) + (where != base)
        dirs[:] = [d for d in sorted(dirs) if not d.startswith(".") and d not in _SKIPPED] if level < depth else []
        yield from (os.path.join(where, name) for name in sorted(files) if name.endswith(".py"))


def path_module(folder: str, module: str, name: str, depth: int = 3) -> str | None:
    """The file `from module import name` reads where the script's folder does not hold it (no `module.py` there, or
    a package whose `__init__.py` lacks `name`): a project that puts its module folders on sys.path (a shell script
    exporting PYTHONPATH, `sys.path.insert`) imports `module.py` from one of its subfolders. The one such file under
    `folder` (`depth` levels down) that defines `name`; None where there is none or more than one (a guess)."""
    found: list[str] = []
    base = os.path.abspath(folder)
    for path in python_files(base, depth):
        if os.path.basename(path) != f"{module}.py":
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                defined = definition(ast.parse(f.read().removeprefix("\ufeff")), name)
        except (OSError, SyntaxError, ValueError):
            continue
        if defined is not None:
            found.append(os.path.join(folder, os.path.relpath(path, base)))
    return found[0] if len(found) == 1 else None


def local_imports(tree: ast.Module, modules: dict[str, str], folder: str,
                   parsed: dict[str, ast.Module | None]) -> dict[str, tuple[str, str | None]]:
    """Name used in the script -> (module file, the name defined there; None for a whole module)."""
    out: dict[str, tuple[str, str | None]] = {}

    def file_of(dotted: str) -> str | None:
        return _file_of(modules, folder, dotted)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found = file_of(a.name)
                if found:
                    out[a.asname or a.name] = (found, None)
        elif isinstance(node, ast.ImportFrom) and node.level <= 1 and node.module:
            star = file_of(node.module) if any(a.name == "*" for a in node.names) else None
            if star:  # `from generate import *`: every function and class the module defines
                module = parsed_module(modules, star, parsed)
                for d in module.body if module is not None else []:
                    if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        out.setdefault(d.name, (star, d.name))
                continue
            for a in node.names:
                sub = file_of(f"{node.module}.{a.name}")
                found = sub or file_of(node.module)
                if not sub and node.level == 0 and "." not in node.module and (
                        found is None or resolve(modules, folder, found, a.name, parsed) is None):
                    on_path = path_module(folder, node.module, a.name)  # `from solver import Solver`, found on sys.path
                    found = on_path if on_path in modules else found
                if found:
                    out[a.asname or a.name] = (found, None if sub else a.name)
    return out


def _import_file(modules: dict[str, str], folder: str, path: str, node: ast.ImportFrom) -> str | None:
    """The project file `from <module> import ...` in module `path` reads (relative to it, or from the project's
    folder or the module's own)."""
    if node.level:
        base = os.path.dirname(path)
        for _ in range(node.level - 1):
            base = os.path.dirname(base)
        return _file_of(modules, base, node.module) if node.module else None
    return _file_of(modules, folder, node.module) or _file_of(modules, os.path.dirname(path), node.module)


def resolve(modules: dict[str, str], folder: str, path: str, name: str, parsed: dict[str, ast.Module | None],
             depth: int = 0) -> tuple[str, ast.AST] | None:
    """(file, definition) of `name` as module `path` sees it: defined there, or imported there from another module
    of the project (`from pkg.training import Trainer` in a package's `__init__.py`, `from .io import save`)."""
    module = parsed_module(modules, path, parsed) if path in modules else None
    if module is None:
        return None
    defn = definition(module, name)
    if defn is not None:
        return path, defn
    for node in module.body if depth < 3 else []:
        if not isinstance(node, ast.ImportFrom) or not any((a.asname or a.name) == name for a in node.names):
            continue
        source = next(a.name for a in node.names if (a.asname or a.name) == name)
        found = _import_file(modules, folder, path, node)
        return resolve(modules, folder, found, source, parsed, depth + 1) if found else None
    for node in module.body if depth < 3 else []:  # `from .util import *` in a package's __init__.py
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            found = _import_file(modules, folder, path, node)
            hit = resolve(modules, folder, found, name, parsed, depth + 1) if found else None
            if hit is not None:
                return hit
    return None


def definition(tree: ast.Module, name: str) -> ast.AST | None:
    return next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                 and n.name == name), None)


def imported_paths(stmt: ast.Import | ast.ImportFrom, modules: dict[str, str], folder: str) -> list[str]:
    """The project files an import statement runs (`import a.b` runs a/__init__.py and a/b.py; `from x import *`
    runs x.py even where it defines nothing the script can name)."""
    names = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else [stmt.module] + [
        f"{stmt.module}.{a.name}" for a in stmt.names if a.name != "*"] if stmt.module and stmt.level <= 1 else []
    out: list[str] = []
    for name in names:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            found = _file_of(modules, folder, ".".join(parts[:i]))
            if found and found not in out:
                out.append(found)
    return out


def class_named(tree: ast.Module, name: str, folder: str | None, modules: dict[str, str],
                parsed: dict[str, ast.Module | None],
                imported: dict[str, tuple[str, str | None]]) -> tuple[str, ast.Module, ast.ClassDef] | None:
    """(file, its module, the class) that a dotted name of the script names: a class of the script itself (file "")
    or of its project (`LSTMModel` of `from model import LSTMModel`, `M.LSTMModel` of `import model as M`);
    `imported` is local_imports of the script. None for anything else (a library's class, a function)."""
    head, _, attr = name.partition(".")
    where, module, cls = "", tree, definition(tree, name) if not attr else None
    if head in imported and (attr or imported[head][1]):
        path, defined = imported[head]
        hit = resolve(modules, folder, path, attr or defined, parsed) if not (attr and defined) else None
        if hit is not None:
            where, cls = hit
            module = parsed_module(modules, where, parsed)
    return (where, module, cls) if isinstance(cls, ast.ClassDef) and module is not None else None
