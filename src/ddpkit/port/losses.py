"""Losses that sum over the batch: after the port each rank sums its share and DDP averages, so they are scaled.

The original's gradient of a sum-reduced loss (`nn.MSELoss(reduction="sum")`, `F.binary_cross_entropy(...,
size_average=False)`, `-0.5 * torch.sum(1 + logvar - ...)`) is the sum over the global batch. After the port each
rank sums over its `B // world_size` samples and DDP averages the ranks' gradients: the step is the original's divided
by world_size. The port multiplies the loss by `ctx.world_size` where backward() is called on it (`(loss *
ctx.world_size).backward()`), so the averaged gradient is the original's sum again; the loss's value, which the script
prints or sums, is left as it was. Where the reduction cannot be read (chosen at run time) or terms summed over the
batch meet terms averaged over it, a TODO names the loss instead.
"""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpkit.port.facts import ARGS_ROOTS, dotted, walk


__all__ = ["plan_summed_losses"]

SUM, MEAN, EACH, FREE, UNKNOWN, MIXED = "sum", "mean", "each", "free", "unknown", "mixed"
"""How a value reduces over the batch: summed, averaged, per sample (not reduced), free of the batch (a number, a
weight penalty), not readable (the reason is kept beside it), or summed and averaged terms together."""

_FUNCTIONAL = ("torch.nn.functional.", "nn.functional.", "F.", "functional.")
_NN = ("torch.nn.", "nn.")
_LOSS_FUNCTIONS = frozenset({
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "cross_entropy", "nll_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss",
    "margin_ranking_loss", "hinge_embedding_loss", "multilabel_margin_loss", "multilabel_soft_margin_loss",
    "multi_margin_loss", "soft_margin_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss", "ctc_loss"})
_TOLD = "(not torch's own loss, told to sum)"
_BATCH_COUNT = ("size(", ".shape", "len(", ".numel(")
_DEPTH = 12
_KEEPS = frozenset({"sum", "mean", "item", "detach", "float", "double", "half", "squeeze", "clone", "cuda", "to",
                    "cpu", "contiguous"})
"""Methods that leave a loss's (or a criterion's) reduction as it was; `sum` and `mean` decide it."""
_ARITHMETIC = frozenset({"mul", "mul_", "add", "add_", "sub", "sub_"})
_TORCH_ARITHMETIC = {"torch.mul": cst.Multiply, "torch.multiply": cst.Multiply, "torch.add": cst.Add,
                     "torch.sub": cst.Subtract}
_CONSTANT_TENSORS = frozenset({"torch.Tensor", "torch.tensor", "torch.FloatTensor", "torch.as_tensor"})


def plan_summed_losses(plan: Any) -> None:
    """Each `x.backward()` of a ported scope whose loss sums over the batch is scaled by ctx.world_size (only where a
    training loader is sharded: with the same data on every rank the average of equal gradients is the original's);
    a loss whose reduction cannot be read, or that mixes summed and averaged terms, gets a TODO naming it."""
    if "train" not in plan.loaders.values():
        return
    for key in sorted(plan.f.ported):
        for call in [n for n in plan.nodes(key) if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                     and n.func.attr.value == "backward" and all(a.keyword is not None for a in n.args)]:
            kind, why = _reduction(plan, key, call.func.value, plan.line_of(call), 0)
            loss = plan.f.code(call.func.value)
            if kind == SUM:
                plan.scale_backward.add(id(call))
                plan.note(call, f"`{loss}` sums over the batch ({why}): each rank sums its batch_size // world_size "
                          "samples and DDP averages the gradients, so backward() gets it times ctx.world_size: "
                          "the gradient is the original's sum over the global batch (the value itself is not scaled)")
                if isinstance(call.func.value, cst.Name):
                    _reported_sums(plan, key, call.func.value.value)
            elif kind == MIXED:
                plan.todo(call, f"`{loss}` adds terms summed over the batch ({why}) to terms that are not: each rank "
                          "sums its batch_size // world_size samples and DDP averages the gradients, so the summed "
                          "terms' gradient is 1/world_size of the original's; multiply those terms (only) by "
                          "ctx.world_size where backward() is called")
            elif kind == UNKNOWN and why:
                plan.todo(call, f"not checked: `{loss}` reaches backward() through {why}, and the port cannot "
                          "read how the whole loss reduces over the batch: if it sums over the batch, each rank sums "
                          "its batch_size // world_size samples and DDP averages the gradients (1/world_size of the "
                          "original's step): then call backward() on it times ctx.world_size")


