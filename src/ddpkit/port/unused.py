"""Parameters DDP would see without a gradient: parts of a model class its forward may not read, and
`requires_grad` or the module tree changed after `ddpkit.wrap` (DDP fixes the parameters it averages then)."""

from __future__ import annotations

import ast
import re
import textwrap
from typing import Any

import libcst as cst

from ddpkit.port.facts import dotted, root_name, walk
from ddpkit.port.models import assigned_value, follows
from ddpkit.port.weights import discarded_outputs, frozen_modules

__all__ = ["plan_unused_parameters", "plan_parameter_changes"]


def plan_unused_parameters(plan: Any) -> None:
    """A model class of this file that holds a module its forward never reads (an EMA copy, a head used only to
    evaluate): DDP waits for that module's gradients, which never come, and fails at the second step. Such a
    model is wrapped with find_unused_parameters=True (slower; correct)."""
    plan.unused_inline = set()
    for (key, model), built in list(plan.built.items()):
        value = assigned_value(built, model)
        cls = dotted(value.func) if isinstance(value, cst.Call) else ""
        unread = _unread_modules(plan.f, cls) if cls in plan.f.classes else []
        thrown = [] if unread or cls not in plan.f.classes else _thrown_away(plan.f.code(plan.f.classes[cls]))
        if not unread and not thrown:
            continue
        attr, conditional = unread[0] if unread else (thrown[0], False)
        how = f"throws away what self.{attr} computes (it never reaches the result): its parameters get" if thrown \
            else f"reads self.{attr} only under a condition: its parameters may get" if conditional else \
            f"never reads self.{attr}: its parameters get"
        plan.note(built, f"{cls}.forward {how} no gradient, so DDP runs "
                  "with find_unused_parameters=True (slower); drop the module from the optimizer's parameters or "
                  "keep it outside the model to train faster")
        if id(built) in plan.wrap_inline:
            plan.unused_inline.add(id(built))
        plain = f"ddpkit.wrap({model}, ctx)"
        for anchor, lines in plan.wrap_before.items():
            plan.wrap_before[anchor] = [line.replace(plain, f"ddpkit.wrap({model}, ctx, find_unused_parameters=True)")
                                        if line.startswith(f"{model} = ") else line for line in lines]


def _thrown_away(code: str) -> list[str]:
    """Modules of a class (its source) whose output forward computes and throws away (ddpkit.port.weights)."""
    try:
        tree = ast.parse(textwrap.dedent(code))
    except SyntaxError:
        return []
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    return [attr for attr, _ in discarded_outputs(cls)] if cls is not None else []


_PARAMETERED = re.compile(r"Linear|Conv|Norm|Embedding|LSTM|GRU|RNN|Attention|Bilinear|PReLU|Transformer|Sequential|"
                          r"Module(List|Dict)|Parameter")
"""Layers of torch.nn that hold parameters (a Dropout or a ReLU read under a condition leaves nothing unused)."""


def _self_reads(node: cst.CSTNode, conditional: bool, out: list[tuple[str, bool]]) -> None:
    """(attribute, read only under a condition) for each `self.x` read in `node`: inside an if's branches or an
    if-expression's arms a read may not happen in a step."""
    if isinstance(node, cst.Attribute) and dotted(node.value) == "self":
        out.append((node.attr.value, conditional))
    if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
        return
    if isinstance(node, cst.If):
        _self_reads(node.test, conditional, out)
        _self_reads(node.body, True, out)
        if node.orelse is not None:
            _self_reads(node.orelse, True, out)
            out.extend((attr, conditional) for attr in _every_path(node.body) & _every_path(node.orelse))
        return
    if isinstance(node, cst.IfExp):
        _self_reads(node.test, conditional, out)
        _self_reads(node.body, True, out)
        _self_reads(node.orelse, True, out)
        return
    for child in node.children:
        _self_reads(child, conditional, out)


def _every_path(node: cst.CSTNode) -> set[str]:
    """The attributes `self.x` that `node` reads on every path through it (`if a: f(self.main) else: self.main(x)`
    reads self.main whichever branch runs)."""
    if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.IfExp)):
        return set()
    if isinstance(node, cst.If):
        both = _every_path(node.body) & _every_path(node.orelse) if node.orelse is not None else set()
        return _every_path(node.test) | both
    found = {node.attr.value} if isinstance(node, cst.Attribute) and dotted(node.value) == "self" else set()
    for child in node.children:
        found |= _every_path(child)
    return found


