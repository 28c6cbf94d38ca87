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

__all__ = ["Definition", "Follow", "ast_dotted", "discarded_outputs", "forward_reads", "frozen_modules", "maybe_unused",
           "strict_loads"]

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


Dropped = Callable[[str], "tuple[set[int], set[str]] | None"]
"""For a method of the object: (positions, keywords) of the arguments of `self.m(...)` that never reach what m returns
or keeps, or None where every argument may."""


def _no_drops(name: str) -> None:
    return None


def _walk(node: ast.AST, dropped: Dropped = _no_drops):
    """ast.walk, leaving out the arguments of `self.m(...)` calls that m throws away (`dropped`)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        drop = dropped(n.func.attr) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
            ast_dotted(n.func.value) == "self" and not any(isinstance(a, ast.Starred) for a in n.args) else None
        if drop is not None:
            stack += [n.func, *(a for i, a in enumerate(n.args) if i not in drop[0]),
                      *(k for k in n.keywords if k.arg not in drop[1])]
        else:
            stack.extend(ast.iter_child_nodes(n))


def _names_in(node: ast.AST, dropped: Dropped = _no_drops) -> set[str]:
    """The names an expression (or a statement's parts) reads, `self` included."""
    return {n.id for n in _walk(node, dropped) if isinstance(n, ast.Name)}


def _flat(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every statement of a function body, into if/for/while/with/try blocks (not into nested definitions)."""
    out: list[ast.stmt] = []
    for stmt in body:
        out.append(stmt)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for block in ("body", "orelse", "finalbody"):
            out += _flat(getattr(stmt, block, []) or [])
        for handler in getattr(stmt, "handlers", []) or []:
            out += _flat(handler.body)
        for case in getattr(stmt, "cases", []) or []:
            out += _flat(case.body)
    return out


def _reaching(function: ast.FunctionDef, methods: set[str], dropped: Dropped = _no_drops) -> list[ast.AST] | None:
    """The parts of `function` whose values may reach what it returns (or what it keeps on `self`): a return's
    value, the value of an assignment to a name that reaches it, the arguments of a method called on such a name
    (`outs.append(head(x))`), a loop's iterable whose element reaches it, and every call of another method of the
    object (it may keep what it computes). Names are followed by name, whatever the order: a value named once where
    it reaches the result counts everywhere. None where the function returns nothing (nothing to follow). An argument
    of `self.m(...)` that m throws away (`dropped`) reaches nothing."""
    statements = _flat(function.body)
    if not any(isinstance(s, ast.Return) and s.value is not None for s in statements):
        return None
    live: set[str] = set()
    parts: list[ast.AST] = []
    done: set[int] = set()
    changed = True
    while changed:
        changed = False
        for stmt in statements:
            if id(stmt) in done:
                continue
            reads: list[ast.AST] = []
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                reads = [stmt.value]
            elif isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                roots = {_root_id(e) for t in targets for e in _elements(t)} - {"_"}  # `out, _ = self.lstm(x)`
                if roots & (live | {"self"}):
                    reads = [stmt.value, *targets] if not isinstance(stmt, ast.AugAssign) else [stmt.value, stmt.target]
            elif isinstance(stmt, (ast.For, ast.AsyncFor)) and _names_in(stmt.target) & live:
                reads = [stmt.iter]
            elif isinstance(stmt, (ast.With, ast.AsyncWith)) and any(
                    i.optional_vars is not None and _names_in(i.optional_vars) & live for i in stmt.items):
                reads = [i.context_expr for i in stmt.items]
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and isinstance(
                    stmt.value.func, ast.Attribute) and (
                    _root_id(stmt.value.func.value) in live - {"self"} or _root_id(stmt.value.func.value) == "self"
                    and (ast_dotted(stmt.value.func.value) != "self" or stmt.value.func.attr in methods)):
                reads = [stmt.value]  # outs.append(head(x)); self.keep(x): the object may keep it (not self.aux(x))
            if reads:
                done.add(id(stmt))
                parts += reads
                live |= set().union(*(_names_in(r, dropped) for r in reads)) - {"_"}  # a throwaway links nothing
                changed = True
    return parts


def _elements(target: ast.AST) -> list[ast.AST]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [e for t in target.elts for e in _elements(t)]
    return [target.value] if isinstance(target, ast.Starred) else [target]


def _root_id(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def discarded_outputs(cls: ast.ClassDef) -> list[tuple[str, int]]:
    """(attribute, line) of the modules set in __init__ (`self.aux = nn.Sequential(...)`, a layer, a class of the
    project) that forward calls but whose output reaches neither what forward returns nor the object, on any path
    (`aux = self.aux(x)` computed and thrown away): their parameters get no gradient, and DDP fails at the second
    step. [] where forward returns nothing, or reads modules by name (getattr). The methods forward calls are
    followed the same way: `self.join(v, self.tag(c))`, where join returns what it makes of v alone, throws tag's
    output away."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if "forward" not in methods or "__init__" not in methods:
        return []
    forward = methods["forward"]
    if any(isinstance(n, ast.Call) and ast_dotted(n.func) in ("getattr", "self.children", "self.modules",
                                                              "self.named_children", "self.named_modules")
           for n in ast.walk(forward)):
        return []
    known: dict[str, tuple[set[int], set[str]] | None] = {}

    def dropped(name: str) -> tuple[set[int], set[str]] | None:
        if name not in known and name in methods and name != "forward":
            known[name] = None  # a method that calls itself: every argument may reach
            function = methods[name]
            parts = _reaching(function, set(methods), dropped)
            named = [a.arg for a in (*function.args.posonlyargs, *function.args.args)][1:]  # after self
            if parts is not None and function.args.vararg is None and function.args.kwarg is None:
                live = set().union(*(_names_in(p, dropped) for p in parts))
                unread = {a.arg for a in function.args.kwonlyargs if a.arg not in live}
                known[name] = ({i for i, a in enumerate(named) if a not in live}, unread | set(named) - live)
        return known.get(name)

    parts = _reaching(forward, set(methods), dropped)
    if parts is None:
        return []
    held = [(t.attr, n.lineno) for n in ast.walk(methods["__init__"]) if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call) and ast_dotted(n.value.func).rsplit(".", 1)[-1][:1].isupper()
            for t in n.targets if isinstance(t, ast.Attribute) and ast_dotted(t.value) == "self"]
    reaching: set[str] = set()
    stack = list(parts)
    while stack:  # what reaches the result, through what reaches the result of each method it calls
        for n in _walk(stack.pop(), dropped):
            if isinstance(n, ast.Attribute) and ast_dotted(n.value) == "self" and n.attr not in reaching:
                reaching.add(n.attr)
                if n.attr in methods and n.attr != "forward":
                    inner = _reaching(methods[n.attr], set(methods), dropped)  # None: all it reads, to be safe
                    stack += inner if inner is not None else [methods[n.attr]]
    called: set[str] = set()
    stack = [forward]
    while stack:  # what forward calls, and the methods it calls
        for n in ast.walk(stack.pop()):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and ast_dotted(n.func.value) == "self" \
                    and n.func.attr not in called:
                called.add(n.func.attr)
                if n.func.attr in methods and n.func.attr != "forward":
                    stack.append(methods[n.func.attr])
    return [(attr, line) for attr, line in held if attr in called and attr not in reaching and attr not in methods]


def frozen_modules(init: ast.AST) -> set[str]:
    """Attributes whose parameters `__init__` freezes (`self.ema.requires_grad_(False)`, `for p in
    self.ema.parameters(): p.requires_grad = False`): DDP leaves parameters without requires_grad out when it
    wraps, so such a module never read by forward needs no find_unused_parameters."""
    out: set[str] = set()
    for n in ast.walk(init):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "requires_grad_" and (
                n.args and isinstance(n.args[0], ast.Constant) and n.args[0].value is False):
            target = n.func.value
        elif isinstance(n, ast.For) and isinstance(n.iter, ast.Call) and isinstance(n.iter.func, ast.Attribute) and \
                n.iter.func.attr == "parameters" and isinstance(n.target, ast.Name) and any(
                isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant) and a.value.value is False and any(
                    ast_dotted(t) == f"{n.target.id}.requires_grad" for t in a.targets) for a in n.body):
            target = n.iter.func.value
        else:
            continue
        if isinstance(target, ast.Attribute) and ast_dotted(target.value) == "self":
            out.add(target.attr)
    return out


