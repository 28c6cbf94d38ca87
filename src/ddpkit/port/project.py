"""The script's own modules, read (never rewritten): what breaks under DDP in code the training path hands over to.

The port rewrites one file. Where the ported script hands the model, a ported loader or its batches, or the parsed
args/config to a function or class of a module beside it (`from utils import train_one_epoch`, `import simclr`),
that code runs on every rank with inputs that changed meaning: the batch size read from the config is now the
global one, batches arrive on the rank's device, the model is a DDP wrapper, and every rank writes, downloads and
draws. Those places are found with ast only, in the modules the script imports directly.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator

from ddpkit.port.asks import bypasses_reached, prompts_reached, stops_reached, trackers_reached
from ddpkit.port.buffers import filled_buffers_in_wrapped
from ddpkit.port.contrast import batch_similarity
from ddpkit.port.cpuonly import cpu_only_reached
from ddpkit.port.diskwrites import (PROCESSES, Site, made_classes, method_of, named_per_rank, one_rank_nodes,
                                    table_entries, where, writer_class, writes_reached)
from ddpkit.port.effects import DOWNLOADS, FETCHES
from ddpkit.port.localcode import definition as _definition, imported_paths as _imported_paths, \
    local_imports as _local_imports, parsed_module as _parsed, resolve as _resolve
from ddpkit.port.orders import ORDER_FIX, orders_reached
from ddpkit.port.packing import cpu_tensors_in_wrapped, host_inputs_in_wrapped, plain_tensor_members
from ddpkit.port.sizes import divided_sizes, fixed_device, fixed_devices, shapes_with, split_sizes
from ddpkit.port.trainers import trained_elsewhere
from ddpkit.port.untrained import unused_in_wrapped, unused_wraps, used_outside_forward
from ddpkit.port.wrapped import plain_wraps
from ddpkit.port.weights import Follow, ast_dotted, strict_loads

__all__ = ["plain_class_wraps", "project_hazards", "import_device_work", "step_loops", "parallel_asserts",
           "unused_parameter_wraps", "project_writers", "project_downloads",
           "project_loaders", "project_disk_writes", "project_prompts", "project_trackers",
           "project_stops", "project_cpu_work", "project_orders", "project_bypasses", "project_groups",
           "module_parameters"]

_LEGACY = {"FloatTensor", "LongTensor", "IntTensor", "DoubleTensor", "ByteTensor", "BoolTensor", "HalfTensor",
           "ShortTensor", "CharTensor", "Tensor"}
_MOVES = {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train"}
"""Methods of a module that return the module itself."""
_WRITES = {"save", "savefig", "imwrite", "save_image", "to_csv", "dump", "makedirs", "mkdir", "urlretrieve",
           "SummaryWriter", "FileWriter", "create_file_writer", "savetxt", "savez", "savez_compressed", "write_text", "write_bytes",
           "copyfile", "rmtree"}
_DRAWS = {"shuffle", "permutation", "randperm", "sample", "choice", "random_split"}
_CONFIG_LOADS = {"parse_args", "parse_known_args", "json.load", "yaml.load", "yaml.safe_load", "yaml.full_load",
                 "OmegaConf.load", "toml.load"}


def _root(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _names(e)]
    if isinstance(target, ast.Starred):
        return _names(target.value)
    return []


def _built(call: ast.Call) -> str:
    """The constructor a value is built by, through the moves that return the module itself:
    `Net(...).to(device)` -> "Net"."""
    while isinstance(call.func, ast.Attribute) and call.func.attr in _MOVES and isinstance(call.func.value, ast.Call):
        call = call.func.value
    return ast_dotted(call.func)


def _handed(tree: ast.Module, classes: dict[str, str]) -> dict[str, str]:
    """Names in the ported script bound to what changed under DDP: 'model', 'loader', 'batch' or 'config'.

    `classes` gets the constructor each wrapped model was built by (`model = ddpkit.wrap(Net(...), ctx)`: Net)."""
    kinds: dict[str, str] = {}
    built_by: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name) and _built(node.value):
            built_by.setdefault(node.targets[0].id, []).append(_built(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = ast_dotted(node.value.func)
            last = func.rsplit(".", 1)[-1]
            kind = ("model" if func == "ddpkit.wrap" else "loader" if func in ("ddpkit.loader", "ddpkit.eval_loader")
                    else "config" if last in _CONFIG_LOADS or func in _CONFIG_LOADS else "")
            if kind:
                for target in node.targets:
                    for name in _names(target):
                        kinds.setdefault(name, kind)
                    if kind == "model" and isinstance(target, ast.Attribute) and ast_dotted(target):
                        kinds.setdefault(ast_dotted(target), kind)  # `self.model = ddpkit.wrap(...)`: self holds it
                if kind == "model":
                    for arg in node.value.args[:1]:
                        if isinstance(arg, ast.Name):
                            kinds.setdefault(arg.id, kind)
                            built = next((b for b in built_by.get(arg.id, [])), "")
                        else:
                            built = ast_dotted(arg.func) if isinstance(arg, ast.Call) else ""
                        for target in node.targets:
                            for name in _names(target):
                                if built:
                                    classes.setdefault(name, built)
    for node in ast.walk(tree):  # `pbar = tqdm(loader)`: the same batches
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and node.value.args and ast_dotted(
                node.value.func) in ("tqdm", "tqdm.tqdm", "enumerate") and kinds.get(_root(node.value.args[0])) == "loader":
            for target in node.targets:
                for name in _names(target):
                    kinds.setdefault(name, "loader")
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)):
            source = node.iter.args[0] if isinstance(node.iter, ast.Call) and ast_dotted(node.iter.func) in (
                "enumerate", "tqdm", "tqdm.tqdm", "zip") and node.iter.args else node.iter
            if kinds.get(_root(source)) == "loader":
                for name in _names(node.target):
                    kinds.setdefault(name, "batch")
    return kinds


def step_loops(tree: ast.Module) -> list[tuple[int, int]]:
    """(first, last line) of each loop over a ported loader: a figure reported inside one is a per-step value."""
    kinds = _handed(tree, {})
    return [(node.lineno, node.end_lineno or node.lineno) for node in ast.walk(tree)
            if isinstance(node, ast.For) and kinds.get(_root(
                node.iter.args[0] if isinstance(node.iter, ast.Call) and ast_dotted(node.iter.func) in (
                    "enumerate", "tqdm", "tqdm.tqdm") and node.iter.args else node.iter)) == "loader"]


def _kind_of(arg: ast.AST, kinds: dict[str, str]) -> str:
    if isinstance(arg, ast.Starred):
        arg = arg.value
    if isinstance(arg, ast.Name):
        return kinds.get(arg.id, "")
    if isinstance(arg, ast.Call):
        func = ast_dotted(arg.func)
        if func == "ddpkit.unwrap" and arg.args:
            return "unwrapped" if _kind_of(arg.args[0], kinds) == "model" else ""
        if func == "vars" and arg.args:
            return _kind_of(arg.args[0], kinds)
        if isinstance(arg.func, ast.Attribute) and arg.func.attr in ("to", "cuda", "float", "long"):
            return "batch" if _kind_of(arg.func.value, kinds) == "batch" else ""
    if isinstance(arg, ast.Subscript):
        return "batch" if _kind_of(arg.value, kinds) == "batch" else ""
    if isinstance(arg, ast.Attribute) and arg.attr == "module":
        return "model" if _kind_of(arg.value, kinds) == "model" else ""
    if isinstance(arg, ast.Attribute) and ast_dotted(arg) in kinds:  # `trainer.model`: an object that stores it
        return kinds[ast_dotted(arg)]
    if isinstance(arg, (ast.Dict, ast.List, ast.Tuple)):  # `{"model": model, ...}`: pickled whole, it holds the wrapper
        items = arg.values if isinstance(arg, ast.Dict) else arg.elts
        return "holds model" if any(_kind_of(v, kinds) in ("model", "holds model") for v in items) else ""
    return ""


def _sum_marker(defn: ast.AST) -> tuple[int, str] | None:
    """(line, code) of a torch loss reduced by a sum over the batch in a definition: `reduction="sum"`,
    `size_average=False`."""
    for node in ast.walk(defn):
        if isinstance(node, ast.keyword) and (
                (node.arg == "reduction" and isinstance(node.value, ast.Constant) and node.value.value == "sum")
                or (node.arg == "size_average" and isinstance(node.value, ast.Constant) and node.value.value is False)):
            return node.value.lineno, f"{node.arg}={ast.unparse(node.value)}"
    return None


def _divided_by_count(defn: ast.AST) -> bool:
    """Every value the loss returns is divided by a count it computes (`return (loc + cls) / num_pos` with
    `num_pos = pos.sum().item()`, `loss.div(n)`): a mean over its own count, as `/ x.size(0)` is in the script,
    whatever it summed first. Not where it divides by a fixed number."""
    calls = [n for n in defn.body if isinstance(n, ast.FunctionDef) and n.name in ("forward", "__call__")] \
        if isinstance(defn, ast.ClassDef) else [defn]
    returns = [(r.value, f) for f in calls for r in ast.walk(f) if isinstance(r, ast.Return) and r.value is not None]

    def counted(value: ast.expr, scope: ast.AST) -> bool:
        if isinstance(value, ast.Name):  # `loss = (loc + cls) / num_pos; return loss`: its last assignment
            bound = [n.value for n in ast.walk(scope) if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == value.id for t in n.targets)]
            return bool(bound) and counted(bound[-1], scope)
        by = value.right if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Div) else \
            value.args[0] if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and \
            value.func.attr == "div" and value.args else None
        return by is not None and not isinstance(by, ast.Constant)

    return bool(returns) and all(counted(value, f) for value, f in returns)


def _backward_losses(tree: ast.Module, definition) -> Iterator[tuple[int, str, tuple[str, str, ast.AST]]]:  # noqa: ANN001
    """(line of backward(), the loss's name, the definition of a call that computes it) for `loss = criterion(out,
    y)` ... `loss.backward()`: every call among the values the loss is built from (`loss = loss_l + loss_c` after
    `loss_l, loss_c = criterion(out, y)`), `criterion` followed to the class it was made from (`criterion =
    MultiBoxLoss(...)`), each resolved by `definition`. Nothing where no loader is sharded (the same data on every
    rank)."""
    if "ddpkit.loader(" not in ast.unparse(tree):
        return
    made: dict[str, str] = {}
    for node in ast.walk(tree):  # `criterion = MultiBoxLoss(...)`, `self.crit = losses.Sum(...)`
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call):
            made.setdefault(ast_dotted(node.targets[0]), ast_dotted(_unmoved(node.value).func))
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [tree]
    for scope in scopes:
        body = [n for n in ast.walk(scope)]
        for call in (n for n in body if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                     and n.func.attr == "backward" and isinstance(n.func.value, ast.Name)):
            name = call.func.value.id
            names, values, seen = [name], [], set()
            while names:  # every name the loss reads, back to the calls that made them
                look = names.pop()
                seen.add(look)
                for n in body:
                    if isinstance(n, ast.Assign) and n.lineno < call.lineno and any(
                            look in [e.id for e in ast.walk(t) if isinstance(e, ast.Name)] for t in n.targets):
                        values.append(n.value)
                        names += [e.id for e in ast.walk(n.value) if isinstance(e, ast.Name) and e.id not in seen
                                  and e.id not in names]
            for value in values:
                for inner in (n for n in ast.walk(value) if isinstance(n, ast.Call)):
                    func = ast_dotted(inner.func)
                    found = definition(made.get(func, func)) if func else None
                    if found is not None:
                        yield call.lineno, name, found


def _unmoved(call: ast.Call) -> ast.Call:
    """`SimLoss(tau=0.1)` of `SimLoss(tau=0.1).to(ctx.device)` or `.cuda()`: the call that built the object."""
    while isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda") and isinstance(
            call.func.value, ast.Call):
        call = call.func.value
    return call


def _summed_elsewhere(tree: ast.Module, definition) -> list[tuple[int, str]]:  # noqa: ANN001
    """`loss = criterion(out, y)` ... `loss.backward()` where `criterion` (or the function called) is the project's
    own code that reduces a loss by a sum (`reduction="sum"`, `size_average=False`): under a sharded loader each rank
    sums its share and DDP averages, so the gradient may be 1/world_size of the original's; the port cannot tell."""
    out: list[tuple[int, str]] = []
    for line, name, found in _backward_losses(tree, definition):
        marker = _sum_marker(found[2]) if not _divided_by_count(found[2]) else None
        if marker is None or any(at == line for at, _ in out):
            continue
        where = os.path.basename(found[0])
        out.append((line, f"not checked: `{name}` reaches backward() from `{found[1]}` in {where} "
                          f"(read, not ported), which reduces a loss by a sum there ({where}:"
                          f"{marker[0]} `{marker[1]}`): where that sums over the batch, each rank "
                          "sums its batch_size // world_size samples and DDP averages the "
                          "gradients, so the step is 1/world_size of the original's: then call "
                          f"backward() on `{name}` times ctx.world_size"))
    return out


def _compared_in_batch(tree: ast.Module, definition) -> list[tuple[int, str]]:  # noqa: ANN001
    """`loss = criterion(z)` ... `loss.backward()` where the loss's code compares the samples of a batch with each
    other (ddpkit.port.contrast): each rank's loss sees only its own batch_size // world_size samples."""
    own = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}  # the script's: file ""

    def own_or_project(name: str) -> tuple[str, str, ast.AST] | None:
        return ("", name, own[name]) if name in own else definition(name)
    out: list[tuple[int, str]] = []
    for line, name, found in _backward_losses(tree, own_or_project):
        marker = batch_similarity(found[2])
        if marker is None or any(at == line for at, _ in out):
            continue
        where = f"{os.path.basename(found[0])}:{marker[0]}" if found[0] else f"line {marker[0]}"
        out.append((line, f"`{name}` reaches backward() from `{found[1]}`, which compares the samples of a batch "
                          f"with each other ({where} `{marker[1]}`: a similarity matrix, in-batch negatives): "
                          + _IN_BATCH))
    return out


def _handed_in_batch(tree: ast.Module, definition, folder: str, modules: dict[str, str],  # noqa: ANN001
                     parsed: dict[str, ast.Module | None], named: set[int]) -> list[tuple[int, str]]:
    """`criterion = NTXentLoss(...)` handed to `train(..., criterion=criterion)` of the project, whose code (or code
    it calls, three levels at most) calls backward(): the loss trains there, read, not ported, where
    `_compared_in_batch` sees no backward(). A TODO at the call when the loss's class or function compares the
    samples of a batch with each other (ddpkit.port.contrast); `named`: lines that TODO already holds."""
    own = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    losses: dict[str, tuple[str, str, tuple[int, str]]] = {}  # the name bound to it -> (file, its name, marker)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _unmoved(node.value) if isinstance(node.value, ast.Call) else node.value
            func = ast_dotted(value.func) if isinstance(value, ast.Call) else ast_dotted(value)
            found = ("", func, own[func]) if func in own else definition(func) if func else None
            marker = batch_similarity(found[2]) if found is not None else None
            if marker is not None:
                losses[node.targets[0].id] = (found[0], found[1], marker)
    out: list[tuple[int, str]] = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)) if losses else ():
        handed = next((a.id for a in [*call.args, *(k.value for k in call.keywords)]
                       if isinstance(a, ast.Name) and a.id in losses), None)
        found = definition(ast_dotted(call.func)) if handed is not None and ast_dotted(call.func) else None
        if found is None or call.lineno in named or not _trains_below(found[0], found[2], folder, modules, parsed):
            continue
        named.add(call.lineno)
        path, cls, (line, code) = losses[handed]
        where = f"{os.path.basename(path)}:{line}" if path else f"line {line}"
        out.append((call.lineno, f"`{handed}` ({cls}) is handed to `{found[1]}` in {os.path.basename(found[0])} "
                                 "(read, not ported), whose code calls backward() (the loss trains there), and "
                                 f"it compares the samples of a batch with each other ({where} `{code}`: a "
                                 "similarity matrix, in-batch negatives): " + _IN_BATCH))
    return out


_IN_BATCH = ("each rank now compares only its own batch_size // world_size samples, so every sample meets world_size "
             "times fewer others than in the original, and the loss is another one; gather the embeddings of every "
             "rank before the loss (torch.distributed.nn.functional.all_gather keeps their gradients), or keep the "
             "per-rank batch and say that the loss changed")
"""What a loss over in-batch negatives becomes under a sharded loader, and the two ways out."""


def _trains_below(path: str, defn: ast.AST, folder: str, modules: dict[str, str],
                  parsed: dict[str, ast.Module | None]) -> bool:
    """`defn` (of module `path`), or a function or class of the project it calls (three levels at most), calls
    `X.backward()`."""
    todo, seen = [(path, defn, 0)], {id(defn)}
    while todo:
        where, node, depth = todo.pop(0)
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
               for n in ast.walk(node)):
            return True
        for found in _called(where, node, folder, modules, parsed) if depth < 3 and len(seen) < 40 else ():
            if id(found[1]) not in seen:
                seen.add(id(found[1]))
                todo.append((*found, depth + 1))
    return False


def _parameters(defn: ast.AST) -> list[str]:
    if isinstance(defn, ast.ClassDef):
        init = next((n for n in defn.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        return [a.arg for a in init.args.args[1:]] if init else []
    args = defn.args
    return [a.arg for a in args.posonlyargs + args.args]


def _kwargs_of(defn: ast.ClassDef) -> set[str]:
    init = next((n for n in defn.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    return {init.args.kwarg.arg} if init is not None and init.args.kwarg is not None else set()


def _received(call: ast.Call, defn: ast.AST, kinds: dict[str, str]) -> dict[str, str]:
    """Parameter name in the definition -> the kind of object the call hands it."""
    params = _parameters(defn)
    got: dict[str, str] = {}

    def hand(param: str, arg: ast.AST) -> None:
        kind = _kind_of(arg, kinds)
        if kind:
            got[param] = kind
        held = ast_dotted(arg)  # `sk.solve(self)` where self.model is the wrapper: the callee's `param.model` is it
        for key, kind in kinds.items() if held else ():
            if kind == "model" and key.startswith(held + ".") and "." not in key[len(held) + 1:]:
                got.setdefault(f"{param}{key[len(held):]}", kind)

    for i, arg in enumerate(call.args):
        if i < len(params):
            hand(params[i], arg)
    for kw in call.keywords:
        if kw.arg:
            hand(kw.arg, kw.value)
    if isinstance(defn, ast.ClassDef):  # self.x = x in __init__: the object lives on as self.x
        for node in ast.walk(defn):
            value = node.value if isinstance(node, ast.Assign) else None
            if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):  # self.x = kwargs["x"]
                value = ast.Name(str(value.slice.value)) if ast_dotted(value.value) in _kwargs_of(defn) else None
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "get" \
                    and ast_dotted(value.func.value) in _kwargs_of(defn) and value.args and \
                    isinstance(value.args[0], ast.Constant):
                value = ast.Name(str(value.args[0].value))
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in _MOVES:
                value = value.func.value  # `self.model = model.to(self.device)`: the same object
            if isinstance(value, ast.Name) and value.id in got:
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and ast_dotted(t.value) == "self":
                        got[f"self.{t.attr}"] = got[value.id]
    return got


_EVERY_RANK = ("writes or downloads", "downloads on every rank", "chooses a device", "nn.DataParallel", "made from the clock")
"""What code every rank runs must not do there (the port would fix each in the script itself)."""


_BLOCKERS = (("AttributeError", "nn.DataParallel", "chooses a device", "pickles the DDP wrapper", "never sees it"),
             ("writes or downloads", "downloads on every rank", "made from the clock", "on every rank", "draws on"))
"""What a `not checked:` item says, by how soon it stops a correct run: a crash or a wrong device first, then files
and data that ranks race for or disagree on, then the rest (keys, batch sizes)."""


def _blocker_rank(message: str) -> int:
    return next((i for i, parts in enumerate(_BLOCKERS) if any(p in message for p in parts)), len(_BLOCKERS))


def _items(items) -> str:  # noqa: ANN001
    """Every item of a `not checked:` TODO on a line of its own (claims._insert writes each as a comment line):
    a TODO never hides, behind "and N more", what blocks a correct run."""
    return "".join(f"\n- {item}" for item in items)


def _every_rank(message: str) -> bool:
    return any(part in message for part in _EVERY_RANK)


def _reached_hazards(path: str, defns: list[ast.AST], folder: str, modules: dict[str, str],
                     parsed: dict[str, ast.Module | None]) -> list[tuple[str, int, str]]:
    """(file, line, what) of what breaks on every rank (`_every_rank`) in the project's functions and classes that
    `defns` (of module `path`) call, followed a level at a time (three at most): a class reached is read whole (a
    layer's forward runs in its model's). The definitions themselves are judged by the caller."""
    out: list[tuple[str, int, str]] = []
    seen = {id(d) for d in defns}
    todo = [(path, d, 0) for d in defns]
    while todo:
        where, defn, depth = todo.pop(0)
        if depth:
            out += [(os.path.basename(where), line, h) for line, h in _hazards(
                defn, {}, False, devices=fixed_devices(_parsed(modules, where, parsed))) if _every_rank(h)]
        for found in _called(where, defn, folder, modules, parsed) if depth < 3 and len(seen) < 40 else ():
            if id(found[1]) not in seen:
                seen.add(id(found[1]))
                todo.append((*found, depth + 1))
    return out


def _called(path: str, defn: ast.AST, folder: str, modules: dict[str, str],
            parsed: dict[str, ast.Module | None]) -> list[tuple[str, ast.AST]]:
    """(file, definition) of each function or class of the project `defn` calls by name (`build(...)`,
    `layers.Block(...)`), resolved as its module `path` imports it."""
    module = _parsed(modules, path, parsed)
    if module is None:
        return []
    imported = {**_local_imports(module, modules, os.path.dirname(path), parsed),
                **_local_imports(module, modules, folder, parsed)}
    out = []
    # a class's project base classes too: `super().__init__(args)` runs the base's code (the device it picks)
    bases = [ast_dotted(b) for b in defn.bases] if isinstance(defn, ast.ClassDef) else []
    for func in [*(ast_dotted(n.func) for n in ast.walk(defn) if isinstance(n, ast.Call)), *bases]:
        head, _, rest = func.partition(".")
        if not func or "." in rest:
            continue
        if not rest:
            found = _resolve(modules, folder, path, func, parsed)
        elif head in imported and imported[head][1] is None:
            found = _resolve(modules, folder, imported[head][0], rest, parsed)
        else:
            found = None
        if found is not None and isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(found)
    return out


def _rank_guarded(tree: ast.Module) -> set[int]:
    """id() of the calls the ported script makes on one rank only (under `if ctx.is_main:` or a rank test)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and any(
                isinstance(n, (ast.Name, ast.Attribute)) and ast_dotted(n).rsplit(".", 1)[-1] in ("is_main", "rank")
                for n in ast.walk(node.test)):
            out.update(id(c) for stmt in node.body for c in ast.walk(stmt) if isinstance(c, ast.Call))
        for body in (getattr(node, f, None) for f in ("body", "orelse", "finalbody")):
            start = None  # the port's rank-0-first region: rank 0 runs it before the others (their files exist then)
            for i, stmt in enumerate(body if isinstance(body, list) else []):
                barrier = isinstance(stmt, ast.If) and len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Expr) \
                    and isinstance(stmt.body[0].value, ast.Call) and ast_dotted(stmt.body[0].value.func) == \
                    "ddpkit.barrier"
                test = ast.unparse(stmt.test) if barrier else ""
                if test == "not ctx.is_main":
                    start = i
                elif test == "ctx.is_main" and start is not None:
                    out.update(id(c) for inner in body[start + 1:i] for c in ast.walk(inner) if isinstance(c, ast.Call))
                    start = None
    return out


_WRAPPER_ATTRS = {"train", "eval", "parameters", "named_parameters", "buffers", "named_buffers", "children",
                  "named_children", "modules", "named_modules", "state_dict", "load_state_dict", "zero_grad", "to",
                  "cuda", "cpu", "float", "half", "double", "bfloat16", "apply", "forward", "module", "training",
                  "requires_grad_", "no_sync", "register_forward_hook", "register_forward_pre_hook",
                  "register_full_backward_hook", "register_buffer", "register_parameter", "add_module", "device",
                  "__class__", "__call__", "extra_repr", "type", "share_memory", "get_submodule"}
"""Attributes a DistributedDataParallel wrapper has: any other attribute of the user's model is missing on it."""


def _legacy_aliases(module: ast.Module) -> set[str]:
    """Module-level names bound to a legacy constructor (`LT = torch.LongTensor`)."""
    imported = {a.asname or a.name for n in module.body if isinstance(n, ast.ImportFrom) and n.module == "torch"
                for a in n.names if a.name in _LEGACY}  # `from torch import LongTensor as LT`
    return imported | {t.id for n in module.body if isinstance(n, ast.Assign) and ast_dotted(n.value).startswith("torch.")
                       and ast_dotted(n.value).rsplit(".", 1)[-1] in _LEGACY for t in n.targets if isinstance(t, ast.Name)}


def _handed_on(defn: ast.AST, received: dict[str, str], one_rank: bool, follow: Follow | None,
               depth: int) -> list[tuple[int, str]]:
    """Calls in the receiving code that hand the model on to another function of the project (`save_model(
    self.model, path)` in a Trainer's method): what that function does with it, at the line of the call."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(defn) if follow is not None and depth < 2 else ():
        if not isinstance(node, ast.Call) or not any(
                _kind_of(a, received) == "model" for a in [*node.args, *(k.value for k in node.keywords)]):
            continue
        code = received.get(ast_dotted(node.func), "")  # `self.engine_class(model, ...)`: the class it was given
        if isinstance(node.func, ast.Name):
            found, name = follow(node.func.id), node.func.id
        elif code.startswith("code:"):
            _, at, name = code.split(":", 2)
            found = follow(name, at)
        else:
            continue
        if found is None or found[1] is defn:
            continue
        path, callee = found
        init = _init_of(callee, lambda n, p=path: follow(n, p))
        got = {k: v for k, v in _received(node, init or callee, received).items() if v == "model"}
        if isinstance(callee, ast.ClassDef):
            got.update(_instance_aliases(callee, got))
        inner = sorted(set(_hazards(callee, got, one_rank, frozenset(), lambda n, p=path: follow(n, p), depth + 1)))
        if inner:
            where = os.path.basename(path)
            lines: dict[str, list[int]] = {}  # one message, every line it holds at
            for line, h in inner:
                lines.setdefault(h, []).append(line)
            grouped = sorted((at, h) for h, at in lines.items())
            out.append((node.lineno, f"`{ast.unparse(node)[:50]}` hands the model to `{name}`: " + "; ".join(
                f"{where}:{', '.join(map(str, at))} {h}" for at, h in grouped)))
    return out


def _init_of(cls: ast.AST, follow: Follow) -> ast.ClassDef | None:
    """The class whose `__init__` builds instances of `cls`: `cls` itself, or the first base (of the project) that
    defines one where `cls` does not (`class Fine(Engine): ...` keeps `Engine.__init__`); None for a function."""
    for _ in range(3):
        if not isinstance(cls, ast.ClassDef):
            return None
        if any(isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in cls.body):
            return cls
        base = next((ast_dotted(b) for b in cls.bases if isinstance(b, ast.Name)), "")
        found = follow(base) if base else None
        cls = found[1] if found is not None else None
    return None


def _instance_aliases(cls: ast.ClassDef, received: dict[str, str]) -> dict[str, str]:
    """`engine.model` for `self.model` in a static method whose first parameter is the instance (an engine that hands
    itself to its step function: `def train(engine, batch): engine.model(...)`): that parameter reads what `__init__`
    stored on self, so it is taken for the instance only where it reads one of those attributes."""
    stored = {k[5:]: v for k, v in received.items() if k.startswith("self.") and "." not in k[5:]}
    out: dict[str, str] = {}
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.args.args and any(
            ast_dotted(d) == "staticmethod" for d in n.decorator_list)):
        first = method.args.args[0].arg
        reads = {n.attr for n in ast.walk(method) if isinstance(n, ast.Attribute) and ast_dotted(n.value) == first}
        if reads & set(stored):
            out.update({f"{first}.{attr}": kind for attr, kind in stored.items()})
    return out


def _hazards(defn: ast.AST, received: dict[str, str], one_rank: bool, aliases: set[str] = frozenset(),
             follow: Follow | None = None, depth: int = 0, devices: set[str] = frozenset(),
             sizes: set[str] = frozenset(), divided: bool = False) -> list[tuple[int, str]]:
    """(line, what to check) in the code that receives the objects; `one_rank`: the call runs on rank 0 only.
    `follow` resolves the names it calls, so a model handed on to another function of the project is followed;
    `devices` are the module's names bound to a GPU it chose itself; `sizes` the keys of the settings whose batch
    size the port divided for its loader; `divided`: the port divided a loader's batch by the world size at all."""
    kinds = set(received.values())
    out: list[tuple[int, str]] = _handed_on(defn, received, one_rank, follow, depth) if "model" in kinds else []
    out += shapes_with(defn, received)
    devices = _chosen_in(defn, devices)
    for node in ast.walk(defn):
        text = ast.unparse(node) if isinstance(node, (ast.Attribute, ast.Call)) else ""
        if isinstance(node, ast.Call) and ast_dotted(node.func) in ("getattr", "setattr") and len(node.args) >= 2 \
                and received.get(ast_dotted(node.args[0])) == "model" and not (isinstance(
                    node.args[1], ast.Constant) and node.args[1].value in _WRAPPER_ATTRS):
            # `getattr(model, "head%d" % i)`: an attribute by a computed name, as absent from the wrapper
            node = ast.Attribute(node.args[0], "", ast.Store() if ast_dotted(node.func) == "setattr" else
                                 ast.Load() if len(node.args) == 2 else None, lineno=node.lineno)
        if isinstance(node, ast.Attribute) and node.attr not in _WRAPPER_ATTRS and not node.attr.startswith("__") \
                and received.get(ast_dotted(node.value)) == "model":
            if isinstance(node.ctx, ast.Load):
                out.append((node.lineno, f"`{text[:60]}` is no attribute of the DDP wrapper it now gets "
                                         "(AttributeError): hand it ddpkit.unwrap(model), or reach it through forward"))
            elif isinstance(node.ctx, ast.Store):
                out.append((node.lineno, f"sets `{text[:60]}` on the DDP wrapper it now gets: the module inside "
                                         "never sees it; set it on ddpkit.unwrap(model)"))

    moved = {id(n.func.value) for n in ast.walk(defn) if isinstance(n, ast.Call) and isinstance(
        n.func, ast.Attribute) and n.func.attr in ("to", "cuda")}  # `torch.FloatTensor(s).to(y.device)`: moved on

    def name_of(node: ast.AST) -> str:
        d = ast_dotted(node)
        return next((p for p in received if d == p or d.startswith(p + ".")), "")

    clocked = _clocked(defn)
    # `try: os.makedirs(p)` `except OSError: pass`: a folder another rank made is fine (not where the handler
    # raises or exits: that rank stops); and what the code writes under its own rank test is rank 0's
    single = one_rank_nodes(defn)

    for node in ast.walk(defn):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and received.get(name_of(node.value)) == "config":
            key = node.attr if isinstance(node, ast.Attribute) else (
                node.slice.value if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) else "")
            if key in sizes:
                out.append((node.lineno, f"reads `{name_of(node.value)}.{key}`, the global batch size the port "
                                         "divided by the world size for the loader: each rank's batch is smaller "
                                         "now; where it sizes a batch's tensors or counts its samples, use the "
                                         "batch's own size (x.size(0))"))
            elif "batch" in key.lower() and "norm" not in key.lower() and divided:
                out.append((node.lineno, f"reads the global batch size `{ast.unparse(node)}`: each rank's batch is "
                                         "now that divided by the world size (ctx.world_size)"))
        if not isinstance(node, ast.Call):
            continue
        func = ast_dotted(node.func)
        last = func.rsplit(".", 1)[-1] if func else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
        if func == "torch.save" and node.args and received.get(name_of(node.args[0])) in ("model", "holds model") \
                and ast_dotted(node.args[0]) in received:
            out.append((node.lineno, f"`{ast.unparse(node)[:60]}` pickles the DDP wrapper itself (not a state_dict): "
                                     "that file cannot be loaded without a process group; hand it "
                                     "ddpkit.unwrap(model)"))
        if kinds & {"batch", "model", "loader"} and (func.startswith("torch.") and last in _LEGACY or func in aliases) \
                and id(node) not in moved:
            out.append((node.lineno, f"`{func}(...)` makes a CPU tensor while the inputs now arrive on the rank's "
                                     "device (ctx.device)"))
        elif (last == "cuda" and isinstance(node.func, ast.Attribute) and (node.args or node.keywords)) or \
                func == "torch.cuda.set_device" or (last in ("device", "to") and any(
                    fixed_device(a, devices) for a in node.args)) or any(
                    k.arg == "device" and fixed_device(k.value, devices) for k in node.keywords):
            # `.cuda()` and "cuda" name the current device, which ddpkit.init sets to the rank's: an index does not
            out.append((node.lineno, f"`{ast.unparse(node)[:60]}` chooses a device of its own, not the rank's "
                                     "(ctx.device)"))
        elif last == "state_dict" and isinstance(node.func, ast.Attribute) and received.get(
                ast_dotted(node.func.value)) == "model":  # `model.module.state_dict()` unwraps it
            out.append((node.lineno, f"`{ast.unparse(node)[:60]}` of the wrapped model: its keys start with "
                                     "`module.` (hand it ddpkit.unwrap(model))"))
        elif func in ("copy.deepcopy", "deepcopy") and "model" in kinds:
            out.append((node.lineno, "`deepcopy` of a module of the model (an EMA copy?): DDP sees its parameters "
                                     "as unused, and the copy of the wrapper holds `module.` keys"))
        elif last == "DataParallel" and not one_rank:
            out.append((node.lineno, f"`{ast.unparse(node)[:60]}` wraps in nn.DataParallel over every GPU each rank's "
                                     "process sees, from cuda:0 (DDP runs one process per GPU): remove it there "
                                     "(ddpkit.wrap replaces it)"))
        elif not one_rank and ((last in _WRITES or func.endswith("onnx.export")) or func == "open" and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) and set(a.value) & set("wax")
                for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"])) and (
                stamp := _stamped(node, clocked)):
            # a name made from the clock: ranks that start a second apart name different files or folders
            out.append((node.lineno, f"`{(func or last)}(...)` on every rank, at a path made from the clock "
                                     f"({stamp}): each rank names its own, or two race for one; make the name on "
                                     "rank 0 and broadcast it (ddpkit.collectives.broadcast_object), write on rank 0"))
        elif one_rank or any(kw.arg == "exist_ok" and not (isinstance(kw.value, ast.Constant) and kw.value.value is
                                                           False) for kw in node.keywords) or (
                id(node) in single or named_per_rank(node)) and (last in _WRITES or func == "open"):
            continue  # what rank 0 alone writes, and a mkdir that lets another rank's come first, are fine
        elif (last in _WRITES or func.endswith("onnx.export")) or func == "open" and any(
                isinstance(a, ast.Constant) and isinstance(a.value, str) and set(a.value) & set("wax")
                for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]):
            # a file saved then loaded back (`torch.save` in train(), `torch.load` after it): once only rank 0
            # writes it, the others must wait for it to be whole
            back = "; then ddpkit.barrier(ctx) where every rank passes, before any rank reads it back" if \
                last == "save" or func == "open" else ""
            out.append((node.lineno, f"`{(func or last)}(...)` writes or downloads on every rank (rank 0 only: "
                                     f"`if ctx.is_main:`{back})"))
        elif kinds & {"config", "loader"} and last in _DRAWS and not any(kw.arg == "generator" for kw in node.keywords) \
                and (func.startswith(("random.", "np.random.", "numpy.random.", "torch.")) or last == "random_split"):
            out.append((node.lineno, f"`{func}(...)` draws on each rank's own random stream: data chosen by it "
                                     "differs between ranks"))
        elif any(kw.arg == "download" and isinstance(kw.value, ast.Constant) and kw.value.value for kw in node.keywords):
            out.append((node.lineno, f"`{func or last}(..., download=True)` downloads on every rank at once"))
    return out


_CLOCKS = {"now", "today", "utcnow", "time", "time_ns", "localtime", "gmtime"}
"""Calls of datetime/time that read the clock: their value differs between ranks that start a moment apart."""


def _clock_call(node: ast.AST) -> str:
    """`datetime.now()`, `time.time()`, `time.strftime(...)` (of the current time) in `node`: its code, else ""."""
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        func = ast_dotted(call.func)
        head, last = func.split(".")[0], func.rsplit(".", 1)[-1]
        if head in ("datetime", "time", "date") and (last in _CLOCKS or last == "strftime" and len(call.args) < 2):
            return f"`{ast.unparse(call)[:40]}`"
    return ""


def _clocked(defn: ast.AST) -> dict[str, str]:
    """Names (`log_dir`, `args.log_dir`) a definition binds to a value built from the clock -> that clock call."""
    out: dict[str, str] = {}
    assigns = [n for n in ast.walk(defn) if isinstance(n, ast.Assign)]
    changed = True
    while changed:
        changed = False
        for a in assigns:
            names = (ast_dotted(n) for n in ast.walk(a.value) if isinstance(n, (ast.Name, ast.Attribute)))
            stamp = _clock_call(a.value) or next((out[d] for d in names if d in out), "")
            for name in (ast_dotted(t) for t in a.targets if ast_dotted(t)) if stamp else ():
                if name not in out:
                    out[name] = stamp
                    changed = True
    return out


def _stamped(call: ast.Call, clocked: dict[str, str]) -> str:
    """Where the path a write is given (its first argument) comes from the clock: that clock call, else ""."""
    for path in call.args[:2]:  # `os.makedirs(path)`, `np.save(path, a)`, `torch.save(obj, path)`
        if isinstance(path, (ast.Name, ast.Attribute, ast.JoinedStr, ast.BinOp)) or isinstance(path, ast.Call) and \
                ast_dotted(path.func).rsplit(".", 1)[-1] in ("join", "Path", "format", "str"):
            stamp = _clock_call(path) or next((clocked[d] for d in (ast_dotted(n) for n in ast.walk(path) if isinstance(
                n, (ast.Name, ast.Attribute))) if d in clocked), "")
            if stamp:
                return stamp
    return ""


_MUTATES = {"append", "extend", "insert", "pop", "update", "setdefault", "add", "clear", "remove", "discard",
            "sort", "reverse"}
_SHARED_WORK = {"backward", "step", "zero_grad", "all_reduce", "all_gather", "broadcast", "barrier", "reduce",
                "scatter", "gather", "init_process_group"}
"""Calls that train or join a collective: code that makes one is never run on rank 0 alone."""


def _own_methods(cls: ast.ClassDef, name: str) -> list[ast.FunctionDef]:
    """The method `name` of a class and the methods of it that it calls through `self.m(...)`, a level at a time."""
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    out, todo = [], [name]
    while todo:
        current = todo.pop()
        if current not in methods or methods[current] in out:
            continue
        out.append(methods[current])
        todo += [n.func.attr for n in ast.walk(methods[current]) if isinstance(n, ast.Call) and isinstance(
            n.func, ast.Attribute) and ast_dotted(n.func.value) == "self"]
    return out


def _writes_in(defns: list[ast.AST]) -> tuple[int, str] | None:
    """(line, call) of the first file write, savefig or process a definition makes, itself; None where it makes
    none, or where it also trains, joins a collective or hands back a value (then it is not a report alone)."""
    found = None
    for defn in defns:
        params = {a.arg for a in defn.args.posonlyargs + defn.args.args + defn.args.kwonlyargs} - {"self"} \
            if isinstance(defn, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
        for node in ast.walk(defn):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            if any(isinstance(t, (ast.Attribute, ast.Subscript)) and _root(t) in params for t in targets) or (
                    isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _root(node.func.value)
                    in params and node.func.attr in _MUTATES):
                return None  # it changes what its caller handed it: on rank 0 alone, the ranks' values part
            if isinstance(node, ast.Return) and node.value is not None and not (
                    isinstance(node.value, ast.Constant) and node.value.value is None):
                return None
            if isinstance(node, (ast.Yield, ast.YieldFrom, ast.Global, ast.Nonlocal)):
                return None
            if not isinstance(node, ast.Call):
                continue
            func = ast_dotted(node.func)
            last = func.rsplit(".", 1)[-1] if func else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
            if last in _SHARED_WORK or func.startswith(("dist.", "torch.distributed")):
                return None
            if found is None and (last in _WRITES and last not in ("makedirs", "mkdir") or func in PROCESSES or (
                    func == "open" and any(isinstance(a, ast.Constant) and isinstance(a.value, str)
                                           and set(a.value) & set("wax+")
                                           for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]))):
                found = (node.lineno, f"`{func or last}(...)`")
    return found


def _instance_calls(tree: ast.Module) -> dict[int, list[ast.Call]]:
    """id(constructor call) of `plotter = Plotter(...)` -> every `plotter.m(...)` call of the script, where the name is
    bound once and used only so (its methods can then be judged where they are called); other names are absent."""
    bound: dict[str, list[ast.Call]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for target in node.targets:
                for name in _names(target):
                    bound.setdefault(name, []).append(node.value)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.withitem, ast.arg)):
            for name in _names(getattr(node, "target", None) or getattr(node, "optional_vars", None) or ast.Name(
                    getattr(node, "arg", ""))):
                bound.setdefault(name, []).append(None)
    calls: dict[str, list[ast.Call]] = {}
    other: set[str] = set()
    methods = {id(n.func.value) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(
        n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            calls.setdefault(node.func.value.id, []).append(node)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and id(node) not in methods:
            other.add(node.id)
    return {id(made[0]): calls.get(name, []) for name, made in bound.items()
            if len(made) == 1 and made[0] is not None and name not in other}


def project_writers(tree: ast.Module, folder: str, modules: dict[str, str]) -> dict[str, tuple[str, int, str] | None]:
    """The script's calls of its own project's code: `report` (a function imported from a module beside it) or
    `Plotter.flush` (a method of a class imported so) -> (file, line, the write) where it only reports into files,
    else None. Such a function writes a file, saves a figure or starts a process, and neither trains, joins a
    collective, returns a value nor changes what it is handed: run as a statement on every rank, each rank writes
    the same files; on rank 0 alone, nothing else changes."""
    parsed: dict[str, ast.Module | None] = {}
    definition = _definer(tree, folder, modules, parsed)
    out: dict[str, tuple[str, int, str] | None] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not ast_dotted(node.func):
            continue
        func = ast_dotted(node.func)
        found = definition(func)
        if found is None:
            continue
        path, _, defn = found
        if isinstance(defn, ast.ClassDef):
            for method in (n.name for n in defn.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
                if not method.startswith("__"):
                    hit = _writes_in(_own_methods(defn, method))
                    out[f"{func}.{method}"] = (path, *hit) if hit else None
        else:
            hit = _writes_in([defn])
            # a function that reaches training through the project's own functions is no report: on rank 0 alone it
            # trains alone, and the other ranks wait for it at their next collective until the timeout
            trains = hit is not None and _trains_in(path, defn, folder, modules, parsed, set()) is not None
            out[func] = (path, *hit) if hit and not trains else None
    return out


def project_loaders(tree: ast.Module, folder: str, modules: dict[str, str]) -> dict[str, str]:
    """The script's calls of its own project's functions that return a torch DataLoader (`loader(dataset, 16)` with
    `def loader(...): return torch.utils.data.DataLoader(...)`, also through a name bound to one) -> their file.
    Every `return` of the function must give one; a DataLoader of another library (graphs) is none."""
    parsed: dict[str, ast.Module | None] = {}
    definition = _definer(tree, folder, modules, parsed)
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        func = ast_dotted(node.func) if isinstance(node, ast.Call) else ""
        found = definition(func) if func and func not in out else None
        if found is None or not isinstance(found[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        path, _, defn = found
        module = _parsed(modules, path, parsed)
        libraries = _library_names(module) if module is not None else {}

        def torch_loader(call: ast.AST) -> bool:
            name = ast_dotted(call.func) if isinstance(call, ast.Call) else ""
            head = name.split(".")[0]
            full = name.replace(head, libraries.get(head, head), 1) if head else ""
            return full in ("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader")

        made: dict[str, list[ast.AST]] = {}
        for n in ast.walk(defn):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    for name in _names(t):
                        made.setdefault(name, []).append(n.value if isinstance(t, ast.Name) else None)
        returns = [r.value for r in ast.walk(defn) if isinstance(r, ast.Return)]
        if returns and all(torch_loader(v) or isinstance(v, ast.Name) and made.get(v.id) and all(
                torch_loader(m) for m in made[v.id]) for v in returns):
            out[func] = path
    return out


def project_groups(tree: ast.Module, folder: str, modules: dict[str, str]) -> dict[str, list[tuple[int, str]]]:
    """The script's calls of its own project's functions that build an optimizer's parameters from a module handed
    in (`add_weight_decay(model, 1e-5)` with `def add_weight_decay(model, ...): for name, p in
    model.named_parameters(): ...; return [{"params": ...}]`) -> (position, name) of each such parameter: the module
    that optimizer trains."""
    parsed: dict[str, ast.Module | None] = {}
    definition = _definer(tree, folder, modules, parsed)
    out: dict[str, list[tuple[int, str]]] = {}
    for node in ast.walk(tree):
        func = ast_dotted(node.func) if isinstance(node, ast.Call) else ""
        found = definition(func) if func and func not in out else None
        if found is not None and isinstance(found[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
            handed = module_parameters(found[2])
            if handed:
                out[func] = handed
    return out


def module_parameters(defn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[int, str]]:
    """(position, name) of each parameter of a function that returns a value and reads the parameter's
    `.parameters()` or `.named_parameters()`."""
    params = [a.arg for a in defn.args.posonlyargs + defn.args.args]
    read = {ast_dotted(n.func.value) for n in ast.walk(defn) if isinstance(n, ast.Call) and isinstance(
        n.func, ast.Attribute) and n.func.attr in ("parameters", "named_parameters")}
    returns = any(isinstance(r, ast.Return) and r.value is not None for r in ast.walk(defn))
    return [(i, p) for i, p in enumerate(params) if p in read] if returns else []


_BUILDS_TRAINING = {"parameters", "DataLoader", "DistributedDataParallel", "DataParallel"}
"""Calls that set training up: an optimizer over a model's parameters, a loader, a data-parallel wrapper."""


def _trains_in(path: str, defn: ast.AST, folder: str, modules: dict[str, str], parsed: dict[str, ast.Module | None],
               seen: set[int]) -> tuple[str, int, str] | None:
    """(file, line, call) of the first call `defn` makes, itself or through the project's functions it calls in turn
    (a level at a time, as `_downloads_in` follows them), that trains, builds training (an optimizer over a model's
    parameters, a loader) or joins a collective; None where none is reached. Code that reaches one must run on every
    rank: on rank 0 alone it trains alone, and the others wait at their next collective until its timeout."""
    if id(defn) in seen or len(seen) > 40:
        return None
    seen.add(id(defn))
    module = _parsed(modules, path, parsed)
    imported = _local_imports(module, modules, os.path.dirname(path), parsed) if module is not None else {}
    calls = [n for n in ast.walk(defn) if isinstance(n, ast.Call)]
    for call in calls:
        func = ast_dotted(call.func) or (call.func.attr if isinstance(call.func, ast.Attribute) else "")
        last = func.rsplit(".", 1)[-1]
        if last in _SHARED_WORK or last in _BUILDS_TRAINING or func.startswith(("dist.", "torch.distributed")):
            return path, call.lineno, f"{func}(...)"
    for call in calls:
        func = ast_dotted(call.func)
        head, _, rest = func.partition(".")
        if not func or "." in rest:
            continue
        if not rest:
            found = _resolve(modules, folder, path, func, parsed) or (_resolve(
                modules, folder, imported[func][0], imported[func][1], parsed) if imported.get(func, ("", None))[1]
                else None)
        elif head in imported and imported[head][1] is None:
            found = _resolve(modules, folder, imported[head][0], rest, parsed)
        else:
            continue
        inner = found[1] if found is not None else None
        if isinstance(inner, ast.ClassDef):
            inner = next((n for n in inner.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        hit = _trains_in(found[0], inner, folder, modules, parsed, seen) if inner is not None else None
        if hit is not None:
            return hit
    return None


def project_downloads(tree: ast.Module, folder: str, modules: dict[str, str]) -> dict[str, tuple[str, int, bool]]:
    """The script's calls of its own project's functions and classes (`getMnistLoader(config)`, `data.load(...)`)
    whose code, followed through the project's functions it calls in turn, downloads: a call with a `download=`
    that is not False/None, or a known download helper (ddpkit.port.effects.DOWNLOADS) -> (file, line of that
    download, whether that code also trains or joins a collective, so rank 0 cannot run it first alone); the file
    is named relative to the script's folder."""
    parsed: dict[str, ast.Module | None] = {}
    definition = _definer(tree, folder, modules, parsed)
    out: dict[str, tuple[str, int, bool]] = {}
    made = _instance_calls(tree)
    for node in ast.walk(tree):
        func = ast_dotted(node.func) if isinstance(node, ast.Call) else ""
        found = definition(func) if func and func not in out else None
        if found is not None:
            defns = [found[2]] if not isinstance(found[2], ast.ClassDef) else _own_methods(found[2], "__init__")
            hit = next((h for d in defns if (h := _downloads_in(found[0], d, folder, modules, parsed, set()))), None)
            if hit is not None:
                out[func] = (os.path.relpath(hit[0], folder), hit[1], hit[2], *hit[3:])
        if found is not None and isinstance(found[2], ast.ClassDef) and (calls := made.get(id(node))):
            # `data = DataSet(...)` then `data.get_loaders()`: the method runs where it is called, and downloads there
            for call in calls:
                method, name = call.func.attr, ast_dotted(call.func)
                hit = None if name in out else next((h for d in _own_methods(found[2], method) if (
                    h := _downloads_in(found[0], d, folder, modules, parsed, set()))), None)
                if hit is not None:
                    out[name] = (os.path.relpath(hit[0], folder), hit[1], hit[2], *hit[3:])
    return out


_RAW_FETCHES = {"requests.get", "urllib.request.urlretrieve", "urlretrieve", "request.urlretrieve", "urlopen",
                "urllib.request.urlopen", "wget.download", "gdown.download"}
"""Calls that fetch a URL every time they run: unlike a library's dataset (`MNIST(download=True)` checks its
files first), a second rank running one after rank 0 downloads and writes the same files again."""
_DISK_TESTS = {"exists", "isfile", "isdir", "listdir", "glob", "is_file", "is_dir", "iterdir"}


def _checks_disk(test: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and (ast_dotted(n.func) or "").rsplit(".", 1)[-1] in _DISK_TESTS
               for n in ast.walk(test))


def _unchecked(defn: ast.AST, call: ast.Call) -> bool:
    """`call` runs in `defn` whatever is on disk: no `if` around it tests a file's existence, and no such `if` before
    it returns early."""
    parents = {id(c): p for p in ast.walk(defn) for c in ast.iter_child_nodes(p)}
    node = parents.get(id(call))
    while node is not None:
        if isinstance(node, (ast.If, ast.While, ast.IfExp)) and _checks_disk(node.test):
            return False
        node = parents.get(id(node))
    return not any(isinstance(n, ast.If) and _checks_disk(n.test) and any(isinstance(b, (ast.Return, ast.Raise))
                   for b in n.body) for n in ast.walk(defn))


def _downloads_in(path: str, defn: ast.AST, folder: str, modules: dict[str, str], parsed: dict[str, ast.Module | None],
                  seen: set[int]) -> tuple[str, int, bool] | None:
    """(file, line, joins) of the first download `defn` makes, itself or through the project's code it calls."""
    if id(defn) in seen or len(seen) > 40:
        return None
    seen.add(id(defn))
    module = _parsed(modules, path, parsed)
    imported = _local_imports(module, modules, os.path.dirname(path), parsed) if module is not None else {}
    calls = [n for n in ast.walk(defn) if isinstance(n, ast.Call)]
    joins = any((ast_dotted(c.func) or "").rsplit(".", 1)[-1] in _SHARED_WORK for c in calls)
    libraries = _library_names(module) if module is not None else {}
    for call in calls:
        func = ast_dotted(call.func)
        if func in _RAW_FETCHES:  # a 4th item where it fetches again wherever it runs
            return (path, call.lineno, joins, f"`{func}(...)`") if _unchecked(defn, call) else (
                path, call.lineno, joins)
    for call in calls:
        func = ast_dotted(call.func)
        head, _, rest = func.partition(".")
        # `CoraGraphDataset()` imported from dgl.data: a library class that downloads when it is made
        if head in libraries and FETCHES.match(f"{libraries[head]}.{rest}" if rest else libraries[head]):
            return path, call.lineno, joins
        if func and DOWNLOADS.search(func) or any(
                k.arg == "download" and not (isinstance(k.value, ast.Constant) and k.value.value in (False, None))
                for k in call.keywords):
            return path, call.lineno, joins
    targets = []
    for call in calls:
        func = ast_dotted(call.func)
        head, _, rest = func.partition(".")
        if not func:  # `_factory[name](cfg)`: any of the functions the module's table holds may run
            targets += [(call, _resolve(modules, folder, path, n, parsed)) for n in table_entries(module, call.func)]
        elif "." in rest:
            continue
        elif not rest:
            targets.append((call, _resolve(modules, folder, path, func, parsed) or (_resolve(
                modules, folder, imported[func][0], imported[func][1], parsed) if imported.get(func, ("", None))[1]
                else None)))
        elif head in imported and imported[head][1] is None:
            targets.append((call, _resolve(modules, folder, imported[head][0], rest, parsed)))
    for call, found in targets:
        if found is None:
            continue
        inner = found[1]
        if isinstance(inner, ast.ClassDef):
            inner = next((n for n in inner.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        hit = _downloads_in(found[0], inner, folder, modules, parsed, seen) if inner is not None else None
        if hit is not None:
            # a fetch that runs again is so only where this call of it is not behind a check of the disk either
            again = hit[3:] if len(hit) > 3 and _unchecked(defn, call) else ()
            return (hit[0], hit[1], hit[2] or joins, *again)
    return None


def _library_names(module: ast.Module) -> dict[str, str]:
    """Name bound by a module's absolute imports -> the dotted name it was imported as (`CoraGraphDataset` ->
    `dgl.data.CoraGraphDataset`, `tfds` -> `tensorflow_datasets`)."""
    out: dict[str, str] = {}
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _definer(tree: ast.Module, folder: str, modules: dict[str, str], parsed: dict[str, ast.Module | None]):
    """Resolves a call of the ported script to (file, name, definition) in the project's own code, else None."""
    imported = _local_imports(tree, modules, folder, parsed)
    aliases = {t.id: n.value.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name)
               and n.value.id in imported for t in n.targets if isinstance(t, ast.Name) and t.id not in imported}

    def definition(func: str) -> tuple[str, str, ast.AST] | None:
        """(file, name, definition) of a call of the project's own code (`Trainer`, `utils.save`, `Exp` after `Exp =
        Exp_Main`), else None."""
        head, _, rest = func.partition(".")
        head = aliases.get(head, head)
        if head not in imported or (imported[head][1] is None) == (not rest) or "." in rest:
            return None
        path, defined = imported[head]
        found = _resolve(modules, folder, path, defined or rest, parsed)
        return (found[0], defined or rest, found[1]) if found is not None else None
    return definition


def _through_builders(definition, folder: str, modules: dict[str, str], parsed: dict[str, ast.Module | None]):
    """`definition` that sees through a builder function of the project (`def get_model(args): ... net =
    Net(...); return net`) to the first class it returns, resolved as the builder's own module imports it."""
    def resolve(func: str) -> tuple[str, str, ast.AST] | None:
        found = definition(func)
        if found is None or not isinstance(found[2], ast.FunctionDef):
            return found
        path, builder = found[0], found[2]
        made = {t.id: ast_dotted(n.value.func) for n in ast.walk(builder) if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Call) for t in n.targets if isinstance(t, ast.Name)}
        for ret in ast.walk(builder):
            if not isinstance(ret, ast.Return) or ret.value is None:
                continue
            cls = ast_dotted(ret.value.func) if isinstance(ret.value, ast.Call) else made.get(ast_dotted(ret.value), "")
            got = _resolve(modules, folder, path, cls, parsed) if cls and "." not in cls else None
            if got is not None and isinstance(got[1], ast.ClassDef):
                return got[0], cls, got[1]
        return found
    return resolve


def _builders(tree: ast.Module, classes: dict[str, str]) -> dict[str, list[str]]:
    """Name -> every constructor it is bound to anywhere in the script (`model = UNet(...)` in one branch,
    `model = PSPNet(...)` in another), the one the wrap saw first."""
    out = {name: [cls] for name, cls in classes.items()}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _built(node.value):
            for target in node.targets:
                for name in _names(target):
                    if _built(node.value) not in out.setdefault(name, []):
                        out[name].append(_built(node.value))
    return out


def unused_parameter_wraps(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[ast.Call, str]]:
    """(wrap call, note) for each `ddpkit.wrap` of a model built by a class of the project's own modules that may
    leave a parameter without gradient (see ddpkit.port.weights.unused_wraps): that wrap needs
    find_unused_parameters=True."""
    classes: dict[str, str] = {}
    _handed(tree, classes)
    parsed: dict[str, ast.Module | None] = {}
    definition = _through_builders(_definer(tree, folder, modules, parsed), folder, modules, parsed)
    own = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}  # the script's own classes: file ""
    return unused_wraps(tree, _builders(tree, classes), lambda name: ("", name, own[name]) if name in own else
                        definition(name), _follower(tree, folder, modules, parsed))


def plain_class_wraps(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[ast.Call, str, str]]:
    """(wrap call, bound name, message) for each `ddpkit.wrap` of an object whose class, of the script or of the
    project's own modules, is no nn.Module (see ddpkit.port.wrapped.plain_wraps)."""
    parsed: dict[str, ast.Module | None] = {}
    definition = _definer(tree, folder, modules, parsed)
    own = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}  # the script's own classes: file ""
    return plain_wraps(tree, lambda name: ("", name, own[name]) if name in own else definition(name),
                       _follower(tree, folder, modules, parsed))


def _follower(tree: ast.Module, folder: str, modules: dict[str, str], parsed: dict[str, ast.Module | None]):
    """(name, file) -> (file, definition) as that module of the project sees the name; file "" is the script."""
    own = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    imported = _local_imports(tree, modules, folder, parsed)

    def follow(name: str, where: str) -> tuple[str, ast.AST] | None:
        if where:
            return _resolve(modules, folder, where, name, parsed)
        if name in own:
            return "", own[name]
        if name in imported and imported[name][1] is not None:
            return _resolve(modules, folder, imported[name][0], imported[name][1], parsed)
        return None
    return follow


_RUN_STARTS = {"wandb.init": "W&B", "mlflow.start_run": "MLflow"}
"""Library calls that start the run the library's module-level functions then log to."""


def _imported_as(module: ast.Module) -> dict[str, str]:
    """The names a module binds to imported libraries: {"wb": "wandb"} for `import wandb as wb`."""
    return {a.asname or a.name: a.name for n in module.body if isinstance(n, ast.Import) for a in n.names
            if "." not in a.name}


def _started_on_rank0(tree: ast.Module, guarded: set[int]) -> dict[str, str]:
    """{library: its name} for the runs the ported script starts on rank 0 only (`if ctx.is_main: wandb.init()`)."""
    names = _imported_as(tree)
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) in guarded:
            head, _, rest = ast_dotted(node.func).partition(".")
            what = _RUN_STARTS.get(f"{names.get(head, head)}.{rest}")
            if what is not None:
                out[names.get(head, head)] = what
    return out


def _logs_to_rank0_run(defn: ast.AST, module: ast.Module | None, started: dict[str, str]) -> list[tuple[int, str]]:
    """`wandb.log(...)` in code every rank runs, where the script starts the W&B run on rank 0 only: the other ranks
    have no run (wandb raises; mlflow starts a run of each rank's own). Classes (`wandb.Image`) need no run."""
    names = _imported_as(module) if module is not None else {}
    out = []
    for node in ast.walk(defn) if started else ():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value,
                                                                                           ast.Name):
            library = names.get(node.func.value.id, "")
            if library in started and node.func.attr[:1].islower() and \
                    f"{library}.{node.func.attr}" not in _RUN_STARTS:
                out.append((node.lineno, f"`{ast.unparse(node.func)}(...)` uses the {started[library]} run the "
                                         "port starts on rank 0 only: the other ranks have none (rank 0 only: "
                                         "`if ctx.is_main:`)"))
    return out


def _wrapped_later(tree: ast.Module, parents: dict[int, ast.AST], call: ast.Call) -> set[str]:
    """Names the ported script wraps (`net = ddpkit.wrap(net, ctx)`) only after `call`, in the same function and
    with no loop around the call: there the call gets the bare model (`coder = BoxCoder(net)` reading `net.steps`
    before the optimizer is made), not the DDP wrapper."""
    def around(node: ast.AST) -> tuple[ast.AST, bool]:
        looped = False
        while id(node) in parents and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node = parents[id(node)]
            looped = looped or isinstance(node, (ast.For, ast.While, ast.AsyncFor))
        return node, looped

    scope, looped = around(call)
    wraps: dict[str, list[tuple[int, ast.AST]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                ast_dotted(node.value.func) == "ddpkit.wrap":
            for target in node.targets:
                wraps.setdefault(ast_dotted(target), []).append((node.lineno, around(node)[0]))
    return set() if looped else {name for name, sites in wraps.items() if name and all(
        where is scope and line > call.lineno for line, where in sites)}


def project_hazards(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the ported script, `not checked:` message) where it hands a changed object to its own module's code
    that does something which breaks under DDP. Silent where that code does none of these things."""
    classes: dict[str, str] = {}
    kinds = _handed(tree, classes)
    parsed: dict[str, ast.Module | None] = {}
    aliases: dict[str, set[str]] = {}
    forwarded: set[str] = set()
    guarded = _rank_guarded(tree)
    started = _started_on_rank0(tree, guarded)
    out: list[tuple[int, str]] = []
    definition = _definer(tree, folder, modules, parsed)
    split = split_sizes(tree)
    sizes = set().union(*split.values()) if split else set()
    divided = bool(divided_sizes(tree))  # a settings key named like a batch is divided only where some loader's is
    for root, keys in split.items():  # the value divided for the loader, read elsewhere as the batch's size
        kinds.setdefault(root, "config" if keys else "size")
    shared = {root: imported for root, imported in _local_imports(tree, modules, folder, parsed).items()
              if split.get(root) and imported[1] is not None}
    """Settings objects the script imports from a module of the project (`from config import cfg`)."""

    def follower(path: str) -> Follow:
        return lambda name, where=path: _resolve(modules, folder, where, name, parsed)

    instances: dict[str, tuple[str, ast.ClassDef, dict[str, str]]] = {}
    """`trainer = Trainer(SomeEngine, cfg)`: its file, class and what its __init__ stores on self (`self.engine`:
    the project code it was handed, as "code:<file>:<name>")."""
    for node in ast.walk(tree):  # `trainer = Trainer(model, ...)` keeps it as self.model: `trainer.model` is it
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                isinstance(node.value, ast.Call):
            found = definition(ast_dotted(node.value.func))
            if found is not None and isinstance(found[2], ast.ClassDef):
                for key, kind in _received(node.value, found[2], kinds).items():
                    if key.startswith("self."):
                        kinds.setdefault(f"{node.targets[0].id}.{key[5:]}", kind)
                code = {ast_dotted(a): f"code:{got[0]}:{got[1]}" for a in [*node.value.args, *(
                    k.value for k in node.value.keywords)] if (got := definition(ast_dotted(a))) is not None}
                stored = {k: v for k, v in _received(node.value, found[2], {**kinds, **code}).items()
                          if k.startswith("self.")}
                instances[node.targets[0].id] = (found[0], found[2], stored)
    for node in ast.walk(tree):  # `trained = train(model, ...)` where train ends `return model`: the wrapper again
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                (found := definition(ast_dotted(node.value.func))) is not None and \
                isinstance(found[2], (ast.FunctionDef, ast.AsyncFunctionDef)):
            got = _received(node.value, found[2], kinds)
            if any(isinstance(r, ast.Return) and r.value is not None and got.get(ast_dotted(r.value)) == "model"
                   for r in ast.walk(found[2])):
                for target in node.targets:
                    kinds.setdefault(ast_dotted(target), "model") if ast_dotted(target) else None
    instance_calls = _instance_calls(tree)
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = ast_dotted(node.func)
        received: dict[str, str] = {}
        if isinstance(node.func, ast.Name) and kinds.get(func) == "model" and func in classes and \
                any(_kind_of(a, kinds) == "batch" for a in node.args) and classes[func] not in forwarded:
            forwarded.add(classes[func])  # the model's own forward gets the batches on the rank's device
            func, received = classes[func], {"forward": "batch"}
        found = definition(func)
        head, _, method = func.partition(".")
        if found is None and head in instances and method and "." not in method:
            # `trainer.fit(model, ...)` on an instance of a project class: the method gets what the call and its
            # __init__ handed it (self.engine_class: the class it builds around the model)
            path, cls, stored = instances[head]
            defn = next((n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                         and n.name == method), None)
            if defn is None or not defn.args.args or defn.args.args[0].arg != "self":
                continue
            handed = _received(ast.Call(node.func, [ast.Name("\0"), *node.args], node.keywords), defn, kinds)
            if "model" not in handed.values():
                continue
            found, received = (path, f"{cls.name}.{method}", defn), {**stored, **handed}
        if found is None:
            continue
        path, name, defn = found
        module = _parsed(modules, path, parsed)
        bare = _wrapped_later(tree, parents, node)
        received = received or _received(node, defn, {k: v for k, v in kinds.items() if k not in bare})
        reached: list[tuple[str, int, str]] = []
        for root, (source, defined) in shared.items():  # the module reads the same settings object by importing it
            if module is not None and (source, defined) == _local_imports(module, modules, folder, parsed).get(root):
                received = {**received, root: "config"}
        if path not in aliases:
            aliases[path] = _legacy_aliases(module)
        devices = fixed_devices(module)
        if not received:  # handed nothing that changed: still every rank's code, so what it writes is checked, and
            # a GPU it picks itself (`torch.device("cuda:0")`) is rank 0's on every rank
            parts = [defn]
            if isinstance(defn, ast.ClassDef) and (calls := instance_calls.get(id(node))) is not None:
                parts = _own_methods(defn, "__init__")  # each method is judged at its own calls (rank 0's or not)
                for call in calls:
                    if id(call) in guarded or isinstance(call.func, ast.Name):
                        continue
                    method = call.func.attr
                    writes = sorted({h for m in _own_methods(defn, method) for h in _hazards(m, {}, False)
                                     if _every_rank(h[1])})
                    if writes:
                        where = os.path.basename(path)
                        out.append((call.lineno, f"not checked: `{name}.{method}` in {where} (read, not ported) runs "
                                                 "on every rank; check each under DDP:" + _items(
                                                     f"{where}:{line} {h}" for line, h in sorted(
                                                         writes, key=lambda w: (_blocker_rank(w[1]), w)))))
            hazards = [] if id(node) in guarded else sorted(
                {h for part in parts for h in _hazards(part, {}, False, devices=devices) if _every_rank(h[1])})
            # and what the project's functions and classes it calls in turn do there (`Net` building a layer
            # class whose forward puts a tensor on cuda:0, a factory wrapping in nn.DataParallel, a save helper)
            reached = [] if id(node) in guarded else _reached_hazards(path, parts, folder, modules, parsed)
            what = "runs on every rank"
        else:
            hazards = sorted(set(_hazards(defn, received, id(node) in guarded, aliases[path], follower(path),
                                          devices=devices, sizes=sizes, divided=divided)))
            # the model's forward (`received` set above) was read whole where the script built the model
            reached = [] if id(node) in guarded or received.get("forward") == "batch" else _reached_hazards(
                path, [defn], folder, modules, parsed)
            handed = ", ".join(sorted({"size": "global batch size", "holds model": "model (in a dict, list or tuple)"}.get(
                k, k) for k in set(received.values()) - {
                "unwrapped"} if not k.startswith("code:")) or ["the unwrapped model"])
            what = f"gets the {handed}"
        if id(node) not in guarded:
            hazards = sorted({*hazards, *(h for part in ([defn] if received else parts)
                                          for h in _logs_to_rank0_run(part, module, started))})
        if hazards or reached:
            where = os.path.basename(path)
            lines: dict[tuple[str, str], list[int]] = {}  # one message, every line it holds at
            for at, line, h in [(where, line, h) for line, h in hazards] + reached:
                lines.setdefault((at, h), []).append(line) if line not in lines.get((at, h), []) else None
            files = {h: f for f, h in lines}
            # what the called code itself does first (`model.heads = 1` there), then what its callees do
            grouped = sorted(((sorted(at), h) for (_, h), at in lines.items()),
                             key=lambda g: (_blocker_rank(g[1]), files[g[1]] != where, g))
            out.append((node.lineno, f"not checked: `{name}` in {where} (read, not ported) {what}; check each "
                                     "under DDP:" + _items(f"{files[h]}:{', '.join(map(str, at))} {h}"
                                                           for at, h in grouped)))
    out += _summed_elsewhere(tree, definition)
    compared = _compared_in_batch(tree, definition)
    out += compared + _handed_in_batch(tree, definition, folder, modules, parsed, {line for line, _ in compared})
    out += unused_in_wrapped(tree, _builders(tree, classes), _through_builders(definition, folder, modules, parsed),
                             _follower(tree, folder, modules, parsed))
    out += used_outside_forward(tree, _builders(tree, classes), _through_builders(definition, folder, modules, parsed),
                                _follower(tree, folder, modules, parsed))
    out += trained_elsewhere(tree, definition)
    own = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}  # the script's own classes: file ""

    def own_or_project(name: str) -> tuple[str, str, ast.AST] | None:
        return ("", name, own[name]) if name in own else _through_builders(definition, folder, modules, parsed)(name)

    def follow(name: str, where: str) -> tuple[str, ast.AST] | None:
        return ("", own[name]) if not where and name in own else follower(where)(name) if where else None
    out += host_inputs_in_wrapped(tree, _builders(tree, classes), own_or_project, follow)
    out += cpu_tensors_in_wrapped(tree, _builders(tree, classes), definition)
    out += plain_tensor_members(tree, _builders(tree, classes), own_or_project, follow)
    out += filled_buffers_in_wrapped(tree, _builders(tree, classes), own_or_project, follow)
    if any("`module.`" in message for _, message in out):
        out += strict_loads(tree, definition, follower)
    return out


def _chosen_in(defn: ast.AST, devices: set[str]) -> set[str]:
    """`devices` and the names and attributes the code binds to a GPU it picks itself, directly or through another
    such name (`device = 'cuda:0'`, then `self.device = device`): `self.to(self.device)` is then GPU 0 on every rank."""
    found = set(devices)
    assigns = [n for n in ast.walk(defn) if isinstance(n, ast.Assign)]
    for _ in range(3):
        more = {ast_dotted(t) for a in assigns if fixed_device(a.value, found) for t in a.targets if ast_dotted(t)}
        if more <= found:
            break
        found |= more
    return found


def _device_names(module: ast.Module) -> set[str]:
    """Module-level names bound to a CUDA device: `device = torch.device("cuda" if ... else "cpu")`, `dev = "cuda"`,
    also in a branch of the module's own `if` (`if USE_GPU: device = torch.device("cuda")`)."""
    return {n for s in _module_level(module) if isinstance(s, ast.Assign) and any(
        isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.startswith("cuda")
        for c in ast.walk(s.value)) for t in s.targets for n in _names(t)}


def _module_level(module: ast.Module) -> list[ast.stmt]:
    """The statements a module runs when it is imported (into if/try/with blocks, not into functions or classes)."""
    out, todo = [], list(module.body)
    while todo:
        stmt = todo.pop(0)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare) and ast_dotted(stmt.test.left) == "__name__":
            continue  # `if __name__ == "__main__":` never runs on import
        if isinstance(stmt, (ast.If, ast.Try, ast.With, ast.For)):
            todo[:0] = [s for block in ("body", "orelse", "finalbody") for s in getattr(stmt, block, [])] + [
                s for h in getattr(stmt, "handlers", []) for s in h.body]
            continue
        out.append(stmt)
    return out


def _cuda_at_import(module: ast.Module) -> tuple[int, str] | None:
    """The first statement a module runs at import that puts a tensor or the current device on a GPU."""
    devices = _device_names(module)

    def on_gpu(expr: ast.AST) -> bool:
        return (isinstance(expr, ast.Constant) and isinstance(expr.value, str) and expr.value.startswith("cuda")) \
            or ast_dotted(expr) in devices
    for stmt in _module_level(module):
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Call):
                continue
            func = ast_dotted(node.func)
            method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            if method == "cuda" or func == "torch.cuda.set_device" or method == "to" and any(
                    on_gpu(a) for a in node.args) or any(k.arg == "device" and on_gpu(k.value) for k in node.keywords):
                return stmt.lineno, ast.unparse(stmt)
    return None


_PINNING = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
"""Environment variables that choose which GPUs a process sees."""


def _pins_at_import(module: ast.Module) -> tuple[int, str] | None:
    """The first statement a module runs at import that sets which GPUs the process sees
    (`os.environ["CUDA_VISIBLE_DEVICES"] = "0"`, `os.environ.setdefault(...)`, `os.putenv(...)`)."""
    def pins(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in _PINNING
    for stmt in _module_level(module):
        for node in ast.walk(stmt):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) and \
                    ast_dotted(node.value) == "os.environ" and pins(node.slice):
                return stmt.lineno, ast.unparse(stmt)
            if isinstance(node, ast.Call) and ast_dotted(node.func) in ("os.environ.setdefault", "os.putenv") and \
                    node.args and pins(node.args[0]) or isinstance(node, ast.Call) and ast_dotted(node.func) == \
                    "os.environ.update" and any(k.arg in _PINNING for k in node.keywords) or isinstance(
                    node, ast.Call) and ast_dotted(node.func) == "os.environ.update" and any(
                    isinstance(a, ast.Dict) and any(pins(k) for k in a.keys) for a in node.args):
                return stmt.lineno, ast.unparse(stmt)
    return None


def _downloads_at_import(module: ast.Module) -> tuple[int, str] | None:
    """The first statement a module runs at import that downloads (`nltk.download("punkt")`, a library dataset that
    fetches when made, a `download=` that is not False/None, a known download helper), resolved through its imports."""
    libraries = _library_names(module)
    for stmt in _module_level(module):
        for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
            func = ast_dotted(call.func)
            head, _, rest = func.partition(".")
            if head in libraries and FETCHES.match(f"{libraries[head]}.{rest}" if rest else libraries[head]) or \
                    func and DOWNLOADS.search(func) or any(k.arg == "download" and not (isinstance(
                        k.value, ast.Constant) and k.value.value in (False, None)) for k in call.keywords):
                return stmt.lineno, ast.unparse(stmt)
    return None


_AT_IMPORT = (
    (_pins_at_import, "each rank then sees only those GPUs, and a rank whose local_rank is past them has no device",
     "delete that line in {where} (the launcher gives each rank its GPU) or move it under "
     "`if __name__ == \"__main__\":`"),
    # no ctx exists at import: rank 0 cannot go first there
    (_downloads_at_import, "every rank downloads into the same files at once",
     "move that line in {where} into a function the script calls after ddpkit.init, between `if not ctx.is_main: "
     "ddpkit.barrier(ctx)` and `if ctx.is_main: ddpkit.barrier(ctx)`, or fetch the files once before launching"))