_REPORTS = frozenset({"print", "info", "debug", "warning", "add_scalar", "set_postfix", "set_description", "write"})
"""Calls that report a value (a print, a log line, a tracker's scalar, a progress bar's text)."""


def _reported_sums(plan: Any, key: str, name: str) -> None:
    """A TODO at each report of the summed loss `name` itself in its scope (`print(loss.item())`): it is the sum over
    this rank's batch_size // world_size samples, about 1/world_size of the figure the original printed. A report
    that divides by the batch's count (`loss.item() / len(x)`) is a per-sample mean and keeps its scale."""
    done: set[int] = set()
    for stmt in plan.f.scope_statements(key):
        for node in walk(stmt):
            summed = _times_batch_count(plan, node.value) if isinstance(node, cst.AugAssign) and isinstance(
                node.operator, cst.AddAssign) and id(node) not in done else None
            if summed is not None and any(isinstance(n, cst.Name) and (n.value == name or _reduction(
                    plan, key, n, plan.line_of(node), 0)[0] == SUM) for n in walk(summed)):
                # `total += loss.item() * x.shape[0]` of a loss that already sums the batch: per rank, a sum over
                # batch_size // world_size samples times that count, so the ranks' total is 1/world_size of the
                # original's (a per-sample mean times the count would be right: it is the sum)
                done.add(id(node))
                plan.todo(node, f"`{plan.f.code(summed)}` already sums over the batch, and this adds it times the batch's size, "
                          "which is now this rank's batch_size // world_size: summed over the ranks the figure is "
                          "1/world_size of the original's; add the sum itself (or its mean over the batch times the "
                          "size), then reduce it across ranks")
                continue
            func = dotted(node.func) if isinstance(node, cst.Call) else ""
            if func.rsplit(".", 1)[-1] not in _REPORTS and func != "wandb.log":
                continue
            text = "".join(plan.f.code(a.value) for a in node.args)
            if any(any(isinstance(n, cst.Name) and n.value == name for n in walk(a.value)) for a in node.args) \
                    and not any(c in text for c in _BATCH_COUNT) and id(node) not in done:
                done.add(id(node))
                plan.todo(node, f"`{name}` sums over this rank's batch_size // world_size samples, so the value "
                          "reported here is about 1/world_size of the original's figure: report "
                          f"ddpkit.all_reduce_sum(ctx, {name}.detach()) (on every rank, outside `if ctx.is_main:`) "
                          "instead, or name the figure as this rank's")


def _times_batch_count(plan: Any, expr: cst.BaseExpression) -> cst.BaseExpression | None:
    """`loss.item() * x.size(0)`, `loss.cpu().data.numpy() * x.shape[0]`: the value multiplied by a count of the
    batch's samples (`loss.item()`), else None."""
    if not (isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply)):
        return None
    counts = [any(c in plan.f.code(side) for c in _BATCH_COUNT) for side in (expr.left, expr.right)]
    if counts == [False, True]:
        return expr.left
    if counts == [True, False]:
        return expr.right
    return None


def _reduction(plan: Any, key: str, expr: cst.BaseExpression, line: int, depth: int) -> tuple[str, str]:
    """(how `expr` reduces over the batch, the code that says so) as read in scope `key` before `line`."""
    if depth > _DEPTH:
        return UNKNOWN, ""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return FREE, ""
    if isinstance(expr, cst.UnaryOperation):
        return _reduction(plan, key, expr.expression, line, depth + 1)
    if isinstance(expr, cst.BinaryOperation):
        left = _reduction(plan, key, expr.left, line, depth + 1)
        if isinstance(expr.operator, (cst.Add, cst.Subtract)):
            right = _reduction(plan, key, expr.right, line, depth + 1)
            return _join(left, right)
        if isinstance(expr.operator, (cst.Divide, cst.FloorDivide)):
            return _divided(plan, key, left, expr.right, line)
        if isinstance(expr.operator, cst.Multiply):
            right = _reduction(plan, key, expr.right, line, depth + 1)
            if FREE in (left[0], right[0]):
                return right if left[0] == FREE else left
            return (UNKNOWN, "") if left[0] != right[0] else left
        return UNKNOWN, ""
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return _name(plan, key, dotted(expr), line, depth)
    if isinstance(expr, cst.Call):
        return _call(plan, key, expr, line, depth)
    return UNKNOWN, ""