def _unread_modules(facts: Any, cls: str) -> list[tuple[str, bool]]:
    """Attributes `self.x = <module>` (or `nn.Parameter(...)`) set in the class's __init__ that forward (and the
    methods it calls) never read, or read only under a condition (`if self.learn_eps:` around the method that reads
    a parameter), each with True for the latter: [] when the class has no forward of its own or reads attributes by
    name (getattr)."""
    methods = {k.split(".", 1)[1]: s.node for k, s in facts.scopes.items() if s.cls == cls}
    if "forward" not in methods or "__init__" not in methods:
        return []
    modules = []
    for node in walk(methods["__init__"].body):
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and isinstance(node.value, cst.Call):
            target = dotted(node.targets[0].target)
            func = dotted(node.value.func)
            if target.startswith("self.") and target.count(".") == 1 and (
                    func.startswith(("nn.", "torch.nn.")) and func.rsplit(".", 1)[-1][:1].isupper()
                    or func.rsplit(".", 1)[-1] == "deepcopy" or func in facts.classes):
                modules.append((target[5:], func.rsplit(".", 1)[-1]))
    try:
        frozen = frozen_modules(ast.parse(textwrap.dedent(facts.code(methods["__init__"]))))
    except SyntaxError:
        frozen = set()
    modules = [(m, func) for m, func in modules if m not in frozen]  # DDP leaves out what needs no gradient
    if not modules:
        return []
    always: set[str] = set()
    sometimes: set[str] = set()
    todo, seen = [("forward", False)], {}
    while todo:
        name, conditional = todo.pop()
        if name not in methods or name in seen and (not seen[name] or conditional):
            continue
        seen[name] = conditional
        code = facts.code(methods[name])
        if re.search(r"\bgetattr\(|\bself\.(children|modules|named_children|named_modules)\(", code):
            return []
        reads: list[tuple[str, bool]] = []
        _self_reads(methods[name].body, conditional, reads)
        for attr, under in reads:
            (sometimes if under else always).add(attr)
            todo.append((attr, under))
    never = [(m, False) for m, _ in modules if m not in always | sometimes]
    return never + [(m, True) for m, func in modules if m in sometimes - always and (
        _PARAMETERED.search(func) or func in facts.classes)]


_INITS = ("nn.init.", "torch.nn.init.", "init.")
_IN_PLACE_DRAWS = frozenset({"normal_", "uniform_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
                             "kaiming_normal_", "orthogonal_", "trunc_normal_", "reset_parameters"})


def _within(plan: Any, outer: cst.CSTNode, stmt: cst.CSTNode) -> bool:
    """`stmt` lies inside the compound statement `outer` (a loop the wrap was placed before)."""
    node = plan._parent.get(id(stmt))
    while node is not None:
        if node is outer:
            return True
        node = plan._parent.get(id(node))
    return False


def _draws_weights(plan: Any, call: cst.Call) -> bool:
    """`model.reset_parameters()`, `model.apply(init_fn)` with an init_fn of the script that draws (nn.init, an
    in-place `normal_`), `nn.init.normal_(p)`: new random weights."""
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "reset_parameters" and not call.args:
        return True
    if isinstance(func, cst.Attribute) and func.attr.value == "apply" and len(call.args) == 1:
        defs = [s.node for k, s in plan.f.scopes.items() if k.rsplit(".", 1)[-1] == dotted(call.args[0].value)]
        return any(isinstance(n, cst.Call) and (dotted(n.func).startswith(_INITS) or isinstance(
            n.func, cst.Attribute) and n.func.attr.value in _IN_PLACE_DRAWS) for d in defs for n in walk(d))
    return bool(call.args) and dotted(func).startswith(_INITS) and dotted(func).endswith("_")


_PARAMETER_SOURCES = frozenset({"parameters", "named_parameters", "children", "named_children", "modules",
                                "named_modules"})


