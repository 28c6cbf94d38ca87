"""Tensors made on the CPU that reach the wrapped model, datasets that put samples on the device, and sizes built
from the training batch size (each rank's batch is `B // world_size`)."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import RANDOM_DRAW, dotted, is_device_expr, root_name, walk

__all__ = ["move_cpu_input", "made_on_cpu", "plan_device_datasets", "plan_batch_dependents", "plan_batch_divisions",
           "passed_as", "RANDOM_DRAW", "CREATORS"]

CREATORS = frozenset({"randn", "rand", "randint", "zeros", "ones", "empty", "full", "arange", "linspace", "eye",
                       "randperm", "tensor", "as_tensor"})
"""torch functions that take device=: a tensor made by them is made on ctx.device instead of moved there."""
_TENSOR_FUNCS = CREATORS | {"from_numpy", "unsqueeze", "squeeze", "cat", "stack", "FloatTensor", "LongTensor",
                             "Tensor", "normal", "sin", "cos", "exp", "pow", "reshape", "flatten"}
_TENSOR_METHODS = frozenset({"type", "float", "long", "double", "half", "int", "view", "reshape", "unsqueeze",
                             "squeeze", "permute", "contiguous", "clone", "transpose", "flatten", "detach"})
_TORCH_ONLY = frozenset({"type", "float", "long", "double", "half", "unsqueeze", "permute", "contiguous", "detach"})
"""Tensor methods numpy arrays do not have."""


def made_on_cpu(expr: cst.BaseExpression) -> bool:
    """A new tensor made on the CPU (`_tensor_made`), given no device (`torch.tensor(x, device=d)` is not)."""
    return _tensor_made(expr) and not any(isinstance(c, cst.Call) and any(
        a.keyword is not None and a.keyword.value == "device" for a in c.args) for c in walk(expr))


def _tensor_made(expr: cst.BaseExpression) -> bool:
    """`from_numpy(a)`, `torch.unsqueeze(d, 1).type(torch.FloatTensor)[:2000] / 255.`,
    `data[:8].view(-1, 784).float()`: a new CPU tensor (a method numpy arrays lack says it is one)."""
    while True:
        if isinstance(expr, cst.BinaryOperation):
            expr = expr.left
        elif isinstance(expr, cst.Subscript):
            expr = expr.value
        elif isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and \
                expr.func.attr.value in _TENSOR_METHODS and not dotted(expr.func).startswith(("torch.", "np.")):
            if expr.func.attr.value in _TORCH_ONLY:
                return True
            expr = expr.func.value
        elif isinstance(expr, cst.Call):
            name = dotted(expr.func)
            return name in ("from_numpy", "torch.from_numpy") or name.startswith("torch.") and \
                name.rsplit(".", 1)[-1] in _TENSOR_FUNCS and name.count(".") == 1
        else:
            return False


def move_cpu_input(plan: Any, key: str, name: str) -> bool:
    """A tensor the script makes on the CPU and gives to the wrapped model: make or move it on ctx.device where it
    is assigned. True when every assignment of `name` in the scope is a new tensor (then it is planned), else
    False (the caller leaves a TODO)."""
    values = [n for n in plan.nodes(key) if isinstance(n, cst.Assign) and len(n.targets) == 1
              and isinstance(n.targets[0].target, cst.Name) and n.targets[0].target.value == name]
    if not values or not all(_tensor_made(a.value) for a in values):
        return False
    for assign in values:
        plan.to_device.add(id(assign))
    _move_partners(plan, key, {name})
    return True


def _move_partners(plan: Any, key: str, moved: set[str]) -> None:
    """Tensors made on the CPU that meet the model's output in one statement (`loss = crit(y_pred, y_data)`)."""
    nodes = list(plan.nodes(key))
    on_device = set(moved)
    for n in nodes:
        if isinstance(n, cst.Assign) and len(n.targets) == 1 and any(
                isinstance(c, cst.Call) and plan.role(key, dotted(c.func)) == "model" for c in walk(n.value)):
            on_device |= {x.value for x in walk(n.targets[0].target) if isinstance(x, cst.Name)}
    made = {}
    for n in nodes:
        if isinstance(n, cst.Assign) and len(n.targets) == 1 and isinstance(n.targets[0].target, cst.Name):
            made.setdefault(n.targets[0].target.value, []).append(n)
    for stmt in (n for n in nodes if isinstance(n, cst.SimpleStatementLine)):
        names = {x.value for x in walk(stmt) if isinstance(x, cst.Name)}
        if not names & on_device or any(isinstance(c, cst.Call) and isinstance(c.func, cst.Attribute)
                                        and c.func.attr.value == "numpy" for c in walk(stmt)):
            continue
        for other in names - on_device:
            assigns = made.get(other, [])
            if assigns and all(_tensor_made(a.value) and not re.search(r"device|cuda|\.to\(", plan.f.code(a.value))
                               for a in assigns):
                for a in assigns:
                    plan.to_device.add(id(a))