def _divided(plan: Any, key: str, left: tuple[str, str], divisor: cst.BaseExpression, line: int) -> tuple[str, str]:
    """A sum divided by this rank's own count (`x.size(0)`, `n = len(y)`, `mask.sum()`) is a mean over its batch; by
    a number fixed before training (a literal, an argument, the global batch size) it stays a sum; by anything else
    the port cannot tell."""
    told = left[0] == UNKNOWN and left[1].endswith(_TOLD)
    if left[0] != SUM and not told:
        return left
    if _fixed(plan, key, divisor, line, 0):
        return left
    text = plan.f.code(divisor)
    if any(m in text for m in (*_BATCH_COUNT, ".sum(")) or _counted(plan, key, divisor, line):
        return MEAN, ""  # `crit(out, y) / x.size(0)`: divided by this rank's own batch
    if told:
        return left
    return UNKNOWN, f"{left[1]} divided by `{text}`"


def _fixed(plan: Any, key: str, expr: cst.BaseExpression, line: int, depth: int) -> bool:
    """A number that is the same on every rank and every step: a literal, an UPPER_CASE name, an argument
    (`args.batch_size`), the training batch size, or a name bound only to such values before `line`."""
    if isinstance(expr, (cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.BinaryOperation):
        return _fixed(plan, key, expr.left, line, depth) and _fixed(plan, key, expr.right, line, depth)
    name = dotted(expr)
    if not name or depth > 4:
        return False
    values = [n.value for n in plan.nodes(key) if isinstance(n, cst.Assign) and plan.line_of(n) < line
              and any(dotted(t.target) == name for t in n.targets)]
    if values:  # bound here (`N = x.size(0)` is no constant, whatever its spelling)
        return all(_fixed(plan, key, v, line, depth + 1) for v in values)
    return name in plan.train_sizes or name.isupper() or name.split(".")[0] in ARGS_ROOTS


def _counted(plan: Any, key: str, expr: cst.BaseExpression, line: int) -> bool:
    """`n = y.size(0)` ... `/ n`: a name bound to a count of this rank's batch."""
    name = dotted(expr)
    return bool(name) and any(isinstance(n, cst.Assign) and plan.line_of(n) < line
                              and any(dotted(t.target) == name for t in n.targets)
                              and any(m in plan.f.code(n.value) for m in _BATCH_COUNT) for n in plan.nodes(key))


def _join(a: tuple[str, str], b: tuple[str, str]) -> tuple[str, str]:
    kinds = {a[0], b[0]} - {FREE}
    if not kinds:
        return FREE, ""
    if kinds == {SUM}:
        return SUM, " and ".join(dict.fromkeys(w for w in (a[1], b[1]) if w))
    if SUM in kinds and kinds & {MEAN, EACH}:
        return MIXED, a[1] if a[0] == SUM else b[1]
    if MIXED in kinds:
        return MIXED, a[1] if a[0] == MIXED else b[1]
    if UNKNOWN in kinds:  # a sum beside a term the port cannot read: named (a TODO), never scaled silently
        if SUM in kinds:
            return UNKNOWN, a[1] if a[0] == SUM else b[1]
        return UNKNOWN, a[1] if a[0] == UNKNOWN else b[1]
    return (MEAN, "") if kinds == {MEAN} else (UNKNOWN, "")


def _name(plan: Any, key: str, name: str, line: int, depth: int) -> tuple[str, str]:
    """A name: what every assignment to it in the scope before `line` holds (a parameter: what callers pass)."""
    if not name:
        return UNKNOWN, ""
    values: list[cst.BaseExpression] = []
    parts: list[tuple[cst.BaseExpression, int]] = []
    for node in plan.nodes(key):
        if plan.line_of(node) >= line:
            continue
        if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets):
            values.append(node.value)
        elif isinstance(node, cst.AugAssign) and dotted(node.target) == name:
            values.append(node.value)
        elif isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Tuple):
            names = [dotted(e.value) for e in node.targets[0].target.elements]
            if name in names:  # `rec, kld = vae_loss(...)`: that element of what it returns
                parts.append((node.value, names.index(name)))
    result: tuple[str, str] | None = None
    for value, index in parts:
        found = _element(plan, key, value, index, depth + 1)
        result = found if result is None else _join(result, found)
    if parts and not values:
        return result if result is not None else (UNKNOWN, "")
    if not values:
        scope = plan.f.scopes[key]
        if name in scope.params:
            return _passed(plan, key, name, depth)
        return FREE, ""  # a number from elsewhere (`alpha`, `args.beta`), or a value the port cannot follow
    for value in values:
        found = _reduction(plan, key, value, plan.line_of(value), depth + 1)
        result = found if result is None else _join(result, found)
    return result if result is not None else (UNKNOWN, "")


