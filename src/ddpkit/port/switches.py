"""The script's own GPU switch (`--cuda`, `--no-cuda`, `use_gpu`): where ddpkit.init's device follows it."""

from __future__ import annotations

import re
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, statements_of, walk
from ddpkit.port.models import move_receiver, moves_to_cpu

__all__ = ["plan_device_flag", "plan_foreign_switch", "plan_unfollowed_switch", "option_dest"]

_SWITCH = re.compile(r"(no_|use_|with_)?(cuda|gpus?)")
"""The name of a boolean GPU switch: `cuda`, `no_cuda`, `use_gpu`, `gpu`."""


def plan_device_flag(plan: Any) -> str | None:
    """`if args.cuda: model.cuda()` or `if args.cuda: x = x.cuda()`: the script runs on the CPU unless a setting
    says otherwise, and its model or its inputs follow that setting (inputs: only under a switch named so,
    `cuda`, `gpu`, `use_cuda`, ...). The model's move is dropped (ddpkit.wrap places it), so ddpkit.init's device
    follows the same condition: `device="auto" if args.cuda else "cpu"`. Only a condition read from names bound before
    ddpkit.init and not set again in the training code; None when there is none (or two that differ)."""
    bound = plan.bound_before_init()
    assigned = {dotted(n.target) for stmt in plan.f.region for n in walk(stmt, into_functions=True)
                if isinstance(n, cst.AssignTarget)}
    found: set[str] = set()
    chosen = _chosen_devices(plan.f.module)
    models = {k: [m for m in _moves_of(plan, k) if not _to_chosen(m, chosen)] for k in sorted(plan.f.ported)}
    if any(not isinstance(plan._parent.get(id(m)), cst.If) for found in models.values() for m in found):
        models = {}  # the model goes to the GPU outside any `if` too (`if args.test: model.cuda()`, then
        # `model.cuda()` on the training path): such an `if` picks a path, not the device
    plan.unfollowed_switch = None
    for key in sorted(plan.f.ported):
        inputs = _input_moves_of(plan, key)
        for stmt in [*models.get(key, []), *inputs, *_device_choices(plan, key)]:
            parent = plan._parent.get(id(stmt))
            if not isinstance(parent, cst.If) or not any(s is stmt for s in statements_of(parent)):
                continue
            test = parent.test
            if any(s is stmt for s in statements_of(parent.orelse)) if isinstance(parent.orelse, cst.Else) else False:
                # `else: device = torch.device("cuda")`: the GPU is chosen when the test is false
                test = cst.UnaryOperation(cst.Not(), cst.Name("_")).with_changes(expression=parent.test)
            if any(s is stmt for s in inputs) and not _SWITCH.fullmatch(dotted(test).rsplit(".", 1)[-1]):
                continue  # inputs moved under `if args.network == "unet":` say nothing about a GPU switch
            code = plan.f.code(test)
            roots = _free_names(test)
            chains = {dotted(n) for n in walk(test) if isinstance(n, cst.Attribute) and dotted(n)}
            if not roots - {"torch"}:  # `if torch.cuda.is_available():` is what device="auto" does
                continue
            if (chains | roots) & assigned and dotted(test):  # `args.cuda = not args.no_cuda and ...` first
                test = _set_once(plan, dotted(test), bound)
                if test is None:
                    plan.unfollowed_switch = (stmt, plan.f.code(parent.test))
                    return None
                code = f"({plan.f.code(test)})" if not isinstance(test, (cst.Name, cst.Attribute)) else \
                    plan.f.code(test)
                found.add(code)
                continue
            if not roots - {"torch", "True", "False", "None"} <= bound or chains & assigned or roots & assigned:
                # `GPU_available = False` set after ddpkit.init (or again in the training code): ddpkit.init cannot
                # read it, yet it keeps the script's own tensors on the CPU while ctx.device is a GPU
                plan.unfollowed_switch = (stmt, plan.f.code(parent.test))
                return None
            found.add(code)
    return next(iter(found)) if len(found) == 1 else None