# ---- datasets given the device -------------------------------------------------------------------------
def plan_device_datasets(plan: Any) -> None:
    """`UrbanSound(..., device)`: its samples come out on ctx.device; the loaders over it must not pin them and
    must not fork workers (CUDA cannot run in a forked worker): then it is ported, else a TODO."""
    datasets = {name for name, cls in plan.f.classes.items() if any(
        dotted(b.value).rsplit(".", 1)[-1] in ("Dataset", "IterableDataset") for b in cls.bases)}
    for key in sorted(plan.f.ported):
        for node in plan.nodes(key):
            name = dotted(node.func) if isinstance(node, cst.Call) else ""
            # a function of the script (`load_datasets(config, device)`) is no dataset: one it builds is met inside
            if name and ("dataset" in name.rsplit(".", 1)[-1].lower() or name in datasets) and not _script_function(
                    plan, name) and any(
                    is_device_expr(a.value) and not isinstance(a.value, cst.SimpleString) for a in node.args):
                _device_dataset(plan, key, node)


def _script_function(plan: Any, name: str) -> bool:
    """`name` is a module-level function of the script, not a class."""
    scope = plan.f.scopes.get(name)
    return scope is not None and scope.cls is None and name not in plan.f.classes


def _device_dataset(plan: Any, key: str, call: cst.Call) -> None:
    stmt = plan._stmt.get(id(call))
    target = dotted(stmt.body[0].targets[0].target) if isinstance(stmt, cst.SimpleStatementLine) and isinstance(
        stmt.body[0], cst.Assign) and stmt.body[0].value is call and len(stmt.body[0].targets) == 1 else ""
    loaders = []
    if target:
        plan._set_role(key, target, "device_data")
        plan._propagate_roles()
        for k in sorted(plan.f.ported):
            for n in plan.nodes(k):
                if isinstance(n, cst.Call) and id(n) in plan.loaders:
                    first = next((a.value for a in n.args if a.keyword is None or a.keyword.value == "dataset"), None)
                    if first is not None and plan.role(k, dotted(first)) == "device_data":
                        loaders.append(n)
    workers = [n for n in loaders if any(a.keyword and a.keyword.value == "num_workers" and not (
        isinstance(a.value, cst.Integer) and a.value.value == "0") for a in n.args) or id(n) in plan.spread]
    if not loaders or workers:
        plan.todo(call, "the dataset is given the device: if it puts samples there itself, ddpkit.loader "
                  "cannot pin them or send them through worker processes; build it on the CPU "
                  "(device='cpu') and let the loader move each batch")
        return
    for n in loaders:
        plan.unpinned.add(id(n))
    plan.note(call, "this dataset puts its samples on ctx.device itself: its loader does not pin them "
              "(pin_memory=False) and keeps num_workers=0 (CUDA cannot run in forked workers)")


_SHAPED = frozenset({"view", "reshape", "expand", "repeat", "eye", "zeros", "ones", "randn", "rand", "randint", "empty",
                     "full", "arange", "range", "split", "chunk", "narrow", "new_zeros", "new_ones", "new_full"})
