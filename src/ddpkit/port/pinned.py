"""GPUs the script's own modules pick by index (`device = "cuda:0"`): the same GPU on every rank.

ddpkit.init makes each rank's GPU current and ddpkit.wrap puts the model there; a tensor the project's code puts on
a GPU it named by index (`.to(config.device)` where config.py says `torch.device("cuda:0")`, a collate function's
`.to(device)` where utils.py says `device = 'cuda:0'`, a `prepare_device()` that returns cuda:0) is on GPU 0 on
every rank: rank 1 then mixes cuda:0 and cuda:1 (a device-mismatch error) or every rank works on GPU 0. A plain
`"cuda"` is the current device, the rank's own, and is not named. The port reads these modules, never rewrites them.
"""

from __future__ import annotations

import ast
import os

from ddpkit.port.sizes import fixed_device
from ddpkit.port.weights import ast_dotted

__all__ = ["pinned_gpus"]

_QUIET = {"print", "format", "info", "debug", "warning", "log", "write", "add_text"}
"""Calls that only show a device: reading it there moves nothing."""

Bound = dict[str, tuple[str, str | None]]
"""Name in a module -> (project file, the name defined there: a fixed GPU's, or "\\0" and a function's or class's;
None for the whole module)."""


def pinned_gpus(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the script, message) for each GPU a module of the script's project binds by index at its top level
    and its code puts tensors on (named at the script's import of that module, else at its first project import),
    and for each call of the script to a project function that hands one back (`device, ids = prepare_device(n)`)."""
    parsed = {path: module for path, text in modules.items() if (module := _parse(text)) is not None}
    fixed = {path: names for path, module in parsed.items() if (names := _fixed_names(module))}
    script = _imports(tree, folder, folder, parsed, fixed)
    per_import = {node.lineno: {f for f, _ in _imports(ast.Module([node], []), folder, folder, parsed, fixed).values()}
                  for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))}
    out: list[tuple[int, str]] = []
    for path, names in sorted(fixed.items()):
        at = min((line for line, files in per_import.items() if path in files),
                 default=min((line for line, files in per_import.items() if files), default=None))
        for name, stmt in names.items():  # each GPU name with the lines that use it
            one = {name: stmt}
            uses = sorted({(os.path.basename(other), line) for other, module in parsed.items()
                           for line in _uses(module, _imports(module, os.path.dirname(other), folder, parsed, fixed)
                                             | ({name: (path, name)} if other == path else {}), path, one)})
            if uses and at is not None:
                out.append((at, _message(path, stmt.lineno, modules[path].splitlines()[stmt.lineno - 1], uses)))
    return out + _handed_back(tree, script, parsed)


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text.removeprefix("\ufeff"))
    except SyntaxError:
        return None


def _fixed_names(module: ast.Module) -> dict[str, ast.Assign]:
    """Top-level names bound to a GPU picked by index (`device = torch.device("cuda:0" if ... else "cpu")`, also
    through an earlier such name) -> the assignment."""
    out: dict[str, ast.Assign] = {}
    for stmt in module.body:
        if isinstance(stmt, ast.Assign) and fixed_device(stmt.value, set(out)) and "rank" not in ast.unparse(
                stmt.value).lower():  # `f"cuda:{local_rank}"` is each rank's own
            out.update({t.id: stmt for t in stmt.targets if isinstance(t, ast.Name)})
    return out


def _file(base: str, dotted: str, parsed: dict[str, ast.Module]) -> str | None:
    relative = os.path.join(base, *dotted.split("."))
    return next((c for c in (relative + ".py", os.path.join(relative, "__init__.py")) if c in parsed), None)


def _imports(module: ast.Module, here: str, folder: str, parsed: dict[str, ast.Module],
             fixed: dict[str, dict[str, ast.Assign]]) -> Bound:
    """What a module's imports bind that reaches a fixed GPU: `import config` -> (config.py, None),
    `from utils import device` (or `*`) -> (utils.py, 'device')."""
    out: Bound = {}
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            for a in node.names:
                found = _file(folder, a.name, parsed) or _file(here, a.name, parsed)
                if found:
                    out[a.asname or a.name] = (found, None)
        elif isinstance(node, ast.ImportFrom):
            base = here if node.level else folder
            for _ in range(max(node.level - 1, 0)):
                base = os.path.dirname(base)
            source = _file(base, node.module, parsed) if node.module else None
            if source is None and node.module and not node.level:
                source = _file(here, node.module, parsed)
            for a in node.names:
                whole = _file(base, f"{node.module}.{a.name}" if node.module else a.name, parsed)
                if whole:
                    out[a.asname or a.name] = (whole, None)
                elif source and a.name == "*":
                    out.update({n: (source, n) for n in fixed.get(source, {})})
                elif source and a.name in fixed.get(source, {}):
                    out[a.asname or a.name] = (source, a.name)
                elif source:
                    out.setdefault(a.asname or a.name, (source, "\0" + a.name))  # a function or class
    return out


def _uses(module: ast.Module, bound: Bound, path: str, names: dict[str, ast.Assign]) -> list[int]:
    """Lines inside the module's functions that hand `path`'s fixed GPU to a call or bind it (`.to(device)`,
    `self.device = config.device`), where no parameter or local of that function shadows the name."""
    out: list[int] = []
    for defn in (n for n in ast.walk(module) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        local = {a.arg for a in (*defn.args.posonlyargs, *defn.args.args, *defn.args.kwonlyargs)} | {
            n.id for n in ast.walk(defn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for node in ast.walk(defn):
            values = [*node.args, *(k.value for k in node.keywords)] if isinstance(node, ast.Call) and _moves(node) \
                else [node.value] if isinstance(node, ast.Assign) else []
            if any(_reads_fixed(v, bound, path, local, names) for v in values):
                out.append(node.lineno)
    return out


def _moves(call: ast.Call) -> bool:
    name = call.func.attr if isinstance(call.func, ast.Attribute) else ast_dotted(call.func)
    return name not in _QUIET


def _reads_fixed(value: ast.AST, bound: Bound, path: str, local: set[str], names: dict[str, ast.Assign]) -> bool:
    for node in ast.walk(value):
        if isinstance(node, ast.Name) and node.id not in local and bound.get(node.id, ("", ""))[0] == path and \
                bound[node.id][1] in names:
            return True
        if isinstance(node, ast.Attribute) and node.attr in names and bound.get(ast_dotted(node.value)) == (
                path, None) and ast_dotted(node.value).split(".")[0] not in local:
            return True
    return False


def _message(path: str, line: int, source: str, uses: list[tuple[str, int]]) -> str:
    where = os.path.basename(path)
    text = " ".join(source.split("#")[0].split())
    text = text if len(text) <= 80 else text[:77] + "..."
    return (f"not checked: {where}:{line} `{text}` picks GPU 0 on every rank, and the project's code (read, "
            "not ported) puts tensors there; under DDP each rank's model is on its own GPU (ctx.device), so rank 1 "
            f"mixes devices or every rank works on GPU 0. In {where} write `\"cuda\"` instead (the current device, "
            "which ddpkit.init makes the rank's), or hand ctx.device in:"
            + "".join(f"\n- {file}:{line}" for file, line in uses))


def _handed_back(tree: ast.Module, script: Bound, parsed: dict[str, ast.Module]) -> list[tuple[int, str]]:
    """Calls of the script to a project function whose `return` hands back a GPU it picked by index."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and
                isinstance(node.value.func, ast.Name) and node.value.func.id in script):
            continue
        name = node.value.func.id
        path, defined = script[name]
        found = _definition(path, defined.lstrip("\0"), parsed) if defined else None
        line = _returned_gpu(found[1]) if found is not None else None
        if line is not None:
            out.append((node.lineno, f"not checked: `{name}` returns a GPU it picks by index "
                                     f"({os.path.basename(found[0])}:{line}), GPU 0 on every rank; under DDP each rank "
                                     "has its own: use ctx.device for the device it returns (`device = ctx.device` "
                                     "after this line)"))
    return out


