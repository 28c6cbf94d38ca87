"""The wrapped model's parameters and weight files in the project's own code (read with ast, never rewritten).

A class of the project whose forward may leave a parameter without gradient fails under DDP at the second step; a
checkpoint the project's own helpers wrote from the DDP wrapper holds `module.` keys, which a
`load_state_dict(..., strict=False)` skips without a word. ddpkit.port.project finds where the script hands the
model over; this module says what then goes wrong with its weights.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Callable

__all__ = ["Follow", "ast_dotted", "strict_loads", "unused_in_wrapped"]

Follow = Callable[..., "tuple[str, ast.AST] | None"]
"""Resolves a function name called in a module of the project to (its file, its definition)."""
Definition = Callable[[str], "tuple[str, str, ast.AST] | None"]
"""Resolves a call of the ported script (`Trainer`, `utils.save`) to (its file, its name, its definition)."""


def ast_dotted(node: ast.AST) -> str:
    """`a.b.c` for a name or an attribute chain of names, else ''."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = ast_dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


_PARAMETERED = ("Linear", "Conv", "Norm", "Embedding", "LSTM", "GRU", "RNN", "Attention", "Bilinear", "PReLU",
                "Transformer", "Sequential", "ModuleList", "ModuleDict", "Parameter")


def _maybe_unused(cls: ast.ClassDef) -> list[tuple[str, int]]:
    """(attribute, line) of parameters and layers set in __init__ (`self.eps = nn.Parameter(...)`) that forward,
    and the methods it calls, read only under a condition (`if self.learn_eps:`) or never."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if "forward" not in methods or "__init__" not in methods:
        return []
    held = [(t.attr, n.lineno) for n in ast.walk(methods["__init__"]) if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call) and any(k in ast_dotted(n.value.func).rsplit(".", 1)[-1] for k in _PARAMETERED)
            and ast_dotted(n.value.func).startswith(("nn.", "torch.nn.")) for t in n.targets
            if isinstance(t, ast.Attribute) and ast_dotted(t.value) == "self"]
    always: set[str] = set()
    seen: dict[str, bool] = {}
    todo = [("forward", False)]

    def closure(nodes: list[ast.AST]) -> set[str]:
        """The attributes a branch reads, through the methods it calls, whatever their own conditions."""
        out: set[str] = set()
        stack = list(nodes)
        while stack:
            for n in ast.walk(stack.pop()):
                if isinstance(n, ast.Attribute) and ast_dotted(n.value) == "self" and n.attr not in out:
                    out.add(n.attr)
                    if n.attr in methods:
                        stack.append(methods[n.attr])
        return out

    def reads(node: ast.AST, conditional: bool) -> None:
        if isinstance(node, ast.Attribute) and ast_dotted(node.value) == "self":
            (always.add(node.attr) if not conditional else None)
            todo.append((node.attr, conditional))
        if isinstance(node, ast.If) and not conditional:  # read by every branch of an if/elif chain: always
            branches, chain = [], node
            while isinstance(chain, ast.If):
                branches.append(chain.body)
                chain = chain.orelse[0] if len(chain.orelse) == 1 and isinstance(chain.orelse[0], ast.If) else \
                    chain.orelse
            branches += [chain] if chain else []
            if len(branches) > 1:
                always.update(set.intersection(*(closure(b) for b in branches)))
        if isinstance(node, (ast.If, ast.IfExp)):
            reads(node.test, conditional)
            for part in (node.body if isinstance(node.body, list) else [node.body]) + (
                    node.orelse if isinstance(node.orelse, list) else [node.orelse]):
                reads(part, True)
            return
        if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.Lambda)) and node not in methods.values():
            return
        for child in ast.iter_child_nodes(node):
            reads(child, conditional)

    while todo:
        name, conditional = todo.pop()
        if name not in methods or name in seen and (not seen[name] or conditional):
            continue
        seen[name] = conditional
        if name != "__init__":
            if any(isinstance(n, ast.Call) and ast_dotted(n.func) in ("getattr", "self.children", "self.modules",
                                                                  "self.named_children", "self.named_modules")
                   for n in ast.walk(methods[name])):
                return []
            reads(methods[name], conditional)
    return [(attr, line) for attr, line in held if attr not in always]


def unused_in_wrapped(tree: ast.Module, classes: dict[str, str], definition: Definition) -> list[tuple[int, str]]:
    """`ddpkit.wrap(Cls(...), ctx)` without find_unused_parameters where Cls, a class of the project, holds a
    parameter its forward may leave unused: DDP fails at the second step when one gets no gradient."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast_dotted(node.func) == "ddpkit.wrap" and node.args) or any(
                kw.arg == "find_unused_parameters" for kw in node.keywords):
            continue
        arg = node.args[0]
        cls = ast_dotted(arg.func) if isinstance(arg, ast.Call) else classes.get(ast_dotted(arg), "")
        found = definition(cls) if cls else None
        unused = _maybe_unused(found[2]) if found is not None and isinstance(found[2], ast.ClassDef) else []
        if unused:
            where = os.path.basename(found[0])
            names = ", ".join(f"self.{attr} ({where}:{line})" for attr, line in unused[:3])
            out.append((node.lineno, f"not checked: `{found[1]}` in {where} (read, not ported): its forward reads "
                                     f"{names} only under a condition, or never, so a step may give it no "
                                     "gradient and DDP fails at the next one: wrap with "
                                     "ddpkit.wrap(..., ctx, find_unused_parameters=True) unless it is always used"))
    return out