"""What a project module may do at its top level that breaks every rank, named at the script's import of it:
(finder, what goes wrong, the fix)."""


def import_device_work(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of an import of the script's own module, message) where that module, when imported at the top of the
    script (before `ddpkit.init` makes each rank's GPU current), makes tensors on a GPU (`not checked:`: on every
    rank they land on cuda:0, and meet rank 1's tensors on cuda:1 later), sets which GPUs the process sees
    (CUDA_VISIBLE_DEVICES: rank 1 then has no GPU of its own) or downloads (every rank into the same files at once)."""
    init = min((n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and ast_dotted(n.func) == "ddpkit.init"),
               default=None)
    parsed: dict[str, ast.Module | None] = {}
    out: list[tuple[int, str]] = []
    for stmt in tree.body:
        if not isinstance(stmt, (ast.Import, ast.ImportFrom)) or init is None or stmt.lineno > init:
            continue
        for path in _imported_paths(stmt, modules, folder):
            module = _parsed(modules, path, parsed)
            for finder, harm, fix in _AT_IMPORT:
                found = finder(module) if module is not None else None
                if found:
                    where = os.path.basename(path)
                    out.append((stmt.lineno, f"importing {where} runs {where}:{found[0]} "
                                             f"`{' '.join(found[1].split())}` on every rank before ddpkit.init: {harm}; "
                                             + fix.format(where=where)))
        seen: set[str] = set()
        for path, _ in _local_imports(ast.Module(body=[stmt], type_ignores=[]), modules, folder, parsed).values():
            module = _parsed(modules, path, parsed)
            found = _cuda_at_import(module) if module is not None and path not in seen else None
            seen.add(path)
            if found:
                where = os.path.basename(path)
                text = " ".join(found[1].split())
                text = text if len(text) <= 70 else text[:67] + "..."
                out.append((stmt.lineno, f"not checked: importing {where} runs {where}:{found[0]} `{text}` before "
                                         "ddpkit.init makes each rank's GPU current, so that tensor is on cuda:0 on "
                                         "every rank; make it inside a function called after ddpkit.init, or import "
                                         "the module after it"))
    return out


def _project_follow(folder: str, modules: dict[str, str], parsed: dict[str, ast.Module | None]) -> Follow:
    """(name, file) -> (file, definition) as module `file` of the project sees `name`: one it defines or imports
    (`save`), or one of a project module it imports whole (`utils.save`)."""
    imports: dict[str, dict[str, tuple[str, str | None]]] = {}

    def follow(name: str, where: str) -> tuple[str, ast.AST] | None:
        head, _, rest = name.partition(".")
        if not rest:
            return _resolve(modules, folder, where, name, parsed)
        if where not in imports:
            module = _parsed(modules, where, parsed) if where in modules else None
            imports[where] = {} if module is None else {
                **_local_imports(module, modules, os.path.dirname(where), parsed),
                **_local_imports(module, modules, folder, parsed)}
        got = imports[where].get(head)
        return _resolve(modules, folder, got[0], rest, parsed) if got is not None and got[1] is None else None
    return follow


def _script_callees(call: ast.Call, definition, instances: dict[str, list[tuple[str, ast.ClassDef]]],  # noqa: ANN001
                    follow: Follow) -> list[tuple[str, ast.AST, tuple | None]]:
    """(file, definition, its class) of the project code a call of the script runs: a function, a class's
    `__init__`, `Class.method(...)`, or `x.method(...)` on an instance the script made of a project class (each
    class `x` is bound to)."""
    func = ast_dotted(call.func)
    head, _, rest = func.partition(".")
    found = definition(func) if func else None
    if found is not None and isinstance(found[2], ast.ClassDef):
        return [hit] if (hit := method_of(found[0], found[2], "__init__", follow)) else []
    if found is not None:
        return [(found[0], found[2], None)] if isinstance(found[2], (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    if not rest or "." in rest:
        return []
    cls = definition(head)
    classes = [(cls[0], cls[2])] if cls is not None and isinstance(cls[2], ast.ClassDef) else instances.get(head, [])
    return [hit for path, c in classes if (hit := method_of(path, c, rest, follow))]


def _script_instances(tree: ast.Module, definition,  # noqa: ANN001
                      follow: Follow) -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Name -> the project classes the script binds it to an instance of (`gan = GAN(args)` in one branch,
    `gan = CGAN(args)` in another, `trainer = trainer_factory(args)` returning one of a dict's classes)."""
    out: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for node in ast.walk(tree):
        found = definition(ast_dotted(node.value.func)) if isinstance(node, ast.Assign) and isinstance(
            node.value, ast.Call) else None
        for path, cls in made_classes(found[0], found[2], follow) if found is not None else []:
            for name in (n for t in node.targets for n in _names(t)):
                if all(c is not cls for _, c in out.get(name, [])):
                    out.setdefault(name, []).append((path, cls))
    return out


def _handed_instances(call: ast.Call,
                      instances: dict[str, list[tuple[str, ast.ClassDef]]]) -> list[tuple[str, ast.ClassDef]]:
    """The project classes of the script's objects a call hands over (`train(model=net)`, `net = Net()`)."""
    return [c for a in [*call.args, *(k.value for k in call.keywords)] if isinstance(a, ast.Name)
            for c in instances.get(a.id, [])]


def _sites_listed(sites: list[Site], folder: str, shown: int = 4) -> str:
    """`GAN.py:215 torch.save, GAN.py:200 savefig (+3 more)`."""
    more = f" (+{len(sites) - shown} more)" if len(sites) > shown else ""
    return ", ".join(where(s, folder) for s in sites[:shown]) + more


def _unnamed(sites: list[Site], named: str) -> list[Site]:
    """The sites the other TODOs (`named`, their text) do not already name (`utils.py:49`, `utils.py:40, 49`)."""
    return [s for s in sites if not re.search(rf"\b{re.escape(os.path.basename(s[0]))}:[\d, ]*\b{s[1]}\b", named)]


def _project_sites(tree: ast.Module, folder: str, modules: dict[str, str], named: str,
                   reach) -> list[tuple[int, str, str, list[Site]]]:  # noqa: ANN001
    """(line of the ported script, "call" or "import", the call's code or the module's file, sites) for each call of
    the script into its project's own code, and each import of a project module whose module-level code runs, where
    `reach` (ddpkit.port.diskwrites.writes_reached, prompts_reached) finds sites on every rank. Calls the port runs
    on rank 0 only are not; a site that `named` (the text of the TODOs already made) names is not said twice."""
    parsed: dict[str, ast.Module | None] = {}
    follow = _project_follow(folder, modules, parsed)
    definition = _definer(tree, folder, modules, parsed)
    instances = _script_instances(tree, definition, follow)
    guarded = _rank_guarded(tree)
    out: list[tuple[int, str, str, list[Site]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and id(node) not in guarded:
            sites = [s for found in _script_callees(node, definition, instances, follow) for s in reach(
                *found[:2], follow, found[2], node, _handed_instances(node, instances))]
            made = definition(ast_dotted(node.func)) if ast_dotted(node.func) and reach is writes_reached else None
            base = writer_class(made[0], made[2], follow) if made and isinstance(made[2], ast.ClassDef) else ""
            sites = [(made[0], made[2].lineno, f"{made[1]} (a {base})")] + sites if base else sites
            sites = _unnamed(list(dict.fromkeys(sites)), named)
            out += [(node.lineno, "call", ast.unparse(node)[:50], sites)] if sites else []
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for path in _imported_paths(node, modules, folder):
                module = _parsed(modules, path, parsed)
                sites = reach(path, ast.Module(_module_level(module), []), follow) if module else []
                out += [(node.lineno, "import", os.path.relpath(path, folder), sites)] if sites else []
    return out


def _runs(kind: str, what: str) -> str:
    """How a message of _project_sites names what runs the project's code: the script's call, or its import."""
    return f"`{what}` runs the project's code" if kind == "call" else f"importing {what} runs its module-level code"


def project_disk_writes(tree: ast.Module, folder: str, modules: dict[str, str],
                        named: str = "") -> list[tuple[int, str]]:
    """(line of the ported script, message) for each call of the script into its project's own code, and each
    import of a project module whose module-level code runs, that writes to the file system on every rank (see
    ddpkit.port.diskwrites): racing writes, FileExistsError, mixed logs. Calls the port runs on rank 0 only are
    not; a write that `named` (the text of the TODOs already made) names is not said twice."""
    return [(line, f"{_runs(kind, what)} on every rank, which writes files: {_sites_listed(sites, folder)}: "
                   "write them on rank 0 only (guard them there by the rank, or put this call under `if ctx.is_main:` "
                   "where it does not train), ddpkit.barrier(ctx) before another rank reads them; make directories "
                   "with exist_ok=True" if kind == "call" else
             f"{_runs(kind, what)} on every rank, which writes files: {_sites_listed(sites, folder)}: move that code "
             "into a function the script calls on rank 0 (`if ctx.is_main:`), or make directories with "
             "exist_ok=True and name files once")
            for line, kind, what, sites in _project_sites(tree, folder, modules, named, writes_reached)]


def _loader_names(tree: ast.Module) -> set[str]:
    """Names the script binds to a DataLoader it builds (`train_loader = DataLoader(...)`)."""
    return {n for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and ast_dotted(node.value.func).endswith("DataLoader") for t in node.targets for n in _names(t)}


def project_cpu_work(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the script, CPU-only sites) for each call of the script that hands a DataLoader it builds to its
    project's own code (`train_model(model, train_loader)`): the operations there that need CPU tensors (see
    ddpkit.port.cpuonly), listed as evaluate.py:11 `y.numpy()`, "" where there are none."""
    parsed: dict[str, ast.Module | None] = {}
    follow = _project_follow(folder, modules, parsed)
    definition = _definer(tree, folder, modules, parsed)
    instances = _script_instances(tree, definition, follow)
    loaders = _loader_names(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id in loaders
                                              for a in [*node.args, *(k.value for k in node.keywords)]):
            found = _script_callees(node, definition, instances, follow)
            sites = [s for f in found for s in cpu_only_reached(*f[:2], follow, f[2], node,
                                                                _handed_instances(node, instances))]
            sites = list(dict.fromkeys(sites))
            out += [(node.lineno, _sites_listed(sites, folder) if sites else "")] if found else []
    return out


def project_prompts(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the ported script, message) for each call of the script into its project's own code, and each
    import of a project module whose module-level code runs, that asks the terminal (`input(...)`) on every rank:
    under torchrun only rank 0 reads stdin, so the other ranks wait for an answer that never comes, or go on with
    another one (a template that picks the dataset)."""
    why = ("only rank 0 reads the terminal under torchrun, so the other ranks wait for an answer or go their own way; "
           "ask on rank 0 and share the answer: `ddpkit.collectives.broadcast_object(ctx, input(...) if ctx.is_main "
           "else None)` after ddpkit.init, or take it as a command-line argument")
    return [(line, f"{_runs(kind, what)} on every rank, which asks the terminal: {_sites_listed(sites, folder)}: "
                   f"{why}")
            for line, kind, what, sites in _project_sites(tree, folder, modules, "", prompts_reached)]


def project_trackers(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the ported script, message) for each call of the script into its project's own code, and each
    import of a project module whose module-level code runs, that starts or records into an experiment tracker's run,
    or opens an environment's window, on every rank: one run per rank (each with 1/world_size of the figures' data),
    and as many windows."""
    why = ("every rank starts its own run (or window) and records its own shard's figures; do it on rank 0 only: "
           "guard those lines there by the rank (`if ctx.is_main:` around this call where it does not train), and "
           "report figures reduced over the ranks")
    return [(line, f"{_runs(kind, what)} on every rank, which reports to an experiment tracker or opens a window: "
                   f"{_sites_listed(sites, folder)}: {why}")
            for line, kind, what, sites in _project_sites(tree, folder, modules, "", trackers_reached)]


def project_bypasses(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the ported script, message) for each call of the script into its project's own training code that
    runs a model through `.module` (ddpkit.port.asks.bypass_of): past the DDP wrapper the port or the TODOs add."""
    why = ("that forward goes past the DDP wrapper, so its gradients are never averaged across ranks and each rank's "
           "copy drifts apart; call the wrapped model itself there (`gen(z)`, its forward), and keep `.module` for "
           "sampling under torch.no_grad(), state_dict() and attributes")
    return [(line, f"`{what}` runs the project's training code on every rank, which calls a model past its DDP "
                   f"wrapper: {_sites_listed(sites, folder)}: {why}")
            for line, kind, what, sites in _project_sites(tree, folder, modules, "", bypasses_reached) if kind == "call"]


def project_orders(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the ported script, message) for each call of the script into its project's own code, and each
    import of a project module whose module-level code runs, that makes a sequence or an index from a set of strings
    on every rank (ddpkit.port.orders): each rank gets its own order."""
    return [(line, f"{_runs(kind, what)} on every rank, which orders a set of strings: {_sites_listed(sites, folder)}: "
                   f"{ORDER_FIX}")
            for line, kind, what, sites in _project_sites(tree, folder, modules, "", orders_reached)]


def project_stops(tree: ast.Module, folder: str, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the ported script, message) for each call of the script into its project's own training code that
    stops (raises, breaks, returns, exits) on a test of this rank's own loss: that rank leaves while the others wait
    for it in their next all-reduce."""
    why = ("under DDP the rank that stops leaves the others waiting in their next backward's all-reduce (a hang until "
           "the timeout); decide the stop on a value every rank shares: reduce the figure first "
           "(`ddpkit.all_reduce_sum(ctx, ...)`, then divide by ctx.world_size) or all-reduce a stop flag, so every "
           "rank stops together")
    return [(line, f"`{what}` runs the project's training code on every rank, which stops on this rank's own loss: "
                   f"{_sites_listed(sites, folder)}: {why}")
            for line, kind, what, sites in _project_sites(tree, folder, modules, "", stops_reached) if kind == "call"]


def _asserts_parallel(defn: ast.AST) -> dict[str, int]:
    """Parameter -> line of `assert isinstance(param, DataParallel)` (any name ending so) in a function."""
    if not isinstance(defn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return {}
    params = set(_parameters(defn))
    out: dict[str, int] = {}
    for node in ast.walk(defn):
        test = node.test if isinstance(node, ast.Assert) else None
        for call in ast.walk(test) if test is not None else ():
            if isinstance(call, ast.Call) and ast_dotted(call.func) == "isinstance" and len(call.args) == 2 and \
                    isinstance(call.args[0], ast.Name) and call.args[0].id in params and any(
                        ast_dotted(c).rsplit(".", 1)[-1].endswith("DataParallel") for c in ast.walk(call.args[1])):
                out.setdefault(call.args[0].id, node.lineno)
    return out


def parallel_asserts(tree: ast.Module, folder: str | None, modules: dict[str, str]) -> list[tuple[int, str]]:
    """(line of the ported script, message) where it hands an argument to a function, of its own or of its project's
    modules (`patch_replication_callback(model)`), that asserts the argument is a DataParallel: the port removed
    nn.DataParallel (DDP replaces it), so the assertion fails on every run."""
    parsed: dict[str, ast.Module | None] = {}
    imported = _local_imports(tree, modules, folder, parsed) if folder is not None else {}
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        name = node.func.id
        where, defn = "this script", _definition(tree, name)
        if defn is None and name in imported and imported[name][1] is not None:
            found = _resolve(modules, folder, imported[name][0], imported[name][1], parsed)
            if found is None:
                continue
            where, defn = os.path.basename(found[0]), found[1]
        checks = _asserts_parallel(defn) if defn is not None else {}
        params = _parameters(defn) if checks else []
        handed = [p for i, p in enumerate(params) if p in checks and (
            i < len(node.args) and not isinstance(node.args[i], ast.Starred)
            or any(k.arg == p for k in node.keywords))]
        for param in handed:
            out.append((node.lineno, f"`{name}(...)` asserts that `{param}` is an nn.DataParallel ({where}:"
                                     f"{checks[param]}), but the port removed nn.DataParallel (DDP replaces it, one "
                                     "process per device): this call fails on every run; delete it (what it patches "
                                     "is DataParallel's own replication)"))
    return out