def _passed(plan: Any, key: str, param: str, depth: int) -> tuple[str, str]:
    """A parameter of the script's function: what each call of it passes (positionally or by keyword)."""
    index = plan.f.scopes[key].params.index(param)
    result: tuple[str, str] | None = None
    for caller in sorted(plan.f.ported):
        for call in (n for n in plan.nodes(caller) if isinstance(n, cst.Call) and key in plan.f.callees(n, caller)):
            positional = [a for a in call.args if a.keyword is None and not a.star]
            given = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == param),
                         positional[index].value if index < len(positional) else None)
            if given is None:
                continue
            found = _reduction(plan, caller, given, plan.line_of(call), depth + 1)
            result = found if result is None else _join(result, found)
    return result if result is not None else (FREE, "")


def _call(plan: Any, key: str, call: cst.Call, line: int, depth: int) -> tuple[str, str]:
    func = dotted(call.func)
    code = plan.f.code(call)
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "div" and call.args and func != "torch.div":
        return _divided(plan, key, _reduction(plan, key, call.func.value, line, depth + 1), call.args[0].value, line)
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "scale" and len(call.args) == 1:
        return _reduction(plan, key, call.args[0].value, line, depth + 1)  # `scaler.scale(loss)`: AMP's scaling
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in _ARITHMETIC and len(call.args) == 1:
        method = call.func.attr.value.rstrip("_")  # `torch.sum(k).mul_(-0.5)`, `bce.add(kld)`: as `*` and `+`
        op = cst.Multiply() if method == "mul" else cst.Add() if method == "add" else cst.Subtract()
        return _reduction(plan, key, cst.BinaryOperation(call.func.value, op, call.args[0].value), line, depth + 1)
    if func in _TORCH_ARITHMETIC and len(call.args) == 2:  # `torch.mul(weight, loss)`: as `weight * loss`
        return _reduction(plan, key, cst.BinaryOperation(call.args[0].value, _TORCH_ARITHMETIC[func](),
                                                         call.args[1].value), line, depth + 1)
    if func in _CONSTANT_TENSORS:
        return FREE, ""  # `torch.Tensor(config["WEIGHT"])`: a weight vector, free of the batch
    if func == "torch.div" and len(call.args) >= 2:
        return _divided(plan, key, _reduction(plan, key, call.args[0].value, line, depth + 1), call.args[1].value,
                        line)
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in _KEEPS:
        method = call.func.attr.value
        inner = call.func.value
        if func in ("torch.sum", "torch.mean"):
            method, inner = func.split(".")[1], call.args[0].value if call.args else inner
            dims = call.args[1:]
        else:
            dims = list(call.args)
        if method in ("sum", "mean"):
            return _reduced(plan, key, method, inner, dims, code, line, depth)
        return _reduction(plan, key, inner, line, depth + 1)
    if func == "sum" and call.args and "parameters(" in plan.f.code(call.args[0].value):
        return FREE, ""  # `sum(p.pow(2).sum() for p in model.parameters())`
    short = func.rsplit(".", 1)[-1]
    full = _full(plan, func)
    if short in _LOSS_FUNCTIONS and full.startswith(_FUNCTIONAL):
        return _options(plan, key, call, code, line, depth)
    criterion = _criterion(plan, key, func, line, depth)
    if criterion is not None:
        return criterion
    if _full(plan, func).startswith(_NN) and func.endswith("Loss"):
        return _options(plan, key, call, code, line, depth)  # the criterion itself, as its callers see it
    found = _element(plan, key, call, None, depth)
    if found[0] == UNKNOWN and _options(plan, key, call, "", line, depth)[0] == SUM:
        return UNKNOWN, f"`{code}` {_TOLD}"  # `CrossEntropyLoss2d(size_average=False)`
    return found


