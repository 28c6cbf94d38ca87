"""The claim gate: what the port did not check in its own output becomes a TODO before it says "ported fully".

Two checks run on the ported text, after the rewrite:

- `ddpkit lint` on the output (with the script's own modules beside it): each finding of a rule that means wrong
  training, wrong figures or a hang becomes `# TODO(ddpkit port): lint DDPxxx: ...` above the reported line.
- The script's own modules (see ddpkit.port.project): code the training path hands the model, a loader, its
  batches or the parsed settings to is read, never rewritten; what breaks there under DDP becomes a `not checked:`
  TODO at the line that hands the object over.
- Four checks of the output itself: a call that may run a function the port gave a required `ctx` but passes none
  (a TypeError at any world size), an `nn.DataParallel(...)` the rewrite left in (a crash on rank 1), and a loss
  that pairs the samples of a batch (in-batch negatives) in a loop over a ported loader (a changed objective), and
  a BatchNorm head of a model trained without labels, wrapped without synchronised statistics (see
  ddpkit.port.batchstats), and a wrapped model whose forward makes CPU tensors while the port puts it on the GPU (see
  ddpkit.port.hosttensors).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from collections.abc import Callable
from typing import Any

from ddpkit.port.batchstats import unsynced_heads
from ddpkit.port.hosttensors import host_tensors
from ddpkit.port.localcode import definition, local_imports, parsed_module, path_module, python_files
from ddpkit.port.orders import script_orders
from ddpkit.port.pinned import pinned_gpus
from ddpkit.port.project import (import_device_work, module_parameters, parallel_asserts, plain_class_wraps,
                                 project_bypasses, project_cpu_work, project_disk_writes, project_downloads,
                                 project_groups, project_hazards, project_loaders, project_orders, project_prompts,
                                 project_stops, project_trackers, project_writers, step_loops, unused_parameter_wraps)
from ddpkit.port.wrapped import without_wraps

__all__ = ["GATE_RULES", "gate", "project_names_a_device", "project_config_names", "project_cpu_calls", "project_reports", "project_fetches",
           "project_loader_calls", "parameter_groups"]

GATE_RULES = {
    "DDP001": "error", "DDP002": "error", "DDP003": "error", "DDP004": "error", "DDP006": "warning",
    "DDP010": "error", "DDP011": "error", "DDP012": "error", "DDP015": "error",
}
"""Lint rules whose finding means wrong training, wrong figures or a hang, with the least severity that does.

Left out: output on every rank (DDP008), torch.load's map_location (DDP005), destroy (DDP009), the launcher (DDP007),
BatchNorm (DDP013, a note), and seeds (DDP014: the port keeps a script's own same-seed call on purpose, with a note,
where random splits and model init must agree between ranks; same dropout on every rank is not wrong training).
"""

Lint = Callable[[dict[str, str]], list[Any]]
"""{path: text} -> findings (with path, line, rule, severity, message), as ddpkit.lint.linter.lint_sources."""

_LINE = re.compile(r"\bline (\d+)\b")
_SEVERITY = {"error": 0, "warning": 1, "note": 2}


def _imported_files(tree: ast.Module, folder: str) -> dict[str, str]:
    """{path: text} of the .py files of the script's own project that it imports directly (beside it, or a package
    beside it), as Python resolves them from the script's folder."""
    names: set[str] = set()
    on_path: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level <= 1:
            base = node.module or ""
            if base:
                names.add(base)
            names.update(f"{base}.{a.name}" if base else a.name for a in node.names)
            if node.level == 0 and base and "." not in base and not os.path.isfile(os.path.join(folder, base + ".py")) \
                    and not _installed(base, folder):
                # neither beside the script nor installed: a package lacking the name, or a folder on sys.path
                init = os.path.join(folder, base, "__init__.py")
                on_path.update(found for a in node.names if a.name != "*" and not os.path.isfile(
                    os.path.join(folder, base, a.name + ".py")) and not _names_in(init, a.name)
                    and (found := path_module(folder, base, a.name)))
    out: dict[str, str] = {}
    candidates = [c for name in sorted(names) for relative in [os.path.join(folder, *name.split("."))]
                  for c in (relative + ".py", os.path.join(relative, "__init__.py"))]
    for candidate in candidates + sorted(on_path):
        if os.path.isfile(candidate) and candidate not in out:
            try:
                with open(candidate, encoding="utf-8", errors="replace") as f:
                    out[candidate] = f.read()
            except OSError:
                pass
    return out