"""Calls whose arguments are sizes: a batch size among them sizes a tensor to the script's (global) batch."""
_STATE = re.compile(r"hidden|state|noise|memory", re.IGNORECASE)
"""`init_hidden(64)`, `make_noise(batch_size)`: a per-batch state or draw sized by its argument."""


def plan_batch_dependents(plan: Any) -> None:
    """A training loader's batch is divided by world_size; a size built from the script's batch size anywhere in
    the code the port runs (`torch.eye(2 * batch_size)`, `out.view(batch_size, -1)`, `model.init_hidden(64)`,
    `range(batch_size)`) still has the global one: a shape mismatch on two ranks. A TODO names the first one in
    each function (unless the training-loop rule named it already)."""
    names = set(plan.train_sizes)
    literals: set[int] = set()
    for key in sorted(plan.f.ported):
        for node in plan.nodes(key):
            if isinstance(node, cst.Call) and plan.loaders.get(id(node)) == "train":
                size = _batch_arg(node)
                value = plan._literal(key, size) if size is not None else None
                if value is not None and value > 1:
                    literals.add(value)
    if not names and not literals:
        return
    named = {m.split("`")[1] for _, m in plan.todos if "is the global batch" in m}
    for key in sorted(plan.f.ported):
        params = set(plan.f.scopes[key].params)
        for node in plan.nodes(key):
            if not isinstance(node, cst.Call) or id(node) in plan.loaders:
                continue
            func = dotted(node.func)
            last = func.rsplit(".", 1)[-1]
            state = bool(_STATE.search(last))
            if last not in _SHAPED and not state:
                continue
            use = None
            for arg in node.args:
                if arg.keyword is not None and arg.keyword.value not in ("size", "batch_size", "bsz", "n"):
                    continue
                for part in walk(arg.value):
                    text = dotted(part) if isinstance(part, (cst.Name, cst.Attribute)) else ""
                    if text and text in names and text not in named and root_name(part) not in params:
                        use = text
                    elif state and isinstance(part, cst.Integer) and int(part.evaluated_value) in literals:
                        use = part.value
                    if use:
                        break
                if use:
                    break
            if use is None or _in_eval_loop(plan, key, node):  # an evaluation loader keeps its batch size
                continue
            plan.todo(node, f"`{plan.f.code(node)}` is sized by the batch size {use}, the global batch, but each "
                      f"rank's batch now holds {use} // ctx.world_size samples: size it from the batch itself "
                      "(e.g. x.size(0)), or keep the global batch per rank")
            named.add(use)
            break  # one TODO per function: the rest follow from it


