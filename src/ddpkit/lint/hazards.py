"""The lint checks for wrong devices and statistics (DDP011-DDP013): CUDA devices, GPU choice, BatchNorm."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

from ddpkit.lint.analysis import Script, argument, batchnorm_constructor, keyword, own_returns, terminal
from ddpkit.lint.bindings import scope_of
from ddpkit.lint.callsites import given_arguments
from ddpkit.lint.rules import Hit, check, off_by_default, splat_keyword

__all__ = ["cuda_device_as_device", "nccl_without_set_device", "device_from_global_rank", "one_gpu_for_every_rank",
           "first_gpu_for_every_rank",
           "ddp_without_device", "cuda_before_set_device", "cuda_tensor_type_without_set_device", "batchnorm_without_sync"]

_DEVICE_KWARGS = ("device", "output_device", "map_location", "device_id")


def _device_positions(call: ast.Call) -> Iterator[ast.AST]:
    """Expressions a call uses as a device: `.to(x)`, `.cuda(x)`, `device=x`, `device_ids=[x]`."""
    if isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda"):
        yield from call.args[:1]
    for k in call.keywords:
        if k.arg in _DEVICE_KWARGS:
            yield k.value
        elif k.arg == "device_ids" and isinstance(k.value, (ast.List, ast.Tuple)):
            yield from k.value.elts


@check
def cuda_device_as_device(s: Script) -> Iterator[Hit]:
    def is_cuda_device(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and s.qualname(node.func) == "torch.cuda.device"

    # `device = torch.cuda.device(i)` and `args.device = torch.cuda.device(i)` (attribute targets too)
    holders = {key for key, value in s.assignments if is_cuda_device(value)}
    for _ in range(4):  # `device = args.device` after `args.device = torch.cuda.device(i)`: aliases hold it too
        more = {key for key, value in s.assignments if isinstance(value, (ast.Name, ast.Attribute))
                and (value.id if isinstance(value, ast.Name) else "." + value.attr) in holders}
        if more <= holders:
            break
        holders |= more
    for call in s.calls:
        for expr in _device_positions(call):
            held = isinstance(expr, ast.Name) and expr.id in holders or \
                isinstance(expr, ast.Attribute) and "." + expr.attr in holders
            if is_cuda_device(expr) or held:
                yield Hit(expr, "DDP011", "error",
                          "torch.cuda.device(...) is a context manager that switches the current GPU, "
                          "not a device: used as one it fails or puts the tensors on the wrong GPU",
                          "use torch.device('cuda', local_rank) (and torch.cuda.set_device(local_rank) once)")


def _strings(s: Script, expr: ast.AST, depth: int = 2) -> set[str]:
    """String constants an expression may evaluate to, following assignments to a plain name and, for a
    parameter of the enclosing function, what the program's calls of that function pass (`setup("nccl")`)."""
    sources = [expr]
    found: set[str] = set()
    if isinstance(expr, ast.Name):
        sources += [n.value for n in s.nodes if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)]
        scope = s.context(expr).scope
        d = next((d for d in s.defs if id(d) == scope), None)
        params = [a.arg for a in d.args.args] if d is not None else []
        if depth and expr.id in params:
            defaults = dict(zip(params[len(params) - len(d.args.defaults):], d.args.defaults))
            if expr.id in defaults:  # `def setup(backend="nccl")` called as `setup()`
                sources.append(defaults[expr.id])
            position = params.index(expr.id) - (params[:1] in (["self"], ["cls"]))
            for x in s.project.scripts.values():
                for call in x.calls:
                    if terminal(call.func) != d.name:
                        continue
                    given = [k.value for k in call.keywords if k.arg == expr.id] + (
                        [call.args[position]] if 0 <= position < len(call.args) else [])
                    found.update(v for g in given for v in _strings(x, g, depth - 1))
    return found | {n.value for src in sources for n in ast.walk(src)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _uses_cuda(s: Script, bare: bool = False) -> bool:
    """The script puts things on CUDA ('cuda', 'cuda:0', .cuda()); bare=True: only `.cuda()` with no index."""
    for node in s.nodes:
        if not bare and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.match(r"cuda(:\d+)?$", node.value):
            return True
        if isinstance(node, ast.Call) and terminal(node.func) == "cuda" and isinstance(node.func, ast.Attribute) \
                and (not bare or not node.args):
            return True
    return False


def _pins_device(s: Script) -> bool:
    """CUDA_VISIBLE_DEVICES set per rank (not to one constant list), or `with torch.cuda.device(i):`, also pick
    the device."""
    for node in s.nodes:
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.slice, ast.Constant) and node.slice.value == "CUDA_VISIBLE_DEVICES":
            assign = s.parents.get(id(node))
            if not (isinstance(assign, ast.Assign) and isinstance(assign.value, ast.Constant)):
                return True  # `= "1,2,3"` shows every rank the same GPUs: each still starts on the first
        if isinstance(node, ast.withitem) and isinstance(node.context_expr, ast.Call) \
                and s.qualname(node.context_expr.func) == "torch.cuda.device":
            return True
    return False


def _set_device_calls(s: Script) -> list[tuple[Script, ast.Call]]:
    return s.project.calls_named("set_device", "set_device_index")


def _pinned(s: Script) -> bool:
    return s.project.memo("pins", lambda: any(_pins_device(script) for script in s.project.scripts.values()))


_NO_DEVICE = ("call torch.cuda.set_device(local_rank) before init_process_group, or pass "
              "device_id=torch.device('cuda', local_rank) to it")


