"""What nn.DataParallel leaves behind once the port removes it: sizes scaled by the GPU count, `module.` keys."""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, walk

__all__ = ["plan_gpu_products", "plan_prefixed_loads"]

_PASS_THROUGH = frozenset({"max", "min", "int", "abs"})
"""Calls whose result is still the GPU count they are given (`max(n_gpu, 1)`)."""


def _counts_gpus(expr: cst.CSTNode, names: set[str]) -> bool:
    """`torch.cuda.device_count()`, a name bound to it, or `max(n_gpu, 1)` of one."""
    if isinstance(expr, cst.Call):
        func = dotted(expr.func)
        if func.endswith("cuda.device_count"):
            return True
        return func in _PASS_THROUGH and any(_counts_gpus(a.value, names) for a in expr.args)
    return bool(dotted(expr)) and dotted(expr) in names


def _gpu_count_names(plan: Any) -> set[str]:
    """Names the script binds to its number of GPUs (`n_gpu = torch.cuda.device_count()`, `opt.num_gpu = ...`),
    through other names and `max(...)`, in every ported scope."""
    assigns = [(dotted(t.target), n.value) for key in plan.f.ported for n in plan.nodes(key)
               if isinstance(n, cst.Assign) for t in n.targets if dotted(t.target)]
    names: set[str] = set()
    while True:
        more = {target for target, value in assigns if target not in names and _counts_gpus(value, names)}
        if not more:
            return names
        names |= more


def _target(stmt: cst.CSTNode) -> str:
    small = stmt.body[0] if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1 else None
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        return dotted(small.targets[0].target)
    return dotted(small.target) if isinstance(small, cst.AugAssign) else ""


def plan_gpu_products(plan: Any) -> None:
    """A value multiplied by the GPU count (`opt.batch_size * opt.num_gpu`, `n_batch * max(n_gpu, 1)`): DataParallel's
    convention, one process splitting its batch over every GPU, so the product is the whole machine's figure. Under
    DDP each rank owns one GPU and takes that figure for itself. Where the product is the batch size of a training
    loader the port made ddpkit's, it divides it by the world size and each rank gets the per-GPU batch (a note);
    anywhere else (a batch the script slices itself, workers, a step count) a TODO names it and what reads it."""
    names = _gpu_count_names(plan)
    if not names and not any(isinstance(n, cst.Call) and dotted(n.func).endswith("cuda.device_count")
                             for key in plan.f.ported for n in plan.nodes(key)):
        return
    for key in sorted(plan.f.ported):
        for node in plan.nodes(key):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
                factor = next((s for s in (node.right, node.left) if _counts_gpus(s, names)), None)
            elif isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.MultiplyAssign):
                factor = node.value if _counts_gpus(node.value, names) else None
            else:
                continue
            if factor is None:
                continue
            stmt = plan._stmt.get(id(node), node)
            target = _target(stmt)
            product = plan.f.code(node.with_changes(lpar=[], rpar=[])) if isinstance(node, cst.BinaryOperation) \
                else plan.f.code(stmt).strip()
            if target and target in plan.train_sizes:
                plan.note(node, f"`{target}` is the batch DataParallel split over every GPU ({product}); "
                          "ddpkit.loader divides it by the world size, so with one rank per GPU each rank gets the "
                          "batch each GPU got")
                continue
            readers = _readers(plan, target) if target else []
            also = f"; {', '.join(readers[:3])} read{'s' if len(readers) == 1 else ''} it too" if readers else ""
            plan.todo(node, f"`{product}` multiplies by the GPU count ({plan.f.code(factor)}), DataParallel's "
                      "convention of one process driving every GPU; under DDP each rank owns one GPU, so each rank "
                      f"takes the whole machine's figure for itself{also}: where it sizes one rank's work (a batch "
                      "the rank slices, its loader's workers) drop the factor; where it counts for the whole run (a "
                      "global batch, a schedule's total steps) put ctx.world_size in its place")


def _readers(plan: Any, name: str) -> list[str]:
    """`n_updates_total` (line 246) for each assignment in a ported scope whose value reads `name`."""
    out: list[str] = []
    for key in sorted(plan.f.ported):
        for node in plan.nodes(key):
            if isinstance(node, cst.Assign) and any(dotted(n) == name for n in walk(node.value)):
                for t in node.targets:
                    if dotted(t.target) and dotted(t.target) != name:
                        out.append(f"`{dotted(t.target)}` (line {plan.line_of(plan._stmt.get(id(node), node))})")
    return list(dict.fromkeys(out))


def plan_prefixed_loads(plan: Any) -> None:
    """`model.load_state_dict(torch.load(path), strict=False)` into a model the port took out of nn.DataParallel:
    the original loaded into the DataParallel, so the checkpoints it saved and loads hold `module.` keys; the bare
    module matches none of them, and strict=False skips them all silently (the model keeps its initial weights).
    A strict load fails loudly on its own, so only the silent one is named."""
    for key in sorted(plan.f.ported):
        parallel_at = [plan.line_of(plan._stmt[id(n)]) for n in plan.nodes(key)
                       if id(n) in plan.drop_parallel and id(n) in plan._stmt]
        if not parallel_at:
            continue
        for node in plan.nodes(key):
            if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == "load_state_dict" and dotted(node.func.value) in plan.parallel_names):
                continue
            strict = next((a.value for a in node.args if a.keyword is not None and a.keyword.value == "strict"), None)
            line = plan.line_of(plan._stmt.get(id(node), node))
            if not (isinstance(strict, cst.Name) and strict.value == "False") or line < min(parallel_at):
                continue
            model = dotted(node.func.value)
            plan.todo(node, f"`{model}` was an nn.DataParallel (line {min(parallel_at)}), which the port removed: "
                      "checkpoints the original saved from it hold `module.` keys, which the bare module matches "
                      "none of, and strict=False skips them silently (training starts from the initial weights); "
                      "strip the prefix before loading (state = torch.load(...); "
                      "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, \"module.\"))")