def plan_unfollowed_switch(plan: Any) -> bool:
    """A GPU switch the script moves its model or tensors by (`if GPU_available: model.cuda()`) that ddpkit.init
    cannot follow, because the switch is set after it or again in the training code: with the switch off the
    original runs on the CPU, and the port would put the model on the GPU of a GPU host beside the tensors the
    script keeps on the CPU. A TODO at the move naming the switch; True where one was written."""
    found = getattr(plan, "unfollowed_switch", None)
    if found is None:
        return False
    stmt, switch = found
    plan.todo(stmt, f"the script chooses the GPU only `if {switch}:`, a value ddpkit.init cannot read (it is set "
              "after ddpkit.init or again in the training code), while ddpkit.init puts the model on ctx.device (a "
              "GPU on a GPU host) and the tensors the script keeps on the CPU when the switch is off stay there: "
              f"decide `{switch}` before ddpkit.init and pass device=\"auto\" if {switch} else \"cpu\" to it "
              "(device=\"cpu\" where the switch is always off)")
    return True


def _device_choices(plan: Any, key: str) -> list[cst.SimpleStatementLine]:
    """`device = torch.device("cuda")` in one branch of an `if` whose other branch binds the same name to the CPU
    (`else: device = torch.device("cpu")`): the test of that `if` is the script's device switch."""
    out = []
    for node in plan.nodes(key):
        if not isinstance(node, cst.If) or not isinstance(node.orelse, cst.Else):
            continue
        both = [_bound_device(node.body), _bound_device(node.orelse.body)]
        if None in both or both[0][0] != both[1][0] or {both[0][1], both[1][1]} != {"gpu", "cpu"}:
            continue
        out.append(both[0][2] if both[0][1] == "gpu" else both[1][2])
    return out


def _bound_device(block: cst.BaseSuite) -> tuple[str, str, cst.SimpleStatementLine] | None:
    """(name, "gpu" or "cpu", statement) where a block is one `name = <device>` line: "cpu" for the CPU alone
    (`torch.device("cpu")`, `"cpu"`), "gpu" for any value that names the GPU (`"cuda" if ... else "cpu"` too)."""
    body = list(getattr(block, "body", ()))
    if len(body) != 1 or not isinstance(body[0], cst.SimpleStatementLine) or len(body[0].body) != 1 or not \
            isinstance(body[0].body[0], cst.Assign) or len(body[0].body[0].targets) != 1:
        return None
    assign = body[0].body[0]
    name = dotted(assign.targets[0].target)
    if not name or "device" not in name.rsplit(".", 1)[-1].lower():
        return None
    strings = [str(n.evaluated_value) for n in walk(assign.value) if isinstance(n, cst.SimpleString)]
    if not strings or _free_names(assign.value) - {"torch"}:
        return None  # `device = torch.device(args.device)`: the value decides, not the `if`
    if all(s == "cpu" for s in strings):
        return name, "cpu", body[0]
    return (name, "gpu", body[0]) if any(s.startswith("cuda") for s in strings) else None


def plan_foreign_switch(plan: Any) -> None:
    """A GPU switch of the script (`--cuda`, `--no-cuda`, `use_gpu = ...`) that the port could not follow and
    that is handed to another module (`Data(path, args.cuda)`): that module may keep its tensors on the CPU
    when the switch is off, while ddpkit.init puts the model on the GPU of a GPU host. A TODO at the call."""
    f = plan.f
    switches = {option_dest(n) for n in walk(f.module, into_functions=True) if isinstance(n, cst.Call)
                and dotted(n.func).endswith("add_argument")}
    switches = {d for d in switches if _SWITCH.fullmatch(d)}
    for key in sorted(f.ported):
        for node in plan.nodes(key):
            if not isinstance(node, cst.Call) or f.callees(node, key):
                continue
            name = dotted(node.func)
            if not name or name.split(".")[0] not in f.imported:
                continue
            given = [dotted(a.value) for a in node.args if dotted(a.value)]
            hit = next((g for g in given if g.rsplit(".", 1)[-1] in switches or "." not in g and _SWITCH.fullmatch(
                g)), None)
            if hit is not None:
                plan.todo(node, f"the script's GPU switch `{hit}` is read in another module here ({name}): the "
                          "port cannot see where that module puts its tensors, while ddpkit.init puts the model on "
                          "ctx.device (a GPU on a GPU host); if the switch decides it, pass "
                          f"device=\"auto\" if {hit} else \"cpu\" to ddpkit.init")
                return


def option_dest(call: cst.Call) -> str:
    """The attribute `add_argument("--no-cuda", ...)` sets ('no_cuda'), or its `dest=`."""
    dest = next((a.value for a in call.args if a.keyword and a.keyword.value == "dest"), None)
    if isinstance(dest, cst.SimpleString):
        return str(dest.evaluated_value)
    names = [str(a.value.evaluated_value) for a in call.args if a.keyword is None
             and isinstance(a.value, cst.SimpleString)]
    chosen = next((n for n in names if n.startswith("--")), names[0] if names else "")
    return chosen.lstrip("-").replace("-", "_")