@check
def nccl_without_set_device(s: Script) -> Iterator[Hit]:
    # Where set_device sits relative to init_process_group does not matter as long as it comes before
    # the first CUDA work; what puts every rank on cuda:0 is not choosing a device at all.
    chosen = _set_device_calls(s) or _pinned(s)
    spawned = s.project.spawned
    fix = _NO_DEVICE.replace("local_rank", "rank") if spawned else _NO_DEVICE
    explicit = not chosen and s.project.memo("explicit devices", lambda: _explicit_devices(s.project))
    for call in s.calls_named("init_process_group"):
        if keyword(call, "device_id") is not None or chosen:
            continue
        backend = argument(call, "backend", 0)
        values = _strings(s, backend) if backend is not None else set()
        if backend is None and _uses_cuda(s) or any("nccl" in v for v in values):
            if explicit in ("explicit", "typed"):
                continue  # every tensor and DDP's device_ids name this rank's GPU: nothing lands on cuda:0
            if explicit == "pinned":
                yield Hit(call, "DDP012", "error",
                          "every placement names this rank's GPU, but torch.cuda.set_device is never called and "
                          "a DataLoader pins memory: its pinning thread and the NCCL communicators use the "
                          "current device, cuda:0, on every rank", fix)
                continue
            yield Hit(call, "DDP012", "error",
                      "init_process_group uses NCCL but torch.cuda.set_device is never called, so the "
                      "current device of every rank stays cuda:0: NCCL communicators, barrier() and every "
                      "bare .cuda() land on one GPU", fix)
        elif backend is not None and (not values or all("gloo" in v for v in values)) \
                and s.project.memo("bare cuda", lambda: any(_uses_cuda(x, bare=True)
                                                            for x in s.project.scripts.values())) \
                and not any(_uses_cuda(x) and _ddp_on_current_device(x, c)
                            for x in s.project.scripts.values() for c in x.calls):
            # (where DDP gets no device_ids, that finding names the same cause at the model: one finding)
            what = f"backend {ast.unparse(backend)}" if values else \
                f"a backend only known at run time ({ast.unparse(backend)})"
            yield Hit(call, "DDP012", "error",
                      f"init_process_group with {what} and bare .cuda() calls, but no rank ever picks its GPU "
                      "(no torch.cuda.set_device): every rank's .cuda() lands on cuda:0", fix)


def _explicit_devices(project) -> str:
    """'explicit' when no code relies on the current CUDA device: every DDP call has device_ids, no bare
    `.cuda()` and no plain 'cuda'/'cuda:0'; 'pinned' when so but a DataLoader pins memory; else ''."""
    ddp = [(x, c) for x in project.scripts.values() for c in x.calls
           if x.qualname(c.func).endswith("DistributedDataParallel")]
    if not ddp or any(_device_ids(x, c)[0] is None for x, c in ddp):
        return ""
    # (`cuda:{rank}` with the global rank names another node's GPU index on a second node: device_from_global_rank
    # reports that cause; nothing here relies on the current device)
    typed = False
    for x in project.scripts.values():
        parents = x.parents
        for n in x.nodes:
            if isinstance(n, (ast.Constant, ast.Call)) and not project.runs(x, n):
                continue  # a method nothing calls places nothing
            typed = typed or _cuda_tensor_type(x, n) and project.runs(x, n)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in ("cuda", "cuda:0"):
                holder = parents.get(id(n))
                if isinstance(holder, ast.keyword) and holder.arg == "device_type" or isinstance(holder, ast.Call) \
                        and terminal(holder.func) in ("autocast", "GradScaler", "is_available", "startswith"):
                    continue  # a device type (autocast("cuda")), not a placement
                if isinstance(holder, ast.Compare):
                    continue  # `device == "cuda"`
                if isinstance(holder, ast.Dict) and any(k is n for k in holder.keys):
                    continue  # `map_location={"cuda:0": f"cuda:{rank}"}`: the device saved from, not a placement
                if isinstance(holder, ast.arguments) and _default_always_given(project, x, holder, n):
                    continue  # `def evaluate(model, device="cuda")` every call gives its device
                return ""
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "cuda" and not n.args:
                return ""
            if isinstance(n, ast.Call) and terminal(n.func) in ("current_device", "barrier"):
                return ""  # current_device() is cuda:0 without set_device; NCCL's barrier guesses by rank
    pinned = any(isinstance(n, ast.keyword) and n.arg == "pin_memory" and not (
        isinstance(n.value, ast.Constant) and not n.value.value) for x in project.scripts.values() for n in x.nodes)
    if typed:
        return "typed"  # but for the legacy CUDA tensor types (`x.type(torch.cuda.FloatTensor)`): the current device
    return "pinned" if pinned or any(_pinning_kwargs(x) for x in project.scripts.values()) else "explicit"


def _default_always_given(project, x: Script, args: ast.arguments, default: ast.AST) -> bool:
    """`def zeroshot_eval(model, loader, device="cuda")` where every call of the function in the program passes
    that parameter (by keyword or position): the default never places anything. False where nothing calls it by
    name, a call spreads `*args`/`**kwargs`, or the function is also used as a value (called elsewhere unseen)."""
    d = x.parents.get(id(args))
    if not isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults)) + [
        (a.arg, v) for a, v in zip(args.kwonlyargs, args.kw_defaults) if v is not None]
    param = next((name for name, v in pairs if v is default), None)
    values = given_arguments(project, x, d).get(param) if param is not None else None
    if not values or any(v is None for _, v in values):
        return False
    calls = {id(c.func) for y in project.scripts.values() for c in y.calls}
    return not any(isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, ast.Load) and terminal(n) == d.name
                   and id(n) not in calls for y in project.scripts.values() for n in y.nodes)


def _cuda_tensor_type(s: Script, node: ast.AST) -> bool:
    """`torch.cuda.FloatTensor` (any legacy CUDA tensor type): casting to it, or building one, puts the data on the
    current device."""
    holder = s.parents.get(id(node))
    if isinstance(holder, ast.Compare) or isinstance(holder, (ast.Tuple, ast.Call)) and any(
            isinstance(h, ast.Call) and terminal(h.func) == "isinstance" for h in (holder, s.parents.get(id(holder)))):
        return False  # `isinstance(x, torch.cuda.FloatTensor)`, `x.type() == ...`: a test, not a placement
    return isinstance(node, ast.Attribute) and node.attr.endswith("Tensor") \
        and s.qualname(node).startswith("torch.cuda.")


@check
def cuda_tensor_type_without_set_device(s: Script) -> Iterator[Hit]:
    """NCCL with no set_device where every other placement names the rank's GPU but a legacy CUDA tensor type
    (`Tensor = torch.cuda.FloatTensor`, then `batch.type(Tensor)`) places data: reported at the type, whose data
    lands on cuda:0 on every rank while the models sit on the rank's own GPU."""
    if _set_device_calls(s) or _pinned(s) or s.project.memo("explicit devices",
                                                             lambda: _explicit_devices(s.project)) != "typed":
        return
    if not any(_nccl_init(x, c) for x in s.project.scripts.values() for c in x.calls_named("init_process_group")):
        return
    for node in s.nodes:
        if _cuda_tensor_type(s, node) and s.project.runs(s, node):
            yield Hit(node, "DDP012", "error",
                      f"{ast.unparse(node)} is a tensor type of the current CUDA device, and torch.cuda.set_device "
                      "is never called: on every rank its data lands on cuda:0 while the models sit on the rank's "
                      "own GPU",
                      "call torch.cuda.set_device(local_rank) before the training starts, or place the data with "
                      ".to(device) on the rank's device")