def _reduced(plan: Any, key: str, method: str, inner: cst.BaseExpression, dims: list[cst.Arg], code: str,
             line: int, depth: int) -> tuple[str, str]:
    """`inner.sum()`, `torch.mean(inner)`: over the batch, unless it runs over features (`dim=1`) or over values
    already averaged over the batch (`torch.sum(weight * mse)` sums the weighted terms of a batch mean: a mean)."""
    if "parameters(" in plan.f.code(inner):
        return FREE, ""  # a weight penalty: free of the batch
    if dims and not any(plan.f.code(a.value).strip() in ("0", "-0") for a in dims):
        return EACH, ""  # summed over features: still one value per sample
    found = _reduction(plan, key, inner, line, depth + 1)
    if found[0] in (MEAN, MIXED):
        return found
    if method == "mean":
        return MEAN, ""
    if _weighted_loss(plan, key, inner, line):
        return UNKNOWN, ""  # a weight vector times a loss the port cannot read: a sum over terms, most likely
    return SUM, code


def _weighted_loss(plan: Any, key: str, expr: cst.BaseExpression, line: int) -> bool:
    """`weight * loss`, `torch.mul(weight, loss)`: a constant weight tensor times a criterion's result."""
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply):
        sides = [expr.left, expr.right]
    elif isinstance(expr, cst.Call) and dotted(expr.func) in ("torch.mul", "torch.multiply") and len(expr.args) == 2:
        sides = [a.value for a in expr.args]
    else:
        return False
    kinds = [(_bound_to(plan, key, s, line, _is_constant_tensor), _bound_to(plan, key, s, line, _is_loss_call))
             for s in sides]
    return (kinds[0][0] and kinds[1][1]) or (kinds[1][0] and kinds[0][1])


def _bound_to(plan: Any, key: str, expr: cst.BaseExpression, line: int, test: Any) -> bool:
    """`test` holds for `expr`, or for every value bound to the name `expr` in the scope before `line`."""
    if not isinstance(expr, cst.Name):
        return test(expr)
    values = [n.value for n in plan.nodes(key) if isinstance(n, cst.Assign) and plan.line_of(n) < line
              and any(dotted(t.target) == expr.value for t in n.targets)]
    return bool(values) and all(test(v) for v in values)


def _is_constant_tensor(expr: cst.BaseExpression) -> bool:
    """`torch.Tensor([1.0, 0.5])`, `torch.tensor(cfg["w"]).to(device)`: a tensor made from numbers."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _KEEPS \
            and dotted(expr.func) not in _CONSTANT_TENSORS:
        expr = expr.func.value
    return isinstance(expr, cst.Call) and dotted(expr.func) in _CONSTANT_TENSORS


def _is_loss_call(expr: cst.BaseExpression) -> bool:
    """`content_criterion(sr, gt)`, `self.perceptual_loss(a, b)`: a call of something named as a loss."""
    name = dotted(expr.func).rsplit(".", 1)[-1].lower() if isinstance(expr, cst.Call) else ""
    return any(word in name for word in ("loss", "criterion"))


def _element(plan: Any, key: str, value: cst.BaseExpression, index: int | None, depth: int) -> tuple[str, str]:
    """What a call of the script's own function returns (element `index` of a returned tuple), or element `index`
    of a tuple written out."""
    if isinstance(value, cst.Tuple) and index is not None:
        if index >= len(value.elements):
            return UNKNOWN, ""
        item = value.elements[index].value
        return _reduction(plan, key, item, plan.line_of(item) + 1, depth + 1)
    if not isinstance(value, cst.Call) or depth >= _DEPTH:
        return UNKNOWN, ""
    result: tuple[str, str] | None = None
    for callee in [c for c in plan.f.callees(value, key) if c in plan.f.scopes and c != key]:
        for ret in (n for n in plan.nodes(callee) if isinstance(n, cst.Return) and n.value is not None):
            item = ret.value
            if isinstance(item, cst.Tuple):
                at = 0 if index is None else index
                if at >= len(item.elements):
                    continue
                item = item.elements[at].value
            elif index is not None:
                continue
            found = _reduction(plan, callee, item, plan.line_of(ret) + 1, depth + 1)
            result = found if result is None else _join(result, found)
    return result if result is not None else (UNKNOWN, "")


def _criterion(plan: Any, key: str, name: str, line: int, depth: int) -> tuple[str, str] | None:
    """`criterion(out, y)` where `criterion = nn.MSELoss(reduction="sum")`: that constructor's reduction."""
    if not name or depth > _DEPTH:
        return None
    scopes = [key] + ([plan.f.entry_key] if plan.f.entry_key != key else []) + [
        k for k in sorted(plan.f.scopes) if k not in (key, plan.f.entry_key)]
    for scope in scopes:
        if scope != key and name in plan.f.scopes[scope].params:
            continue
        for node in plan.nodes(scope):
            if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets) \
                    and isinstance(node.value, cst.Call):
                made = _full(plan, dotted(node.value.func))
                if made.startswith(_NN) and made.endswith("Loss"):
                    return _options(plan, scope, node.value, plan.f.code(node.value), plan.line_of(node), depth)
                if _options(plan, scope, node.value, "", plan.line_of(node), depth)[0] == SUM:
                    # `CrossEntropyLoss2d(size_average=False)`: not torch's, but told to sum
                    return UNKNOWN, f"`{plan.f.code(node.value)}` {_TOLD}"
        if scope == key and name in plan.f.scopes[key].params:
            found = _passed(plan, key, name, depth)
            return None if found[0] == FREE else found
    for stmt in plan.f.module.body:  # made at module level, before the entry point
        if isinstance(stmt, cst.SimpleStatementLine):
            for node in stmt.body:
                if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets) \
                        and isinstance(node.value, cst.Call) and dotted(node.value.func).endswith("Loss") \
                        and _full(plan, dotted(node.value.func)).startswith(_NN):
                    return _options(plan, key, node.value, plan.f.code(node.value), line, depth)
    return None


