"""Copies of the wrapped model that the script builds beside it (target networks, EMA copies): on ctx.device."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, names_a_device, walk
from ddpkit.port.models import assigned_value

__all__ = ["plan_model_copies"]


def plan_model_copies(plan: Any) -> None:
    """In a script that names no device, ddpkit.wrap puts the model on ctx.device while a copy of it stays on the
    CPU: its forward on the model's inputs, or a soft update mixing both state dicts, fails on a GPU host. A copy
    is a module built in the model's scope by the model's own constructor (`target = Net(...)` beside
    `model = Net(...)`), `copy.deepcopy(model)`, or a module that loads the model's state dict
    (`target.load_state_dict(model.state_dict())`); where the script moves it nowhere, it is built on ctx.device.
    A module of another kind (a teacher, a feature extractor) is left alone: nothing says it meets the model."""
    f = plan.f
    if names_a_device(f.module):
        return  # the script places its modules itself: its moves become ctx.device
    text = f.module.code
    wrapped = {model for _, model in plan.wrapped}
    for (key, model), built in plan.built.items():
        if (key, model) not in plan.wrapped:
            continue
        made = assigned_value(built, model)
        maker = dotted(made.func) if isinstance(made, cst.Call) else ""
        if not maker:
            continue
        loads = _loads_state_of(plan, key, model)
        for stmt in plan.nodes(key):
            if not (isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign)
                    and len(stmt.body[0].targets) == 1) or stmt is built or id(stmt.body[0]) in plan.to_device:
                continue
            name = dotted(stmt.body[0].targets[0].target)
            value = stmt.body[0].value
            if not name or name in wrapped or not isinstance(value, cst.Call):
                continue
            copy = dotted(value.func) == maker or name in loads or dotted(value.func) in (
                "copy.deepcopy", "deepcopy") and value.args and dotted(value.args[0].value) == model
            if copy and not re.search(rf"(?<![\w.]){re.escape(name)}\s*\.\s*(to|cuda)\s*\(", text):
                plan.to_device.add(id(stmt.body[0]))
                plan.model_copies.add((key, name))
                plan.note(stmt, f"`{name}`, a copy of the model beside it, goes to ctx.device with the model "
                          "(ddpkit.wrap put it there)")


def _loads_state_of(plan: Any, key: str, model: str) -> set[str]:
    """The names that load `model`'s state dict in `key`: `target.load_state_dict(model.state_dict())`."""
    out = set()
    for node in plan.nodes(key):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value == "load_state_dict" and node.args and any(
                    isinstance(n, cst.Call) and dotted(n.func) == f"{model}.state_dict" for n in walk(node.args[0].value)):
            out.add(dotted(node.func.value))
    return out

