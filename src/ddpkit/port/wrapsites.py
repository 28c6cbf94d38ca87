"""Where a wrap the port placed falls short on another path: a sibling branch that builds the optimizer through a
call the port cannot read as one (the model trains unwrapped there), and apex's `amp.initialize` run after the wrap
(apex refuses a model already in a parallel wrapper). Each is a TODO at the line to change."""

from __future__ import annotations

from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted
from ddpkit.port.models import follows, is_optimizer

__all__ = ["check_wrap_sites"]


def check_wrap_sites(plan: Any) -> None:
    """After ddpkit.port.models placed the wraps (`plan.wrapped`): the TODOs of this module."""
    _check_unwrapped_branches(plan)
    _check_amp_order(plan)


def _check_amp_order(plan: Any) -> None:
    """apex's `model, optimizer = amp.initialize(model, optimizer)` after the port's wrap of `model`: apex refuses a
    model already inside a parallel wrapper (RuntimeError at start). A TODO at the call, once per model."""
    for (key, model), placed in plan.wrapped.items():
        for node in plan.nodes(key):
            if not (isinstance(node, cst.Call) and dotted(node.func).endswith("amp.initialize") and node.args):
                continue
            first = node.args[0].value
            handed = [dotted(e.value) for e in first.elements] if isinstance(first, (cst.List, cst.Tuple)) else \
                [dotted(first)]
            stmt = plan._stmt.get(id(node))
            where = next((w for w in placed if stmt is not None and follows(plan, w, stmt)), None)
            if model in handed and where is not None:
                plan.todo(node, f"apex `amp.initialize` gets `{model}` after the port wrapped it (line "
                          f"{plan.line_of(where)}): apex raises RuntimeError for a model already in a parallel "
                          f"wrapper; move {model} = ddpkit.wrap({model}, ctx) to just after this line (wrap the "
                          "model amp.initialize returns), or train with torch.autocast and torch.amp.GradScaler")
                break


def _check_unwrapped_branches(plan: Any) -> None:
    """A model wrapped in one branch of an if/elif before its optimizer (one branch per optimizer choice), where a
    sibling branch builds the same optimizer name with a call the port does not read as an optimizer: on that
    path the model trains unwrapped, an unsynchronised copy per rank. A TODO at that branch's build."""
    for (key, model), placed in plan.wrapped.items():
        for where in placed:
            top = plan._parent.get(id(where))
            if not isinstance(top, cst.If):
                continue
            targets = {dotted(t.target) for s in plan._block[id(where)][0] for n in _assigns(s)
                       if isinstance(n.value, cst.Call) and is_optimizer(n.value) for t in n.targets}
            for block in plan.blocks_of(top):
                if any(plan._block.get(id(p), ([None],))[0][:1] == block[:1] for p in placed):
                    continue
                for stmt in block:
                    for assign in _assigns(stmt):
                        if isinstance(assign.value, cst.Call) and not is_optimizer(assign.value) and any(
                                dotted(t.target) in targets for t in assign.targets):
                            _unwrapped_branch_todo(plan, model, assign, plan.line_of(where))


def _assigns(stmt: cst.CSTNode) -> list[cst.Assign]:
    return [n for n in stmt.body if isinstance(n, cst.Assign)] if isinstance(stmt, cst.SimpleStatementLine) else []


def _unwrapped_branch_todo(plan: Any, model: str, assign: cst.Assign, line: int) -> None:
    callee = dotted(assign.value.func) or "a call"
    plan.todo(assign, f"`{dotted(assign.targets[0].target)}` is built here by `{callee}(...)`, which the port does "
              f"not read as an optimizer, while `{model}` is wrapped only in another branch of this if (line "
              f"{line}): on this path each rank trains its own unsynchronised copy of `{model}`; if this trains "
              f"{model}, add {model} = ddpkit.wrap({model}, ctx) just before this line")