def wrapped_classes(wrap: ast.Call, builders: dict[str, list[str]], definition: Definition
                    ) -> list[tuple[str, str, ast.ClassDef]]:
    """(file, name, class) of each class of the script ("" file) or its project that `ddpkit.wrap(model, ctx)` may
    wrap: the class called in place (`ddpkit.wrap(Net(), ctx)`), or any class the name is built by, in any branch."""
    arg = wrap.args[0]
    names = [ast_dotted(arg.func)] if isinstance(arg, ast.Call) else builders.get(ast_dotted(arg), [])
    found = [definition(name) if name else None for name in names]
    return [f for f in found if f is not None and isinstance(f[2], ast.ClassDef)]  # type: ignore[misc]


def maybe_unused(cls: ast.ClassDef) -> list[tuple[str, int]]:
    """(attribute, line) of parameters and layers set in __init__ (`self.eps = nn.Parameter(...)`) that forward,
    and the methods it calls, read only under a condition (`if self.learn_eps:`) or never."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    always = forward_reads(cls)
    if always is None:
        return []
    frozen = frozen_modules(methods["__init__"])
    held = [(t.attr, n.lineno) for n in ast.walk(methods["__init__"]) if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call) and (any(k in ast_dotted(n.value.func).rsplit(".", 1)[-1]
                                                       for k in _PARAMETERED)
                                                   and ast_dotted(n.value.func).startswith(("nn.", "torch.nn."))
                                                   or ast_dotted(n.value.func).rsplit(".", 1)[-1] == "deepcopy")
            for t in n.targets if isinstance(t, ast.Attribute) and ast_dotted(t.value) == "self"
            and t.attr not in frozen]
    out = [(attr, line) for attr, line in held if attr not in always]
    return out + [(attr, line) for attr, line in discarded_outputs(cls) if attr not in {a for a, _ in out}]


def forward_reads(cls: ast.ClassDef) -> set[str] | None:
    """The attributes of `self` that every call of the class's forward reads (through the methods it calls, and
    read by every branch of an if/elif chain); None when the class has no forward or __init__ of its own, or
    reads its modules by name (getattr, self.children())."""
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if "forward" not in methods or "__init__" not in methods:
        return None
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
                return None
            reads(methods[name], conditional)
    return always


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