def _nccl_init(s: Script, call: ast.Call) -> bool:
    """An init_process_group that uses NCCL: named (also through a parameter's value), or the default on CUDA."""
    if keyword(call, "device_id") is not None:
        return False
    backend = argument(call, "backend", 0)
    values = _strings(s, backend) if backend is not None else set()
    return backend is None and _uses_cuda(s) or any("nccl" in v for v in values)


def _pinning_kwargs(x: Script) -> bool:
    """A dict with a true `"pin_memory"` that reaches a DataLoader's `**kwargs`, itself or merged into the dict that
    does (`cuda_kwargs = {"pin_memory": True}; train_kwargs.update(cuda_kwargs); DataLoader(ds, **train_kwargs)`)."""
    unpacked = {k.value.id for c in x.calls if terminal(c.func) == "DataLoader" for k in c.keywords
                if k.arg is None and isinstance(k.value, ast.Name)}
    merged = {c.args[0].id for c in x.calls if isinstance(c.func, ast.Attribute) and c.func.attr == "update"
              and isinstance(c.func.value, ast.Name) and c.func.value.id in unpacked
              and c.args and isinstance(c.args[0], ast.Name)}
    return any(isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict) and any(
        isinstance(t, ast.Name) and t.id in unpacked | merged for t in n.targets) and any(
        isinstance(k, ast.Constant) and k.value == "pin_memory" and not (isinstance(v, ast.Constant) and not v.value)
        for k, v in zip(n.value.keys, n.value.values)) for n in x.nodes)


def _device_indices(s: Script, call: ast.Call) -> Iterator[ast.AST]:
    """Expressions a call uses as a GPU index: set_device(i), torch.device('cuda', i), device_ids=[i], 'cuda:{i}',
    `.to(i)`, `.cuda(i)`, `device=i`."""
    name = terminal(call.func)
    if name in ("set_device", "set_device_index") and call.args:
        yield call.args[0]
    if s.qualname(call.func) == "torch.device" and len(call.args) == 2:
        yield call.args[1]
    for k in call.keywords:
        if k.arg == "device_ids" and isinstance(k.value, (ast.List, ast.Tuple)):
            yield from k.value.elts
        elif k.arg == "device_ids" and isinstance(k.value, (ast.Name, ast.Attribute)):
            key = k.value.id if isinstance(k.value, ast.Name) else "." + k.value.attr
            held = [v for name, v in s.assignments if name == key]
            if len(held) == 1 and isinstance(held[0], (ast.List, ast.Tuple)):  # `gpus = [rank]` ... device_ids=gpus
                # reported at the keyword's value, where the wrong GPU is chosen for DDP
                yield from (ast.copy_location(ast.Name(e.id, ast.Load()), k.value) if isinstance(e, ast.Name)
                            else e for e in held[0].elts)
    if isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda") and call.args \
            and not isinstance(call.args[0], ast.JoinedStr):
        yield call.args[0]  # `.to(i)` / `.cuda(i)` with a number: the tensor goes to GPU i
    device = keyword(call, "device")
    if device is not None and not isinstance(device, ast.JoinedStr):
        yield device  # `torch.zeros(n, device=i)`
    for arg in call.args[:1]:
        if isinstance(arg, ast.JoinedStr) and any(isinstance(v, ast.Constant) and str(v.value).endswith("cuda:")
                                                  for v in arg.values):
            yield from (v.value for v in arg.values if isinstance(v, ast.FormattedValue))
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "format" \
                and isinstance(arg.func.value, ast.Constant) and str(arg.func.value.value).startswith("cuda:{") \
                and arg.args:
            yield arg.args[0]  # `"cuda:{}".format(i)`


def _grows_with_global_rank(s: Script, expr: ast.AST, depth: int = 0) -> ast.AST | None:
    """The global rank a GPU index is built from by growing it (`rank * n`, `rank + 1`, an element of
    `list(range(rank * n, (rank + 1) * n))`), through this function's assignments; None when the index is not so
    built (`rank % torch.cuda.device_count()` wraps it into range)."""
    if depth > 5:
        return None
    if s.is_global_rank(expr):
        return expr
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Mult, ast.Sub)):
        sides = [expr.left] if isinstance(expr.op, ast.Sub) else [expr.left, expr.right]
        return next((g for side in sides if (g := _grows_with_global_rank(s, side, depth + 1)) is not None), None)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in ("range", "list", "tuple") \
            and expr.args and not expr.keywords:
        return _grows_with_global_rank(s, expr.args[0], depth + 1)  # range(start, ...) starts at the rank's value
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, int) \
            and expr.slice.value >= 0:
        return _grows_with_global_rank(s, expr.value, depth + 1)
    if isinstance(expr, ast.Name):
        values = [v for v in s.local_values(expr.id, expr) if v.lineno < expr.lineno]
        if len(values) == 1:
            return _grows_with_global_rank(s, values[0], depth + 1)
    return None


def _global_rank_store(s: Script, source: ast.AST, use: ast.AST) -> ast.AST | None:
    """`args.local_rank = dist.get_rank()` in another function of this file than the GPU index built from
    `args.local_rank`: the store that puts the global rank where a local rank is read (the line to fix)."""
    if not isinstance(source, ast.Attribute):
        return None
    stores = [v for k, v in s.assignments if k == "." + source.attr and s.is_global_rank(v)]
    return stores[0] if len(stores) == 1 and s.context(stores[0]).scope != s.context(use).scope else None


def _global_rank_binding(s: Script, index: ast.AST) -> ast.AST | None:
    """The one assignment that puts the global rank in the name or attribute a GPU index reads
    (`local_rank = int(os.environ["RANK"])`, `device_id = rank`, `cfg.rank = dist.get_rank()`), also where other
    assignments bind it to something else (`args.local_rank = int(os.environ["SLURM_PROCID"])` in the SLURM branch,
    LOCAL_RANK in the other). None for the rank call itself, a parameter, or a name several global stores bind."""
    if isinstance(index, ast.Name):
        values = s.local_values(index.id, index) or [  # a module-level name read in a function
            v for k, v in s.assignments if k == index.id and scope_of(v, s.parents) is None]
    elif isinstance(index, ast.Attribute):
        values = [v for k, v in s.assignments if k == "." + index.attr]
    else:
        return None
    stores = [v for v in values if s.is_global_rank(v)]
    return stores[0] if len(stores) == 1 else None