def _set_once(plan: Any, flag: str, bound: set[str]) -> cst.BaseExpression | None:
    """The value of `args.cuda = not args.no_cuda and torch.cuda.is_available()`, the one assignment of the flag
    in the training code, made by a statement of the entry point's own block from settings parsed before
    ddpkit.init: ddpkit.init can read that expression itself."""
    values = [n for stmt in plan.f.region for n in walk(stmt, into_functions=True)
              if isinstance(n, cst.Assign) and any(dotted(t.target) == flag for t in n.targets)]
    if len(values) != 1 or len(values[0].targets) != 1:
        return None
    value = values[0].value
    top = any(isinstance(stmt, cst.SimpleStatementLine) and any(s is values[0] for s in stmt.body)
              for stmt in plan.f.region)
    roots = _free_names(value)
    if not top or not roots - {"torch", "True", "False", "None"} <= bound or any(
            isinstance(n, cst.Call) and dotted(n.func) not in ("torch.cuda.is_available", "bool") for n in walk(value)):
        return None
    return value


def _free_names(expr: cst.BaseExpression) -> set[str]:
    """The names an expression reads (`args` and `torch` in `args.cuda and torch.cuda.is_available()`), not the
    attribute names after a dot."""
    attrs = {id(n.attr) for n in walk(expr) if isinstance(n, cst.Attribute)}
    return {n.value for n in walk(expr) if isinstance(n, cst.Name) and id(n) not in attrs}


def _input_moves_of(plan: Any, key: str) -> list[cst.SimpleStatementLine]:
    """Statements that move a tensor to the GPU by the script's own switch: `if args.cuda: x = x.cuda()`,
    `images = images.to("cuda")`. Where the switch decides where the inputs go, it decides ddpkit's device too:
    with the model on the GPU and the inputs left on the CPU the original's CPU run would crash."""
    out = []
    for node in plan.nodes(key):
        if not isinstance(node, cst.SimpleStatementLine):
            continue
        for call in (n for n in walk(node) if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)):
            to_gpu = call.func.attr.value == "cuda" or call.func.attr.value == "to" and any(
                isinstance(a.value, cst.SimpleString) and "cuda" in a.value.value for a in call.args)
            # a tensor the script already holds (`x.cuda()`, `batch[0].cuda()`), not a module it builds here
            held = isinstance(call.func.value, (cst.Name, cst.Attribute, cst.Subscript))
            if to_gpu and held and plan.role(key, dotted(call.func.value)) != "model":
                out.append(node)
                break
    return out


def _moves_of(plan: Any, key: str) -> list[cst.SimpleStatementLine]:
    """Statements that only move a model to the GPU: `model.cuda()`, `model = model.to(device)`."""
    out = []
    for node in plan.nodes(key):
        if not isinstance(node, cst.SimpleStatementLine) or len(node.body) != 1:
            continue
        small = node.body[0]
        value = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
        receiver = move_receiver(value) if value is not None and not moves_to_cpu(value) else None
        if receiver is not None and plan.role(key, dotted(receiver)) == "model" and (
                isinstance(small, cst.Expr) or dotted(small.targets[0].target) == dotted(receiver)):
            out.append(node)
    return out


def _chosen_devices(module: cst.Module) -> set[str]:
    """Names bound to a device the script chooses between the GPU and the CPU itself (`device = torch.device(
    "cuda" if args.cuda else "cpu")`): a move to one under some `if` is not decided by that `if`."""
    out = set()
    for node in walk(module, into_functions=True):
        if isinstance(node, cst.Assign) and any(isinstance(n, cst.SimpleString) and "cpu" in n.value
                                                for n in walk(node.value)):
            out.update(dotted(t.target) for t in node.targets if dotted(t.target))
    return out


def _to_chosen(stmt: cst.SimpleStatementLine, chosen: set[str]) -> bool:
    """`model = model.to(device)` where `device` is such a choice: the `if` around it (`if args.multi_gpu:`)
    decides how the model is run, not which device it runs on."""
    small = stmt.body[0]
    call = small.value if isinstance(small, (cst.Expr, cst.Assign)) else None
    return isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) and call.func.attr.value == "to" \
        and any(a.keyword is None and dotted(a.value) in chosen for a in call.args)