def _installed(module: str, folder: str) -> bool:
    """A top-level module importable from outside the project at `folder` (torch, numpy): never one of its own."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return False
    origin = spec.origin if spec is not None else None
    return origin is not None and not os.path.abspath(origin).startswith(os.path.abspath(folder) + os.sep)


def _names_in(path: str, name: str) -> bool:
    """The file at `path` mentions `name` as a word (defines or imports it); False where it does not exist."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return re.search(rf"\b{re.escape(name)}\b", f.read()) is not None
    except OSError:
        return False


def _import_root(tree: ast.Module, folder: str) -> str:
    """The folder the script's own imports resolve from: its own, or for a script kept in a subfolder and run from
    the project's root (`scripts/train.py` doing `from models import unet`), the nearest of its two parent folders
    that holds a module or package the script imports by its top-level name, where its own folder holds none."""
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | {
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module}

    def holds(where: str) -> bool:
        # the whole dotted name: `from DiT.DiT import DiT` in DiT/train.py names DiT/DiT.py from the folder above,
        # not from DiT/ (which holds a DiT.py but no DiT/DiT.py)
        return any(os.path.isfile(os.path.join(where, *t.split(".")) + ".py") or os.path.isfile(
            os.path.join(where, *t.split("."), "__init__.py")) for t in names)

    if holds(folder):
        return folder
    where = folder
    for _ in range(2):
        where = os.path.dirname(os.path.abspath(where))
        if holds(where):
            return where
    where = folder
    for _ in range(3):  # the src layout: the project's package under <root>/src, installed editable (`pip install -e .`)
        if holds(os.path.join(where, "src")):
            return os.path.join(where, "src")
        where = os.path.dirname(os.path.abspath(where))
    return folder


def project_names_a_device(source: str, folder: str) -> bool:
    """A module of the script's own project that it reaches (imported beside it, and the modules those import, as
    a model factory's `from .seg_model import SegModel` inside `get_model`) names a device: `.cuda()`, `device`,
    "cuda" (a file that does not parse counts as naming one)."""
    try:
        tree = ast.parse(source.removeprefix("\ufeff"))
    except SyntaxError:
        return True
    folder = _import_root(tree, folder)
    return any(re.search(r"\bcuda\b|device", text) for text in _reached_files(_imported_files(tree, folder),
                                                                                 folder).values())


def _sets_device(module: ast.Module, whole: bool) -> bool:
    """A project module sets a device: `device = ...` at its top level (`whole`: the script imports the module
    itself), or anywhere an assignment to a name or attribute `device` (`cfg.device = ...`, a class body's `device =
    ...`, `self.device = ...`) or a `"device"` key of a dict literal (the script imports an object of it)."""
    stores = module.body if whole else list(ast.walk(module))
    for node in stores:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, (ast.AnnAssign, ast.AugAssign)) else []
        if any(isinstance(t, ast.Name) and t.id == "device" or not whole and isinstance(t, ast.Attribute)
               and t.attr == "device" for t in targets):
            return True
        if not whole and isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "device" for k in node.keys):
            return True
    return False


def project_config_names(source: str, folder: str) -> frozenset[str]:
    """Names the script binds to a settings module of its own project, or to an object one defines, that sets a
    device (`import settings as S` with `device = ...` in settings.py, `from config import cfg` with `cfg.device =
    ...`): `S.device` is the script's device setting, as `args.device` is. Empty where the script does not parse."""
    try:
        tree = ast.parse(source.removeprefix("\ufeff"))
    except SyntaxError:
        return frozenset()
    folder = _import_root(tree, folder)
    modules = _imported_files(tree, folder)
    parsed: dict[str, ast.Module | None] = {}
    out = set()
    for name, (path, defined) in local_imports(tree, modules, folder, parsed).items():
        module = parsed_module(modules, path, parsed)
        if module is not None and (defined is None or not isinstance(definition(module, defined), (
                ast.FunctionDef, ast.AsyncFunctionDef))) and _sets_device(module, defined is None):
            out.add(name)
    return frozenset(out)