def _held_for_a_gpu(s: Script, index: ast.AST, uses: list[ast.AST]) -> bool:
    """Whether the name or attribute the GPU indices `uses` read is held for a GPU, so that its assignment is the
    line to fix: it is named a local rank (`local_rank = int(os.environ["RANK"])`), or the program reads it
    nowhere but as a GPU index or a `device=`/`gpu=` argument (`device_id = rank`). A `rank` also read for seeds
    or rank checks is right as it is: its uses as a GPU are the mistake."""
    name = index.id if isinstance(index, ast.Name) else index.attr
    if "local" in name.lower():
        return True
    reads = {id(n) for n in s.nodes if isinstance(getattr(n, "ctx", None), ast.Load) and (
        isinstance(n, ast.Name) and n.id == name if isinstance(index, ast.Name)
        else isinstance(n, ast.Attribute) and n.attr == name)}
    passed_as_device = {id(k.value) for c in s.calls for k in c.keywords
                        if k.arg and any(word in k.arg.lower() for word in ("device", "gpu"))}
    return reads <= {id(u) for u in uses} | passed_as_device


def _global_rank_indices(s: Script) -> dict[object, tuple[ast.AST | None, list[ast.AST]]]:
    """The GPU indices of live code that are the global rank, grouped by their cause: the assignment that stores
    the rank (`_global_rank_binding`), else the index's text in its function (one parameter used five times)."""
    groups: dict[object, tuple[ast.AST | None, list[ast.AST]]] = {}
    for call in s.calls:
        for index in _device_indices(s, call):
            if s.is_global_rank(index) and s.project.runs(s, index):
                binding = _global_rank_binding(s, index)
                key = id(binding) if binding is not None else (id(s.context(index).scope), ast.unparse(index))
                groups.setdefault(key, (binding, []))[1].append(index)
    return groups


def _global_rank_hit(s: Script, binding: ast.AST | None, uses: list[ast.AST]) -> Hit:
    """One DDP012 for a global rank used as a GPU index, naming every line that uses it as a GPU: at the assignment
    that stores it where that name is held for a GPU (`_held_for_a_gpu`), else at its first use."""
    lines = sorted({u.lineno for u in uses})
    first = min(uses, key=lambda u: (u.lineno, u.col_offset))
    at = binding if binding is not None and _held_for_a_gpu(s, first, uses) else first
    where = "" if at is first and len(lines) == 1 else \
        f" (used as a GPU at line{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))})"
    return Hit(at, "DDP012", "error",
               f"the GPU index {ast.unparse(first)} is the global rank{where}: right on the first node only; "
               "on the second node rank 8 asks for cuda:8",
               "index GPUs by the local rank: int(os.environ['LOCAL_RANK'])")


@check
def device_from_global_rank(s: Script) -> Iterator[Hit]:
    if s.project.single_node or s.project.spawned:
        return
    yield from (_global_rank_hit(s, binding, uses) for binding, uses in _global_rank_indices(s).values())
    for call in s.calls:
        for index in _device_indices(s, call):
            if not s.is_global_rank(index) and (source := _grows_with_global_rank(s, index)) is not None:
                store = _global_rank_store(s, source, index)
                where = f" (stored at line {store.lineno})" if store is not None else ""
                yield Hit(store if store is not None else index, "DDP012", "error",
                          f"the GPU index {ast.unparse(index)} (line {index.lineno}) is built from the global rank "
                          f"{ast.unparse(source)}{where}: right on the first node only; on the second node it "
                          "passes the node's GPU count",
                          "build GPU indices from the local rank: int(os.environ['LOCAL_RANK'])")