def _options(plan: Any, key: str, call: cst.Call, code: str, line: int, depth: int) -> tuple[str, str]:
    """A torch loss's reduction: `reduction=` (a string, or a name bound to one), else the legacy
    `size_average=`/`reduce=` flags, else its default, the mean."""
    options = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
    if "reduction" in options:
        value = options["reduction"]
        text = _string(plan, key, value, line)
        if text is None:
            return UNKNOWN, f"`{code}` (its reduction, `{plan.f.code(value)}`, is chosen at run time)"
        return {"sum": (SUM, code), "none": (EACH, "")}.get(text, (MEAN, ""))
    if "reduce" in options and plan.f.code(options["reduce"]).strip() == "False":
        return EACH, ""
    if "size_average" in options:
        flag = plan.f.code(options["size_average"]).strip()
        if flag == "False":
            return SUM, code
        if flag not in ("True", "None"):
            return UNKNOWN, f"`{code}` (its size_average, `{flag}`, is chosen at run time)"
    return MEAN, ""


def _full(plan: Any, name: str) -> str:
    """`nnf.mse_loss` -> `torch.nn.functional.mse_loss` through the script's module-level imports (`from torch.nn
    import functional as nnf`, `from torch.nn import MSELoss`); a name no import binds stays as written."""
    root, _, rest = name.partition(".")
    for stmt in plan.f.module.body:
        for small in (stmt.body if isinstance(stmt, cst.SimpleStatementLine) else []):
            if isinstance(small, cst.ImportFrom) and small.module is not None \
                    and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    bound = alias.asname.name.value if alias.asname else dotted(alias.name)
                    if bound == root:
                        origin = f"{dotted(small.module)}.{dotted(alias.name)}"
                        return f"{origin}.{rest}" if rest else origin
            elif isinstance(small, cst.Import):
                for alias in small.names:
                    if alias.asname is not None and alias.asname.name.value == root:
                        origin = dotted(alias.name)
                        return f"{origin}.{rest}" if rest else origin
    return name


def _string(plan: Any, key: str, value: cst.BaseExpression, line: int) -> str | None:
    """The text of a string literal, or of a name bound only to string literals in the scope (or at module level)."""
    if isinstance(value, cst.SimpleString):
        return value.evaluated_value if isinstance(value.evaluated_value, str) else None
    name = dotted(value)
    if not isinstance(value, cst.Name):
        return None
    found: set[str] = set()
    bound = False
    for stmt in list(plan.f.scope_statements(key)) + list(plan.f.module.body):
        for node in walk(stmt):
            if isinstance(node, cst.Assign) and any(dotted(t.target) == name for t in node.targets):
                bound = True
                if not isinstance(node.value, cst.SimpleString):
                    return None
                found.add(str(node.value.evaluated_value))
    return found.pop() if bound and len(found) == 1 else None
