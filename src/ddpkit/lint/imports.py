"""How the linted files import each other: the file an import names, and the programs the files form."""

from __future__ import annotations

import ast
import os

__all__ = ["Modules", "programs"]


class Modules:
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
            self._found[key] = next((p for name in names if name for p in [self._search(key[0], name)] if p), None) \
                or next((p for name in names if "." in name for p in [self._unique(name)] if p), None)
        return self._found[key]

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


def programs(trees: dict[str, ast.Module]) -> list[dict[str, ast.Module]]:
    """Split files into programs: each entry script (a file no other file imports) with what it imports.

    `ddpkit lint DIR` on a folder of unrelated scripts lints each on its own; a train.py that imports
    utils.py and model.py is one program with them. A helper two entry scripts share (datautils.py
    beside a single-GPU and a DDP script) belongs to both programs; files in an import cycle that
    nothing else imports form one.
    """
    modules = Modules(list(trees))
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