def _setting_key(expr: ast.AST) -> str | None:
    """The key of a setting a name, attribute or string subscript reads: 'gpu_ids' for `gpu_ids`, `opt.gpu_ids`,
    `self.gpu_ids` and `opt['gpu_ids']`; None for anything else."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
        return expr.slice.value
    return None


def _involves_rank(x: Script, value: ast.AST) -> bool:
    return any(x.kind(n) for n in ast.walk(value) if isinstance(n, (ast.Name, ast.Attribute, ast.Call)))


def _passed_per_rank(project, parameter: str) -> bool:
    """Some call of the program passes `parameter=` a value that involves the rank (`device_id=[local_rank]`)."""
    return any(k.arg == parameter and _involves_rank(x, k.value)
               for x in project.scripts.values() for c in x.calls for k in c.keywords)


def _set_per_rank(project, key: str) -> bool:
    """Some file of the program assigns the setting `key` (`x.key = ...`, `key = ...`, `d["key"] = ...`) a value
    that involves the rank, or under a rank check, or a parameter some call fills with the rank by keyword
    (`self.device_id = device_id` in a class built as `Head(..., device_id=[local_rank])`, also through
    `getattr(heads, name)(...)`)."""
    for x in project.scripts.values():
        for node in x.nodes:
            if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not any(_setting_key(t) == key for t in targets):
                continue
            if x.context(node).level or _involves_rank(x, node.value):
                return True
            function = scope_of(node, x.parents)
            if isinstance(node.value, ast.Name) and isinstance(function, ast.FunctionDef) and node.value.id in {
                    a.arg for a in (*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs)} \
                    and _passed_per_rank(project, node.value.id):
                return True
    return False


def _fixed_gpu_matters(project) -> bool:
    """A DDP program in which a GPU index fixed in the code is the same GPU on every rank: it sets no
    CUDA_VISIBLE_DEVICES (a per-rank one renumbers the GPUs) and has no DataParallel mode (which uses the first GPU)."""
    scripts = list(project.scripts.values())
    return any(x.uses_ddp for x in scripts) and not any(
        isinstance(n, ast.Constant) and n.value == "CUDA_VISIBLE_DEVICES" for x in scripts for n in x.nodes) \
        and not any(x.qualname(c.func).endswith(".DataParallel") for x in scripts for c in x.calls)


@check
def one_gpu_for_every_rank(s: Script) -> Iterator[Hit]:
    """`torch.device(f"cuda:{opt.gpu_ids[0]}")` in the code every rank runs of a DDP program: the first GPU of a
    settings list is the same index on every rank, so every rank works on that one GPU."""
    project = s.project
    if not _fixed_gpu_matters(project):
        return
    for call in s.calls:
        ctx = s.context(call)
        if ctx.level or ctx.single or not s.per_rank(call):
            continue
        for index in _device_indices(s, call):
            if not (isinstance(index, ast.Subscript) and isinstance(index.slice, ast.Constant)
                    and index.slice.value == 0):
                continue
            key = _setting_key(index.value)
            if key is None or s.kind(index.value) or _set_per_rank(project, key):
                continue
            yield Hit(index, "DDP012", "error",
                      f"the GPU index {ast.unparse(index)} is the first GPU of a settings list, the same on every "
                      "rank: every rank works on that one GPU (nothing in the files linted gives each rank its own "
                      "list or its own CUDA_VISIBLE_DEVICES)",
                      "index GPUs by the local rank: torch.device('cuda', int(os.environ['LOCAL_RANK']))")


def _first_gpu_literals(s: Script, call: ast.Call) -> Iterator[ast.Constant]:
    """The literal "cuda:0" a call is given as a device: `torch.load(f, map_location="cuda:0")`, `device="cuda:0"`,
    `torch.device("cuda:0")`, `.to("cuda:0")` (not a dict's key, `map_location={"cuda:0": ...}`: a device saved from;
    not a question about GPU 0, `torch.cuda.memory_allocated(device="cuda:0")`)."""
    if s.qualname(call.func).startswith("torch.cuda."):
        return iter(())
    given = [k.value for k in call.keywords if k.arg in _DEVICE_KWARGS]
    if s.qualname(call.func) == "torch.device" or isinstance(call.func, ast.Attribute) and call.func.attr == "to":
        given += call.args[:1]
    if s.qualname(call.func) == "torch.load":
        given += call.args[1:2]
    return (v for v in given if isinstance(v, ast.Constant) and v.value == "cuda:0")


def _local_gpu_indices(project) -> bool:
    """Some live code of the program picks this rank's GPU by its local rank (`set_device(local_rank)`,
    `device_ids=[args.gpu]`, `f"cuda:{local_rank}"`): it runs with every GPU of the node visible to each rank."""
    return any(x.kind(i) and not x.is_global_rank(i) and project.runs(x, i)
               for x in project.scripts.values() for c in x.calls for i in _device_indices(x, c))


@check
def first_gpu_for_every_rank(s: Script) -> Iterator[Hit]:
    """`torch.load(path, map_location="cuda:0")` in the code every rank runs of a program that otherwise gives each
    rank its own GPU by the local rank: every rank puts this on GPU 0 (and opens a CUDA context there)."""
    project = s.project
    if not project.memo("first GPU matters", lambda: _fixed_gpu_matters(project) and _local_gpu_indices(project)):
        return
    for call in s.calls:
        ctx = s.context(call)
        if ctx.level or ctx.single or not s.per_rank(call) or not project.runs(s, call):
            continue
        for literal in _first_gpu_literals(s, call):
            yield Hit(literal, "DDP012", "error",
                      f"{ast.unparse(call.func)}(...) is given \"cuda:0\" on every rank, while the program gives each "
                      "rank its own GPU by the local rank elsewhere: every rank puts this on GPU 0 (memory and a CUDA "
                      "context there; a tensor meeting one on the rank's own GPU fails)",
                      "use this rank's device: torch.device('cuda', local_rank) (for torch.load, map_location='cpu' "
                      "also works)")


def _branches(node: ast.AST, parents: dict[int, ast.AST]) -> set[tuple[str, bool]]:
    """(test, which side) of every `if` around a node."""
    sides: set[tuple[str, bool]] = set()
    child = node
    while id(child) in parents:
        parent = parents[id(child)]
        if isinstance(parent, ast.If) and child is not parent.test:
            side = child in parent.body
            sides.add((ast.dump(parent.test), side))
            if side and isinstance(parent.test, ast.BoolOp) and isinstance(parent.test.op, ast.And):
                sides.update((ast.dump(v), True) for v in parent.test.values)  # `a and b` passing means a passed
        child = parent
    return sides


def _cpu_arm(s: Script, node: ast.AST) -> bool:
    """The node runs only where no GPU is seen: in the `else:` of `if torch.cuda.is_available():` (or the body of
    `if not torch.cuda.is_available():`)."""
    child = node
    while id(child) in s.parents:
        parent = s.parents[id(child)]
        if isinstance(parent, ast.If) and child is not parent.test:
            test, side = parent.test, child in parent.body
            if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
                test, side = test.operand, not side
            if not side and isinstance(test, ast.Call) and s.qualname(test.func) == "torch.cuda.is_available":
                return True
        child = parent
    return False


def _device_ids(s: Script, call: ast.Call) -> tuple[ast.AST | None, bool]:
    """The device_ids a DDP call gets, given or through a `**kwargs` dict the script builds (`DDP(model,
    **ddp_kwargs)`, `ddp_kwargs = {'device_ids': [rank]}`), and whether that is known (False: a `**kwargs` from
    elsewhere may carry them)."""
    given = keyword(call, "device_ids")
    return (given, True) if given is not None else splat_keyword(s, call, "device_ids")


def _ddp_on_current_device(s: Script, call: ast.Call) -> bool:
    """A DistributedDataParallel call with no device_ids (nor a device mesh) outside the arm of `if
    torch.cuda.is_available():` that runs without a GPU (a CPU model needs no device): the model stays where
    the current device put it."""
    return s.qualname(call.func).endswith("DistributedDataParallel") and len(call.args) <= 1 \
        and _device_ids(s, call) == (None, True) and keyword(call, "device_mesh") is None and not _cpu_arm(s, call)


@check
def ddp_without_device(s: Script) -> Iterator[Hit]:
    if not _uses_cuda(s) or _pinned(s):
        return
    parents = s.parents
    chosen = _set_device_calls(s)
    for call in s.calls:
        if not _ddp_on_current_device(s, call):
            continue
        sides = _branches(call, parents)
        # a set_device on the other side of an `if` this call is in (or of the same test) does not run first
        reaching = [c for script, c in chosen if script is not s or not any(
            (test, not side) in sides for test, side in _branches(c, parents))]
        if not reaching:
            yield Hit(call, "DDP012", "error",
                      "DistributedDataParallel without device_ids on a CUDA model, and no torch.cuda.set_device "
                      "on this path: every rank's model sits on cuda:0",
                      "call torch.cuda.set_device(local_rank) first and pass device_ids=[local_rank]")


@check
def cuda_before_set_device(s: Script) -> Iterator[Hit]:
    """`model = Model().cuda()` in the rank's function, above the torch.cuda.set_device(gpu) further down that same
    function (the program's only ones): the bare .cuda() runs on the current device, still cuda:0, so every rank
    first builds the model (and a CUDA context) on GPU 0."""
    if not (s.distributed or s.project.distributed) or _pinned(s):
        return
    chosen = _set_device_calls(s)
    homes = {x.context(c).scope for x, c in chosen}
    if not chosen or any(x is not s for x, _ in chosen) or len(homes) != 1 or 0 in homes:
        return
    scope = homes.pop()
    first = min(c.lineno for _, c in chosen)
    parents = s.parents
    for call in s.calls:
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "cuda" and not call.args
                and not call.keywords and call.lineno < first and s.context(call).scope == scope) \
                or _tensorless_loss(s, call.func.value):
            continue
        node, looped = call, False
        while id(node) in parents and id(node) != scope:
            node = parents[id(node)]
            looped = looped or isinstance(node, (ast.For, ast.While, ast.AsyncFor))
        sides = _branches(call, parents)
        if looped or s.context(call).single or all(any((test, not side) in sides for test, side in _branches(c, parents))
                                                   for _, c in chosen):
            continue  # (a loop may come back to it after the set_device; the other arm of its `if` runs alone)
        yield Hit(call, "DDP012", "error",
                  f"{ast.unparse(call.func)}() runs before torch.cuda.set_device (line {first}) in the same "
                  "function: the current device is still cuda:0, so every rank first puts this (and a CUDA context) "
                  "on GPU 0",
                  "call torch.cuda.set_device(local_rank) first, at the top of the rank's function, or pass the "
                  "device: .cuda(local_rank)")


def _tensorless_loss(s: Script, built: ast.AST) -> bool:
    """`nn.CrossEntropyLoss(ignore_index=255)`: a torch loss module built without a tensor argument (no `weight`,
    `pos_weight`, nothing positional) holds no parameter or buffer, so `.cuda()` on it moves nothing."""
    return isinstance(built, ast.Call) and s.qualname(built.func).startswith("torch.nn.") \
        and terminal(built.func).endswith("Loss") and not built.args \
        and not any(k.arg in (None, "weight", "pos_weight") for k in built.keywords)


# torch's SyncBatchNorm and its converter, and apex's (`apex.parallel.convert_syncbn_model`, `apex.parallel.SyncBatchNorm`)
_SYNC_BATCHNORM = frozenset({"SyncBatchNorm", "convert_sync_batchnorm", "convert_syncbn_model"})
# a model constructor's own switch to SyncBatchNorm (`Detector(..., sync_bn=args.syncbn)`): the model has BatchNorm
_SYNC_BN_OPTION = re.compile(r"sync_?(bn|batch_?norm)", re.IGNORECASE)


def _flag_gate(s: Script, node: ast.AST) -> str:
    """The flag, off by default, that an `if`/conditional expression around `node` tests for the side `node` is on
    (`if args.sync_bn: model = convert_sync_batchnorm(model)`): the conversion does not run by default; else ''."""
    child = node
    while id(child) in s.parents:
        parent = s.parents[id(child)]
        if isinstance(parent, (ast.If, ast.IfExp)) and child is not parent.test \
                and (child in parent.body if isinstance(parent, ast.If) else child is parent.body) \
                and off_by_default(s, parent.test):
            return ast.unparse(parent.test)
        child = parent
    return ""


def _conversions(project) -> tuple[bool, list[tuple[Script, ast.AST, str]]]:
    """Whether the program converts to SyncBatchNorm on its default path, and its conversions that run only when
    an off-by-default flag is passed: (file, node, flag)."""
    default, gated = False, []
    for x in project.scripts.values():
        for n in x.nodes:
            if isinstance(n, ast.keyword) and n.arg is not None and _SYNC_BN_OPTION.fullmatch(n.arg):
                value = n.value
                if isinstance(value, ast.IfExp) and isinstance(value.orelse, ast.Constant) and not value.orelse.value:
                    value = value.test  # `sync_bn=True if args.syncbn else False`
                if isinstance(value, ast.Constant) and not value.value:
                    continue
                flag = ast.unparse(value) if off_by_default(x, value) else _flag_gate(x, n.value)
            elif isinstance(n, (ast.Name, ast.Attribute)) and terminal(n) in _SYNC_BATCHNORM:
                flag = _flag_gate(x, n)
            else:
                continue
            if flag:
                gated.append((x, n, flag))
            else:
                default = True
    return default, gated


def _model_origins(s: Script, value: ast.AST, depth: int = 0) -> Iterator[ast.AST]:
    """What the model handed to DDP is built from, through its local assignments, the methods that return the
    module itself (`model = Net().cuda()`; `model = model.to(device)`) and the returns of this file's functions
    (`model, criterion = get_model(args)`)."""
    if depth > 6:
        return
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
            and value.func.attr in ("cuda", "to", "train", "float", "half", "requires_grad_"):
        yield from _model_origins(s, value.func.value, depth + 1)
    elif isinstance(value, ast.Name) and not s.local_assignments(value.id, value):
        yield value
        yield from _passed_in(s, value, depth)
    elif isinstance(value, ast.Name):
        for stmt, v in s.local_assignments(value.id, value):
            if stmt.lineno >= value.lineno:
                continue
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else None
            if v is None and isinstance(target, ast.Tuple) and isinstance(stmt.value, ast.Call):
                at = next((i for i, e in enumerate(target.elts) if isinstance(e, ast.Name) and e.id == value.id), -1)
                yield from _returned(s, stmt.value, at, depth)
            elif v is not None:
                yield from _model_origins(s, v, depth + 1)
    elif isinstance(value, ast.Call) and s.local_callee(value) and isinstance(value.func, ast.Name):
        yield value
        yield from _returned(s, value, None, depth)
    elif isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "self" \
            and depth < 4 and (cls := _enclosing_class(s, value)) is not None:
        # `self.model = Model(...)` in one method, `DDP(self.model)` in another: every value the class gives it
        inside = {id(n) for n in ast.walk(cls)}
        yield value
        for key, v in s.assignments:
            if key == "." + value.attr and id(v) in inside:
                yield from _model_origins(s, v, depth + 1)
    else:
        yield value


def _passed_in(s: Script, name: ast.Name, depth: int) -> Iterator[ast.AST]:
    """What the calls of this file pass for a parameter (`def __init__(self, model)` of `Trainer`, built as
    `Trainer(model, ...)`; `def setup(model)` called as `setup(net)`), followed on as a model's origin."""
    func = next((n for n in _parents(s, name) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if func is None:
        return
    params = [a.arg for a in func.args.args]
    if name.id not in params:
        return
    at = params.index(name.id)
    owner = _enclosing_class(s, func)
    if func.name == "__init__" and owner is not None:
        callee, at = owner.name, at - 1
    elif owner is None:
        callee = func.name
    else:
        return
    for call in s.calls:
        if terminal(call.func) != callee or any(isinstance(a, ast.Starred) for a in call.args):
            continue
        arg = next((k.value for k in call.keywords if k.arg == name.id), None)
        if arg is None and 0 <= at < len(call.args):
            arg = call.args[at]
        if arg is not None:
            yield from _model_origins(s, arg, depth + 1)


def _parents(s: Script, node: ast.AST) -> Iterator[ast.AST]:
    while id(node) in s.parents:
        node = s.parents[id(node)]
        yield node


def _enclosing_class(s: Script, node: ast.AST) -> ast.ClassDef | None:
    while id(node) in s.parents:
        node = s.parents[id(node)]
        if isinstance(node, ast.ClassDef):
            return node
    return None


def _returned(s: Script, call: ast.Call, at: int | None, depth: int) -> Iterator[ast.AST]:
    """What a function of this file returns (position `at` of a returned tuple, where given)."""
    for d in (d for d in s.defs if d.name == s.local_callee(call)):
        for r in own_returns(d):
            value = r.value
            if at is not None:
                if not (isinstance(value, ast.Tuple) and 0 <= at < len(value.elts)):
                    continue
                value = value.elts[at]
            if value is not None:
                yield from _model_origins(s, value, depth + 1)


def _batchnorm_model(s: Script, wrap: ast.Call, gated: list[tuple[Script, ast.AST, str]]) -> str:
    """Why the model a DDP call wraps surely holds BatchNorm layers: a library network of a BatchNorm architecture,
    or a model the program itself converts (or builds with SyncBatchNorm) only behind a flag; else ''."""
    model = argument(wrap, "module", 0)
    if model is None:
        return ""
    origins = list(_model_origins(s, model))
    library = next((b for o in origins if isinstance(o, ast.Call) and (b := batchnorm_constructor(s, o))), "")
    built, flag = {id(o) for o in origins}, ""
    for x, node, gate in gated:
        # the conversion (`model = convert_sync_batchnorm(model)`) or constructor (`Net(sync_bn=...)`) it comes from
        holder = next((c for c in x.calls if node in c.keywords or node is c.func or node in ast.walk(c.func)), None)
        if x is s and holder is not None and id(holder) in built:
            flag = gate
            break
    switched = f"switched to SyncBatchNorm only when {flag} is set, which is off by default"
    if library:
        return f"{library} holds BatchNorm layers" + (f" ({switched})" if flag else "")
    classes = _program_classes(s.project)
    # (timm's factory under any of its paths: `timm.create_model`, `from timm.models import create_model`)
    known = any(isinstance(o, ast.Call) and (s.qualname(o.func).startswith("torchvision.models.") or terminal(o.func)
                                             in classes or s.qualname(o.func).startswith("timm.")
                                             and terminal(o.func) == "create_model") for o in origins)
    if flag and not known:  # a library network of another architecture, or a class of the program that names no
        # BatchNorm, has none to switch
        return f"the program's model has BatchNorm layers, {switched}"
    return ""


@check
def batchnorm_without_sync(s: Script) -> Iterator[Hit]:
    def named() -> bool:
        return any(_batchnorm_names(x) for x in s.project.scripts.values())

    if not any(script.uses_ddp for script in s.project.scripts.values()):
        return
    default, gated = s.project.memo("sync batchnorm", lambda: _conversions(s.project))
    if default:
        return
    wraps = s.project.memo("batchnorm wraps", lambda: _batchnorm_wraps(s.project))
    if wraps:  # the program's own BatchNorm classes reach these DDP calls: the fix goes where the model is wrapped
        for x, call, holder in wraps:
            if x is s:
                yield Hit(call, "DDP013", "note",
                          f"{holder} holds BatchNorm layers, and DistributedDataParallel normalises them with each "
                          "rank's own per-GPU batch statistics, not the global batch's",
                          "if the per-GPU batch is small, convert before wrapping: "
                          "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)")
        return
    first = next(iter(_batchnorm_names(s)), None)
    if first is not None:
        off = f" (SyncBatchNorm only when {gated[0][2]} is set, off by default)" if gated else ""
        yield Hit(first, "DDP013", "note",
                  f"{terminal(first)} under DistributedDataParallel normalises with each rank's own "
                  f"per-GPU batch statistics, not the global batch's{off}",
                  "if the per-GPU batch is small, convert before wrapping: "
                  "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)")
        return
    if s.project.memo("batchnorm named", named):
        return  # reported where the program names BatchNorm
    for call in s.calls:
        if s.qualname(call.func).endswith("DistributedDataParallel") and s.project.runs(s, call) \
                and (why := _batchnorm_model(s, call, gated)):
            yield Hit(call, "DDP013", "note",
                      f"{why}, and DistributedDataParallel normalises them with each rank's own per-GPU batch "
                      "statistics, not the global batch's",
                      "if the per-GPU batch is small, convert before wrapping: "
                      "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)")


def _batchnorm_wraps(project) -> list[tuple[Script, ast.Call, str]]:
    """(file, DDP call, what it wraps) for the DDP calls some rank runs whose model is built by a class or function
    of the program that names BatchNorm (itself or through the program's classes it builds)."""
    found = []
    for x in project.scripts.values():
        for call in x.calls:
            model = argument(call, "module", 0)
            if model is None or not x.qualname(call.func).endswith("DistributedDataParallel") \
                    or not project.runs(x, call):
                continue
            holder = next((name for o in _model_origins(x, model) if isinstance(o, ast.Call)
                           for name in (terminal(o.func), *sorted(_classes_passed_for(project, x, o)))
                           if _names_batchnorm(project, name, 0)), "")
            if holder:
                found.append((x, call, f"{holder}()"))
    return found


def _classes_passed_for(project, s: Script, call: ast.Call) -> set[str]:
    """`network(self)` where `network` is a parameter of the function around it (`def get_network(self, network)`,
    defined once in the program): the program's classes that the calls some rank runs pass for that parameter
    (`cfg.get_network(Generator64)` in another file), which the call builds."""
    func = next((n for n in _parents(s, call) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)] if func is not None else []
    if not isinstance(call.func, ast.Name) or call.func.id not in params \
            or sum(d.name == func.name for x in project.scripts.values() for d in x.defs) != 1:
        return set()
    method = _enclosing_class(s, func) is not None and params[0] in ("self", "cls")
    classes, found = _program_classes(project), set()
    for x, site in project.calls_named(func.name):
        shift = 1 if method and isinstance(site.func, ast.Attribute) else 0
        at = params.index(call.func.id) - shift
        arg = next((k.value for k in site.keywords if k.arg == call.func.id),
                   site.args[at] if 0 <= at < len(site.args) else None)
        if isinstance(arg, ast.Name) and arg.id in classes and project.runs(x, site) \
                and not any(isinstance(a, ast.Starred) for a in site.args):
            found.add(arg.id)
    return found


def _names_batchnorm(project, name: str, depth: int) -> bool:
    """A class or function of the program named `name` names a BatchNorm class where some rank runs it, builds a
    library network of a BatchNorm architecture there, or builds (calls) a class or function of the program that
    does."""
    if depth > 3 or not name:
        return False
    defs = [(x, d) for x in project.scripts.values() for d in x.nodes
            if isinstance(d, (ast.ClassDef, ast.FunctionDef)) and d.name == name]
    if len(defs) != 1:
        return False
    x, d = defs[0]
    named = project.memo(("batchnorm names", x.path), lambda: {id(n) for n in _batchnorm_names(x)})
    if any(id(n) in named for n in ast.walk(d)):
        return True
    # `self.resnet = resnet50()` in the program's own wrapper class: a library network of a BatchNorm architecture
    if any(isinstance(c, ast.Call) and batchnorm_constructor(x, c) and project.runs(x, c) for c in ast.walk(d)):
        return True
    called = {terminal(c.func) for c in ast.walk(d) if isinstance(c, ast.Call)} - {name}
    built = called | _classes_handed_on(project, d)
    return any(_names_batchnorm(project, c, depth + 1) for c in built if c[:1].isalpha())


def _program_classes(project) -> set[str]:
    """The names of the classes the program defines."""
    return project.memo("class names", lambda: {n.name for x in project.scripts.values() for n in x.nodes
                                                 if isinstance(n, ast.ClassDef)})


def _classes_handed_on(project, d: ast.AST) -> set[str]:
    """The program's classes `d` hands, by name, to a class or function of the program it calls, which builds
    its layers from them (`ResNet(Bottleneck, [3, 4, 6, 3])`, `_resnet(block=Bottleneck)`)."""
    classes = _program_classes(project)
    callables = classes | {f.name for x in project.scripts.values() for f in x.defs}
    return {a.id for c in ast.walk(d) if isinstance(c, ast.Call) and terminal(c.func) in callables
            for a in [*c.args, *(k.value for k in c.keywords)] if isinstance(a, ast.Name) and a.id in classes}


def _batchnorm_names(s: Script) -> list[ast.AST]:
    """The BatchNorm classes a file names where some rank runs them; a class named in a type test
    (`isinstance(layer, nn.BatchNorm2d)`) builds no layer."""
    tested = {id(m) for c in s.calls if terminal(c.func) in ("isinstance", "issubclass") and len(c.args) > 1
              for m in ast.walk(c.args[1])}
    return [n for n in s.nodes if isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in tested
            and re.fullmatch(r"BatchNorm[123]d", terminal(n)) and s.project.runs(s, n)
            and not _default_overridden(s, n)]


def _in_super(s: Script, node: ast.AST) -> bool:
    """`super(Net, self)`: the class named to reach its base, not handed on."""
    parent = s.parents.get(id(node))
    return isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id == "super"


def _default_overridden(s: Script, node: ast.AST) -> bool:
    """`node` is the default of a parameter (`def __init__(self, ..., norm_layer=nn.BatchNorm2d)`) that every call
    of its function, or construction of its class, in the program gives another value (`norm_layer=nn.InstanceNorm2d`):
    the default builds no layer. Not where the function or class is also named otherwise than called (handed on as a
    value, `partial(NLayerDiscriminator, ...)`), nor where nothing calls it."""
    arguments = s.parents.get(id(node))
    func = s.parents.get(id(arguments))
    if not isinstance(arguments, ast.arguments) or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    positional = [*arguments.posonlyargs, *arguments.args]
    pairs = list(zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults)) + [
        (a, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults) if d is not None]
    param = next((a.arg for a, d in pairs if d is node), None)
    if param is None:
        return False
    owner = s.parents.get(id(func))
    name, shift = func.name, 0
    if isinstance(owner, ast.ClassDef):
        if func.name != "__init__":
            return False
        name, shift = owner.name, 1  # (`self` is no argument of the construction)
    elif positional[:1] and positional[0].arg in ("self", "cls"):
        return False  # a method reached as an attribute: its calls are not found by name
    at = [a.arg for a in positional].index(param) - shift if param in [a.arg for a in positional] else -1
    project = s.project
    sites = project.calls_named(name)
    called = {id(c.func) for _, c in sites}
    handed = [n for x in project.scripts.values() for n in x.nodes
              if isinstance(n, (ast.Name, ast.Attribute)) and terminal(n) == name and isinstance(n.ctx, ast.Load)
              and id(n) not in called and not _in_super(x, n)]
    if not sites or handed:
        return False

    def other_value(call: ast.Call) -> bool:
        given = next((k.value for k in call.keywords if k.arg == param), None)
        if given is None and 0 <= at < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[:at]):
            given = call.args[at]
        return given is not None and not any(isinstance(n, (ast.Name, ast.Attribute))
                                             and re.fullmatch(r"BatchNorm[123]d|SyncBatchNorm", terminal(n))
                                             for n in ast.walk(given))
    return all(other_value(c) for _, c in sites)