def project_cpu_calls(source: str, folder: str) -> list[tuple[int, str]]:
    """The script's calls that hand a DataLoader to its own project's code -> what that code does that needs CPU
    tensors (see ddpkit.port.project.project_cpu_work)."""
    return list(_project_calls(source, folder, project_cpu_work))


def project_reports(source: str, folder: str) -> dict[str, tuple[str, int, str] | None]:
    """The script's calls of its own project's code (see ddpkit.port.project.project_writers): `report` or
    `Plotter.flush` -> (file, line, the write) where it only writes files, else None; empty where the script does not
    parse."""
    return _project_calls(source, folder, project_writers)


def project_fetches(source: str, folder: str) -> dict[str, tuple[str, int, bool]]:
    """The script's calls of its own project's code that download (see ddpkit.port.project.project_downloads):
    `getMnistLoader` -> (file, line of the download, whether that code also trains or joins a collective)."""
    return _project_calls(source, folder, project_downloads)


def project_loader_calls(source: str, folder: str) -> dict[str, str]:
    """The script's calls of its own project's code that return a torch DataLoader (see
    ddpkit.port.project.project_loaders): `loader` -> the file defining it."""
    return _project_calls(source, folder, project_loaders)


def parameter_groups(source: str, folder: str | None) -> dict[str, list[tuple[int, str]]]:
    """The script's calls of its own functions, or its project's, that build an optimizer's parameters from a module
    handed in (see ddpkit.port.project.project_groups): `add_weight_decay` -> (position, name) of that module."""
    try:
        tree = ast.parse(source.removeprefix("\ufeff"))
    except SyntaxError:
        return {}
    own = {n.name: module_parameters(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return {**(_project_calls(source, folder, project_groups) if folder is not None else {}),
            **{name: handed for name, handed in own.items() if handed}}


def _project_calls(source: str, folder: str, finder) -> dict:
    """`finder(tree, folder, files)` over the project modules the script reaches; empty where it does not parse or
    imports none."""
    try:
        tree = ast.parse(source.removeprefix("\ufeff"))
    except SyntaxError:
        return {}
    folder = _import_root(tree, folder)  # the gate's root: `src/train.py` doing `from src.dataset import ...`
    modules = _imported_files(tree, folder)
    return finder(tree, folder, _reached_files(modules, folder)) if modules else {}


def _reached_files(modules: dict[str, str], folder: str, depth: int = 2) -> dict[str, str]:
    """`modules` and the project files they import in turn (`from pkg.training import Trainer` in a package's
    `__init__.py`, `from .io import save`), `depth` levels on: a model handed to the project's code is followed there."""
    out = dict(modules)
    for _ in range(depth):
        for path, text in list(out.items()):
            try:
                tree = ast.parse(text.removeprefix("\ufeff"))
            except SyntaxError:
                continue
            names: list[tuple[str, str]] = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names += [(folder, a.name) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names += [(folder, node.module), (os.path.dirname(path), node.module)]
                    names += [(folder, f"{node.module}.{a.name}") for a in node.names]  # `from pkg import sets`
                elif isinstance(node, ast.ImportFrom):
                    base = os.path.dirname(path)
                    for _ in range(node.level - 1):
                        base = os.path.dirname(base)
                    names += [(base, node.module)] if node.module else []
                    names += [(base, f"{node.module}.{a.name}" if node.module else a.name) for a in node.names]
            for base, name in names:
                relative = os.path.join(base, *name.split("."))
                for candidate in (relative + ".py", os.path.join(relative, "__init__.py")):
                    if candidate not in out and os.path.isfile(candidate):
                        try:
                            with open(candidate, encoding="utf-8", errors="replace") as f:
                                out[candidate] = f.read()
                        except OSError:
                            pass
    return out


def _lint_findings(code: str, path: str, modules: dict[str, str], lint: Lint) -> list[tuple[int, str]]:
    found = lint({path: code, **{p: t for p, t in modules.items() if p != path}})
    return [(f.line, f"lint {f.rule}: {f.message}") for f in found
            if f.path == path and f.rule in GATE_RULES and _SEVERITY[f.severity] <= _SEVERITY[GATE_RULES[f.rule]]]


def _insert(code: str, todos: list[tuple[int, str]], mark: str) -> tuple[str, list[tuple[int, str]]]:
    """The code with `# <mark>: message` above each statement line, indented as the line; the lines they now name."""
    lines = code.splitlines(keepends=True)
    newline = "\r\n" if lines and lines[0].endswith("\r\n") else "\n"
    by_line: dict[int, list[str]] = {}
    for line, message in todos:
        if 0 < line <= len(lines) and message not in by_line.get(line, []):
            by_line.setdefault(line, []).append(message)
    moved: dict[int, int] = {}
    shift = 0
    for number in range(1, len(lines) + 1):
        shift += sum(1 + message.count("\n") for message in by_line.get(number, []))
        moved[number] = number + shift

    def renumber(message: str) -> str:  # a lint message's "line N" names a line of the output before insertion
        return _LINE.sub(lambda m: f"line {moved.get(int(m.group(1)), int(m.group(1)))}", message)

    out: list[str] = []
    placed: list[tuple[int, str]] = []
    for number, text in enumerate(lines, start=1):
        indent = text[:len(text) - len(text.lstrip())]
        for message in by_line.get(number, []):
            head, *items = renumber(message).split("\n")  # a list of items: one comment line each
            out.append(f"{indent}# {mark}: {head}{newline}")
            out += [f"{indent}#   {item}{newline}" for item in items]
            placed.append((moved[number], renumber(message)))
        out.append(text)
    return "".join(out), placed


_MODULE_METHODS = frozenset({
    "train", "eval", "forward", "to", "cuda", "cpu", "half", "float", "double", "step", "zero_grad", "state_dict",
    "load_state_dict", "parameters", "named_parameters", "modules", "children", "apply", "update", "save", "load",
    "item", "backward", "append", "extend", "close", "write", "log", "add_scalar", "add_scalars", "run", "fit",
})
"""Method names that also belong to torch's modules, optimizers, tensors, lists and writers: a call of one on an
object the port cannot type is not taken for a call of the script's own method of that name."""


def _calls_without_ctx(tree: ast.Module) -> list[tuple[int, str]]:
    """A call that may run a function the port gave a required `ctx` parameter but passes no `ctx=`: it would
    raise TypeError at run time (at any world size). The rewrite threads `ctx=ctx` through the calls it can
    resolve; this is what it could not (a method called on an object whose class it did not follow)."""
    needs: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _requires_ctx(item):
                    needs.setdefault(item.name, f"{node.name}.{item.name}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _requires_ctx(node):
            needs.setdefault(node.name, node.name)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or any(k.arg in ("ctx", None) for k in node.keywords):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name not in needs or (isinstance(func, ast.Attribute) and (
                name in _MODULE_METHODS or name.startswith("__")  # `super().__init__()`: the parent's, not ours
                or isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name)
                and func.value.func.id == "super")):
            continue
        out.append((node.lineno, f"not checked: `{ast.unparse(func)}(...)` may call `{needs[name]}`, which now takes "
                                 "`ctx` (the port gave it one), but it passes none: add `ctx=ctx` to this call, or "
                                 "it raises TypeError"))
    return out


def _imported_without_ctx(tree: ast.Module, path: str, folders: list[str]) -> list[tuple[int, str]]:
    """A function (or class) of the script that now needs `ctx` (the port gave it a required `ctx` parameter, or it
    reads the `ctx` only the script's own run binds: its `__main__` block or a function) where another file of the
    project imports it from the script (`from train import prepare`): called from there, it raises TypeError (no
    `ctx=` passed) or NameError (no `ctx` in that run). The port rewrote the script alone, so that importer (an
    inference or evaluation script) is the user's to change."""
    bound_on_import = any(isinstance(t, ast.Name) and t.id == "ctx" and isinstance(t.ctx, ast.Store)
                          for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) for t in ast.walk(n))
    needs = {n.name: (n, error) for n in tree.body
             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
             for error in [_needs_ctx(n, bound_on_import)] if error}
    if not needs:
        return []
    stem = os.path.splitext(os.path.basename(path))[0]
    found: dict[str, list[str]] = {}
    for other in _project_files(folders, path):
        try:
            with open(other, encoding="utf-8", errors="replace") as f:
                module = ast.parse(f.read())
        except (OSError, SyntaxError, ValueError):
            continue
        where = os.path.relpath(other, folders[0])
        for name, line in _names_imported_from(module, stem):
            for hit in (needs if name == "*" else [name] if name in needs else []):
                found.setdefault(hit, []).append(f"{where}:{line}")
    out = []
    for name, places in sorted(found.items(), key=lambda kv: needs[kv[0]][0].lineno):
        places = sorted(set(places))
        shown = ", ".join(places[:3]) + (f" (and {len(places) - 3} more)" if len(places) > 3 else "")
        out.append((needs[name][0].lineno,
                    f"not checked: `{name}` now needs `ctx` and {shown} import{'s' if len(places) == 1 else ''} it from "
                    f"this script: called there it raises {needs[name][1]}; have those callers make one "
                    "(`ctx = ddpkit.init()`) and pass it, or keep the old single-process version for them"))
    return out


def _needs_ctx(defn: ast.AST, bound_on_import: bool) -> str:
    """How a call from another file fails now: "TypeError (no `ctx=` passed)" where the port gave the function (a
    method of the class) a required `ctx`, "NameError (no `ctx` in that run)" where it reads a `ctx` nothing in it
    binds and the script binds only when it runs; "" where neither."""
    defs = [defn] if not isinstance(defn, ast.ClassDef) else [
        n for n in defn.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if any(_requires_ctx(d) for d in defs):
        return "TypeError (no `ctx=` passed)"
    if not bound_on_import and any(_reads_global_ctx(d) for d in defs):
        return "NameError (no `ctx` in that run)"
    return ""


def _reads_global_ctx(defn: ast.AST) -> bool:
    """`ctx` read in the definition where nothing in it binds the name (no parameter, assignment or loop of it)."""
    bound = {a.arg for n in ast.walk(defn) if isinstance(n, ast.arguments)
             for a in (*n.posonlyargs, *n.args, *n.kwonlyargs, *([n.vararg] if n.vararg else []),
                       *([n.kwarg] if n.kwarg else []))}
    bound |= {n.id for n in ast.walk(defn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return "ctx" not in bound and any(isinstance(n, ast.Name) and n.id == "ctx" and isinstance(n.ctx, ast.Load)
                                      for n in ast.walk(defn))


def _project_files(folders: list[str], script: str, depth: int = 2, cap: int = 300) -> list[str]:
    """The `.py` files of the script's folders and their subfolders (`depth` levels down), the script aside."""
    skip = os.path.abspath(script)
    seen = [f for top in dict.fromkeys(os.path.abspath(f) for f in folders) for f in python_files(top, depth)]
    return [f for f in dict.fromkeys(seen) if f != skip][:cap]


def _names_imported_from(module: ast.Module, stem: str) -> list[tuple[str, int]]:
    """(name, line) of what a module takes from the module `stem`: `from stem import a, b` (`*` for a star import),
    `import stem` then `stem.a`."""
    out: list[tuple[str, int]] = []
    aliases: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1] == stem:
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name for a in node.names if a.name.split(".")[-1] == stem}
    if aliases:
        out += [(n.attr, n.lineno) for n in ast.walk(module) if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name) and n.value.id in aliases]
    return out


def _data_parallel(tree: ast.Module) -> list[tuple[int, str]]:
    """`nn.DataParallel(model)` left in the output (where the port wrapped no model, or could not follow it): under
    ddpkit each rank already owns one GPU (ddpkit.init sets it current), and DataParallel on rank 1 refuses a model
    that is not on cuda:0, so a 2-GPU run fails at the first step."""
    return [(node.lineno, f"not checked: `{ast.unparse(node.func)}(...)` is left in: each rank already owns one GPU "
                          "(ddpkit.init made it current), and DataParallel on a rank other than 0 refuses a model "
                          "off cuda:0; drop it and wrap the model with ddpkit.wrap(model, ctx) instead")
            for node in ast.walk(tree) if isinstance(node, ast.Call)
            and (node.func.id if isinstance(node.func, ast.Name) else
                 node.func.attr if isinstance(node.func, ast.Attribute) else None) == "DataParallel"]


def _transposed(node: ast.AST) -> bool:
    """`z.t()`, `z.T`, `z.transpose(0, 1)`: a 2-D matrix turned so that a product pairs every sample with every other."""
    if isinstance(node, ast.Attribute) and node.attr == "T":
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr == "t" and not node.args:
            return True
        if node.func.attr == "transpose" and [ast.unparse(a) for a in node.args] in (["0", "1"], ["1", "0"]):
            return True
    return False


def _pairs_samples(node: ast.AST) -> bool:
    """`a @ b.t()`, `torch.mm(a, b.T)`, `torch.matmul(a, b.t())`, `F.cosine_similarity(a.unsqueeze(1), b.unsqueeze(0))`:
    a batch-by-batch matrix, as contrastive losses (NT-Xent, InfoNCE, triplet mining) build from in-batch negatives."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return _transposed(node.right)
    if isinstance(node, ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id if isinstance(
            node.func, ast.Name) else ""
        if name in ("mm", "matmul") and len(node.args) == 2:
            return _transposed(node.args[1])
        if name == "cosine_similarity" and len(node.args) >= 2:
            return all(isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr == "unsqueeze"
                       for a in node.args[:2])
    return False


def _batch_coupled(tree: ast.Module, loops: list[tuple[int, int]]) -> list[tuple[int, str]]:
    """A loss that pairs every sample of the batch with every other (in-batch negatives), computed in a loop over a
    ported loader or in a function of this file called there (not in a model's own methods: attention is
    `q @ k.transpose(-2, -1)` over tokens, not samples). Each rank now sees B // N samples: the negatives, and so
    the objective, change unless the embeddings are gathered across ranks with their gradients."""
    if not loops:
        return []
    coupled = {node.name: next(n for n in ast.walk(node) if _pairs_samples(n))
               for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any(_pairs_samples(n) for n in ast.walk(node))}
    out = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if not any(a <= line <= b for a, b in loops):
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in coupled:
            where = f"`{node.func.id}` (line {coupled[node.func.id].lineno}: `{ast.unparse(coupled[node.func.id])}`)"
        elif _pairs_samples(node):
            where = f"`{ast.unparse(node)}`"
        else:
            continue
        out.append((line, f"not checked: {where} pairs every sample of the batch with every other (in-batch "
                          "negatives, a similarity matrix): each rank now sees batch_size // world_size samples, so "
                          "the objective changes; gather the embeddings across ranks with their gradients before it, "
                          "or keep the per-rank batch and accept fewer negatives"))
    return out


def _requires_ctx(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    args = node.args
    return any(a.arg == "ctx" and d is None for a, d in zip(args.kwonlyargs, args.kw_defaults))


def _statement_lines(tree: ast.Module) -> dict[int, int]:
    """Each line inside a simple statement -> the statement's first line (a TODO goes above the statement)."""
    first: dict[int, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                                 ast.If, ast.For, ast.While, ast.With, ast.Try)):
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                first.setdefault(line, node.lineno)
    return first


def _covered(tree: ast.Module, code: str) -> set[int]:
    """Lines inside a statement that already has a port TODO above it (or above a statement around it)."""
    lines = code.splitlines()

    def has_todo(node: ast.AST) -> bool:
        above = node.lineno - 2
        while above >= 0 and lines[above].strip().startswith("#"):
            if "TODO(ddpkit port):" in lines[above]:
                return True
            above -= 1
        return False

    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and has_todo(node):
            out.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return out


def _find_unused(code: str, tree: ast.Module, wraps: list[tuple[ast.Call, str]]) -> tuple[str, ast.Module]:
    """The code with `find_unused_parameters=True` added to each of `wraps` (a model whose class, in another module
    of the project, may leave a parameter without gradient), a `# ddpkit port:` note above each; and its tree."""
    if not wraps:
        return code, tree
    lines = code.splitlines(keepends=True)
    for call, _ in sorted(wraps, key=lambda w: (w[0].end_lineno, w[0].end_col_offset), reverse=True):
        raw = lines[call.end_lineno - 1].encode()
        head = raw[:call.end_col_offset - 1].decode()  # up to the call's closing parenthesis (ast counts bytes)
        comma = "" if head.rstrip().endswith(",") else ","
        lines[call.end_lineno - 1] = f"{head}{comma} find_unused_parameters=True" + raw[call.end_col_offset - 1:].decode()
    starts = _statement_lines(tree)
    code, _ = _insert("".join(lines), [(starts.get(call.lineno, call.lineno), note) for call, note in wraps], "ddpkit port")
    return code, ast.parse(code)


def _plain_wraps(code: str, tree: ast.Module, folder: str, modules: dict[str, str]
                 ) -> tuple[str, ast.Module, list[tuple[int, str]]]:
    """The code without the wraps of objects that are no nn.Module (ddpkit.wrap would raise TypeError), its tree,
    and a TODO at each such line."""
    wraps = plain_class_wraps(tree, folder, _reached_files(modules, folder))
    if not wraps:
        return code, tree, []
    code = without_wraps(code, tree, wraps)
    return code, ast.parse(code), [(call.lineno, message) for call, _, message in wraps]


def gate(code: str, path: str, mark: str, folder: str | None, lint: Lint) -> tuple[str, list[tuple[int, str]]]:
    """(the ported code with the gate's TODOs inserted, [(line of the output, message)]).

    `lint` is ddpkit.lint.linter.lint_sources (passed in by the caller, which keeps the import chain short).
    `folder` is the script's own folder (None when the script is not a file: its modules cannot be read).
    """
    try:
        tree = ast.parse(code.removeprefix("\ufeff"))
    except SyntaxError:
        return code, []
    folder = _import_root(tree, folder) if folder is not None else None
    modules = _imported_files(tree, folder) if folder is not None else {}
    plain: list[tuple[int, str]] = []
    if folder is not None:
        code, tree = _find_unused(code, tree, unused_parameter_wraps(tree, folder, _reached_files(modules, folder)))
        code, tree, plain = _plain_wraps(code, tree, folder, modules)
    loops = step_loops(tree)
    covered = _covered(tree, code)
    # a figure reported inside a loop over a ported loader is a per-step value: this rank's by the port's contract
    # (figures after the loop are reduced); a line under a TODO the rewrite already wrote is not said twice
    todos = [(line, message) for line, message in _lint_findings(code, path, modules, lint)
             if line not in covered and not (message.startswith("lint DDP006") and any(a <= line <= b for a, b in loops))]
    todos += plain
    hazards = project_hazards(tree, folder, _reached_files(modules, folder)) if folder is not None else []
    todos += hazards  # a write those already name is not named again
    # four imports deep: a factory in a package's __init__.py picks a class whose base (another file) writes
    todos += project_disk_writes(tree, folder, _reached_files(modules, folder, 4), "\n".join(m for _, m in hazards)) \
        if folder is not None else []
    todos += project_prompts(tree, folder, _reached_files(modules, folder, 4)) if folder is not None else []
    todos += project_trackers(tree, folder, _reached_files(modules, folder, 4)) if folder is not None else []
    todos += project_stops(tree, folder, _reached_files(modules, folder, 4)) if folder is not None else []
    todos += project_orders(tree, folder, _reached_files(modules, folder, 4)) if folder is not None else []
    todos += script_orders(tree)
    todos += project_bypasses(tree, folder, _reached_files(modules, folder, 4)) if folder is not None else []
    todos += import_device_work(tree, folder, modules) if folder is not None else []
    todos += pinned_gpus(tree, folder, _reached_files(modules, folder)) if folder is not None else []
    todos += _calls_without_ctx(tree)
    todos += _imported_without_ctx(tree, path, [os.path.dirname(os.path.abspath(path)), folder]) \
        if folder is not None and os.path.isfile(path) else []
    todos += _data_parallel(tree)
    asserted = parallel_asserts(tree, folder, _reached_files(modules, folder) if folder is not None else {})
    lines = {line for line, _ in asserted}  # that call fails before anything it does with the model: said once
    todos = [(line, m) for line, m in todos if not (line in lines and m.startswith("not checked: `"))] + asserted
    todos += _batch_coupled(tree, loops)
    todos += unsynced_heads(tree, loops, folder, _reached_files(modules, folder) if folder is not None else {})
    todos += host_tensors(tree, folder, _reached_files(modules, folder) if folder is not None else {})
    if not todos:
        return code, []
    starts = _statement_lines(tree)
    todos = [(starts.get(line, line), message) for line, message in todos]
    return _insert(code, sorted(todos), mark)