def _strict_false_loads(defn: ast.AST, follow: Follow, depth: int = 0) -> list[tuple[str, int]]:
    """(file, line) of each `load_state_dict(..., strict=False)` in `defn` or the functions it calls."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(defn):
        if not isinstance(node, ast.Call):
            continue
        if _strict_false(node):
            out.append(("", node.lineno))
        elif depth < 2 and isinstance(node.func, ast.Name):
            found = follow(node.func.id)
            if found is not None and found[1] is not defn:
                out += [(where or found[0], line) for where, line in _strict_false_loads(
                    found[1], lambda n, p=found[0]: follow(n, p), depth + 1)]
    return out


def _strict_false(node: ast.Call) -> bool:
    """`x.load_state_dict(state, strict=False)`."""
    return isinstance(node.func, ast.Attribute) and node.func.attr == "load_state_dict" and any(
        kw.arg == "strict" and isinstance(kw.value, ast.Constant) and kw.value.value is False for kw in node.keywords)


def strict_loads(tree: ast.Module, definition: Definition, follower: Callable[[str], Follow]) -> list[tuple[int, str]]:
    """Where the project's own code saves the wrapped model's state_dict (keys start with `module.`), a load of a
    checkpoint with `load_state_dict(..., strict=False)`, here or in a function of the project the script calls,
    skips every such key without a word: the model it loads keeps its initial weights."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if _strict_false(node):
            out.append((node.lineno, "not checked: `load_state_dict(..., strict=False)` of a checkpoint the "
                                     "project's own code may have saved from the DDP wrapper (`module.` keys, "
                                     "named above): strict=False skips every such key silently; save "
                                     "ddpkit.unwrap(model) there"))
            continue
        found = definition(ast_dotted(node.func))
        loads = _strict_false_loads(found[2], follower(found[0])) if found is not None else []
        if loads:
            where = ", ".join(f"{os.path.basename(p or found[0])}:{line}" for p, line in loads[:2])
            out.append((node.lineno, f"not checked: `{found[1]}` in {os.path.basename(found[0])} (read, not "
                                     f"ported) loads a checkpoint with strict=False ({where}), and the project's "
                                     "own code may have saved it from the DDP wrapper (`module.` keys, named "
                                     "above): strict=False skips every such key silently, so the model keeps its "
                                     "initial weights; hand the saving code ddpkit.unwrap(model)"))
    return out