def plan_batch_divisions(plan: Any) -> None:
    """A figure divided by the training batch size on the training path (`corrects / args.batch_size` in a helper
    the loop calls, `num_batch = len(dataset) / opt.batchSize` beside the loop): each rank's batch now holds
    B // world_size samples and each rank runs 1/world_size of the steps, so the figure is off by world_size.
    A TODO names the first one in each function; uses inside the training loop itself have their own rule."""
    names = set(plan.train_sizes)
    if not names:
        return
    loops = {key: [n for n in plan.nodes(key) if isinstance(n, cst.For) and plan.loop_role(key, n) == "train"]
             for key in sorted(plan.f.ported)}
    inside = {id(n) for key in loops for loop in loops[key] for n in walk(loop.body)}
    path = {key for key, found in loops.items() if found}  # functions that hold a training loop
    frontier = [c for key in sorted(path) for loop in loops[key] for c in walk(loop.body) if isinstance(c, cst.Call)]
    reached = {k for c in frontier for key in path for k in plan.f.callees(c, key) if k in plan.f.ported}
    for _ in range(2):  # the script's functions those call, two levels on
        reached |= {k for key in sorted(reached) for c in plan.nodes(key) if isinstance(c, cst.Call)
                    for k in plan.f.callees(c, key) if k in plan.f.ported}
    # and the functions that call a training function (`for epoch in ...: train(...)` after `n = len(ds) / B`)
    path |= {k for k in sorted(plan.f.ported) for c in plan.nodes(k) if isinstance(c, cst.Call)
             and any(callee in path for callee in plan.f.callees(c, k))}
    for key in sorted(path | reached):
        params = set(plan.f.scopes[key].params)
        for node in plan.nodes(key):
            if not isinstance(node, cst.BinaryOperation) or not isinstance(node.operator, (
                    cst.Divide, cst.FloorDivide)) or (id(node) in inside and key in path):
                continue
            use = next((dotted(n) for n in walk(node.right) if isinstance(n, (cst.Name, cst.Attribute))
                        and dotted(n) in names and (root_name(n) not in params or _passed_alike(plan, key, n))),
                       None)
            if use is None or _in_eval_loop(plan, key, node):
                continue
            where = "on the training path" if key in path else "in a function the training loop calls"
            plan.todo(node, f"`{plan.f.code(node)}` divides by {use}, the global batch, {where}: each rank's batch "
                      f"now holds {use} // ctx.world_size samples and each rank runs 1/world_size of the steps, so "
                      "this figure is off by world_size; divide by the batch's own size (e.g. y.size(0)) or count "
                      "steps with len(loader)")
            break  # one TODO per function: the rest follow from it


def _given(plan: Any, key: str, param: str) -> list[cst.BaseExpression | None]:
    """What each call of the script's function `key` passes for its parameter `param` (None: the default)."""
    index = plan.f.scopes[key].params.index(param)
    given: list[cst.BaseExpression | None] = []
    for caller in sorted(plan.f.ported):
        for call in (n for n in plan.nodes(caller) if isinstance(n, cst.Call) and key in plan.f.callees(n, caller)):
            positional = [a for a in call.args if a.keyword is None and not a.star]
            given.append(next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param),
                              positional[index].value if index < len(positional) else None))
    return given


def _passed_alike(plan: Any, key: str, node: cst.CSTNode) -> bool:
    """`def train(args): ... / args.batch_size` called as `train(args)`: the parameter is the caller's `args`."""
    given = _given(plan, key, root_name(node))
    return bool(given) and all(g is not None and dotted(g) == root_name(node) for g in given)


def passed_as(plan: Any, key: str, name: str) -> set[str]:
    """`def make_loader(ds, batch_size): DataLoader(ds, batch_size=batch_size)` called as
    `make_loader(ds, args.batch_size)`: the callers' names for a parameter-rooted batch size."""
    root, _, rest = name.partition(".")
    if root not in plan.f.scopes[key].params or key == plan.f.entry_key:
        return set()
    return {f"{dotted(g)}.{rest}" if rest else dotted(g) for g in _given(plan, key, root)
            if g is not None and dotted(g)}


def _batch_arg(call: cst.Call) -> cst.BaseExpression | None:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "batch_size":
            return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return positional[1].value if len(positional) > 1 else None


def _in_eval_loop(plan: Any, key: str, node: cst.CSTNode) -> bool:
    """Inside a loop over an evaluation loader, or where no gradient is taken (`with torch.no_grad():`, a
    function decorated so): a sample drawn there (`torch.randn(batch_size, z_dim)` to decode) meets no batch."""
    scope = plan.f.scopes[key].node
    if isinstance(scope, cst.FunctionDef) and any(_NO_GRAD.search(plan.f.code(d.decorator))
                                                  for d in scope.decorators):
        return True
    stmt = plan._stmt.get(id(node))
    while stmt is not None:
        if isinstance(stmt, cst.For) and plan.loop_role(key, stmt) == "eval":
            return True
        if isinstance(stmt, cst.With) and any(_NO_GRAD.search(plan.f.code(i.item)) for i in stmt.items):
            return True
        stmt = plan._parent.get(id(stmt))
    return False


_NO_GRAD = re.compile(r"no_grad|inference_mode")