def _definition(path: str, name: str, parsed: dict[str, ast.Module], depth: int = 2
                ) -> tuple[str, ast.FunctionDef] | None:
    """The function `name` of module `path`, also where that module re-exports it (`from .util import *` in a
    package's `__init__.py`)."""
    module = parsed[path]
    found = next((d for d in module.body if isinstance(d, ast.FunctionDef) and d.name == name), None)
    if found is not None or depth == 0:
        return (path, found) if found is not None else None
    for node in module.body:
        if isinstance(node, ast.ImportFrom) and node.level and node.module and any(
                a.name in ("*", name) and (a.asname or a.name) in ("*", name) for a in node.names):
            base = os.path.dirname(path)
            for _ in range(node.level - 1):
                base = os.path.dirname(base)
            source = _file(base, node.module, parsed)
            if source is not None and (again := _definition(source, name, parsed, depth - 1)) is not None:
                return again
    return None


def _returned_gpu(defn: ast.FunctionDef) -> int | None:
    """The line that binds the GPU a function returns by index (`device = torch.device('cuda:0' if ...)`)."""
    chosen: dict[str, int] = {}
    for stmt in (n for n in ast.walk(defn) if isinstance(n, ast.Assign)):
        if fixed_device(stmt.value, set(chosen)):
            chosen.update({t.id: stmt.lineno for t in stmt.targets if isinstance(t, ast.Name)})
    for ret in (n for n in ast.walk(defn) if isinstance(n, ast.Return) and n.value is not None):
        for node in ast.walk(ret.value):
            if isinstance(node, ast.Name) and node.id in chosen:
                return chosen[node.id]
            if isinstance(node, ast.Constant) and fixed_device(node, set()):
                return ret.lineno
    return None
