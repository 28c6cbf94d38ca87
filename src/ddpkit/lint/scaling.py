"""The lint checks for sums over ranks reported at the wrong scale (DDP006): the training objective all-reduced with
SUM and never divided, a sum divided by the GPU count of one machine instead of the world size."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from ddpkit.lint.analysis import Script, argument, terminal
from ddpkit.lint.passes import enclosing_function
from ddpkit.lint.rules import Hit, check

__all__ = ["summed_objective", "divided_by_device_count"]

_COPIES = frozenset({"clone", "detach", "data"})


def _summed(s: Script, call: ast.Call) -> str:
    """The name an `all_reduce` with SUM (the default) sums in place, else ''."""
    if not (s.is_dist_collective(call) and terminal(call.func) == "all_reduce" and call.args
            and isinstance(call.args[0], ast.Name)):
        return ""
    op = argument(call, "op", 1)
    return call.args[0].id if op is None or terminal(op) == "SUM" else ""


def _divided(function: ast.AST, name: str) -> bool:
    """Anything in the function divides the name (`x / n`, `x /= n`, `x.div_(n)`, `torch.div(x, n)`)."""
    for n in ast.walk(function):
        if isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv)) and any(
                isinstance(m, ast.Name) and m.id == name for m in ast.walk(n.left)):
            return True
        if isinstance(n, ast.AugAssign) and isinstance(n.op, (ast.Div, ast.FloorDiv, ast.Mult)) \
                and isinstance(n.target, ast.Name) and n.target.id == name:
            return True
        if isinstance(n, ast.Call) and terminal(n.func) in ("div", "div_", "mul", "mul_", "true_divide") and any(
                isinstance(m, ast.Name) and m.id == name for m in ast.walk(n)):
            return True
    return False


def _copy_of(value: ast.AST) -> str:
    """`loss.clone().detach()`, `loss.detach()`, `loss.data.clone()`: the name copied, else ''."""
    while isinstance(value, (ast.Call, ast.Attribute)):
        if isinstance(value, ast.Call):
            if value.args or value.keywords or not isinstance(value.func, ast.Attribute):
                return ""
            value = value.func
        if value.attr not in _COPIES:
            return ""
        value = value.value
    return value.id if isinstance(value, ast.Name) else ""


def _objectives(function: ast.AST) -> set[str]:
    """Names the function calls `.backward()` on (`loss.backward()`, `scaler.scale(loss).backward()`)."""
    out = set()
    for n in ast.walk(function):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward":
            target = n.func.value
            if isinstance(target, ast.Call) and terminal(target.func) == "scale" and target.args:
                target = target.args[0]
            if isinstance(target, ast.Name):
                out.add(target.id)
    return out


@check
def summed_objective(s: Script) -> Iterator[Hit]:
    """`reduced = loss.clone().detach(); dist.all_reduce(reduced)` then read, never divided: DDP averages the
    gradients over the ranks, so the loss that matches them is the mean over ranks; the sum is world_size times it."""
    for call in s.calls:
        name = _summed(s, call)
        function = enclosing_function(s, call) if name else None
        if function is None:
            continue
        values = [n.value for n in ast.walk(function) if isinstance(n, ast.Assign)
                  and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
        copied = {_copy_of(v) for v in values}
        if not values or "" in copied or not copied <= _objectives(function) or _divided(function, name):
            continue
        read = [n for n in ast.walk(function) if isinstance(n, ast.Name) and n.id == name
                and isinstance(n.ctx, ast.Load) and n.lineno > call.lineno]
        if read:
            yield Hit(call, "DDP006", "warning",
                      f"'{name}' (a copy of the loss backward() runs on) is all-reduced with SUM and never divided by "
                      "the world size: DDP averages the gradients over the ranks, so the figure reported is "
                      "world_size times the loss that is trained",
                      f"divide after the sum: {name} /= dist.get_world_size() (or use ReduceOp.AVG on NCCL)")


def _device_counted(s: Script, expr: ast.AST) -> bool:
    """`torch.cuda.device_count()`, or a name or attribute every store of which in the program is one
    (`args.nprocs = torch.cuda.device_count()`): the GPUs this machine shows, not the number of processes."""
    if isinstance(expr, ast.Call):
        return s.qualname(expr.func) == "torch.cuda.device_count"
    if not isinstance(expr, (ast.Name, ast.Attribute)):
        return False
    key = terminal(expr)
    stores = [(x, v) for x in s.project.scripts.values() for k, v in x.assignments if k.lstrip(".") == key]
    return bool(stores) and all(isinstance(v, ast.Call) and x.qualname(v.func) == "torch.cuda.device_count"
                                for x, v in stores)


def _sets_world_size(s: Script, expr: ast.AST) -> bool:
    """Some `init_process_group` of the program is given this value as its world size (`world_size=num_gpus`, also
    as the parameter of the helper that calls it): the program starts one process per GPU it counts, so the GPU
    count is the world size."""
    key = terminal(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
    for x in s.project.scripts.values():
        for call in x.calls:
            if x.qualname(call.func) != "torch.distributed.init_process_group":
                continue
            size = argument(call, "world_size", 3)
            if size is not None and (key is not None and isinstance(size, (ast.Name, ast.Attribute))
                                     and terminal(size) == key or _device_counted(x, size)):
                return True
    return False


def _dividing_parameters(s: Script) -> dict[str, int]:
    """{function: position of the parameter it divides an all-reduced sum by} (`def reduce_mean(t, nprocs):
    dist.all_reduce(rt); rt /= nprocs`)."""
    out = {}
    for d in s.defs:
        params = [a.arg for a in (*d.args.posonlyargs, *d.args.args)]
        summed = {n for c in ast.walk(d) if isinstance(c, ast.Call) for n in [_summed(s, c)] if n}
        for n in ast.walk(d):
            divisor = n.value if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) \
                and isinstance(n.target, ast.Name) and n.target.id in summed else \
                n.right if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) \
                and isinstance(n.left, ast.Name) and n.left.id in summed else None
            if isinstance(divisor, ast.Name) and divisor.id in params:
                out[d.name] = params.index(divisor.id)
    return out


@check
def divided_by_device_count(s: Script) -> Iterator[Hit]:
    """A sum over all ranks divided by `torch.cuda.device_count()` (directly, or by a helper given it): the GPUs of
    one machine, which is the world size only on one machine running a process on every GPU it shows (not reported
where the program passes that count to `init_process_group` as the world size)."""
    helpers = s.project.memo("dividing helpers", lambda: {
        (x.path, name): index for x in s.project.scripts.values() for name, index in _dividing_parameters(x).items()})
    for call in s.calls:
        found = s.project.resolve(s, call.func) if not isinstance(call.func, ast.Name) or \
            call.func.id not in s.function_names else (s.path, call.func.id)
        index = helpers.get(found) if found else None
        if index is not None and len(call.args) > index and _device_counted(s, call.args[index]) \
                and not _sets_world_size(s, call.args[index]):
            yield Hit(call, "DDP006", "warning",
                      f"{ast.unparse(call.func)}() divides a sum over all ranks by {ast.unparse(call.args[index])}, "
                      "the number of GPUs this machine shows, not the number of processes: on several machines, or "
                      "with fewer processes than GPUs, the figure is scaled wrong",
                      "divide by dist.get_world_size()")