def _model_root(plan: Any, key: str, expr: cst.CSTNode, wrapped: set[str]) -> str:
    """The wrapped model an expression reads its modules or parameters from: `model.backbone.parameters()`."""
    for node in walk(expr):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value in _PARAMETER_SOURCES:
            root = root_name(node.func.value)
            if plan.role(key, root) == "model" or root in wrapped and (
                    (key, root) in plan.wrapped or root not in plan._locals(key)):
                return root  # a function's own `model` (a builder's, before any wrap) is not the wrapped one
    return ""


def plan_parameter_changes(plan: Any) -> None:
    """`p.requires_grad = False` over the wrapped model's parameters (a warm-up that freezes the backbone, a
    layer-wise unfreeze), `model.requires_grad_(...)`, a submodule replaced or a parameter added, where it may run
    after the wrap: DDP fixed the parameters it averages when it wrapped, so a frozen one never gets its gradient
    (the second step fails) and an unfrozen or new one is never averaged. A TODO at each such line; the same
    change before the wrap is what DDP sees, and fine."""
    wrapped = {model for (_, model) in plan.wrapped}
    for key in sorted(plan.f.ported):
        nodes = list(plan.nodes(key))
        elements: dict[str, str] = {}  # `for p in model.backbone.parameters():` p -> 'model'
        for node in nodes:
            if isinstance(node, (cst.For, cst.CompFor)):
                owner = _model_root(plan, key, node.iter, wrapped)
                if owner:
                    elements.update({n.value: owner for n in walk(node.target) if isinstance(n, cst.Name)})
        for node in nodes:
            owner, what = "", ""
            if isinstance(node, cst.Assign):
                for t in node.targets:
                    target = t.target
                    if isinstance(target, cst.Attribute) and target.attr.value == "requires_grad":
                        root = root_name(target.value)
                        owner = elements.get(root) or (root if root in wrapped and plan.role(key, root) == "model"
                                                       else "")
                        what = "sets requires_grad on parameters"
                    elif isinstance(target, cst.Attribute) and root_name(target) in wrapped and plan.role(
                            key, root_name(target)) == "model" and isinstance(node.value, cst.Call) and (
                            dotted(node.value.func).rsplit(".", 1)[-1][:1].isupper()):
                        owner, what = root_name(target), f"replaces the module `{plan.f.code(target)}`"
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in (
                    "requires_grad_", "add_module", "register_parameter", "register_module"):
                root = root_name(node.func.value)
                owner = elements.get(root) or (root if root in wrapped and plan.role(key, root) == "model" else "")
                what = "sets requires_grad on parameters" if node.func.attr.value == "requires_grad_" else \
                    "adds a parameter or module"
            elif isinstance(node, cst.Call) and _draws_weights(plan, node):
                root = root_name(node.func.value) if isinstance(node.func, cst.Attribute) and \
                    node.func.attr.value in ("reset_parameters", "apply") else root_name(node.args[0].value)
                owner = elements.get(root) or (root if root in wrapped and plan.role(key, root) == "model" else "")
                what = "draws the weights again"
            if not owner or id(node) not in plan._stmt:
                continue
            stmt = plan._stmt[id(node)]
            placed = plan.wrapped.get((key, owner))
            if placed is not None and not any(follows(plan, where, stmt) or _within(plan, where, stmt)
                                              for where in placed):
                continue  # before the wrap in this scope: DDP registers what it sees then
            if what == "draws the weights again":
                plan.todo(node, f"this line draws the weights of the wrapped `{owner}` again after ddpkit.wrap, and DDP "
                          "copies rank 0's weights only when it wraps: unless every rank has drawn the same random "
                          "numbers up to here (ddpkit.init seeds the ranks apart), the replicas train from different "
                          "weights; seed every rank alike right before this line, or draw them before the wrap")
                continue
            plan.todo(node, f"this line {what} of the wrapped `{owner}` after ddpkit.wrap: DDP fixed the parameters it "
                      "averages when it wrapped, so a parameter frozen now gets no gradient (DDP fails at the next "
                      "step) and one unfrozen or added now is never averaged (ranks drift apart); make the change "
                      f"before {owner} = ddpkit.wrap({owner}, ctx), or train each phase with its own wrap")
